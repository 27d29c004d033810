// replication.h: primary-backup replication of a cluster node's grants, the
// pure part (docs/cluster.md, "Replication"). No sockets, no clocks, no
// locks: the caller passes the time in (nanoseconds on the server's clock,
// CLOCK_BOOTTIME) and serialises calls, so tests drive it directly.
//
// Not API: the cluster node's building block.
//
// One stream per (primary, backup) pair of nodes carries, in order, every
// change that hands out or ends a holder on the buckets the backup backs up
// for that primary:
//   * kGrant: a holder added (an ACQUIRE granted, a waiter handed the key, a
//     part of an ACQUIRE_MANY), with the ACQUIRE's owner and request id so a
//     new primary answers the client's retransmission with the same grant;
//   * kRelease: a holder gone (released, or expired at the primary);
//   * kResetBucket ... kBucketCaughtUp: a snapshot of one bucket's holders,
//     sent when the backup starts backing it up (a new stream, a join, the
//     next node in the replica set after a loss). The backup keeps the
//     holders it knew (an earlier run of the primary may have granted them,
//     and they may be live): a snapshot adds, only releases remove.
// Renewals are not in the stream (they stay on the primary), nor are waiter
// queues (a waiting client's retransmission queues again after a failover).
//
// PrimaryStream (the primary's end) numbers entries, sends them in
// datagrams of at most kMaxReplicationDatagram bytes, retransmits what is
// not acknowledged, heartbeats when idle, and keeps the *primary lease* the
// backup grants it in each acknowledgement: the primary may grant or renew
// only while now < lease_until_ns() of every backup of the bucket. The lease
// runs from the send time of the datagram acknowledged (echoed in the ack, so
// only the primary's own clock is read), shortened by a drift allowance.
//
// BackupStream (the backup's end) applies entries strictly in order (a gap
// is acknowledged at the last entry applied, so the primary resends from
// there), keeps the replicated holders per bucket, and promises, with each
// acknowledgement, not to take over the primary's buckets before
// receipt + lease. Receipt is later than the primary's send, so the backup's
// promise outlasts the primary's lease whenever the two clocks' rates differ
// by less than the drift allowance. After stop_promising() it grants no more
// leases; once promise_expired(), the primary can neither grant nor renew,
// and the backup, holding every grant the primary ever answered, may take
// over.
//
// HeldReplies keeps the answers to replicated grants until every backup has
// acknowledged them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "shardlock/lease/wire/auth.h"
#include "shardlock/lease/wire/internal/peer.h"
#include "shardlock/lease/wire/protocol.h"

