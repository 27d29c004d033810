// Primary-backup replication's pure part: the node-to-node codec and the two
// ends of a stream (include/shardlock/lease/server/internal/replication.h).
#include "shardlock/lease/server/internal/replication.h"

#include <arpa/inet.h>
#include <xxhash.h>

#include <algorithm>
#include <cstring>

namespace shardlock::lease::internal::replication {
namespace {

constexpr std::size_t kEntryPrefix = 5;                                         // kind, bucket
constexpr std::size_t kGrantFixed = kEntryPrefix + 2 + 16 + 8 + 8 + 1 + 4 + 4;  // + key
constexpr std::size_t kReleaseFixed = kEntryPrefix + 2 + 16 + 8;                // + key
// The wire kind of a kGrant whose holder has a value: the kGrant fields,
// then u16 length + value (1..kMaxHolderValueLength bytes). A grant without
// one keeps kind 1, byte for byte what version 1 sent before values.
constexpr std::uint8_t kGrantWithValue = 5;
// A kBucketCaughtUp with Entry::owner_active.
constexpr std::uint8_t kCaughtUpActive = 6;

class Writer {
 public:
  explicit Writer(std::vector<std::uint8_t>& out) : out_(out) {}
  template <class T>
  void put(T value) {
    static_assert(std::is_integral_v<T>);
    using U = std::make_unsigned_t<T>;
    const U v = static_cast<U>(value);
    for (std::size_t i = 0; i < sizeof(T); ++i) {
      out_.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
    }
  }
  void bytes(std::string_view s) { out_.insert(out_.end(), s.begin(), s.end()); }

 private:
  std::vector<std::uint8_t>& out_;
};

class Reader {
 public:
  explicit Reader(std::span<const std::uint8_t> in) noexcept : in_(in) {}
  template <class T>
  bool get(T& value) noexcept {
    static_assert(std::is_integral_v<T>);
    if (in_.size() - pos_ < sizeof(T)) return false;
    using U = std::make_unsigned_t<T>;
    U v = 0;
    for (std::size_t i = 0; i < sizeof(T); ++i) {
      v = static_cast<U>(v | (static_cast<U>(in_[pos_ + i]) << (8 * i)));
    }
    pos_ += sizeof(T);
    value = static_cast<T>(v);
    return true;
  }
  bool string(std::size_t n, std::string& out) {
    if (in_.size() - pos_ < n) return false;
    out.assign(reinterpret_cast<const char*>(in_.data() + pos_), n);
    pos_ += n;
    return true;
  }
  [[nodiscard]] bool done() const noexcept { return pos_ == in_.size(); }
  [[nodiscard]] std::size_t left() const noexcept { return in_.size() - pos_; }
  [[nodiscard]] std::size_t position() const noexcept { return pos_; }
  void skip(std::size_t n) noexcept { pos_ += n; }  // at most left()

