// membership.h: one node's membership in a shardlock cluster, and the bucket
// map with its epoch that every node agrees on (docs/cluster.md). The values
// themselves (MemberRecord, ClusterMap, ClusterRouting) and their encodings
// are gRPC-free and live in the core library: shardlock/cluster/cluster_map.h;
// what a read of the prefix shows (ClusterView) is in ../cluster_view.h.
//
//   MembershipOptions options;
//   options.endpoints = "127.0.0.1:2379";
//   options.prefix = "/shardlock/prod/";
//   options.node_id = "n1";
//   options.advertise = "10.0.0.7:7700";
//   options.data_dir = "/var/lib/shardlock";
//   options.on_map_change = [](const ClusterMap& map) { ... };
//   options.on_view = [](const ClusterView& view) { ... };  // hand-offs, gone members
//   std::unique_ptr<Membership> member;
//   if (auto ec = Membership::start(options, member, detail)) ...;
//   member->lease_alive();          // the grant path's check (b)
//   member->current_map();          // the newest map, epoch included
//
// Layout in etcd, under the prefix:
//   members/<id>  "address=HOST:PORT weight=W state=active|draining|joining
//                 max_ttl_ms=T replicas=R", under the node's own etcd lease (TTL 5 s,
//                 kept alive every TTL/3)
//   map           the published membership and its epoch: a version line
//                 "shardlock-map v2 epoch=E", then one "<id> <address>
//                 <weight> lease=L" line per member in id order, then one
//                 "+<id> ..." line per learner
//
// Members and learners: an active member key is a member. A joining one
// (a node with replication that has not caught up) is a learner, unless the
// published map already has it as a member under the same etcd lease (it
// was promoted, or the cluster had no member to learn from: then every
// joining node is a member at once).
//   handoff/<id>  the newest epoch node <id> has handed off (decimal), under
//                 that node's etcd lease (put_handoff())
//   drain/<id>    an operator's drain request for node <id>, any value,
//                 permanent until deleted (request_drain(), cancel_drain())
//
// How the map is agreed: every node watches the prefix. When the live,
// active member keys differ from the published map, a node publishes the new
// membership with a compare-and-swap on the map key's mod_revision (or
// put-if-absent the first time), so of several nodes that react to the same
// change exactly one succeeds; the others' CAS fails, they re-read and see
// the winner's map. A publisher writes the epoch it read plus one, so the
// epochs of consecutive maps are consecutive integers: a cluster-local
// counter that a shared etcd's write rate cannot exhaust, and one whose
// jumps tell a node it missed a map (BucketActivation treats a jump as a
// start over). All nodes end up on the same map and epoch.
// A node persists the highest epoch it has adopted (EpochFile) before it
// adopts a map, and refuses a map with a lower epoch, also after a restart;
// over such a map (etcd restored from a snapshot) it publishes the same
// membership again above the highest epoch it has seen.
//
// A fresh epoch on every start: the first reconcile after start() publishes
// the membership again even when the map already equals it (the CAS re-put
// carries the next epoch), unless some node publishes a map after this node
// registered anyway. So a restarted node
// never works in an epoch it worked in before the restart; the token scheme
// (epoch << 32 | a per-epoch counter) relies on it. request_new_epoch() asks
// for the same at run time.
//
// Drain by key: when drain/<self> appears and the node is active, it puts
// its member key with state=draining (as drain() does), so the next map
// leaves it out; when the key goes again it puts state=active, but only if
// the key, not a drain() call, made it drain.
//
// The local lease deadline (the grant path fails closed past it) is the send
// time of the last acknowledged keep-alive plus the TTL etcd answered minus
// the drift margin, on the injected monotonic clock. Measuring from the send,
// not the answer, errs early: etcd started its TTL after we sent. A
// keep-alive that finds the lease gone makes the deadline pass at once, and
// the node registers again under a new lease.
//
// Threads: a keep-alive thread and a map thread (which owns the watch and
// does the reads and CAS writes). The map and view callbacks run on the map
// thread, or on the caller's thread inside start(); they must not call
// stop().
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <vector>

#include "cluster_view.h"
#include "epoch_file.h"
#include "etcd_client.h"
#include "map_history.h"
#include "shardlock/cluster/cluster_map.h"
#include "shardlock/internal/thread_annotations.h"
#include "shardlock/mutex.h"
#include "shardlock/router.h"