namespace shardlock::lease::internal::replication {

inline constexpr std::uint32_t kReplicateMagic = 0x50524C53;  // "SLRP" little-endian
inline constexpr std::uint32_t kAckMagic = 0x41524C53;        // "SLRA" little-endian
// Version 2 added the addressing (Addressing below): version 1 datagrams
// named neither end, so a backup matched them by source address alone.
// Version 3 added the receiver's incarnation (Addressing::
// receiver_incarnation): a version 2 stream named no backup process, so a
// backup that had just restarted followed a recorded opening of an old one.
// Each version refuses the others (docs/cluster.md, "Upgrades").
inline constexpr std::uint8_t kReplicationVersion = 3;
// Node-to-node datagrams stay under a common path MTU, as client ones do,
// with room for the authentication tag.
inline constexpr std::size_t kMaxReplicationDatagram = kMaxDatagramSize - kAuthTagSize;
// Both headers put their flags byte where a client datagram has its own
// (kHeaderFlagsOffset), so seal_datagram() and open_datagram() (auth.h)
// authenticate node-to-node datagrams unchanged. A REPLICATE's flags may
// also carry kFlagPrimarySettled.
inline constexpr std::size_t kReplicateHeaderSize = 72;
// The primary's process has been up for its lock-delay: every lease it may
// have granted, its earlier runs' included, is in its state, so a stream's
// snapshots cover them all (ReplicateHeader::settled).
inline constexpr std::uint8_t kFlagPrimarySettled = 0x02;
// An ACK's flag: the backup will never follow the acknowledged stream (it
// stopped promising it for good, or follows a newer one), so the primary
// starts a new stream, with snapshots (Ack::refused). "Nothing applied"
// alone cannot say so to a primary that has had nothing of the stream
// acknowledged yet.
inline constexpr std::uint8_t kFlagStreamRefused = 0x04;
inline constexpr std::size_t kAckHeaderSize = 68;  // the whole ack
// A REPLICATE's flag: after its entries come relays (Relay below), client
// answers the backup sends on once it has applied what they wait for. A
// backup that predates relays refuses such a datagram; the primary's
// retransmission carries none, so the stream goes on and the clients'
// retransmissions are answered by the primary.
inline constexpr std::uint8_t kFlagRelays = 0x08;
// A REPLICATE's flag, set with kFlagRelays: its answers are relayed and no
// other answer at the primary waits on the stream, so the backup may send
// the ack up to StreamTiming::ack_later_ns late, and one ack then answers
// every such datagram of the stream that came meanwhile (docs/cluster.md,
// "Answers from the backup"). A late ack is no different from one the
// network delayed.
inline constexpr std::uint8_t kFlagAckLater = 0x10;
// A REPLICATE's flag: its last kAckHeaderSize bytes are an ACK (as sent
// alone) of a stream going the other way, from this REPLICATE's receiver to
// its sender: every node backs the others up, so an ack owed at the end of
// a batch rides in the REPLICATE the batch sends to the same peer instead of
// a datagram of its own (docs/cluster.md, "Answers from the backup"). It is
// read as if it had come alone, whatever becomes of the REPLICATE; the one
// seal covers both.
inline constexpr std::uint8_t kFlagCarriesAck = 0x20;

// Who a node-to-node datagram is from and for, so a stale or misaddressed one earns nothing. Each
// end is named by node_tag() of its node id, so a backup finds the stream of the primary the
// datagram names, not of whichever node last used the address, and checks that the address is the
// one the layout gives that node; a datagram for another node (a stale address, a replaced node) is
// refused. `incarnation` is the sender's process (ReplicatorOptions::incarnation), and
// `receiver_incarnation` the receiver's as the sender last heard it (0: not yet). A node takes a
// datagram only when it names its own process: a backup refuses (kFlagStreamRefused, its
// incarnation in the refusal) a REPLICATE for another, or for none, so a recorded stream opening
// replayed to a backup that restarted since is refused, and the primary learns whom to address;
// a primary drops an ack for another of its runs (stream ids may repeat across its restarts).
// All zero: unaddressed (tests of the streams alone).
struct Addressing {
  std::uint64_t sender = 0;
  std::uint64_t receiver = 0;
  std::uint64_t incarnation = 0;
  std::uint64_t receiver_incarnation = 0;
  friend bool operator==(const Addressing&, const Addressing&) = default;
};
// A node id's tag on the wire: XXH3 of the id. Two ids of one cluster with
// one tag cannot tell their streams apart; the layout refuses such a pair
// (replica_layout() logs nothing: 2^-64 per pair).
[[nodiscard]] std::uint64_t node_tag(std::string_view node_id) noexcept;

enum class EntryKind : std::uint8_t {
  kGrant = 1,
  kRelease = 2,
  kResetBucket = 3,
  kBucketCaughtUp = 4,
  // The primary activated the bucket (it grants there now): every lease of
  // an earlier owner is over or among the holders this stream carried
  // before this mark. A backup already caught up on the bucket then counts
  // it as the snapshot's owner_active; one not caught up ignores it (its
  // snapshot's own mark says). Wire kind 7 (5 and 6 are kGrant and
  // kBucketCaughtUp forms).
  kBucketActivated = 7,
};

struct Entry {
  EntryKind kind = EntryKind::kGrant;
  std::uint32_t bucket = 0;
  std::string key;                         // kGrant, kRelease
  ClientId owner;                          // kGrant, kRelease
  std::uint64_t token = 0;                 // kGrant, kRelease
  std::uint64_t request_id = 0;            // kGrant: the granted ACQUIRE's request id
  LeaseMode mode = LeaseMode::kExclusive;  // kGrant
  std::uint32_t permits = 0;               // kGrant: a semaphore key's limit
  std::uint32_t ttl_ms = 0;                // kGrant: the TTL granted
  // kGrant: the holder's value (protocol.h, kItemFlagValue), at most
  // kMaxHolderValueLength bytes. A grant with one travels as its own wire
  // kind (kGrantWithValue below), so a datagram without values is what
  // version 1 always sent, and a backup that predates values refuses only
  // the datagrams that carry one.
  std::string value;
  // kBucketCaughtUp: the primary had the bucket active when it sent the
  // snapshot (every earlier owner's lease there was over), so a backup that
  // takes it over need not wait for the history it did not see (a wire kind
  // of its own, kCaughtUpActive below).
  bool owner_active = false;
  friend bool operator==(const Entry&, const Entry&) = default;
};

// The encoded size of one entry.
[[nodiscard]] std::size_t entry_size(const Entry& e) noexcept;

struct ReplicateHeader {
  std::uint64_t stream = 0;     // rises per (primary, backup) within a process; never 0
  std::uint64_t epoch = 0;      // the primary's map epoch at the send
  std::uint64_t first_seq = 0;  // the first entry's number (entries are consecutive);
                                // with no entries, the next number (a heartbeat)
  std::int64_t sent_ns = 0;     // the primary's clock at the send, echoed in the ack
  bool settled = false;         // kFlagPrimarySettled
  Addressing addressing{};      // sender: the primary
  bool ack_later = false;       // kFlagAckLater
  friend bool operator==(const ReplicateHeader&, const ReplicateHeader&) = default;
};

struct Ack {
  std::uint64_t stream = 0;
  std::uint64_t applied = 0;      // every entry up to this number is applied
  std::int64_t echo_sent_ns = 0;  // the acknowledged datagram's sent_ns
  std::uint32_t lease_ms = 0;     // the primary lease granted from echo_sent_ns; 0: none
  Addressing addressing{};        // sender: the backup
  bool refused = false;           // kFlagStreamRefused
  friend bool operator==(const Ack&, const Ack&) = default;
};

// Codec. encode_replicate() writes the header and as many of `entries` as
// fit in kMaxReplicationDatagram, and returns how many it wrote (at least
// one, unless `entries` is empty, or its first entry alone is too large: a key
// longer than kMaxKeyLength, or a value longer than kMaxHolderValueLength).
// The decoders never throw and reject anything
// malformed, truncated or of another version.
[[nodiscard]] std::size_t encode_replicate(const ReplicateHeader& header,
                                           std::span<const Entry> entries,
                                           std::vector<std::uint8_t>& out);
// A client answer a REPLICATE carries (kFlagRelays): the backup sends
// `bytes` (already sealed for the client, as the primary would have sent
// them) to `to` once every entry up to `seq` of the stream is applied, and
// only from a stream it would acknowledge (docs/cluster.md, "Answers from
// the backup"). One network hop fewer than waiting for the acknowledgement
// at the primary.
struct Relay {
  std::uint64_t seq = 0;
  Peer to;
  std::span<const std::uint8_t> bytes;  // into the decoded datagram
};
// `relays`, when given, receives the datagram's relays (none without
// kFlagRelays); they are checked either way. `carried`, when given,
// receives the ack the datagram carries (kFlagCarriesAck), or is reset; a
// malformed carried ack refuses the whole datagram.
[[nodiscard]] bool decode_replicate(std::span<const std::uint8_t> bytes, ReplicateHeader& header,
                                    std::vector<Entry>& entries,
                                    std::vector<Relay>* relays = nullptr,
                                    std::optional<Ack>* carried = nullptr);
// Appends a relay to an encoded REPLICATE, if it fits in
// kMaxReplicationDatagram, names an IPv4 or IPv6 peer and waits for no entry
// past the datagram's last (a heartbeat's: the one before its first_seq).
// Returns whether it did.
[[nodiscard]] bool append_relay(std::vector<std::uint8_t>& datagram, std::uint64_t seq,
                                const Peer& to, std::span<const std::uint8_t> bytes);
// Flags an encoded REPLICATE kFlagAckLater (before it is sealed).
void mark_ack_later(std::vector<std::uint8_t>& datagram) noexcept;
void encode_ack(const Ack& ack, std::vector<std::uint8_t>& out);
// Appends `ack` to an encoded REPLICATE (kFlagCarriesAck), last, after any
// relays (append_relay() refuses a datagram that carries one), if it fits
// in kMaxReplicationDatagram and the datagram carries none yet. Returns
// whether it did.
[[nodiscard]] bool append_ack(std::vector<std::uint8_t>& datagram, const Ack& ack);
[[nodiscard]] bool decode_ack(std::span<const std::uint8_t> bytes, Ack& ack) noexcept;

struct StreamTiming {
  std::int64_t heartbeat_ns = 50'000'000;   // send at least this often
  std::int64_t retransmit_ns = 20'000'000;  // resend what is unacknowledged after this
  // Each retransmission that brings no acknowledgement of anything new
  // doubles the wait before the next, up to this; an ack that moves on
  // brings it back to retransmit_ns. A backup slowed past retransmit_ns (a
  // starved or sanitizer-built process) was otherwise sent the whole window
  // again every 20 ms, which it had to decode while already behind.
  std::int64_t max_retransmit_ns = 160'000'000;
  std::uint32_t lease_ms = 250;  // the backup's grant per acknowledgement
  // The primary shortens each lease by factor x lease + allowance, for the
  // two clocks' rate difference and scheduling (as the client's drift margin).
  double drift_factor = 0.01;
  std::int64_t drift_allowance_ns = 2'000'000;
  // Flow control: at most this many datagrams per poll(), and new entries
  // go out only while fewer than max_in_flight are unacknowledged. A
  // snapshot of a node's share of 65536 buckets is thousands of datagrams;
  // sent (and resent every retransmit_ns) at once, they overflow the
  // sockets' buffers and are lost over and over.
  std::size_t max_datagrams_per_poll = 32;
  std::uint64_t max_in_flight = 4096;  // entries
  // A backup answers a REPLICATE flagged kFlagAckLater at its first poll
  // this long after it came (the I/O loops poll after every batch and on
  // every 2 ms tick), with one ack for all that came meanwhile: far below
  // retransmit_ns and the lease, and it spares most acks under load.
  std::int64_t ack_later_ns = 1'000'000;
};

class PrimaryStream {
 public:
  // `stream`: this stream's id, non-zero, and larger than every earlier
  // stream of this process to this backup (the node puts the map epoch in
  // the high bits and a count of its streams in the low ones): a backup
  // follows only a larger id, so a late datagram of an older stream can
  // never roll it back. Across the primary's restarts ids may repeat within
  // an epoch (the first map a restarted node adopts may be its earlier
  // run's last), so a backup follows an id only from the process that
  // started it, and the primary takes an ack only for its own process
  // (Addressing).
  // `addressing`: what every datagram of the stream names (Addressing).
  PrimaryStream(std::uint64_t stream, const StreamTiming& timing,
                const Addressing& addressing = {}) noexcept;