 private:
  std::span<const std::uint8_t> in_;
  std::size_t pos_ = 0;
};

// A relay: u64 seq, u8 address kind (4 or 6), u16 port, the address (4 or
// 16 bytes, IPv4 as a u32), u16 length, then that many bytes. The relays
// follow the entries, and a u8 count of them ends the datagram.
constexpr std::size_t kRelayPrefix = 8 + 1 + 2 + 2;

bool read_relay(Reader& r, std::span<const std::uint8_t> bytes, Relay& relay) {
  std::uint8_t kind = 0;
  std::uint16_t port = 0;
  if (!r.get(relay.seq) || relay.seq == 0 || !r.get(kind) || !r.get(port)) return false;
  relay.to = Peer{};
  if (kind == 4) {
    std::uint32_t ip = 0;
    if (!r.get(ip)) return false;
    relay.to.addr.v4.sin_family = AF_INET;
    relay.to.addr.v4.sin_port = htons(port);
    relay.to.addr.v4.sin_addr.s_addr = htonl(ip);
    relay.to.len = sizeof(sockaddr_in);
  } else if (kind == 6) {
    if (r.left() < 16) return false;
    relay.to.addr.v6.sin6_family = AF_INET6;
    relay.to.addr.v6.sin6_port = htons(port);
    std::memcpy(relay.to.addr.v6.sin6_addr.s6_addr, bytes.data() + r.position(), 16);
    r.skip(16);
    relay.to.len = sizeof(sockaddr_in6);
  } else {
    return false;
  }
  std::uint16_t length = 0;
  if (!r.get(length) || length == 0 || length > kMaxDatagramSize || r.left() < length) {
    return false;
  }
  relay.bytes = bytes.subspan(r.position(), length);
  r.skip(length);
  return true;
}

void put_addressing(Writer& w, const Addressing& a) {
  w.put(a.sender);
  w.put(a.receiver);
  w.put(a.incarnation);
  w.put(a.receiver_incarnation);
}

bool get_addressing(Reader& r, Addressing& a) noexcept {
  return r.get(a.sender) && r.get(a.receiver) && r.get(a.incarnation) &&
         r.get(a.receiver_incarnation);
}

bool has_key(EntryKind kind) noexcept {
  return kind == EntryKind::kGrant || kind == EntryKind::kRelease;
}

bool carries_value(const Entry& e) noexcept {
  return e.kind == EntryKind::kGrant && !e.value.empty();
}

void write_entry(Writer& w, const Entry& e) {
  const bool active_mark = e.kind == EntryKind::kBucketCaughtUp && e.owner_active;
  w.put(carries_value(e) ? kGrantWithValue
        : active_mark    ? kCaughtUpActive
                         : static_cast<std::uint8_t>(e.kind));
  w.put(e.bucket);
  if (!has_key(e.kind)) return;
  w.put(static_cast<std::uint16_t>(e.key.size()));
  w.bytes(e.key);
  w.put(e.owner.lo);
  w.put(e.owner.hi);
  w.put(e.token);
  if (e.kind != EntryKind::kGrant) return;
  w.put(e.request_id);
  w.put(static_cast<std::uint8_t>(e.mode));
  w.put(e.permits);
  w.put(e.ttl_ms);
  if (!carries_value(e)) return;
  w.put(static_cast<std::uint16_t>(e.value.size()));
  w.bytes(e.value);
}

bool read_entry(Reader& r, Entry& e) {
  std::uint8_t kind = 0;
  if (!r.get(kind) || !r.get(e.bucket)) return false;
  const bool with_value = kind == kGrantWithValue;
  if (with_value) kind = static_cast<std::uint8_t>(EntryKind::kGrant);
  e.owner_active = kind == kCaughtUpActive;
  if (e.owner_active) kind = static_cast<std::uint8_t>(EntryKind::kBucketCaughtUp);
  if ((kind < static_cast<std::uint8_t>(EntryKind::kGrant) ||
       kind > static_cast<std::uint8_t>(EntryKind::kBucketCaughtUp)) &&
      kind != static_cast<std::uint8_t>(EntryKind::kBucketActivated)) {
    return false;
  }
  e.kind = static_cast<EntryKind>(kind);
  e.value.clear();
  if (!has_key(e.kind)) return true;
  std::uint16_t length = 0;
  if (!r.get(length) || length < kMinKeyLength || length > kMaxKeyLength) return false;
  if (!r.string(length, e.key) || !r.get(e.owner.lo) || !r.get(e.owner.hi) || !r.get(e.token)) {
    return false;
  }
  if (e.kind != EntryKind::kGrant) return true;
  std::uint8_t mode = 0;
  if (!r.get(e.request_id) || !r.get(mode) || !r.get(e.permits) || !r.get(e.ttl_ms)) return false;
  if (mode > static_cast<std::uint8_t>(LeaseMode::kPermit)) return false;
  e.mode = static_cast<LeaseMode>(mode);
  if (!with_value) return true;
  std::uint16_t value_length = 0;
  return r.get(value_length) && value_length >= 1 && value_length <= kMaxHolderValueLength &&
         r.string(value_length, e.value);
}

}  // namespace

std::uint64_t node_tag(std::string_view node_id) noexcept {
  return XXH3_64bits(node_id.data(), node_id.size());
}

std::size_t entry_size(const Entry& e) noexcept {
  switch (e.kind) {
    case EntryKind::kGrant:
      return kGrantFixed + e.key.size() + (carries_value(e) ? 2 + e.value.size() : 0);
    case EntryKind::kRelease:
      return kReleaseFixed + e.key.size();
    case EntryKind::kResetBucket:
    case EntryKind::kBucketCaughtUp:
    case EntryKind::kBucketActivated:
      return kEntryPrefix;
  }
  return kEntryPrefix;
}

namespace {

// encode_replicate() of the entries [first, last) of any random-access
// container (PrimaryStream's deque, without copying them out).
template <class It>
std::size_t encode_run(const ReplicateHeader& header, It first, It last,
                       std::vector<std::uint8_t>& out) {
  std::size_t count = 0;
  std::size_t size = kReplicateHeaderSize;
  for (It it = first; it != last; ++it) {
    const Entry& e = *it;
    if (has_key(e.kind) && (e.key.size() < kMinKeyLength || e.key.size() > kMaxKeyLength)) break;
    if (e.value.size() > kMaxHolderValueLength) break;
    if (size + entry_size(e) > kMaxReplicationDatagram || count == UINT16_MAX) break;
    size += entry_size(e);
    ++count;
  }
  out.clear();
  out.reserve(size);
  Writer w(out);
  w.put(kReplicateMagic);
  w.put(kReplicationVersion);
  w.put(static_cast<std::uint8_t>((header.settled ? kFlagPrimarySettled : 0) |
                                  (header.ack_later ? kFlagAckLater : 0)));
  w.put(static_cast<std::uint16_t>(count));
  w.put(header.stream);
  w.put(header.epoch);
  w.put(header.first_seq);
  w.put(header.sent_ns);
  put_addressing(w, header.addressing);
  for (std::size_t i = 0; i < count; ++i) write_entry(w, first[static_cast<std::ptrdiff_t>(i)]);
  return count;
}

}  // namespace

std::size_t encode_replicate(const ReplicateHeader& header, std::span<const Entry> entries,
                             std::vector<std::uint8_t>& out) {
  return encode_run(header, entries.begin(), entries.end(), out);
}

namespace {

// decode_replicate() of a datagram without a carried ack.
bool decode_replicate_body(std::span<const std::uint8_t> bytes, ReplicateHeader& header,
                           std::vector<Entry>& entries, std::vector<Relay>* relays) {
  Reader r(bytes);
  std::uint32_t magic = 0;
  std::uint8_t version = 0;
  std::uint8_t flags = 0;
  std::uint16_t count = 0;
  if (!r.get(magic) || magic != kReplicateMagic || !r.get(version) ||
      version != kReplicationVersion || !r.get(flags) ||
      (flags & ~(kFlagAuthenticated | kFlagPrimarySettled | kFlagRelays | kFlagAckLater |
                 kFlagCarriesAck)) != 0 ||
      !r.get(count) || !r.get(header.stream) || !r.get(header.epoch) || !r.get(header.first_seq) ||
      !r.get(header.sent_ns) || !get_addressing(r, header.addressing)) {
    return false;
  }
  if (header.stream == 0 || header.first_seq == 0) return false;
  header.settled = (flags & kFlagPrimarySettled) != 0;
  header.ack_later = (flags & kFlagAckLater) != 0;
  // Every entry takes at least its prefix: a count the bytes cannot hold is
  // refused before anything is allocated for it (a forged count would
  // otherwise cost 65535 entries per datagram).
  if (count > r.left() / kEntryPrefix) return false;
  entries.resize(count);
  for (Entry& e : entries) {
    if (!read_entry(r, e)) {
      entries.clear();
      return false;
    }
  }
  if ((flags & kFlagRelays) != 0) {
    // Their count is the last byte (append_relay() adds one at a time), so
    // a datagram cut between two relays is refused too.
    std::uint8_t relay_count = bytes.back();
    Reader trailer(bytes.first(bytes.size() - 1));
    trailer.skip(r.position());
    if (r.left() == 0 || relay_count == 0) {
      entries.clear();
      return false;
    }
    for (; relay_count > 0; --relay_count) {
      Relay relay;
      if (!read_relay(trailer, bytes, relay)) {
        entries.clear();
        if (relays != nullptr) relays->clear();
        return false;
      }
      if (relays != nullptr) relays->push_back(relay);
    }
    if (!trailer.done()) {
      entries.clear();
      if (relays != nullptr) relays->clear();
      return false;
    }
    return true;
  }
  if (!r.done()) {
    entries.clear();
    return false;
  }
  return true;
}

}  // namespace

bool decode_replicate(std::span<const std::uint8_t> bytes, ReplicateHeader& header,
                      std::vector<Entry>& entries, std::vector<Relay>* relays,
                      std::optional<Ack>* carried) {
  entries.clear();
  if (relays != nullptr) relays->clear();
  if (carried != nullptr) carried->reset();
  if (bytes.size() > kMaxReplicationDatagram || bytes.size() < kReplicateHeaderSize) return false;
  if ((bytes[kHeaderFlagsOffset] & kFlagCarriesAck) != 0) {
    // The ack is the tail (append_ack()); the rest reads as without it.
    if (bytes.size() < kReplicateHeaderSize + kAckHeaderSize) return false;
    Ack ack;
    if (!decode_ack(bytes.last(kAckHeaderSize), ack)) return false;
    if (!decode_replicate_body(bytes.first(bytes.size() - kAckHeaderSize), header, entries,
                               relays)) {
      return false;
    }
    if (carried != nullptr) *carried = ack;
    return true;
  }
  return decode_replicate_body(bytes, header, entries, relays);
}

void mark_ack_later(std::vector<std::uint8_t>& datagram) noexcept {
  // Only the flag to set: callers pass what encode_replicate() wrote.
  if (datagram.size() < kReplicateHeaderSize) return;
  datagram[kHeaderFlagsOffset] |= kFlagAckLater;
}

bool append_relay(std::vector<std::uint8_t>& datagram, std::uint64_t seq, const Peer& to,
                  std::span<const std::uint8_t> bytes) {
  const sa_family_t family = to.addr.sa.sa_family;
  if (family != AF_INET && family != AF_INET6) return false;
  if (bytes.empty() || bytes.size() > kMaxDatagramSize) return false;
  if (datagram.size() < kReplicateHeaderSize) return false;
  Reader header(datagram);
  std::uint32_t magic = 0;
  std::uint8_t version = 0;
  std::uint8_t flags = 0;
  std::uint16_t count = 0;
  std::uint64_t stream = 0;
  std::uint64_t epoch = 0;
  std::uint64_t first_seq = 0;
  if (!header.get(magic) || magic != kReplicateMagic || !header.get(version) ||
      !header.get(flags) || !header.get(count) || !header.get(stream) || !header.get(epoch) ||
      !header.get(first_seq)) {
    return false;
  }
  if (seq == 0 || seq > first_seq + count - 1) return false;  // first_seq is never 0
  if ((flags & kFlagCarriesAck) != 0) return false;           // the ack stays last
  const std::size_t address = family == AF_INET ? 4 : 16;
  const bool first = (flags & kFlagRelays) == 0;
  if (!first && datagram.back() == UINT8_MAX) return false;  // as many as the count can say
  if (datagram.size() + kRelayPrefix + address + bytes.size() + (first ? 1 : 0) >
      kMaxReplicationDatagram) {
    return false;
  }
  datagram[kHeaderFlagsOffset] = static_cast<std::uint8_t>(flags | kFlagRelays);
  const std::uint8_t count_now = first ? 1 : static_cast<std::uint8_t>(datagram.back() + 1);
  if (!first) datagram.pop_back();
  Writer w(datagram);
  w.put(seq);
  w.put(static_cast<std::uint8_t>(family == AF_INET ? 4 : 6));
  if (family == AF_INET) {
    w.put(ntohs(to.addr.v4.sin_port));
    w.put(ntohl(to.addr.v4.sin_addr.s_addr));
  } else {
    w.put(ntohs(to.addr.v6.sin6_port));
    datagram.insert(datagram.end(), to.addr.v6.sin6_addr.s6_addr,
                    to.addr.v6.sin6_addr.s6_addr + 16);
  }
  w.put(static_cast<std::uint16_t>(bytes.size()));
  datagram.insert(datagram.end(), bytes.begin(), bytes.end());
  datagram.push_back(count_now);
  return true;
}

namespace {

void put_ack(Writer& w, const Ack& ack) {
  w.put(kAckMagic);
  w.put(kReplicationVersion);
  w.put(ack.refused ? kFlagStreamRefused : std::uint8_t{0});
  w.put(std::uint16_t{0});
  w.put(ack.stream);
  w.put(ack.applied);
  w.put(ack.echo_sent_ns);
  w.put(ack.lease_ms);
  put_addressing(w, ack.addressing);
}

}  // namespace

void encode_ack(const Ack& ack, std::vector<std::uint8_t>& out) {
  out.clear();
  out.reserve(kAckHeaderSize);
  Writer w(out);
  put_ack(w, ack);
}

bool append_ack(std::vector<std::uint8_t>& datagram, const Ack& ack) {
  Reader header(datagram);
  std::uint32_t magic = 0;
  if (!header.get(magic) || magic != kReplicateMagic || datagram.size() < kReplicateHeaderSize) {
    return false;
  }
  if ((datagram[kHeaderFlagsOffset] & kFlagCarriesAck) != 0) return false;
  if (datagram.size() + kAckHeaderSize > kMaxReplicationDatagram) return false;
  datagram[kHeaderFlagsOffset] |= kFlagCarriesAck;
  Writer w(datagram);
  put_ack(w, ack);
  return true;
}

bool decode_ack(std::span<const std::uint8_t> bytes, Ack& ack) noexcept {
  Reader r(bytes);
  std::uint32_t magic = 0;
  std::uint8_t version = 0;
  std::uint8_t flags = 0;
  std::uint16_t reserved = 1;
  if (!r.get(magic) || magic != kAckMagic || !r.get(version) || version != kReplicationVersion ||
      !r.get(flags) || (flags & ~(kFlagAuthenticated | kFlagStreamRefused)) != 0 ||
      !r.get(reserved) || reserved != 0 || !r.get(ack.stream) || !r.get(ack.applied) ||
      !r.get(ack.echo_sent_ns) || !r.get(ack.lease_ms) || !get_addressing(r, ack.addressing) ||
      !r.done()) {
    return false;
  }
  ack.refused = (flags & kFlagStreamRefused) != 0;
  return ack.stream != 0;
}

// ------------------------------------------------------------ PrimaryStream

PrimaryStream::PrimaryStream(std::uint64_t stream, const StreamTiming& timing,
                             const Addressing& addressing) noexcept
    : stream_(stream),
      timing_(timing),
      addressing_(addressing),
      retransmit_after_ns_(timing.retransmit_ns) {}

bool PrimaryStream::readdress(std::uint64_t stream, std::uint64_t receiver_incarnation) noexcept {
  // Nothing acknowledged: every entry is still here, and no lease counts
  // on the process the stream was addressed to.
  if (resync_ || applied_ != 0 || lease_until_ns_ != kNever || stream <= stream_) return false;
  stream_ = stream;
  addressing_.receiver_incarnation = receiver_incarnation;
  sent_up_to_ = 0;
  last_send_ns_ = kNever;
  oldest_unacked_send_ns_ = kNever;
  newest_echo_ns_ = kNever;
  retransmit_after_ns_ = timing_.retransmit_ns;
  return true;
}

std::uint64_t PrimaryStream::append(Entry entry) {
  if (has_key(entry.kind) &&
      (entry.key.size() < kMinKeyLength || entry.key.size() > kMaxKeyLength)) {
    return 0;
  }
  if (entry.value.size() > kMaxHolderValueLength) return 0;
  pending_.push_back(std::move(entry));
  return next_seq_++;
}

void PrimaryStream::send_from(std::size_t index, std::int64_t now_ns, std::uint64_t epoch,
                              bool settled, std::vector<std::vector<std::uint8_t>>& out) {
  // Each datagram takes as many entries from `index` on as fit; every
  // entry fits a datagram on its own (append() checks the key), so each
  // takes at least one.
  // Within the window (an entry past it goes out once the ones before it
  // are acknowledged), and a bounded burst.
  const auto window = static_cast<std::size_t>(std::max<std::uint64_t>(timing_.max_in_flight, 1));
  const std::size_t end = std::min(pending_.size(), window);
  for (std::size_t sent = 0; index < end && sent < timing_.max_datagrams_per_poll; ++sent) {
    const ReplicateHeader header{stream_, epoch,   applied_ + 1 + index,
                                 now_ns,  settled, addressing_};
    out.emplace_back();
    index += encode_run(header, pending_.begin() + static_cast<std::ptrdiff_t>(index),
                        pending_.end(), out.back());
    ++datagrams_sent_;
    sent_up_to_ = std::max(sent_up_to_, applied_ + index);
  }
  last_send_ns_ = now_ns;
}

void PrimaryStream::poll(std::int64_t now_ns, std::uint64_t epoch,
                         std::vector<std::vector<std::uint8_t>>& out, bool settled) {
  if (resync_) return;
  // New entries go out while the unacknowledged ones stay under the window.
  const bool unsent = sent_up_to_ < last_seq() && sent_up_to_ - applied_ < timing_.max_in_flight;
  const bool overdue = !pending_.empty() && sent_up_to_ > applied_ &&
                       now_ns - oldest_unacked_send_ns_ >= retransmit_after_ns_;
  if (overdue) {
    // The unacknowledged, from the oldest: the backup applies in order, so
    // a lost datagram holds back all after it. Backed off until an ack
    // moves on (on_ack()); heartbeats still go out meanwhile, so the
    // backup's lease is renewed whatever the timeout has grown to.
    ++retransmissions_;
    send_from(0, now_ns, epoch, settled, out);
    oldest_unacked_send_ns_ = now_ns;
    retransmit_after_ns_ = std::min(std::max(timing_.max_retransmit_ns, timing_.retransmit_ns),
                                    retransmit_after_ns_ * 2);
    return;
  }
  if (unsent) {
    const bool was_idle = sent_up_to_ == applied_;
    send_from(static_cast<std::size_t>(sent_up_to_ - applied_), now_ns, epoch, settled, out);
    if (was_idle) oldest_unacked_send_ns_ = now_ns;
    return;
  }
  if (now_ns - last_send_ns_ >= timing_.heartbeat_ns) {
    out.emplace_back();
    (void)encode_replicate(ReplicateHeader{stream_, epoch, next_seq_, now_ns, settled, addressing_},
                           {}, out.back());
    ++datagrams_sent_;
    last_send_ns_ = now_ns;
  }
}

void PrimaryStream::on_ack(const Ack& ack, std::int64_t now_ns) noexcept {
  if (ack.stream != stream_ || resync_) return;
  // An ack from the future (the echoed send time is ahead of now) is not
  // one of ours; nor is one that claims entries never sent.
  if (ack.echo_sent_ns > now_ns || ack.applied > sent_up_to_) return;
  // The backup will never follow this stream: only a new one, with its
  // snapshots, brings it back (a backup answers so for good, so any such
  // answer, however old, says it).
  if (ack.refused) {
    resync_ = true;
    return;
  }
  if (ack.echo_sent_ns >= newest_echo_ns_) {
    newest_echo_ns_ = ack.echo_sent_ns;
    // The newest answer has less than an older one had: the backup lost
    // what it acknowledged (it restarted). What was trimmed here is gone
    // there; only a new stream with snapshots brings it back.
    if (ack.applied < applied_) {
      resync_ = true;
      return;
    }
  }
  // An ack that lends no lease, for a datagram sent after this primary's
  // lease from the backup had ended: the backup no longer promises, and may
  // have taken the buckets over without what it applies now. It releases
  // no held answer (with a backup that still applied such
  // a datagram, a grant made under the lease but replicated late was
  // answered after the takeover had given the key to someone else).
  if (ack.lease_ms == 0 && ack.echo_sent_ns >= lease_until_ns_) return;
  if (ack.applied > applied_) {
    while (applied_ < ack.applied && !pending_.empty()) {
      pending_.pop_front();
      ++applied_;
    }
    // What is still unacknowledged was last sent no earlier than this.
    oldest_unacked_send_ns_ = last_send_ns_;
    retransmit_after_ns_ = timing_.retransmit_ns;
  }
  if (ack.lease_ms > 0) {
    const auto lease_ns = static_cast<std::int64_t>(ack.lease_ms) * 1'000'000;
    const auto margin =
        static_cast<std::int64_t>(timing_.drift_factor * static_cast<double>(lease_ns)) +
        timing_.drift_allowance_ns;
    lease_until_ns_ = std::max(lease_until_ns_, ack.echo_sent_ns + lease_ns - margin);
  }
}

// ------------------------------------------------------------- BackupStream

Ack BackupStream::on_replicate(const ReplicateHeader& header, std::span<const Entry> entries,
                               std::int64_t now_ns) {
  Ack ack;
  ack.stream = header.stream;
  ack.echo_sent_ns = header.sent_ns;
  const bool followed =
      header.stream == stream_ && header.addressing.incarnation == stream_incarnation_;
#if !defined(SHARDLOCK_FAULT_ACK_AFTER_TAKEOVER)  // UNSAFE when defined: docs/simulation.md
  if (promise_expired(now_ns)) {
    // Frozen (a backup that took over never acknowledges the old primary): this node may have taken
    // the primary's buckets over with what it had applied by now. An entry applied and acknowledged
    // after that would let the primary answer a grant the takeover never saw: two holders. What it
    // acknowledges stays where it was, and a new stream is not followed.
    ack.applied = followed ? applied_ : 0;
    return ack;
  }
#endif
  // An older stream of this primary, or one this node stopped promising for
  // good: no lease, nothing applied, and refused outright, so the primary
  // starts a new stream even if it had nothing of this one acknowledged.
  // So is the id followed, from another process of the primary: its entries
  // are not the ones applied under that id (a primary that restarted within
  // a map epoch numbers its streams as its earlier run did).
  if (header.stream < stream_ || header.stream <= after_stream_ ||
      (header.stream == stream_ && !followed)) {
    ack.refused = true;
    return ack;
  }
  if (header.stream > stream_) {
    // A new stream (the primary restarted or started over, or this node
    // did): followed from its first entry. Its snapshots reset every bucket
    // it covers.
    stream_ = header.stream;
    stream_incarnation_ = header.addressing.incarnation;
    applied_ = 0;
    primary_settled_ = false;
  }
  if (header.settled) primary_settled_ = true;
  const std::uint64_t first = header.first_seq;
  // A datagram of a later map than the backup's may carry buckets this
  // node backs up only there (see carry()): those are not refused.
  const bool later_map = header.epoch > carried_epoch_;
  if (first > applied_ + 1 && !entries.empty()) ++gaps_;
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const std::uint64_t seq = first + i;
    if (seq <= applied_) continue;   // a duplicate
    if (seq != applied_ + 1) break;  // after a gap: wait for the resend
    apply(entries[i], later_map);
    applied_ = seq;
  }
  ack.applied = applied_;
  if (promising_ && header.epoch >= lease_from_epoch_) {
    ack.lease_ms = timing_.lease_ms;
    promised_until_ns_ = std::max(promised_until_ns_,
                                  now_ns + static_cast<std::int64_t>(timing_.lease_ms) * 1'000'000);
  }
  return ack;
}