namespace shardlock::cluster {

// ---------------------------------------------------------------------------
// Errors and stats
// ---------------------------------------------------------------------------

enum class MembershipErrc : std::uint8_t {
  kOk = 0,
  kInvalidOptions,    // a bad node id, address, weight, TTL, margin or prefix
  kMemberExists,      // members/<id> is held under another live etcd lease
  kStaleMap,          // a map with an epoch below the highest this node has seen
  kEpochFileFailed,   // the epoch file could not be read or written
  kReplicasMismatch,  // a live member runs with another --replicas
};
[[nodiscard]] std::string_view to_string(MembershipErrc e) noexcept;
[[nodiscard]] const std::error_category& membership_category() noexcept;
[[nodiscard]] inline std::error_code make_error_code(MembershipErrc e) noexcept {
  return {static_cast<int>(e), membership_category()};
}

struct MembershipStats {
  std::uint64_t registrations = 0;       // leases granted with the member key put (start included)
  std::uint64_t keep_alives_acked = 0;   // keep-alives etcd acknowledged
  std::uint64_t keep_alives_failed = 0;  // keep-alives that failed (any reason)
  std::uint64_t leases_lost = 0;         // keep-alives that found the lease gone
  std::uint64_t maps_published = 0;      // CAS writes of the map key this node won
  std::uint64_t maps_republished = 0;    // of those, re-puts of an unchanged membership
                                         // (a fresh epoch for a start or a request)
  std::uint64_t epochs_requested = 0;    // request_new_epoch() calls
  std::uint64_t drains_by_key = 0;       // switches to draining for a drain/<self> key
  std::uint64_t drains_cancelled = 0;    // switches back to active when it went
  std::uint64_t maps_adopted = 0;        // maps taken as current (each a higher epoch)
  std::uint64_t maps_refused = 0;        // maps ignored for an epoch below highest_epoch
  std::uint64_t maps_read_back = 0;      // maps the watch missed, read from etcd's history
  std::uint64_t last_refused_epoch = 0;
  std::uint64_t bad_values = 0;  // member, handoff, drain or map values that did not decode
  std::uint64_t etcd_errors = 0;
  std::uint64_t epoch_file_errors = 0;  // maps not adopted because the epoch file write failed
  std::uint64_t highest_epoch = 0;      // as persisted
};

// ---------------------------------------------------------------------------
// The node's membership
// ---------------------------------------------------------------------------

struct MembershipOptions {
  std::string endpoints;  // etcd, "HOST:PORT[,HOST:PORT...]"
  // TLS towards etcd, and etcd's user/password authentication
  // (EtcdClientOptions): unset, plaintext and no credentials.
  std::optional<EtcdTls> tls{};
  std::optional<EtcdCredentials> credentials{};
  std::string prefix;     // the cluster's key prefix, e.g. "/shardlock/prod/"; ends in '/'
  std::string node_id;    // valid_node_id()
  std::string advertise;  // HOST:PORT clients reach this node at
  std::uint32_t weight = 1;
  // The node's largest lease TTL, published in its member record so that
  // every node's lock-delay covers it (0: not published).
  std::chrono::milliseconds max_ttl{0};
  // The node's --replicas, published in its member record; start() refuses
  // to register beside a live member whose record says another count
  // (MembershipErrc::kReplicasMismatch). 0: not published, not checked.
  std::uint32_t replicas = 0;
  // Every registration joins as a learner (state=joining), which the maps
  // list apart from the members, until caught_up(): a node with
  // replication joins this way (docs/cluster.md, "Repair").
  bool join_as_learner = false;
  // The lowest epoch this node wants to work in (the token floor of its
  // data dir): its first publish writes at least this epoch.
  std::uint64_t min_epoch = 0;
  // The data dir holding the epoch file (EpochFile); required.
  std::string data_dir;
  // The etcd lease TTL asked for; etcd may grant more (never less than 2 s).
  std::chrono::seconds lease_ttl{5};
  // Subtracted from every lease deadline; must be below half the TTL.
  std::chrono::milliseconds drift_margin{500};
  // Every etcd call's deadline; 0 means lease_ttl / 3, so a keep-alive that
  // hangs cannot hide the deadline passing.
  std::chrono::milliseconds call_timeout{0};
  // How soon a failed map read or write is tried again.
  std::chrono::milliseconds retry_interval{250};
  // The monotonic clock (a steady_clock time_since_epoch). Default:
  // std::chrono::steady_clock.
  std::function<std::chrono::nanoseconds()> clock;
  // Called with each map this node adopts, in epoch order (see the header
  // comment for the thread).
  std::function<void(const ClusterMap&)> on_map_change;
  // Called after every successful pass over the prefix (the first inside
  // start(), then on the map thread after each watch event or retry), once
  // the map read was adopted or refused, with what the pass read. A pass
  // that loses the map CAS reads again; the view is its final read. Views
  // come in revision order, but not one per revision: a change between two
  // reads may be seen only as its end state.
  //
  // Views carry states, not events: the driver derives them by comparing a
  // view with the previous one, and must. A member is gone when its id is
  // no longer in `members` (its etcd lease ended or it left); it registered
  // (again) when its id is new or its create_revision changed, which is the
  // only sign of a node that left and came back between two views.
  std::function<void(const ClusterView&)> on_view;
  // One line per notable event (refused maps, lost leases, etcd errors).
  // Default: stderr.
  std::function<void(std::string_view)> log;
};

enum class StopMode : std::uint8_t {
  kRevokeLease,   // a clean leave: etcd deletes the member key at once
  kAbandonLease,  // what a crash looks like: the key goes when the TTL runs out
};

class Membership {
 public:
  // Validates the options, opens the epoch file, grants an etcd lease and
  // puts members/<id> under it only if absent; then reads (and, if the
  // membership changed, publishes) the map once and starts the threads.
  // Blocks for a few etcd round trips. Errors: kInvalidOptions,
  // kMemberExists (another live lease holds the id; `detail` names it),
  // kEpochFileFailed, or an EtcdErrc when etcd cannot be reached. A map that
  // cannot be read yet is not an error: the map thread keeps trying.
  [[nodiscard]] static std::error_code start(MembershipOptions options,
                                             std::unique_ptr<Membership>& out, std::string& detail);