  // Queues one entry; returns its number, or 0 for an entry that cannot be
  // sent (a key outside kMinKeyLength..kMaxKeyLength, a value longer than
  // kMaxHolderValueLength). Sent by the next
  // poll().
  std::uint64_t append(Entry entry);
  // The datagrams due at `now_ns`: every entry not sent yet, everything not
  // acknowledged once the retransmission timeout (retransmit_ns, doubled by
  // each retransmission without progress up to max_retransmit_ns) has passed
  // since it was last sent, and a heartbeat (no entries) when nothing was
  // sent for heartbeat_ns.
  // `settled`: the primary's process is past its lock-delay
  // (kFlagPrimarySettled).
  void poll(std::int64_t now_ns, std::uint64_t epoch, std::vector<std::vector<std::uint8_t>>& out,
            bool settled = false);
  // Takes the backup's acknowledgement. One for another stream is ignored,
  // and so is one that lends no lease for a datagram sent after this
  // primary's lease had ended (the backup may have taken over: what it
  // applied then releases no held answer).
  void on_ack(const Ack& ack, std::int64_t now_ns) noexcept;

  [[nodiscard]] std::uint64_t stream() const noexcept { return stream_; }
  [[nodiscard]] std::uint64_t last_seq() const noexcept { return next_seq_ - 1; }
  [[nodiscard]] std::uint64_t applied() const noexcept { return applied_; }
  [[nodiscard]] std::size_t unacknowledged() const noexcept { return pending_.size(); }
  // The primary may grant and renew while now < lease_until_ns().
  [[nodiscard]] std::int64_t lease_until_ns() const noexcept { return lease_until_ns_; }
  [[nodiscard]] bool holds_lease(std::int64_t now_ns) const noexcept {
    return !resync_ && now_ns < lease_until_ns_;
  }
  // The backup cannot follow this stream any more: it asked for a resync,
  // or acknowledged less than it had before (it restarted and lost what was
  // acknowledged and trimmed here). The owner starts a new, larger stream
  // with a snapshot of every bucket. No lease until then.
  [[nodiscard]] bool resync_requested() const noexcept { return resync_; }
  // The backup's process is not the one this stream followed (its
  // incarnation changed): what it acknowledged is gone with it, so
  // resync_requested() from now on.
  void backup_restarted() noexcept { resync_ = true; }
  // What every datagram of the stream names.
  [[nodiscard]] const Addressing& addressing() const noexcept { return addressing_; }
  // Another process of the backup than the stream is addressed to refused
  // it (Addressing): when nothing of it was acknowledged (no entry trimmed,
  // no lease), the stream goes on as `stream` (larger than stream()),
  // addressed to `receiver_incarnation`, every entry unsent, so the next
  // poll() sends it all from the first entry and a refusal of a datagram
  // addressed as before names the old id. Returns false and changes nothing
  // otherwise: only a new stream with snapshots serves then.
  [[nodiscard]] bool readdress(std::uint64_t stream, std::uint64_t receiver_incarnation) noexcept;
  [[nodiscard]] std::uint64_t datagrams_sent() const noexcept { return datagrams_sent_; }
  [[nodiscard]] std::uint64_t retransmissions() const noexcept { return retransmissions_; }