void BackupStream::carry(std::vector<std::uint32_t> buckets, std::uint64_t epoch) {
  carried_ = std::move(buckets);
  carried_epoch_ = epoch;
  carry_set_ = true;
  for (auto it = buckets_.begin(); it != buckets_.end();) {
    if (std::binary_search(carried_.begin(), carried_.end(), it->first)) {
      ++it;
      continue;
    }
    for (const auto& [key, holders] : it->second.keys) holder_count_ -= holders.size();
    it = buckets_.erase(it);
  }
}

void BackupStream::apply(const Entry& e, bool later_map) {
  if (e.bucket >= kMaxBuckets ||
      (carry_set_ && !later_map &&
       !std::binary_search(carried_.begin(), carried_.end(), e.bucket))) {
    ++refused_entries_;  // not a bucket this stream backs up
    return;
  }
  switch (e.kind) {
    case EntryKind::kResetBucket: {
      // A snapshot begins: not caught up until it ends. The holders already
      // known stay: a primary that restarted starts a new stream, and the
      // leases its earlier run granted may still be live although the new
      // run knows nothing of them. Only a release (or forget()) removes a
      // holder, so a takeover inherits them too, and blocks their keys until
      // they have surely ended. Unless the primary is settled (up for its
      // lock-delay: every lease of its earlier runs has ended, and every one
      // of this run is in its state): its snapshot then lists every holder
      // it has, and one it no longer lists ended there, its release lost
      // with the stream it was on (before, such a holder came back
      // at the takeover and blocked its key, and a resigned leader was
      // reported leader again).
      BucketReplica& bucket = buckets_[e.bucket];
      if (primary_settled_) {
        for (const auto& [key, holders] : bucket.keys) holder_count_ -= holders.size();
        bucket.keys.clear();
      }
      bucket.caught_up = false;
      bucket.owner_active = false;
      return;
    }
    case EntryKind::kBucketCaughtUp:
      buckets_[e.bucket].caught_up = true;
      buckets_[e.bucket].owner_active = e.owner_active;
      return;
    case EntryKind::kBucketActivated:
      if (const auto it = buckets_.find(e.bucket); it != buckets_.end() && it->second.caught_up) {
        it->second.owner_active = true;
      }
      return;
    case EntryKind::kGrant: {
      auto& list = buckets_[e.bucket].keys[e.key];
      const ReplicaHolder h{e.owner, e.token, e.request_id, e.mode, e.permits, e.ttl_ms, e.value};
      // Idempotent: a grant seen twice (a snapshot overlapping the stream,
      // or repeating what an earlier stream sent) is one holder: the owner
      // and token name it.
      const auto same = std::find_if(list.begin(), list.end(), [&](const ReplicaHolder& x) {
        return x.owner == h.owner && x.token == h.token;
      });
      if (same == list.end()) {
        if (holder_count_ >= kMaxReplicaHolders) {
          ++refused_entries_;
          if (list.empty()) buckets_[e.bucket].keys.erase(e.key);
          return;
        }
        list.push_back(h);
        ++holder_count_;
      }
      return;
    }
    case EntryKind::kRelease: {
      auto bucket = buckets_.find(e.bucket);
      if (bucket == buckets_.end()) return;
      auto key = bucket->second.keys.find(e.key);
      if (key == bucket->second.keys.end()) return;
      auto& list = key->second;
      const auto gone = std::remove_if(list.begin(), list.end(), [&](const ReplicaHolder& h) {
        return h.owner == e.owner && h.token == e.token;
      });
      holder_count_ -= static_cast<std::size_t>(list.end() - gone);
      list.erase(gone, list.end());
      if (list.empty()) bucket->second.keys.erase(key);
      return;
    }
  }
}

