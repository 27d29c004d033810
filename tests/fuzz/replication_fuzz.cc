// libFuzzer target for the node-to-node replication codec and the backup's
// state machine. Any bytes must decode to a REPLICATE, an ACK or nothing
// without reading outside the input; whatever decodes must re-encode to a
// datagram that decodes to the same header and entries, never larger than
// what came in; and a backup fed any decoded datagram must keep its
// invariants (a repeat or an older stream's datagram changes nothing it has
// applied, and a stopped promise is never extended).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

#include "shardlock/lease/server/internal/replication.h"

namespace replication = shardlock::lease::internal::replication;

namespace {

void check_ack(std::span<const std::uint8_t> in) {
  replication::Ack ack;
  if (!replication::decode_ack(in, ack)) return;
  std::vector<std::uint8_t> out;
  replication::encode_ack(ack, out);
  if (out.size() > in.size()) std::abort();
  replication::Ack again;
  if (!replication::decode_ack(out, again) || !(again == ack)) std::abort();
}

void check_replicate(std::span<const std::uint8_t> in) {
  replication::ReplicateHeader header;
  std::vector<replication::Entry> entries;
  if (!replication::decode_replicate(in, header, entries)) return;

  std::vector<std::uint8_t> out;
  const std::size_t written = replication::encode_replicate(header, entries, out);
  // Every decoded entry fits again unless the input was larger than a
  // primary ever sends.
  if (written != entries.size() && in.size() <= replication::kMaxReplicationDatagram) std::abort();
  if (written == entries.size() && out.size() > in.size()) std::abort();
  replication::ReplicateHeader header2;
  std::vector<replication::Entry> entries2;
  if (!replication::decode_replicate(out, header2, entries2)) std::abort();
  if (!(header2 == header) || entries2.size() != written) std::abort();
  for (std::size_t i = 0; i < written; ++i) {
    if (!(entries2[i] == entries[i])) std::abort();
  }

  // The backup: the same datagram twice, then with a promise stopped.
  std::int64_t now = 0;
  if (in.size() >= 8) std::memcpy(&now, in.data() + in.size() - 8, sizeof now);
  now &= 0x0000'FFFF'FFFF'FFFF;  // a clock, not an overflow test
  const replication::StreamTiming timing;
  replication::BackupStream backup(timing, now);
  const replication::Ack first = backup.on_replicate(header, entries, now);
  const std::uint64_t applied = backup.applied();
  const replication::Ack second = backup.on_replicate(header, entries, now + 1);
  if (backup.applied() != applied || second.applied != first.applied) std::abort();
  if (header.stream > 1) {
    // A late datagram of an older stream is neither applied nor leased.
    replication::ReplicateHeader older = header;
    older.stream = header.stream - 1;
    const replication::Ack late = backup.on_replicate(older, entries, now + 1);
    if (late.lease_ms != 0 || backup.applied() != applied) std::abort();
  }
  const std::int64_t promised = backup.promised_until_ns();
  backup.stop_promising();
  const replication::Ack third = backup.on_replicate(header, entries, now + 2);
  if (third.lease_ms != 0 || backup.promised_until_ns() > promised) std::abort();
  for (const replication::Entry& e : entries) {
    (void)backup.caught_up(e.bucket);
    (void)backup.bucket_holders(e.bucket);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  // Copy so the decoders see a buffer whose end ASan guards exactly.
  const std::vector<std::uint8_t> in(data, data + size);
  check_ack(in);
  check_replicate(in);
  return 0;
}