  // stop(kRevokeLease).
  ~Membership();
  Membership(const Membership&) = delete;
  Membership& operator=(const Membership&) = delete;

  // Stops both threads (waiting for an etcd call in flight, bounded by the
  // call timeout) and ends the lease as `mode` says. lease_alive() is false
  // afterwards. Idempotent; not from the map callback.
  void stop(StopMode mode = StopMode::kRevokeLease);

  // Whether the node's etcd lease is known alive at `now` (the clock's
  // time): now < lease_deadline(). Lock-free; the grant path calls it.
  [[nodiscard]] bool lease_alive(std::chrono::nanoseconds now) const noexcept {
    return now < lease_deadline();
  }
  [[nodiscard]] bool lease_alive() const { return lease_alive(options_.clock()); }
  [[nodiscard]] std::chrono::nanoseconds lease_deadline() const noexcept {
    // Relaxed is enough here: the deadline is a value on its own, read again
    // on every check (lease_deadline_of() is the one that pairs).
    return std::chrono::nanoseconds(deadline_ns_.load(std::memory_order_relaxed));
  }
  // Registrations so far: 1 after start(), one more each time the node
  // registers again under a new etcd lease (after losing one).
  [[nodiscard]] std::uint64_t registration() const noexcept {
    return registration_.load(std::memory_order_relaxed);  // relaxed: see lease_deadline_of()
  }
  // lease_deadline() while the node is still in registration `registration`,
  // else 0 (passed). A grant decided on what the node knew under an earlier
  // lease must not use a later lease's deadline: while the node was without
  // a lease, the cluster may have given its buckets away.
  [[nodiscard]] std::chrono::nanoseconds lease_deadline_of(
      std::uint64_t registration) const noexcept {
    // Acquire pairs with set_deadline()'s release, which register_member()
    // issues after raising registration_: a deadline of a later
    // registration comes with that registration's count.
    const std::int64_t deadline = deadline_ns_.load(std::memory_order_acquire);
    return std::chrono::nanoseconds(
        registration_.load(std::memory_order_relaxed) == registration ? deadline : 0);
  }

  // The newest adopted map; epoch 0 and no members before the first.
  [[nodiscard]] std::shared_ptr<const ClusterMap> current_map() const;

  // Sets this node's member state to draining (kept across re-registration),
  // so the next map leaves it out while its member key stays alive. One
  // etcd put, after a registration in flight (at most two etcd calls). A
  // drain by code is never undone by a drain/<self> key going away.
  [[nodiscard]] EtcdStatus drain();

