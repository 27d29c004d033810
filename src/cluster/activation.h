// activation.h: which buckets one node may grant in the newest map it knows,
// rule 3 of docs/cluster.md "Who may grant". Pure: no etcd, no sockets, no
// clock of its own; the caller feeds it maps, hand-off records, member-key
// events and the monotonic time.
//
//   BucketActivation activation({.node_id = "n2", .lock_delay = 47s});
//   activation.on_map(map, now);                  // each adopted map
//   activation.on_handoff("n1", epoch);           // handoff/n1 read or changed
//   activation.on_member_gone("n1", now);         // members/n1 deleted
//   activation.on_member_registered("n1", now);   // members/n1 put again
//   if (activation.may_grant(bucket, now)) ...;   // the grant path
//   for (auto b : activation.buckets_to_hand_off()) ...;  // stop, release
//   if (activation.ready_to_ack(epoch, leases_on_unowned)) write handoff/n2
//
// The rule. A bucket b is active at this node N in the current map E when
//   - E gives b to N,
//   - every node that may still hold a lease on b has let go of it: it wrote
//     handoff/X == E (so it let go of every bucket E does not give it, and E
//     gives b to N), or its member key vanished and lock_delay has passed on
//     N's clock since N saw it go,
//   - and the start-up gate below is open.
//
// Who "may still hold a lease on b": every owner b had in the maps since
// b was last settled, except the current owner. This is the chain A->B->C:
// if b moves A->B in E2 and B->C in E3 before B activated, C cannot know
// whether B ever activated (A may have acked E2), nor whether A's leases have
// ended, so C waits for both A and B. A node leaves the chain for good once
// it is released (acked, or gone plus the delay); it re-enters only by owning
// b again and losing it again. A bucket owned in consecutive maps keeps its
// state, so an active bucket stays active.
//
// Why an ack counts only when it equals E, not when it is >= E (a deliberate
// narrowing of the design's wording). handoff/X holds only X's newest epoch,
// and a node may skip maps (the map thread reads the newest map, not every
// one). If X acked E5 while N is still at E3, E5 may give b back to X, and X
// may have gone from E1 straight to E5 keeping b active and its leases live:
// ">= E3" would let N grant beside them. An ack == E3 proves X let go of b in
// the very map N is looking at. The cost is liveness only: N waits until it
// adopts the map X acked, and every live node acks every map it adopts. The
// same narrowing keeps "stays active" safe across skipped maps: nobody else
// can activate N's bucket without N's ack of exactly their epoch.
//
// Missing history: the first map, and a skipped map. N's first map comes
// with no history: N cannot know who owned its buckets before. Nor can it
// after it skipped a map (epochs are consecutive, so a map whose epoch is not
// the current one plus one means N missed at least one; the caller reads the
// maps its watch missed back from etcd's history first, map_history.h, so
// this is left for a history etcd compacted meanwhile): the owners b had in
// the missed maps are unknown, and one of them may have activated b and
// granted in it. In both cases every bucket starts over with the chain of
// every node N knows of (members seen, live or draining, gone or not; ack
// writers; map members), minus its new owner, and cannot activate before
// lock_delay has passed from now (for nodes that came and went unseen). The
// one exception is a bucket N owned before the skip and owns after it: no
// node activated it in between, since that needs N's ack of exactly the map
// in between, which N never saw. Treating a skip as a start over costs only
// time: lock_delay for the buckets that moved to N.
//
// The caller's duties: report every adopted map in epoch order (older or equal
// epochs are ignored), every handoff/<id> value, and every delete and put of a
// member key, in the order etcd's watch delivers them. A restarted node must
// not ack (ready_to_ack's lease count) until its previous run's leases are
// over (TokenStore::previous_lease_bound_ms()).
//
// Memory: one 4-byte chain index per bucket plus the distinct chains, so the
// default 2^22 buckets cost 16 MiB. on_map() and a release are O(buckets).
//
// Not thread-safe: one thread (or a lock the caller holds) drives it.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "cluster_view.h"
#include "shardlock/router.h"

