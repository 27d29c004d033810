// One node's replication streams (server/replicator.h).
#include "server/replicator.h"

#include <algorithm>
#include <cstring>
#include <iterator>
#include <limits>
#include <random>

#include "shardlock/lock_guard.h"

namespace shardlock::lease::internal {
namespace {

using replication::Entry;
using replication::EntryKind;

constexpr std::int64_t kForever = std::numeric_limits<std::int64_t>::max();

bool same_peer(const Peer& a, const Peer& b) noexcept {
  if (a.len != b.len || a.addr.sa.sa_family != b.addr.sa.sa_family) return false;
  if (a.addr.sa.sa_family == AF_INET) {
    return a.addr.v4.sin_port == b.addr.v4.sin_port &&
           a.addr.v4.sin_addr.s_addr == b.addr.v4.sin_addr.s_addr;
  }
  if (a.addr.sa.sa_family == AF_INET6) {
    return a.addr.v6.sin6_port == b.addr.v6.sin6_port &&
           std::memcmp(&a.addr.v6.sin6_addr, &b.addr.v6.sin6_addr, sizeof(in6_addr)) == 0;
  }
  return false;
}

std::uint32_t magic_of(std::span<const std::uint8_t> bytes) noexcept {
  if (bytes.size() < 4) return 0;
  return static_cast<std::uint32_t>(bytes[0]) | static_cast<std::uint32_t>(bytes[1]) << 8 |
         static_cast<std::uint32_t>(bytes[2]) << 16 | static_cast<std::uint32_t>(bytes[3]) << 24;
}

// A process's incarnation when none is given: 0 names none on the wire.
std::uint64_t drawn_incarnation() {
  std::random_device device;
  std::uint64_t drawn = 0;
  while (drawn == 0) drawn = static_cast<std::uint64_t>(device()) << 32 | device();
  return drawn;
}

}  // namespace

Replicator::Replicator(const ReplicatorOptions& options, std::int64_t now_ns)
    : options_(options), created_ns_(now_ns) {
  if (options_.incarnation == 0) options_.incarnation = drawn_incarnation();
  {
    LockGuard guard(layout_mu_);
    layout_ = std::make_shared<const Layout>();
  }
}

Replicator::~Replicator() = default;

std::uint64_t Replicator::next_stream_id(std::uint64_t epoch) noexcept {
  return (epoch << 32) | ++streams_started_;
}

bool Replicator::restart_pending() const {
  LockGuard lock(mu_);
  if (start_over_) return true;
  for (const auto& entry : to_) {
    if (entry.second->stream.resync_requested()) return true;
  }
  return false;
}

void Replicator::start_over() {
  LockGuard lock(mu_);
  start_over_ = true;
  for (auto& entry : to_) {
    entry.second->lease_until->store(std::numeric_limits<std::int64_t>::min(),
                                     std::memory_order_release);
  }
}

replication::PrimaryStream* Replicator::stream_to(std::uint16_t peer) {
  if (peer >= current_.peers.size()) return nullptr;
  const auto it = to_.find(current_.peers[peer].id);
  return it == to_.end() ? nullptr : &it->second->stream;
}

void Replicator::mark(std::uint16_t peer, EntryKind kind, std::uint32_t bucket, bool owner_active) {
  LockGuard lock(mu_);
  if (replication::PrimaryStream* s = stream_to(peer)) {
    Entry e;
    e.kind = kind;
    e.bucket = bucket;
    e.owner_active = owner_active;
    (void)s->append(e);
  }
}

void Replicator::begin_snapshot(std::uint16_t peer, std::uint32_t bucket) {
  mark(peer, EntryKind::kResetBucket, bucket);
}

void Replicator::append_snapshot(std::uint16_t peer, std::span<const Entry> holders) {
  LockGuard lock(mu_);
  if (replication::PrimaryStream* s = stream_to(peer)) {
    for (const Entry& e : holders) (void)s->append(e);
  }
}

void Replicator::end_snapshot(std::uint16_t peer, std::uint32_t bucket, bool owner_active) {
  mark(peer, EntryKind::kBucketCaughtUp, bucket, owner_active);
}

void Replicator::activated(std::span<const std::uint32_t> buckets) {
  LockGuard lock(mu_);
  Entry e;
  e.kind = EntryKind::kBucketActivated;
  for (const std::uint32_t b : buckets) {
    if (b >= current_.backups.size()) continue;
    e.bucket = b;
    for (const std::uint16_t peer : current_.backups[b]) {
      if (replication::PrimaryStream* s = stream_to(peer)) (void)s->append(e);
    }
  }
}

void Replicator::route(std::span<const Entry> entries) {
  std::vector<Entry> copy(entries.begin(), entries.end());
  route_moved(copy);
}

void Replicator::route_moved(std::vector<Entry>& entries) {
  if (entries.empty()) return;
  LockGuard lock(mu_);
  for (Entry& e : entries) {
    if (e.bucket >= current_.backups.size()) continue;
    const std::vector<std::uint16_t>& backups = current_.backups[e.bucket];
    if (backups.empty()) continue;
    for (std::size_t i = 0; i + 1 < backups.size(); ++i) {
      (void)to_by_peer_[backups[i]]->stream.append(e);
    }
    (void)to_by_peer_[backups.back()]->stream.append(std::move(e));
  }
}

void Replicator::add_need(ToBackup& s,
                          std::vector<replication::HeldReplies<OutDatagram>::Need>& needs) {
  if (s.stream.applied() >= s.stream.last_seq()) return;
  const std::uint64_t id = s.stream.stream();
  const auto at = std::find(held_streams_.begin(), held_streams_.end(), id);
  const auto index = static_cast<std::size_t>(at - held_streams_.begin());
  if (at == held_streams_.end()) held_streams_.push_back(id);
  needs.push_back({index, s.stream.last_seq()});
}

std::vector<replication::HeldReplies<OutDatagram>::Need> Replicator::needs_now(
    std::span<const std::uint32_t> buckets) {
  std::vector<replication::HeldReplies<OutDatagram>::Need> needs;
  // The streams of the buckets' backups, each once (a handful at most),
  // in a scratch vector kept across calls: this runs for every held answer.
  std::vector<ToBackup*>& streams = hold_streams_;
  streams.clear();
  bool every_stream = buckets.empty();
  for (const std::uint32_t b : buckets) {
    if (b >= current_.backups.size() || current_.backups[b].empty()) {
      every_stream = true;
      break;
    }
    for (const std::uint16_t p : current_.backups[b]) {
      const auto it = to_.find(current_.peers[p].id);
      if (it == to_.end()) {
        every_stream = true;
        break;
      }
      if (std::find(streams.begin(), streams.end(), it->second.get()) == streams.end()) {
        streams.push_back(it->second.get());
      }
    }
    if (every_stream) break;
  }
  if (every_stream) {
    for (auto& [peer, s] : to_) add_need(*s, needs);
  } else {
    for (ToBackup* s : streams) add_need(*s, needs);
  }
  return needs;
}

bool Replicator::hold(OutDatagram& reply, std::span<const std::uint32_t> buckets, bool relayable) {
  LockGuard lock(mu_);
  std::vector<replication::HeldReplies<OutDatagram>::Need> needs = needs_now(buckets);
  if (needs.empty()) return false;
  held_.hold(std::move(needs), reply, relayable && options_.relay_replies);
  return true;
}

bool Replicator::attach_relays(ToBackup& s, std::vector<std::vector<std::uint8_t>>& wire) {
  if (wire.empty() || held_.size() == 0) return false;
  const std::uint64_t id = s.stream.stream();
  // Only to a backup that has answered this stream: a backup that predates
  // relays (a rolling upgrade) refuses a datagram with them, and the
  // answers would wait for the clients' retransmissions.
  if (!s.answered) return false;
  std::vector<std::uint8_t>& last = wire.back();
  bool attached = false;
  // Bound here, under mu_: the thread-safety analysis does not see a lock
  // held around a lambda.
  const std::span<const std::uint64_t> streams(held_streams_);
  held_.relay([&](const replication::HeldReplies<OutDatagram>::Need& need, OutDatagram& reply) {
    if (need.stream >= streams.size() || streams[need.stream] != id) return false;
    if (!replication::append_relay(
            last, need.seq, reply.peer,
            std::span<const std::uint8_t>(reply.bytes.data(), reply.length))) {
      return false;
    }
    relayed_.fetch_add(1, std::memory_order_relaxed);
    attached = true;
    return true;
  });
  return attached;
}

void Replicator::drop_held() {
  // A held reply waited for the backups of the layout it was decided under.
  // One that left it (killed, evicted, no longer backing the bucket up)
  // will never have its grant, and this node may have lost the bucket too:
  // answered now, the grant could be lost with this node, or a backup that
  // never had it could take over and grant the key again (the replication
  // end-to-end tests of a backup killed mid-grant and of a partitioned primary).
  std::vector<OutDatagram> dropped;
  held_.take_all(dropped);
  held_streams_.clear();
  dropped_.fetch_add(dropped.size(), std::memory_order_relaxed);
}

void Replicator::release_held(std::vector<OutDatagram>& out) {
  if (held_.size() == 0) return;
  // What each stream held_ refers to has applied. A stream the layout
  // dropped (or that started over) holds nothing back any more: its peer no
  // longer backs up what the answer granted, or will get it in a snapshot.
  std::vector<std::uint64_t> applied(held_streams_.size(),
                                     std::numeric_limits<std::uint64_t>::max());
  for (std::size_t i = 0; i < held_streams_.size(); ++i) {
    for (const auto& entry : to_) {
      if (entry.second->stream.stream() == held_streams_[i]) {
        applied[i] = entry.second->stream.applied();
      }
    }
  }
  held_.release([&applied](std::size_t index) { return applied[index]; }, out);
  if (held_.size() == 0) held_streams_.clear();
}

Replicator::ToBackup* Replicator::backup_at(std::uint64_t sender, const Peer& from) {
  for (auto& [id, s] : to_) {
    if (s->tag == sender && same_peer(s->address, from)) return s.get();
  }
  return nullptr;
}

replication::Addressing Replicator::addressing_to(const std::string& peer) const {
  const std::uint64_t tag = replication::node_tag(peer);
  const auto known = backup_incarnations_.find(tag);
  return replication::Addressing{self_tag_, tag, options_.incarnation,
                                 known == backup_incarnations_.end() ? 0 : known->second};
}

void Replicator::emit(std::span<const std::uint8_t> bytes, const Peer& to,
                      std::vector<OutDatagram>& out) {
  OutDatagram& d = out.emplace_back();
  d.peer = to;
  std::memcpy(d.bytes.data(), bytes.data(), bytes.size());
  std::size_t length = bytes.size();
  if (options_.auth_key) length = seal_datagram(d.bytes, length, *options_.auth_key);
  d.length = static_cast<std::uint16_t>(length);
}

bool Replicator::on_datagram(std::span<const std::uint8_t> bytes, const Peer& from,
                             std::int64_t now_ns, std::vector<OutDatagram>& out) {
  std::span<const std::uint8_t> body = bytes;
  if (options_.auth_key) {
    // Sealed datagrams carry the tag after the body; the magic is in clear.
    const std::uint32_t magic = magic_of(bytes);
    if (magic != replication::kReplicateMagic && magic != replication::kAckMagic) return false;
    body = open_datagram(bytes, *options_.auth_key);
    if (body.empty()) {
      // Relaxed, both: statistics.
      rejected_.fetch_add(1, std::memory_order_relaxed);
      auth_failures_.fetch_add(1, std::memory_order_relaxed);
      return true;
    }
  }
  const std::uint32_t magic = magic_of(body);
  if (magic == replication::kReplicateMagic) {
    replication::ReplicateHeader header;
    std::optional<replication::Ack> carried;
    LockGuard lock(mu_);
    if (!replication::decode_replicate(body, header, entries_, &relays_, &carried)) {
      rejected_.fetch_add(1, std::memory_order_relaxed);
      return true;
    }
    on_replicate(header, from, now_ns, out);
    // Read as if it had come alone, whatever became of the REPLICATE.
    if (carried) on_ack(*carried, from, now_ns, out);
    return true;
  }
  if (magic == replication::kAckMagic) {
    replication::Ack ack;
    if (!replication::decode_ack(body, ack)) {
      rejected_.fetch_add(1, std::memory_order_relaxed);
      return true;
    }
    LockGuard lock(mu_);
    on_ack(ack, from, now_ns, out);
    return true;
  }
  return false;
}

void Replicator::on_replicate(const replication::ReplicateHeader& header, const Peer& from,
                              std::int64_t now_ns, std::vector<OutDatagram>& out) {
  // The stream of the primary the datagram names, if it comes from the
  // address the layout gives that primary and is for this node (matched
  // by address alone, a node that replaced a departed one
  // at its address was applied to the departed one's replica).
  FromPrimary* primary = nullptr;
  if (header.addressing.receiver == self_tag_) {
    for (auto& [id, f] : from_) {
      if (f->tag == header.addressing.sender && same_peer(f->address, from)) primary = f.get();
    }
  }
  if (primary == nullptr) {
    // Not a primary of this node's in its map: not applied, not answered
    // (an answer would give it a lease).
    rejected_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  replication::Ack ack;
  if (header.addressing.receiver_incarnation == options_.incarnation) {
    const std::uint64_t followed = primary->stream.stream();
    ack = primary->stream.on_replicate(header, entries_, now_ns);
    if (primary->stream.stream() != followed) {
      std::uint64_t& largest = followed_[primary->tag];
      largest = std::max(largest, primary->stream.stream());
    }
    for (auto& [id, f] : from_) {
      if (f.get() == primary && heard_.contains(id)) heard_[id] = now_ns;
    }
  } else {
    // For another process of this node, or for none yet (the primary has not
    // heard from this one): refused untouched, however genuine its seal. A
    // process that has just started follows no stream, so it took a recorded
    // opening of an old one and counted the primary's buckets caught up on
    // holders long gone; cut off from the primary, it then took them over
    // and granted a key the primary's holder still had
    // (ReplicatorTest.ARestartedBackupRefusesAStreamRecordedForItsEarlierProcess;
    // against real nodes, ReplicationForgeryTest.
    // AReplayedStreamOpeningDoesNotCatchUpARestartedBackup).
    // The refusal names this process, so the primary addresses the stream
    // to it. No news of the primary either: a replay would keep it "heard".
    ack.stream = header.stream;
    ack.echo_sent_ns = header.sent_ns;
    ack.refused = true;
    refused_process_.fetch_add(1, std::memory_order_relaxed);  // Relaxed: statistics.
  }
  ack.addressing = replication::Addressing{self_tag_, primary->tag, options_.incarnation,
                                           header.addressing.incarnation};
  // The answers the primary would send on this acknowledgement: every
  // relay whose entries are applied, from a stream acknowledged (not
  // refused; a frozen stream's acknowledgement stays where the takeover
  // saw it, so what it covers is in the takeover's holders).
  if (!ack.refused && ack.stream == header.stream) {
    for (const replication::Relay& relay : relays_) {
      if (relay.seq > ack.applied) continue;
      OutDatagram& d = out.emplace_back();
      d.peer = relay.to;
      d.any_order = true;
      std::memcpy(d.bytes.data(), relay.bytes.data(), relay.bytes.size());
      d.length = static_cast<std::uint16_t>(relay.bytes.size());
      relays_sent_.fetch_add(1, std::memory_order_relaxed);
    }
  }
  // An ack the primary asked for later (kFlagAckLater: nothing it holds
  // waits on it) is owed for ack_later_ns; with carry_acks any other is
  // owed to the next poll(), which sends it in its REPLICATE to the
  // primary or alone. The newest of a stream's owed acks answers for all
  // of them. An ack owed is no different from one the network delayed.
  const bool later =
      header.ack_later && !ack.refused && ack.stream == header.stream && ack.lease_ms > 0;
  if (primary->owed_ack && primary->owed_ack->stream != ack.stream) {
    flush_ack(*primary, std::nullopt, out);  // another stream's
  }
  if (primary->owed_ack) {
    // Superseded: every ack of a stream says all the earlier ones do.
    acks_spared_.fetch_add(1, std::memory_order_relaxed);
  }
  if (!later && !options_.carry_acks) {
    primary->owed_ack.reset();
    replication::encode_ack(ack, scratch_);
    emit(scratch_, from, out);
    return;
  }
  const std::int64_t due = later ? now_ns + options_.timing.ack_later_ns : now_ns;
  primary->owed_due_ns = primary->owed_ack ? std::min(primary->owed_due_ns, due) : due;
  primary->owed_ack = ack;
}

void Replicator::on_ack(const replication::Ack& ack, const Peer& from, std::int64_t now_ns,
                        std::vector<OutDatagram>& out) {
  ToBackup* s =
      ack.addressing.receiver == self_tag_ ? backup_at(ack.addressing.sender, from) : nullptr;
  // And for this process: stream ids may repeat across this node's restarts
  // (they count from 1 in each map epoch), so an ack recorded from an
  // earlier run and replayed could otherwise acknowledge entries of this
  // run's stream that the backup never saw, and release the grants held on
  // them (ReplicatorTest.AnAckToAnEarlierRunOfThePrimaryIsDropped).
  if (s == nullptr || ack.addressing.receiver_incarnation != options_.incarnation) {
    rejected_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  if (ack.addressing.incarnation != s->stream.addressing().receiver_incarnation) {
    // From another process of the backup than the stream is addressed to.
    // Only its refusal of this very stream says anything: that process is
    // the backup now (it refuses what is not addressed to it). Anything else
    // is an ack of a process gone, or of a datagram addressed as before.
    if (!ack.refused || ack.stream != s->stream.stream() || ack.addressing.incarnation == 0) {
      return;
    }
    backup_incarnations_[s->tag] = ack.addressing.incarnation;
    const std::uint64_t before = s->stream.stream();
    if (s->stream.readdress(next_stream_id(current_.epoch), ack.addressing.incarnation)) {
      // Nothing of it was acknowledged, so it goes on, sent again from its
      // first entry, and a start-up costs no second snapshot. Held answers
      // wait on the same entries under the new id.
      std::replace(held_streams_.begin(), held_streams_.end(), before, s->stream.stream());
      poll_stream(*s, now_ns, out);
    } else {
      // What this stream's earlier acks counted on is gone with the old
      // process: a new stream, with snapshots, addressed to the new one.
      s->stream.backup_restarted();
    }
  } else {
    s->stream.on_ack(ack, now_ns);
    s->answered = true;
  }
  if (heard_.contains(s->peer)) heard_[s->peer] = now_ns;
  s->lease_until->store(s->stream.resync_requested() ? std::numeric_limits<std::int64_t>::min()
                                                     : s->stream.lease_until_ns(),
                        std::memory_order_release);
  release_held(out);
}

void Replicator::poll(std::int64_t now_ns, std::vector<OutDatagram>& out) {
  LockGuard lock(mu_);
  for (auto& [id, s] : to_) poll_stream(*s, now_ns, out);
  for (auto& [id, f] : from_) flush_ack(*f, now_ns, out);
  release_held(out);
}

void Replicator::poll_stream(ToBackup& s, std::int64_t now_ns, std::vector<OutDatagram>& out) {
  std::vector<std::vector<std::uint8_t>>& wire = wire_;
  wire.clear();
  s.stream.poll(now_ns, current_.epoch, wire, now_ns >= options_.settled_at_ns);
  if (options_.relay_replies && attach_relays(s, wire)) mark_ack_later(s, wire);
  if (options_.carry_acks) carry_ack(s, wire);
  for (const auto& d : wire) emit(d, s.address, out);
}

void Replicator::mark_ack_later(const ToBackup& s,
                                std::vector<std::vector<std::uint8_t>>& wire) const {
  const std::uint64_t id = s.stream.stream();
  for (std::size_t i = 0; i < held_streams_.size(); ++i) {
    if (held_streams_[i] == id && held_.waits_on(i)) return;
  }
  replication::mark_ack_later(wire.back());
}

void Replicator::carry_ack(const ToBackup& s, std::vector<std::vector<std::uint8_t>>& wire) {
  if (wire.empty()) return;
  // The same node: its id, and the address the layout gives it.
  const auto it = from_.find(s.peer);
  if (it == from_.end()) return;
  FromPrimary& primary = *it->second;
  if (!primary.owed_ack || primary.tag != s.tag || !same_peer(primary.address, s.address)) return;
  if (!replication::append_ack(wire.back(), *primary.owed_ack)) return;  // no room: alone
  primary.owed_ack.reset();
  acks_carried_.fetch_add(1, std::memory_order_relaxed);
}

void Replicator::flush_ack(FromPrimary& primary, std::optional<std::int64_t> now_ns,
                           std::vector<OutDatagram>& out) {
  if (!primary.owed_ack) return;
  if (now_ns && *now_ns < primary.owed_due_ns) return;
  replication::encode_ack(*primary.owed_ack, scratch_);
  emit(scratch_, primary.address, out);
  primary.owed_ack.reset();
}

std::chrono::nanoseconds Replicator::lease_until(std::size_t bucket) const noexcept {
  const std::shared_ptr<const Layout> layout = this->layout();
  // A bucket with no backup in the current layout has no primary lease.
  // Only a gate that replicates the bucket asks, and such a gate's map has
  // backups for every bucket it gives this node; but the layout of the next
  // map is installed before its gate, and a map without this node (evicted)
  // has no backups at all: until its gate is in, the old gate must not read
  // "forever" here and grant without a replica (a partitioned primary did,
  // and its backup had taken the keys over: two holders).
  if (bucket >= layout->leases.size() || layout->leases[bucket].empty()) {
    return std::chrono::nanoseconds(std::numeric_limits<std::int64_t>::min());
  }
  std::int64_t until = kForever;
  for (const auto& lease : layout->leases[bucket]) {
    until = std::min(until, lease->load(std::memory_order_acquire));
  }
  return std::chrono::nanoseconds(until);
}

ReplicaProgress Replicator::progress() const {
  LockGuard lock(mu_);
  // A stream still promised is one from a primary of the current layout, and
  // lists exactly the buckets backed up for it (set_layout()).
  ReplicaProgress p;
  for (const auto& [id, from] : from_) {
    if (!from->stream.promising()) continue;
    p.backed += from->buckets.size();
    for (const std::uint32_t b : from->buckets) {
      p.caught_up += from->stream.caught_up(b) ? 1 : 0;
      p.owner_active += from->stream.owner_active(b) ? 1 : 0;
    }
  }
  return p;
}

const Replicator::FromPrimary* Replicator::stream_with(const std::string& primary,
                                                       std::uint32_t bucket) const {
  const auto lists = [&](const FromPrimary& from) {
    return std::binary_search(from.buckets.begin(), from.buckets.end(), bucket);
  };
  if (const auto it = from_.find(primary); it != from_.end() && lists(*it->second)) {
    return it->second.get();
  }
  // A retiring stream goes at the next layout that leaves this node none of
  // its buckets (set_layout()); a bucket taken over stays listed till then
  // (erasing each would cost a takeover of a node's buckets O(buckets^2)).
  for (const auto& [id, from] : retiring_) {
    if (id == primary && lists(*from)) return from.get();
  }
  return nullptr;
}

bool Replicator::primary_settled(const std::string& primary, std::uint32_t bucket) const {
  LockGuard lock(mu_);
  const FromPrimary* from = stream_with(primary, bucket);
  // Or the primary had this bucket active: a node within its lock-delay
  // activates a bucket only by taking it over complete (BucketActivation's
  // unseen history), so every lease of its earlier runs there is in its
  // state, and in this stream (without it, a rolling restart's next
  // step waited a lock-delay for the buckets the node restarted before had
  // taken back).
  return from != nullptr && (from->stream.primary_settled() || from->stream.owner_active(bucket));
}

bool Replicator::takeover(const std::string& primary, std::uint32_t bucket, std::int64_t now_ns,
                          std::vector<std::pair<std::string, replication::ReplicaHolder>>& out,
                          bool* owner_active) {
  LockGuard lock(mu_);
  const FromPrimary* from = stream_with(primary, bucket);
  if (from == nullptr) return false;
  const replication::BackupStream& s = from->stream;
  if (!s.promise_expired(now_ns) || !s.caught_up(bucket)) return false;
  out = s.bucket_holders(bucket);
  from->taken.insert(bucket);
  taken_over_from_.insert(primary);
  if (owner_active != nullptr) *owner_active = s.owner_active(bucket);
  return true;
}

std::vector<std::string> Replicator::silent_peers(std::int64_t now_ns,
                                                  std::int64_t silence_ns) const {
  LockGuard lock(mu_);
  const std::int64_t until = loops_ran_ns_ ? std::min(now_ns, *loops_ran_ns_) : now_ns;
  std::vector<std::string> silent;
  for (const auto& [id, at] : heard_) {
    if (at && until - *at >= silence_ns) silent.push_back(id);
  }
  std::sort(silent.begin(), silent.end());
  return silent;
}

void Replicator::loop_ran(std::int64_t now_ns) {
  LockGuard lock(mu_);
  loops_ran_ns_ = std::max(loops_ran_ns_.value_or(now_ns), now_ns);
}

std::size_t Replicator::held() const {
  LockGuard lock(mu_);
  return held_.size();
}

std::size_t Replicator::primary_streams() const {
  LockGuard lock(mu_);
  return from_.size() + retiring_.size();
}

}  // namespace shardlock::lease::internal