  // Ends this registration's learning (options.join_as_learner): puts the
  // member key with state=active, so the next map makes the node a member.
  // One etcd put, none when it is not learning or not registered right now.
  [[nodiscard]] EtcdStatus caught_up();
  // Whether this registration is still a learner.
  [[nodiscard]] bool learning() const;

  // Puts handoff/<node_id> = `epoch` (decimal) under the node's current etcd
  // lease, so it vanishes with the node. One etcd put. kNotFound when the
  // node is not registered right now (re-registering after a lost lease), or
  // etcd's error.
  [[nodiscard]] EtcdStatus put_handoff(std::uint64_t epoch);
  // Evicts a member this node has stopped hearing from (docs/cluster.md,
  // "Eviction"): revokes the etcd lease its member key is under, `lease` as
  // a view showed it. Its member key and hand-off record go at once, so the
  // next map leaves it out without waiting for its lease to run out; if it
  // is alive, its next keep-alive finds the lease gone and it fails closed
  // and registers again. A lease id is never reused, so an old suspicion
  // cannot evict the node's next registration.
  //
  // First, in one etcd transaction, it deletes the member key `id` holds
  // under `lease`, and only while this node's own member key is still under
  // its own lease: of two nodes cut off from each other that suspect each
  // other at once, the first evicts the second, whose own transaction then
  // fails (it is no longer a member), so one of them survives. kNotFound
  // when the transaction did not apply.
  [[nodiscard]] EtcdStatus evict(std::string_view id, std::int64_t lease);

  // Asks for a map with an epoch above the current one and at least
  // `at_least`, with the same membership if nothing changes: the map thread
  // re-puts the map (a CAS) on its next pass, unless such a map arrives
  // first. Done only while
  // this node is registered and the live membership is non-empty; until
  // then the request waits. Thread-safe, never blocks on etcd.
  void request_new_epoch(std::uint64_t at_least = 0);

  // For operator tools, which are not members. An operator drain: puts
  // drain/<node_id> = "1" under `prefix` (permanent, no lease); the node
  // drains on its next pass. cancel_drain() deletes the key (not an error
  // when it is absent). One etcd call each; a node_id that is not
  // valid_node_id() is kInvalidArgument without I/O.
  [[nodiscard]] static EtcdStatus request_drain(EtcdClient& client, std::string_view prefix,
                                                std::string_view node_id);
  [[nodiscard]] static EtcdStatus cancel_drain(EtcdClient& client, std::string_view prefix,
                                               std::string_view node_id);
  // One read of `prefix`, decoded (ClusterView::map as read, not adopted).
  // Values that do not decode are skipped and counted in `bad_values` when
  // it is given.
  [[nodiscard]] static EtcdResult<ClusterView> read_view(EtcdClient& client,
                                                         std::string_view prefix,
                                                         std::uint64_t* bad_values = nullptr);

  // The etcd lease the member key is under now (0 while re-registering).
  [[nodiscard]] std::int64_t lease_id() const;
  [[nodiscard]] MembershipStats stats() const;
  [[nodiscard]] const MembershipOptions& options() const noexcept { return options_; }
  // The etcd client this node uses (for tests and tools; thread-safe).
  [[nodiscard]] EtcdClient& etcd() noexcept { return *client_; }

 private:
  explicit Membership(MembershipOptions options);

  std::string member_key() const { return options_.prefix + "members/" + options_.node_id; }
  std::string handoff_key() const { return options_.prefix + "handoff/" + options_.node_id; }
  std::string map_key() const { return options_.prefix + "map"; }
  std::chrono::nanoseconds now() const { return options_.clock(); }
  void set_deadline(std::chrono::nanoseconds send_time, std::int64_t ttl_seconds);
  void note(std::string_view line);
  void note_etcd_error(std::string_view what, const std::string& detail);

