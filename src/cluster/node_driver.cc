// One cluster node's driver decisions. See node_driver.h.
#include "node_driver.h"

#include <algorithm>
#include <utility>

#include "shardlock/lock_guard.h"

namespace shardlock::cluster {

using std::chrono::milliseconds;
using std::chrono::nanoseconds;

namespace {

// How often the driver counts the leases left in buckets given away while a
// hand-off is pending: the count walks every key under the shard locks.
constexpr milliseconds kHandOffCountInterval{100};

}  // namespace

NodeDriver::NodeDriver(NodeDriverOptions options, NodeHost& host)
    : options_(std::move(options)), host_(host) {
  lock_delay_ = options_.max_ttl + lock_delay_margin();
  activation_ = new_activation();
  LockGuard lock(mutex_);
  stats_.min_grant_epoch = options_.min_grant_epoch;
  stats_.lock_delay = lock_delay_;
}

void NodeDriver::close() { host_.publish_gate(lease::internal::ClusterGate::closed()); }

std::shared_ptr<const lease::internal::ClusterGate> NodeDriver::published_gate() const {
  LockGuard lock(mutex_);
  return published_gate_;
}

NodeDriverStats NodeDriver::stats() const {
  LockGuard lock(mutex_);
  return stats_;
}

void NodeDriver::step(const std::vector<ClusterView>& views, nanoseconds now,
                      std::uint64_t registration) {
  if (registration != registration_) {
    if (registration_ != 0) start_over();
    registration_ = registration;
    learning_since_ = now;
  }
  // A gate changes with news from etcd, or with time while some bucket of
  // this node waits for its lock-delay; otherwise there is nothing to redo
  // (the 65536 bucket states cost about a millisecond to recompute).
  const bool news = !views.empty();
  apply_views(views, now);
  if (news || activation_pending_) publish(now);
  if (options_.replicas > 1) {
    evict_silent_replicas();
    finish_learning(now);
  }
  // Both below take every shard lock in turn: at the count's pace, not
  // every tick.
  if (now - last_count_ < kHandOffCountInterval) return;
  last_count_ = now;
  hand_off(now);
  if (map_ && host_.needs_new_epoch() && new_epoch_asked_for_ != map_->epoch) {
    new_epoch_asked_for_ = map_->epoch;
    note("a shard's token counter ran out in epoch " + std::to_string(map_->epoch) +
         "; asking for a new epoch");
    host_.request_new_epoch();
  }
}

void NodeDriver::start_over() {
  note(
      "registered again under a new etcd lease: granting nothing until this node's buckets "
      "are active again, as after a start");
  host_.publish_gate(lease::internal::ClusterGate::closed());
  gate_.reset();
  activation_pending_ = false;
  map_.reset();
  routing_.reset();
  seen_members_.clear();
  activation_ = new_activation();
  skip_views_through_ = self_create_revision_;
  LockGuard lock(mutex_);
  stats_.acked_epoch = 0;  // handoff/<id> went with the old lease
  ++stats_.restarts;
}

void NodeDriver::apply_views(const std::vector<ClusterView>& views, nanoseconds now) {
  for (const ClusterView& view : views) {
    for (const ClusterView::Member& member : view.members) {
      if (member.id == options_.node_id) self_create_revision_ = member.create_revision;
    }
    // After start_over(): only what was read after the new registration.
    if (skip_views_through_ != 0) {
      if (self_create_revision_ <= skip_views_through_) continue;
      skip_views_through_ = 0;
    }
    // Member keys: gone, new, or registered again (a new create revision is
    // a new incarnation even if no view saw the key missing).
    std::unordered_map<std::string, SeenMember> present;
    for (const ClusterView::Member& member : view.members) {
      // An unreadable record (a newer version's) is a live node all the same.
      present[member.id] = SeenMember{member.create_revision, member.lease};
      if (member.readable && member.record.max_ttl_ms != 0) {
        activation_->raise_max_ttl(milliseconds(member.record.max_ttl_ms));
      }
      note_replicas_mismatch(member);
      const auto seen = seen_members_.find(member.id);
      if (seen == seen_members_.end()) {
        activation_->on_member_registered(member.id, now);
      } else if (seen->second.create_revision != member.create_revision) {
        activation_->on_member_gone(member.id, now);
        activation_->on_member_registered(member.id, now);
      }
    }
    for (const auto& [id, seen] : seen_members_) {
      if (!present.contains(id)) activation_->on_member_gone(id, now);
    }
    seen_members_ = std::move(present);
    for (const ClusterView::Handoff& handoff : view.handoffs) {
      activation_->on_handoff(handoff.id, handoff.epoch);
    }
    if (!view.map || view.map->epoch <= activation_->epoch()) continue;
    // A map member without a member key (its etcd lease ended before this
    // node ever saw it) is gone from now on, so that its lock-delay starts.
    for (const ClusterMember& member : view.map->members) {
      if (!seen_members_.contains(member.id)) activation_->on_member_gone(member.id, now);
    }
    // The maps published between two reads, as the watch delivered them,
    // then the newest: every epoch in order keeps each moved bucket's chain
    // of possible holders, where a skipped one would cost a lock-delay.
    for (const std::shared_ptr<const ClusterMap>& map : view.adopted) {
      if (map->epoch < view.map->epoch) adopt_map(map, now);
    }
    adopt_map(view.map, now);
  }
  LockGuard lock(mutex_);
  stats_.lock_delay = activation_->lock_delay();
}

void NodeDriver::adopt_map(const std::shared_ptr<const ClusterMap>& map, nanoseconds now) {
  if (map->epoch <= activation_->epoch()) return;
  const std::uint64_t previous_epoch = activation_->epoch();
  const std::uint64_t restarts = activation_->history_restarts();
  const MapVerdict verdict = activation_->on_map(*map, now);
  if (verdict != MapVerdict::kAdopted) {
    note("cluster map epoch " + std::to_string(map->epoch) +
         " not used for grants (its buckets do not route)");
    return;
  }
  if (previous_epoch != 0 && activation_->history_restarts() != restarts) {
    note("cluster map epoch " + std::to_string(map->epoch) + " follows epoch " +
         std::to_string(previous_epoch) +
         ": maps in between were missed, so buckets that moved here wait for every known "
         "node's hand-off or the lock-delay, as after a start");
    LockGuard lock(mutex_);
    ++stats_.maps_missed;
  }
  std::unique_ptr<ClusterRouting> routing;
  if (ClusterRouting::build(*map, options_.router_options, routing) != RouterStatus::kOk) {
    return;  // on_map accepted it, so this cannot happen
  }
  map_ = map;
  routing_ = std::shared_ptr<const ClusterRouting>(std::move(routing));
  if (options_.replicas > 1) {
    adopt_replica_layout(activation_->history_restarts() != restarts, now);
  }
}

void NodeDriver::adopt_replica_layout(bool history_restarted, nanoseconds now) {
  std::unique_ptr<ReplicaRouting> replicas;
  if (ReplicaRouting::build(*map_, options_.router_options, replicas) != RouterStatus::kOk) {
    return;  // the map routed, so its members and learners do too
  }
  std::vector<std::string> addresses;
  auto self = static_cast<std::uint16_t>(replicas->nodes().size());  // absent: no role
  for (std::size_t i = 0; i < replicas->nodes().size(); ++i) {
    addresses.push_back(replicas->nodes()[i].address);
    if (replicas->nodes()[i].id == options_.node_id) self = static_cast<std::uint16_t>(i);
  }
  std::string detail;
  if (const std::error_code ec =
          host_.set_replica_layout(map_->epoch, replicas->snapshot(), replicas->learners(), self,
                                   options_.replicas, addresses, detail)) {
    note("epoch " + std::to_string(map_->epoch) + ": no replica layout: " + detail);
  }
  // A skipped map leaves no history to take over by: those buckets wait as
  // after a start.
  std::unordered_map<std::size_t, std::string> carried;
  carried.swap(pending_takeovers_);
  if (history_restarted) return;
  for (std::size_t b = 0; b < routing_->bucket_count(); ++b) {
    if (!activation_->owns(b) || activation_->may_grant(b, now)) continue;
    if (auto primary = activation_->previous_primary_backed_by_self(b, options_.replicas)) {
      pending_takeovers_.emplace(b, std::move(*primary));
    } else if (const auto it = carried.find(b); it != carried.end()) {
      // Owned here in the map before too, and not taken over yet: a map
      // that keeps the bucket here (a learner listed, a weight changed)
      // keeps its takeover (before, a restarted node's learner
      // map dropped the takeovers of its buckets at their new primaries,
      // which then waited for the lock-delay). Every map since the one
      // that moved it here gave it to this node, so its chain is still
      // that primary's.
      pending_takeovers_.emplace(b, std::move(it->second));
    }
  }
}

bool NodeDriver::take_over_pending(nanoseconds now) {
  if (pending_takeovers_.empty()) return false;
  // Every inherited lease may have been renewed just before the primary
  // stopped: it lasts the largest max TTL any member has, plus the drift
  // margin, from now.
  const auto hold =
      std::chrono::duration_cast<milliseconds>(activation_->lock_delay() - options_.lease_ttl);
  std::size_t buckets = 0;
  std::size_t holders = 0;
  for (auto it = pending_takeovers_.begin(); it != pending_takeovers_.end();) {
    // A primary that restarted less than a lock-delay ago may have leases
    // from its earlier run that its stream never carried: its buckets wait
    // for the lock-delay as without replication. Settled: its stream says
    // its process is past its lock-delay, or this node saw it register that
    // long ago (a node that just started sees every registration as new).
    const auto bucket = static_cast<std::uint32_t>(it->first);
    if (!host_.replica_primary_settled(it->second, bucket) &&
        !activation_->incarnation_settled(it->second, now)) {
      ++it;
      continue;
    }
    bool owner_active = false;
    const auto installed = host_.take_over(it->second, bucket, hold, &owner_active);
    if (!installed) {
      ++it;
      continue;
    }
    activation_->on_taken_over(it->first, it->second, owner_active);
    ++buckets;
    holders += *installed;
    it = pending_takeovers_.erase(it);
  }
  if (buckets == 0) return false;
  note("epoch " + std::to_string(map_->epoch) + ": took over " + std::to_string(buckets) +
       " buckets with " + std::to_string(holders) + " leases");
  LockGuard lock(mutex_);
  stats_.buckets_taken_over += buckets;
  stats_.holders_inherited += holders;
  return true;
}

void NodeDriver::note_replicas_mismatch(const ClusterView::Member& member) {
  // Membership::start() refuses such a node; two that register at once can
  // still meet here. Safe all the same (a takeover needs a caught-up stream
  // from the primary), but buckets shared with it wait for lock-delays and
  // its grants may wait for acknowledgements that never come: said loudly,
  // once per incarnation.
  if (member.id == options_.node_id || !member.readable) return;
  const std::size_t theirs = std::max<std::size_t>(member.record.replicas, 1);
  if (theirs == options_.replicas) return;
  if (!replicas_mismatch_noted_.insert({member.id, member.create_revision}).second) return;
  note("node " + member.id + " runs with --replicas " + std::to_string(theirs) +
       " and this node with --replicas " + std::to_string(options_.replicas) +
       ": every node of a cluster needs the same count; restart one of them");
  LockGuard lock(mutex_);
  ++stats_.replicas_mismatched;
}

void NodeDriver::finish_learning(nanoseconds now) {
  if (!map_ || !host_.learning()) return;
  const auto is_self = [&](const ClusterMember& m) { return m.id == options_.node_id; };
  const bool member = std::any_of(map_->members.begin(), map_->members.end(), is_self);
  const bool learner = std::any_of(map_->learners.begin(), map_->learners.end(), is_self);
  if (!member && !learner) return;  // the map does not list this registration yet
  // Caught up on primaries that grant the buckets: a promotion before that
  // takes a bucket over from a primary that had not activated it yet (it
  // was still taking it over itself, say from this node's earlier run), and
  // such a takeover waits for this node's lock-delay (before, a
  // rolling restart refused a third of the keys for a minute and lost the
  // leases on them).
  const lease::ReplicaProgress progress = host_.replica_progress();
  const std::size_t backed = progress.backed;
  const std::size_t caught_up = progress.owner_active;
  std::string why;
  if (member) {
    why = "the map made it a member (no member was left to learn from)";
  } else if (caught_up == backed) {
    why = "caught up on all " + std::to_string(backed) +
          " buckets it backs up, each active at its primary";
  } else if (now - learning_since_ >= activation_->lock_delay()) {
    // A primary that never streams (a peer of another --replicas, one that is
    // itself stuck) must not keep this node out for good. Safe all the same:
    // a bucket this node was not a caught-up backup of waits for its chain's
    // hand-offs or the lock-delay when it moves here.
    why = "still behind on " + std::to_string(backed - caught_up) + " of " +
          std::to_string(backed) + " buckets after a lock-delay; joining all the same";
  } else {
    return;
  }
  const HostResult put = host_.caught_up();
  note("learner: " + why + (put.ok() ? std::string(": now active") : ": " + put.detail));
  LockGuard lock(mutex_);
  ++stats_.learner_promotions;
}

void NodeDriver::evict_silent_replicas() {
  for (const std::string& id : host_.silent_replicas(options_.evict_after)) {
    const auto seen = seen_members_.find(id);
    if (seen == seen_members_.end() || seen->second.lease == 0) continue;
    if (!evicted_leases_.insert(seen->second.lease).second) continue;  // asked already
    const HostResult evicted = host_.evict(id, seen->second.lease);
    note("replica " + id + " silent for " + std::to_string(options_.evict_after.count()) +
         " ms: evicting it (deleting its member key, revoking its etcd lease): " +
         (evicted.ok() ? std::string("done") : evicted.detail));
    if (!evicted.ok()) {
      // Refused by etcd's comparison (this node was evicted first, or the
      // peer registered again): that suspicion is over. Otherwise the next
      // pass tries again.
      if (evicted.status != HostResult::Status::kRefused) evicted_leases_.erase(seen->second.lease);
      continue;
    }
    LockGuard lock(mutex_);
    ++stats_.replicas_evicted;
  }
}

void NodeDriver::publish(nanoseconds now) {
  if (!routing_) return;  // no map yet: the server's gate stays closed
  // Takeovers only under a gate of the current map, which marks their
  // buckets replicated: the inherited holders then reach this node's own
  // backups, after the snapshots the layout sent them.
  if (gate_ && gate_->epoch == map_->epoch) (void)take_over_pending(now);
  const std::size_t n = routing_->bucket_count();
  std::vector<std::uint8_t> buckets(n, lease::internal::ClusterGate::kForeign);
  std::size_t owned = 0;
  std::size_t active = 0;
  for (std::size_t b = 0; b < n; ++b) {
    if (!activation_->owns(b)) continue;
    ++owned;
    if (activation_->may_grant(b, now)) {
      buckets[b] = lease::internal::ClusterGate::kActive;
      ++active;
    } else {
      buckets[b] = lease::internal::ClusterGate::kOwned;
    }
  }
  activation_pending_ = active < owned;
  // With replicas, every bucket owned here has backups once the map has
  // another node, member or learner: granted and renewed only within the
  // primary lease (has_backups()).
  std::vector<std::uint8_t> replicated;
#if defined(SHARDLOCK_FAULT_LONE_MEMBER_UNGATED)
  // UNSAFE, planted for the simulation's self-test (docs/simulation.md):
  // a lone member with learners granting without a primary lease, its buckets never replicated.
  const bool backed = options_.replicas > 1 && map_->members.size() > 1;
#else
  const bool backed = has_backups(*map_, options_.replicas);
#endif
  if (backed) {
    replicated.assign(n, 0);
    for (std::size_t b = 0; b < n; ++b) {
      replicated[b] = buckets[b] != lease::internal::ClusterGate::kForeign ? 1 : 0;
    }
  }
  if (gate_ && gate_->epoch == map_->epoch && gate_->buckets == buckets &&
      gate_->replicated == replicated) {
    return;
  }
  auto gate = std::make_shared<lease::internal::ClusterGate>();
  gate->epoch = map_->epoch;
  {
    LockGuard lock(mutex_);
    gate->min_grant_epoch = stats_.min_grant_epoch;
  }
  // Aliasing: the snapshot lives as long as the routing that owns it.
  gate->routing = std::shared_ptr<const RouterSnapshot>(routing_, &routing_->snapshot());
  gate->buckets = std::move(buckets);
  gate->replicated = std::move(replicated);
  gate->replica_deadline = [host = &host_](std::size_t bucket) {
    return host->replica_lease_until(bucket);
  };
  // Bound to the registration this gate's activation belongs to: after a
  // re-registration the new lease's deadline must not revive this gate (the
  // cluster may have given its buckets away while the node had no lease).
  gate->lease_deadline = [host = &host_, registration = registration_] {
    return host->lease_deadline_of(registration);
  };
  for (const ClusterMember& member : map_->members) {
    gate->members.push_back({member.id, member.address, member.weight});
  }
  gate->retry_after_ms = static_cast<std::uint32_t>(options_.retry_after.count());
  const bool new_epoch = !gate_ || gate_->epoch != gate->epoch;
  host_.publish_gate(gate);
  gate_ = std::move(gate);
  if (new_epoch) {
    note("epoch " + std::to_string(gate_->epoch) + ": " + std::to_string(owned) + " of " +
         std::to_string(n) + " buckets here, " + std::to_string(active) + " active");
  }
  {
    LockGuard lock(mutex_);
    published_gate_ = gate_;
    stats_.epoch = gate_->epoch;
    stats_.members = map_->members.size();
    stats_.buckets_owned = owned;
    stats_.buckets_active = active;
    ++stats_.gates_published;
  }
  // A new epoch's takeovers need its gate (above), not the next tick: they
  // are the failover's critical path. Their buckets then go active in a
  // second gate at once (the recursion stops there: no new epoch).
  if (new_epoch && take_over_pending(now)) publish(now);
}

void NodeDriver::hand_off(nanoseconds now) {
  if (!map_ || !gate_ || gate_->epoch != map_->epoch) return;  // the refusing gate goes first
  std::uint64_t acked = 0;
  {
    LockGuard lock(mutex_);
    acked = stats_.acked_epoch;
  }
  if (acked == map_->epoch || now < options_.server_recovered_at) return;
  // Runs on this thread under each shard lock in turn; activation_ and
  // routing_ are this thread's.
  const std::size_t leases = host_.count_leases(
      [this](std::string_view key) { return !activation_->owns(routing_->bucket_of(key)); });
  {
    LockGuard lock(mutex_);
    stats_.leases_to_hand_off = leases;
  }
  if (!activation_->ready_to_ack(map_->epoch, leases)) return;
  const HostResult put = host_.put_handoff(map_->epoch);
  if (!put.ok()) return;  // not registered right now, or etcd down: the next count tries again
  LockGuard lock(mutex_);
  stats_.acked_epoch = map_->epoch;
  ++stats_.acks_written;
}

}  // namespace shardlock::cluster