namespace shardlock::cluster {

struct ActivationOptions {
  std::string node_id;  // this node; valid_node_id()
  // max lease TTL + etcd lease TTL + drift margin (docs/cluster.md): the
  // lock-delay for this node's own max TTL. raise_max_ttl() raises it.
  std::chrono::nanoseconds lock_delay{0};
  // The lock-delay's part that is not a lease TTL (etcd lease TTL + drift
  // margin): what raise_max_ttl() adds to a member's max TTL.
  std::chrono::nanoseconds lock_delay_margin{0};
  // Must equal the options every node routes with.
  RouterOptions router_options;
  // A map with no history (the first, a skipped one) activates nothing
  // before this time (on the caller's clock), whatever the lock-delay: the
  // end of the server's own lock-delay, past which every lease its earlier
  // run may have granted is over. A bucket taken over complete
  // (on_taken_over with owner_active) does not wait for it: the primary's
  // snapshot holds every live lease of the bucket, the earlier run's
  // included, since they were taken over with its buckets when it died
  // (docs/cluster.md, "A node returns").
  std::chrono::nanoseconds history_floor{0};
};

enum class MapVerdict : std::uint8_t {
  kAdopted,
  kStale,        // epoch <= the current map's: ignored
  kUnroutable,   // the Router refused the members: ignored
  kBucketCount,  // a different bucket count than the first map's: ignored
};

class BucketActivation {
 public:
  // Times are on the caller's monotonic clock (a steady_clock
  // time_since_epoch, like MembershipOptions::clock).
  using Time = std::chrono::nanoseconds;

  explicit BucketActivation(ActivationOptions options);

  // Adopts `map` as current unless its epoch is not above the current one.
  // Buckets this node owned before and `map` does not give it are returned by
  // buckets_to_hand_off() from now on, and may_grant() refuses them at once.
  MapVerdict on_map(const ClusterMap& map, Time now);

  // handoff/<node_id> holds `epoch`. Values below one already seen are
  // ignored; this node's own record is ignored.
  void on_handoff(std::string_view node_id, std::uint64_t epoch);

  // members/<node_id> vanished at `now` (its etcd lease ended). The first
  // time counts until the key is registered again.
  void on_member_gone(std::string_view node_id, Time now);
  // members/<node_id> was put at `now` (a restart or a re-registration): its
  // earlier gone time no longer speaks for the leases it may take from now on.
  void on_member_registered(std::string_view node_id, Time now);
  // Replication (docs/cluster.md, "Takeover"): this node took `bucket` over
  // from `node`, its primary in the map before: it was the bucket's
  // caught-up backup, its promise to `node` ran out (so `node` can neither
  // grant nor renew it), and it installed every holder `node` answered. So
  // `node` no longer needs to let go of `bucket`: it leaves the bucket's
  // chain (only this bucket's); other nodes in it still must let go.
  // `owner_active`: `node` had the bucket active (every earlier owner's
  // lease there was over), so nobody else in its chain, nor the history this
  // node did not see, need let go either: it is active at once.
  void on_taken_over(std::size_t bucket, std::string_view node, bool owner_active = false);
  // The owner `bucket` had in the map before the current one, if this node
  // followed both (consecutive epochs, no start over) and that map ranked
  // this node among its backups (`replicas` owners per bucket: the first
  // backup, or a later one when those before it left together with the
  // primary), else nullopt. The caller's check before a takeover; the
  // replicator's (a caught-up stream from that primary, its promise run
  // out) decides.
  [[nodiscard]] std::optional<std::string> previous_primary_backed_by_self(
      std::size_t bucket, std::size_t replicas) const;
  // Whether `node`'s current incarnation was registered at least the
  // lock-delay ago (as this node saw it, which errs late): then every lease
  // an earlier run of it granted has ended, and what its replication stream
  // carries is every live lease it may have. A takeover needs it: a
  // restarted primary's snapshot cannot hold its earlier run's leases.
  [[nodiscard]] bool incarnation_settled(std::string_view node, Time now) const;

  // A member's record says its largest lease TTL is `max_ttl`: the
  // lock-delay becomes at least max_ttl + lock_delay_margin, so that it
  // covers the longest lease any member may have granted (a rolling raise
  // of --max-ttl). It never comes down within this run.
  void raise_max_ttl(Time max_ttl);