  // Grants a lease and puts the member key under it if absent; the put's
  // revision in `revision`.
  // Refuses (kReplicasMismatch) when a live member's record says another
  // replica count than options_.replicas.
  std::error_code check_replicas(std::string& detail);
  std::error_code register_member(std::string& detail, std::int64_t* revision = nullptr);
  // Puts the member key with `state` under `lease`; the caller holds
  // member_key_mutex_ and has just set state_ to `state`.
  EtcdStatus put_member_state(MemberState state, std::int64_t lease)
      SHARDLOCK_REQUIRES(member_key_mutex_);
  // A drain/<self> key appeared or went: switches state_ and puts the member
  // key. True when it put (the caller reads again), false when nothing
  // changed or no lease; nothing when the put failed.
  std::optional<bool> follow_drain_key(bool drain_key_present);
  void keep_alive_loop();
  void map_loop(std::int64_t watch_from);
  // One read of the prefix, adoption of the map read, and a CAS publish when
  // the live membership differs from it. The revision read, or nothing when
  // etcd failed.
  std::optional<std::int64_t> reconcile();
  // Persists and publishes `map` (read or written at the map key's
  // `mod_revision`) unless its epoch is old; appends it to `adopted_in_pass`
  // when adopted.
  void adopt(ClusterMap map, std::int64_t mod_revision,
             std::vector<std::shared_ptr<const ClusterMap>>* adopted_in_pass = nullptr);
  // Adopts, in epoch order, the maps the watch delivered below `published`
  // and those it missed in between, read back from the map key's history
  // (map_history.h), then `published`; forgets the rest of what the watch
  // delivered.
  void adopt_maps_through(RevisedMap published,
                          std::vector<std::shared_ptr<const ClusterMap>>& adopted);
  MemberRecord record_of(MemberState state) const {
    return {options_.advertise, options_.weight, state,
            static_cast<std::uint64_t>(options_.max_ttl.count()), options_.replicas};
  }

  MembershipOptions options_;
  std::unique_ptr<EtcdClient> client_;
  std::unique_ptr<EpochFile> epoch_file_;  // map thread (and start()) only

  // Serialises every write of members/<self> with the state it writes
  // (register_member, drain, follow_drain_key), so the last put always
  // carries the current state_. Taken before mutex_, never after it; held
  // across one etcd call.
  Mutex member_key_mutex_;

  // Nanoseconds on options_.clock; 0 (never alive) until registered.
  std::atomic<std::int64_t> deadline_ns_{0};
  std::atomic<std::uint64_t> registration_{0};  // see registration()

  mutable Mutex mutex_;
  std::condition_variable_any wake_;  // waits on mutex_ itself
  bool stopping_ SHARDLOCK_GUARDED_BY(mutex_) = false;
  bool stopped_ SHARDLOCK_GUARDED_BY(mutex_) = false;
  bool map_dirty_ SHARDLOCK_GUARDED_BY(mutex_) = false;
  bool watch_failed_ SHARDLOCK_GUARDED_BY(mutex_) = false;
  std::int64_t lease_id_ SHARDLOCK_GUARDED_BY(mutex_) = 0;
  MemberState state_ SHARDLOCK_GUARDED_BY(mutex_) = MemberState::kActive;
  // This registration is a learner (options_.join_as_learner, until
  // caught_up()); an active state_ is then written as joining.
  bool learning_ SHARDLOCK_GUARDED_BY(mutex_) = false;
  // state_ is kDraining because of a drain/<self> key, not drain().
  bool drained_by_key_ SHARDLOCK_GUARDED_BY(mutex_) = false;
  // A fresh epoch is wanted: a map published after the etcd revision
  // epoch_wanted_after_revision_ (the registration's, at start) with an
  // epoch above epoch_wanted_above_ (the current one, on a request).
  bool epoch_wanted_ SHARDLOCK_GUARDED_BY(mutex_) = false;
  std::int64_t epoch_wanted_after_revision_ SHARDLOCK_GUARDED_BY(mutex_) = 0;
  std::uint64_t epoch_wanted_above_ SHARDLOCK_GUARDED_BY(mutex_) = 0;
  // Publishes write at least this epoch (options_.min_epoch, raised by
  // request_new_epoch(at_least)).
  std::uint64_t epoch_floor_ SHARDLOCK_GUARDED_BY(mutex_) = 0;
  std::shared_ptr<const ClusterMap> map_ SHARDLOCK_GUARDED_BY(mutex_);
  std::int64_t map_revision_ SHARDLOCK_GUARDED_BY(mutex_) = 0;  // map_'s mod_revision
  // Map puts the watch delivered since the last pass, with their revisions.
  std::vector<RevisedMap> watched_maps_ SHARDLOCK_GUARDED_BY(mutex_);
  MembershipStats stats_ SHARDLOCK_GUARDED_BY(mutex_);

  std::thread keep_alive_thread_;
  std::thread map_thread_;
};

}  // namespace shardlock::cluster

template <>
struct std::is_error_code_enum<shardlock::cluster::MembershipErrc> : std::true_type {};