 private:
  void send_from(std::size_t index, std::int64_t now_ns, std::uint64_t epoch, bool settled,
                 std::vector<std::vector<std::uint8_t>>& out);

  std::uint64_t stream_;
  StreamTiming timing_;
  Addressing addressing_;
  std::deque<Entry> pending_;  // entries applied_+1 .. next_seq_-1
  std::uint64_t applied_ = 0;  // acknowledged by the backup
  std::uint64_t next_seq_ = 1;
  std::uint64_t sent_up_to_ = 0;  // highest entry number sent at least once
  // Long ago, yet far enough from the type's limit that now - kNever cannot
  // overflow.
  static constexpr std::int64_t kNever = std::numeric_limits<std::int64_t>::min() / 4;
  std::int64_t last_send_ns_ = kNever;
  std::int64_t oldest_unacked_send_ns_ = kNever;
  std::int64_t newest_echo_ns_ = kNever;  // of the newest ack taken
  std::int64_t lease_until_ns_ = kNever;
  std::int64_t retransmit_after_ns_;  // the current retransmission timeout
  bool resync_ = false;
  std::uint64_t datagrams_sent_ = 0;
  std::uint64_t retransmissions_ = 0;
};

// One replicated holder, as the backup knows it.
struct ReplicaHolder {
  ClientId owner;
  std::uint64_t token = 0;
  std::uint64_t request_id = 0;
  LeaseMode mode = LeaseMode::kExclusive;
  std::uint32_t permits = 0;
  std::uint32_t ttl_ms = 0;
  std::string value;  // the holder's value (Entry::value)
  friend bool operator==(const ReplicaHolder&, const ReplicaHolder&) = default;
};

class BackupStream {
 public:
  // Created at `now_ns`: a node that restarted may have promised a lease in
  // its previous run, up to lease_ms before it died, so a new BackupStream
  // counts as having promised until now + lease_ms.
  //
  // `after_stream`: streams up to this id are answered as if nothing were
  // applied, with no lease, and not applied. A backup that takes a bucket
  // over from a live primary stops promising its stream for good (a lease
  // is per stream, not per bucket), and follows the rest of that primary's
  // buckets on a new one: this answer makes the primary start it, with
  // snapshots (PrimaryStream::resync_requested()).
  //
  // `lease_from_epoch`: acknowledgements grant a lease only to datagrams
  // sent in this map epoch or a later one. That backup owns the buckets it
  // took over from the epoch it did; a primary still on an older map may
  // believe it owns them, and must not get a lease from this backup
  // until it has left that map behind.
  BackupStream(const StreamTiming& timing, std::int64_t now_ns, std::uint64_t after_stream = 0,
               std::uint64_t lease_from_epoch = 0) noexcept
      : timing_(timing),
        after_stream_(after_stream),
        lease_from_epoch_(lease_from_epoch),
        promised_until_ns_(now_ns + static_cast<std::int64_t>(timing.lease_ms) * 1'000'000) {}