  // Whether this node may grant or renew in `bucket` at `now` (rule 3 only;
  // rules 1 and 2, ownership at the lease path and the etcd lease deadline,
  // are the caller's too). False before the first map and for a bucket out
  // of range.
  [[nodiscard]] bool may_grant(std::size_t bucket, Time now) const;

  // Whether the current map gives `bucket` to this node (rule 1).
  [[nodiscard]] bool owns(std::size_t bucket) const noexcept;

  // The buckets the latest adopted map took from this node, ascending: stop
  // granting them (may_grant already refuses) and end or release their
  // leases. Empty before the second map.
  [[nodiscard]] const std::vector<std::size_t>& buckets_to_hand_off() const noexcept {
    return hand_off_;
  }

  // Whether this node may write handoff/<id> = `epoch`: `epoch` is the
  // current map's, and `live_leases_on_unowned_buckets` (the caller's count
  // of leases it still holds in buckets owns() is false for, from any earlier
  // map) is 0.
  [[nodiscard]] bool ready_to_ack(std::uint64_t epoch,
                                  std::size_t live_leases_on_unowned_buckets) const noexcept;

  [[nodiscard]] std::uint64_t epoch() const noexcept { return epoch_; }
  [[nodiscard]] Time lock_delay() const noexcept { return lock_delay_; }
  // Maps that came with no history (the first, and each after a skip).
  [[nodiscard]] std::uint64_t history_restarts() const noexcept { return history_restarts_; }
  [[nodiscard]] std::size_t bucket_count() const noexcept { return chain_of_bucket_.size(); }
  [[nodiscard]] const ActivationOptions& options() const noexcept { return options_; }

 private:
  using NodeIndex = std::uint32_t;
  using ChainIndex = std::uint32_t;  // 0: the empty chain (settled)
  static constexpr NodeIndex kNoNode = ~NodeIndex{0};

  struct Node {
    std::string id;
    std::uint64_t acked_epoch = 0;
    std::optional<Time> gone_at;
    std::optional<Time> registered_at;  // its current incarnation, as first seen here
  };

  NodeIndex intern(std::string_view id);
  std::optional<NodeIndex> find(std::string_view id) const;
  // Released for the current map: acked exactly it, or gone long enough.
  bool released(NodeIndex node, Time now) const;
  // Removes `node` from every chain and from the start-up gate.
  void release(NodeIndex node);
  // Releases every node acked == epoch_ or gone long enough at `now`.
  void release_settled(Time now);
  // Drops chains no bucket refers to and renumbers the rest.
  void compact_chains();
  // The chain's index (0 for an empty one), appended to chains_.
  ChainIndex add_chain(std::vector<NodeIndex> chain);
  // A map with no history: see the header comment, "Missing history".
  template <typename OwnerInNewMap>
  void start_history_over(const OwnerInNewMap& owner_in_new_map, Time now);

  ActivationOptions options_;
  NodeIndex self_ = 0;
  std::vector<Node> nodes_;
  std::unordered_map<std::string, NodeIndex> node_by_id_;

  std::uint64_t epoch_ = 0;
  std::unique_ptr<ClusterRouting> routing_;
  // The replica sets of the current map and, when the current one followed
  // it directly, of the map before (for previous_primary_backed_by_self);
  // null otherwise.
  std::unique_ptr<ReplicaRouting> replicas_;
  std::unique_ptr<ReplicaRouting> previous_replicas_;
  // owner_[b]: the current owner's node index, or kNoNode.
  std::vector<NodeIndex> owner_;
  std::vector<ChainIndex> chain_of_bucket_;
  std::vector<std::vector<NodeIndex>> chains_;  // chains_[0] is always empty
  std::vector<std::size_t> hand_off_;
  // on_taken_over's chains, by (chain before, node taken over from).
  std::map<std::pair<ChainIndex, NodeIndex>, ChainIndex> taken_over_cache_;

  Time lock_delay_{0};
  // Buckets that started over without history (first map, skipped map)
  // activate no sooner than history_known_from_.
  std::vector<bool> unseen_history_;
  Time history_known_from_{0};
  std::uint64_t history_restarts_ = 0;
};

}  // namespace shardlock::cluster
