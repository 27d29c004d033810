// The replicator's layout: which streams a map keeps, starts and retires
// (server/replicator.h, "Layout").
#include <algorithm>
#include <iterator>
#include <set>

#include "server/replicator.h"
#include "shardlock/lock_guard.h"

namespace shardlock::lease::internal {

ReplicaLayout replica_layout(std::uint64_t epoch, const RouterSnapshot& routing,
                             const std::vector<bool>& learners, std::uint16_t self,
                             std::size_t replicas, const std::vector<Peer>& addresses) {
  ReplicaLayout layout;
  layout.epoch = epoch;
  if (self < routing.size()) layout.self_id = routing.nodes()[self].id;
  // Peer index of each node index (self has none).
  std::vector<std::uint16_t> peer_of(routing.size(), ReplicaLayout::kNone);
  for (std::size_t i = 0; i < routing.size() && i < addresses.size(); ++i) {
    if (i == self) continue;
    peer_of[i] = static_cast<std::uint16_t>(layout.peers.size());
    layout.peers.push_back(ReplicaPeer{routing.nodes()[i].id, addresses[i]});
  }
  const std::size_t buckets = routing.bucket_count();
  layout.backups.resize(buckets);
  layout.backing.assign(buckets, ReplicaLayout::kNone);
  if (replicas < 2) return layout;
  layout.owned.assign(buckets, false);
  for (std::size_t b = 0; b < buckets; ++b) {
    const std::vector<std::uint16_t> set = routing.replica_set(b, replicas, learners);
    if (set.empty()) continue;
    if (set[0] == self) {
      layout.owned[b] = true;
      for (std::size_t r = 1; r < set.size(); ++r) {
        if (peer_of[set[r]] != ReplicaLayout::kNone) layout.backups[b].push_back(peer_of[set[r]]);
      }
    } else if (std::find(set.begin() + 1, set.end(), self) != set.end()) {
      layout.backing[b] = peer_of[set[0]];
    }
  }
  return layout;
}

std::vector<std::pair<std::uint16_t, std::uint32_t>> Replicator::set_layout(ReplicaLayout layout,
                                                                            std::int64_t now_ns) {
  auto leases = std::make_shared<Layout>();
  LockGuard lock(mu_);
  drop_held();
  self_tag_ = replication::node_tag(layout.self_id);
  std::vector<std::pair<std::uint16_t, std::uint32_t>> to_snapshot =
      layout_backups(layout, *leases);
  // A skipped map (this layout's epoch is past the last one's plus one): a
  // primary may have granted in the missed maps with other backups, so what
  // this node applied of its stream is no replica of it any more
  // (simulation seed 4486: a node cut off from etcd missed the map that
  // dropped it, came back a learner in the next one, counted its stale
  // replicas caught up, was promoted and took a bucket over without the
  // holder its primary had granted meanwhile). Every stream from a primary
  // starts over: fresh, caught up only by new snapshots (its first ack
  // makes the primary restart the stream), promised from now; and no peer
  // counts as heard from (its silence while this node was off its layout
  // is no fault of its own: the same node evicted both its primaries).
  if (current_.epoch != 0 && layout.epoch > current_.epoch + 1) {
    from_.clear();
    retiring_.clear();
    heard_.clear();
  }
  // Primaries this node backs up. Per primary, the buckets it backs up now;
  // the rest are forgotten.
  std::unordered_map<std::string, std::vector<std::uint32_t>> backed;
  for (std::size_t b = 0; b < layout.backing.size(); ++b) {
    if (layout.backing[b] == ReplicaLayout::kNone) continue;
    backed[layout.peers[layout.backing[b]].id].push_back(static_cast<std::uint32_t>(b));
  }
  layout_primaries(layout, now_ns, backed);
  // Peers new to the layout are not heard from yet; the rest keep their time.
  std::unordered_map<std::string, std::optional<std::int64_t>> heard;
  for (const auto& entry : to_) heard[entry.first] = std::nullopt;
  for (const auto& entry : backed) heard[entry.first] = std::nullopt;
  for (auto& [id, at] : heard) {
    const auto old = heard_.find(id);
    if (old != heard_.end()) at = old->second;
  }
  heard_ = std::move(heard);
  current_ = std::move(layout);
  {
    LockGuard guard(layout_mu_);
    layout_ = std::move(leases);
  }
  return to_snapshot;
}

std::vector<std::pair<std::uint16_t, std::uint32_t>> Replicator::layout_backups(
    const ReplicaLayout& layout, Layout& leases) {
  std::vector<std::pair<std::uint16_t, std::uint32_t>> to_snapshot;
  // Streams to backups: kept for peers that still back something up here
  // (unless the backup asked to start over), started for new ones, dropped
  // for the rest.
  std::vector<bool> is_backup(layout.peers.size(), false);
  for (const auto& list : layout.backups) {
    for (const std::uint16_t p : list) is_backup[p] = true;
  }
  std::unordered_map<std::string, std::unique_ptr<ToBackup>> to;
  for (std::size_t p = 0; p < layout.peers.size(); ++p) {
    if (!is_backup[p]) continue;
    const ReplicaPeer& peer = layout.peers[p];
    auto it = to_.find(peer.id);
    if (it != to_.end() && !it->second->stream.resync_requested()) {
      it->second->address = peer.address;
      to.emplace(peer.id, std::move(it->second));
    } else {
      to.emplace(peer.id,
                 std::make_unique<ToBackup>(peer.id, peer.address, next_stream_id(layout.epoch),
                                            options_.timing, addressing_to(peer.id)));
    }
  }
  to_ = std::move(to);
  to_by_peer_.assign(layout.peers.size(), nullptr);
  for (std::size_t p = 0; p < layout.peers.size(); ++p) {
    if (const auto it = to_.find(layout.peers[p].id); it != to_.end()) {
      to_by_peer_[p] = it->second.get();
    }
  }
  leases.leases.resize(layout.backups.size());
  for (std::size_t b = 0; b < layout.backups.size(); ++b) {
    for (const std::uint16_t p : layout.backups[b]) {
      ToBackup& s = *to_.at(layout.peers[p].id);
      leases.leases[b].push_back(s.lease_until);
      const auto bucket = static_cast<std::uint32_t>(b);
      if (s.covered.insert(bucket).second) to_snapshot.emplace_back(p, bucket);
    }
  }
  for (auto& entry : to_) {
    // Buckets a kept stream no longer carries: a later return starts with
    // a snapshot again.
    const std::string& id = entry.first;
    std::set<std::uint32_t>& covered = entry.second->covered;
    for (auto it = covered.begin(); it != covered.end();) {
      const std::uint32_t b = *it;
      const bool still = b < layout.backups.size() &&
                         std::any_of(layout.backups[b].begin(), layout.backups[b].end(),
                                     [&](std::uint16_t p) { return layout.peers[p].id == id; });
      it = still ? std::next(it) : covered.erase(it);
    }
  }

  return to_snapshot;
}

void Replicator::layout_primaries(
    const ReplicaLayout& layout, std::int64_t now_ns,
    std::unordered_map<std::string, std::vector<std::uint32_t>>& backed) {
  // Buckets this node owns now (it is their primary).
  auto primary_here = [&](std::uint32_t b) {
    return b < layout.backups.size() && !layout.backups[b].empty();
  };
  // A stream from a primary that is still one, some of whose buckets this
  // node owns now: it stops promising that stream for good, since a lease
  // covers a stream, not a bucket; the stream is kept for the takeover of
  // those buckets, and the primary's other buckets follow a new stream
  // (after_stream), which it starts with snapshots.
  std::unordered_map<std::string, std::uint64_t> after_stream;
  for (auto it = from_.begin(); it != from_.end();) {
    FromPrimary& from = *it->second;
    const auto now_backed = backed.find(it->first);
    if (now_backed == backed.end()) {
      // Its promise still runs out on time; no new one. Kept only for the
      // buckets this node now owns (with backups or without) and has not
      // taken over yet: a departed
      // primary's stream goes once its takeovers are done (before,
      // one stale replica stayed per departed id).
      from.stream.stop_promising();
#if defined(SHARDLOCK_FAULT_ACK_AFTER_TAKEOVER)  // UNSAFE: docs/simulation.md
      // Hole 1 as it was: the departed stream stays, and takes late datagrams.
      ++it;
      continue;
#endif
      std::vector<std::uint32_t> kept;
      for (const std::uint32_t b : from.buckets) {
        const bool owned = b >= layout.owned.size() || layout.owned[b];
        if (owned && !from.taken.contains(b)) {
          kept.push_back(b);
        } else {
          from.stream.forget(b);
        }
      }
      from.buckets = std::move(kept);
      it = from.buckets.empty() ? from_.erase(it) : std::next(it);
      continue;
    }
    std::vector<std::uint32_t> taking;
    // Both lists ascend (built by walking the buckets in order).
    for (const std::uint32_t b : from.buckets) {
      if (std::binary_search(now_backed->second.begin(), now_backed->second.end(), b)) continue;
      if (primary_here(b) && from.stream.promising()) {
        taking.push_back(b);
      } else {
        from.stream.forget(b);
      }
    }
    if (taking.empty()) {
      ++it;
      continue;
    }
    from.stream.stop_promising();
    from.buckets = std::move(taking);
    from.stream.carry(from.buckets, layout.epoch);
    after_stream[it->first] = from.stream.stream();
    retiring_.emplace_back(it->first, std::move(it->second));
    it = from_.erase(it);
  }
  // A retiring stream is kept only for buckets this node still owns.
  for (auto& [id, from] : retiring_) {
    std::erase_if(from->buckets, [&](std::uint32_t b) { return !primary_here(b); });
    from->stream.carry(from->buckets, layout.epoch);
  }
  std::erase_if(retiring_, [](const auto& r) { return r.second->buckets.empty(); });
  for (auto& entry : backed) {
    const std::string& id = entry.first;
    std::vector<std::uint32_t>& buckets = entry.second;
    auto it = from_.find(id);
    const ReplicaPeer& peer = *std::find_if(layout.peers.begin(), layout.peers.end(),
                                            [&](const ReplicaPeer& p) { return p.id == id; });
    if (it == from_.end() || !it->second->stream.promising()) {
      // A fresh stream counts as having promised a lease from now: this
      // node's previous run, or this run before it stopped promising, may
      // have promised one.
      // No lease to the primary before it is on this map if this node took
      // a bucket over from it: on an older map it may still count that
      // bucket as its own (after a retirement, or after a map that moved
      // the primary away and one that gave it back: simulation seed 9345,
      // where a drained and undrained primary still on the map before its
      // drain was lent leases for a bucket its backup had taken over and
      // granted meanwhile). Any other primary gets leases on any map, as a
      // lagging one must to keep granting (refused by every fresh stream, a
      // learner's or a new backup's, a primary behind a slow etcd link
      // could grant nothing until it caught up with the maps).
      //
      // Nor does a fresh stream follow a stream this run already followed
      // from the primary, or an older one. It took the first it heard of:
      // a recorded opening of an old stream (a snapshot with its caught-up
      // marks, sealed by the primary itself) replayed to a backup cut off
      // from its primary counted the bucket caught up on holders long gone,
      // and the backup took the bucket over and granted a key the primary's
      // holder still had (ReplicationForgeryTest.
      // AReplayedStreamOpeningDoesNotCatchUpAFreshStream). The primary's
      // own datagrams of such a stream are refused (kFlagStreamRefused), so
      // it starts a new one with snapshots, as the gap they met made it do
      // before. A restarted process remembers no stream; every REPLICATE
      // names the backup process it is for, so a recorded one reaches no
      // later process (Replicator::on_replicate()).
      const auto after = after_stream.find(id);
      const bool retired = after != after_stream.end();
      const bool taken_from = retired || taken_over_from_.contains(id);
      const std::uint64_t tag = replication::node_tag(id);
      const auto followed = followed_.find(tag);
      const std::uint64_t refused_up_to =
          std::max(retired ? after->second : 0, followed != followed_.end() ? followed->second : 0);
      from_[id] = std::make_unique<FromPrimary>(
          tag, peer.address, options_.timing, std::max(now_ns, created_ns_), std::move(buckets),
          layout.epoch, refused_up_to, taken_from ? layout.epoch : 0);
    } else {
      it->second->address = peer.address;
      it->second->buckets = std::move(buckets);
      it->second->stream.carry(it->second->buckets, layout.epoch);
    }
  }
}

std::vector<std::pair<std::uint16_t, std::uint32_t>> Replicator::restart_streams() {
  std::vector<std::pair<std::uint16_t, std::uint32_t>> to_snapshot;
  LockGuard lock(mu_);
  drop_held();
  for (std::size_t p = 0; p < current_.peers.size(); ++p) {
    const auto it = to_.find(current_.peers[p].id);
    if (it == to_.end() || !(start_over_ || it->second->stream.resync_requested())) continue;
    ToBackup& s = *it->second;
    s.stream = replication::PrimaryStream(next_stream_id(current_.epoch), options_.timing,
                                          addressing_to(s.peer));
    s.answered = false;
    s.lease_until->store(std::numeric_limits<std::int64_t>::min(), std::memory_order_release);
    s.covered.clear();
    for (std::size_t b = 0; b < current_.backups.size(); ++b) {
      const auto& list = current_.backups[b];
      if (std::find(list.begin(), list.end(), p) == list.end()) continue;
      s.covered.insert(static_cast<std::uint32_t>(b));
      to_snapshot.emplace_back(static_cast<std::uint16_t>(p), static_cast<std::uint32_t>(b));
    }
  }
  start_over_ = false;
  return to_snapshot;
}

}  // namespace shardlock::lease::internal