  // Applies one REPLICATE datagram received at `now_ns` and returns the
  // acknowledgement to send back. Once promise_expired(now_ns) the stream
  // is frozen: nothing more is applied and the ack names what was applied
  // before (0 for another stream), so a takeover's holders are every grant
  // the primary can ever have answered. A datagram of a larger stream id than the
  // one followed starts following it from its first entry (the primary
  // keeps everything unacknowledged, so it resends from there). One of a
  // smaller id is answered without a lease and not applied, so a late
  // datagram of an older stream can never roll the replica back. A stream
  // is followed from the primary process (Addressing::incarnation) whose
  // datagram started it: one of the same id from another process (stream
  // ids may repeat across the primary's restarts) is refused, so its
  // entries are never taken for the ones applied. Entries
  // already applied are skipped; entries after a gap are not applied (the
  // ack names the last one applied, and the primary resends).
  Ack on_replicate(const ReplicateHeader& header, std::span<const Entry> entries,
                   std::int64_t now_ns);

  // From now on, acknowledgements grant no primary lease (the map moved the
  // primary's buckets, or this node is about to take them over). Leases
  // already granted still run out at promised_until_ns().
  void stop_promising() noexcept { promising_ = false; }
  [[nodiscard]] bool promising() const noexcept { return promising_; }
  [[nodiscard]] std::int64_t promised_until_ns() const noexcept { return promised_until_ns_; }
  // The primary can neither grant nor renew any more: every lease this
  // backup granted it has run out, and it grants no new one.
  [[nodiscard]] bool promise_expired(std::int64_t now_ns) const noexcept {
    return !promising_ && now_ns >= promised_until_ns_;
  }