bool BackupStream::caught_up(std::uint32_t bucket) const noexcept {
  const auto it = buckets_.find(bucket);
  return it != buckets_.end() && it->second.caught_up;
}

bool BackupStream::owner_active(std::uint32_t bucket) const noexcept {
  const auto it = buckets_.find(bucket);
  return it != buckets_.end() && it->second.caught_up && it->second.owner_active;
}

std::vector<ReplicaHolder> BackupStream::holders(std::uint32_t bucket, std::string_view key) const {
  const auto b = buckets_.find(bucket);
  if (b == buckets_.end()) return {};
  const auto k = b->second.keys.find(std::string(key));
  if (k == b->second.keys.end()) return {};
  return k->second;
}

std::vector<std::pair<std::string, ReplicaHolder>> BackupStream::bucket_holders(
    std::uint32_t bucket) const {
  std::vector<std::pair<std::string, ReplicaHolder>> out;
  const auto b = buckets_.find(bucket);
  if (b == buckets_.end()) return out;
  for (const auto& [key, list] : b->second.keys) {
    for (const ReplicaHolder& h : list) out.emplace_back(key, h);
  }
  std::sort(out.begin(), out.end(), [](const auto& x, const auto& y) {
    return x.first != y.first ? x.first < y.first : x.second.token < y.second.token;
  });
  return out;
}

void BackupStream::forget(std::uint32_t bucket) {
  const auto b = buckets_.find(bucket);
  if (b == buckets_.end()) return;
  for (const auto& [key, list] : b->second.keys) holder_count_ -= list.size();
  buckets_.erase(b);
}

}  // namespace shardlock::lease::internal::replication