  [[nodiscard]] std::uint64_t stream() const noexcept { return stream_; }
  [[nodiscard]] std::uint64_t applied() const noexcept { return applied_; }
  // A datagram of the stream followed said its primary was settled
  // (kFlagPrimarySettled): the snapshots of this stream cover every lease the
  // primary's process, or its earlier runs, may have granted.
  [[nodiscard]] bool primary_settled() const noexcept { return primary_settled_; }
  // Whether `bucket`'s snapshot has been applied, so its holders here are
  // every holder the primary has answered (and maybe a few released since).
  [[nodiscard]] bool caught_up(std::uint32_t bucket) const noexcept;
  // Whether `bucket`'s snapshot said the primary had it active.
  [[nodiscard]] bool owner_active(std::uint32_t bucket) const noexcept;
  // The holders replicated for `key` (empty when none).
  [[nodiscard]] std::vector<ReplicaHolder> holders(std::uint32_t bucket,
                                                   std::string_view key) const;
  // Every replicated holder of `bucket`, by key, for a takeover.
  [[nodiscard]] std::vector<std::pair<std::string, ReplicaHolder>> bucket_holders(
      std::uint32_t bucket) const;
  // Drops what is known of `bucket` (this node no longer backs it up).
  void forget(std::uint32_t bucket);
  // The buckets this stream carries (ascending) in the backup's map of
  // `epoch`: entries of a datagram of that map or an earlier one for any
  // other bucket are not applied (before, a forged or faulty
  // stream grew a backup without bound with holders of arbitrary buckets).
  // A datagram of a later map may carry buckets this node backs up only
  // there, so its entries are applied (within kMaxBuckets and
  // kMaxReplicaHolders), and forgotten by the carry() of that map unless
  // it carries them. Unset, every bucket is carried.
  // What is known of buckets not in `buckets` is forgotten.
  void carry(std::vector<std::uint32_t> buckets, std::uint64_t epoch);
  // Entries not applied because of carry() or kMaxReplicaHolders.
  [[nodiscard]] std::uint64_t refused_entries() const noexcept { return refused_entries_; }
  // The most holders one stream keeps: past it a grant is refused (and
  // counted), bounding a backup's memory whatever a primary sends.
  static constexpr std::size_t kMaxReplicaHolders = std::size_t{1} << 21;
  // Buckets are numbered below this whatever the map (RouterOptions'
  // largest bucket_bits, the cluster's 65536).
  static constexpr std::uint32_t kMaxBuckets = std::uint32_t{1} << 16;
  [[nodiscard]] std::size_t holder_count() const noexcept { return holder_count_; }
  [[nodiscard]] std::uint64_t gaps() const noexcept { return gaps_; }

 private:
  struct BucketReplica {
    bool caught_up = false;
    bool owner_active = false;  // the caught-up mark said so
    std::unordered_map<std::string, std::vector<ReplicaHolder>> keys;
  };
  void apply(const Entry& e, bool later_map);

  StreamTiming timing_;
  std::uint64_t after_stream_ = 0;
  std::uint64_t lease_from_epoch_ = 0;
  std::uint64_t stream_ = 0;
  std::uint64_t stream_incarnation_ = 0;  // the primary process that sent stream_
  std::uint64_t applied_ = 0;
  bool primary_settled_ = false;
  bool promising_ = true;
  std::int64_t promised_until_ns_;
  std::unordered_map<std::uint32_t, BucketReplica> buckets_;
  std::size_t holder_count_ = 0;
  std::uint64_t gaps_ = 0;
  std::vector<std::uint32_t> carried_;
  std::uint64_t carried_epoch_ = 0;
  bool carry_set_ = false;
  std::uint64_t refused_entries_ = 0;
};

// Answers held until the entries they depend on are acknowledged: each
// needs, for some streams (by the caller's index), an entry number.
template <class Reply>
class HeldReplies {
 public:
  struct Need {
    std::size_t stream = 0;
    std::uint64_t seq = 0;
  };
  // `relayable`: relay() may hand it to a backup to send on.
  void hold(std::vector<Need> needs, Reply reply, bool relayable = false) {
    held_.push_back(Held{std::move(needs), std::move(reply), relayable});
  }
  // Offers each relayable reply that waits on one stream alone to `take`
  // (called as take(need, reply), in the order held); one it takes (returns
  // true for) is no longer held.
  template <class Take>
  void relay(const Take& take) {
    std::size_t kept = 0;
    for (std::size_t i = 0; i < held_.size(); ++i) {
      const bool taken = held_[i].relayable && held_[i].needs.size() == 1 &&
                         take(held_[i].needs[0], held_[i].reply);
      if (!taken) {
        if (kept != i) held_[kept] = std::move(held_[i]);
        ++kept;
      }
    }
    held_.erase(held_.begin() + static_cast<std::ptrdiff_t>(kept), held_.end());
  }
  // Moves every reply whose needs are all met (applied(stream) >= seq) to
  // `out`, in the order held.
  template <class Applied>
  void release(const Applied& applied, std::vector<Reply>& out) {
    std::size_t kept = 0;
    for (std::size_t i = 0; i < held_.size(); ++i) {
      bool met = true;
      for (const Need& n : held_[i].needs) met = met && applied(n.stream) >= n.seq;
      if (met) {
        out.push_back(std::move(held_[i].reply));
      } else {
        if (kept != i) held_[kept] = std::move(held_[i]);
        ++kept;
      }
    }
    held_.erase(held_.begin() + static_cast<std::ptrdiff_t>(kept), held_.end());
  }
  [[nodiscard]] std::size_t size() const noexcept { return held_.size(); }
  // Whether any held reply waits on `stream`.
  [[nodiscard]] bool waits_on(std::size_t stream) const noexcept {
    for (const Held& h : held_) {
      for (const Need& n : h.needs) {
        if (n.stream == stream) return true;
      }
    }
    return false;
  }
  // Moves every held reply to `out`, in the order held, needs dropped.
  void take_all(std::vector<Reply>& out) {
    for (Held& h : held_) out.push_back(std::move(h.reply));
    held_.clear();
  }

 private:
  struct Held {
    std::vector<Need> needs;
    Reply reply;
    bool relayable = false;
  };
  std::vector<Held> held_;
};

}  // namespace shardlock::lease::internal::replication
