// ClusterGate: what the cluster lets this node grant, as the shards see it
// (docs/cluster.md, "Who may grant"). Not API: the cluster layer builds one
// per change (a new map, a bucket activated, a hand-off) and the server
// hands it to every shard under that shard's lock (Dispatcher::publish_gate).
//
// Why under each shard's lock and not through one shared pointer: a node
// writes its hand-off acknowledgement only after every shard has the gate
// that refuses the moved buckets and it has then counted no live lease in
// them, both under the shard locks. A grant decided under a shard lock after
// that count therefore sees the new gate, so no grant can slip in between
// the count and the acknowledgement that would let the new owner grant too.
//
// A single shardlockd has no gate (null): every key is its own.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "shardlock/router.h"

namespace shardlock::lease::internal {

struct ClusterGate {
  enum class Verdict : std::uint8_t {
    kGrant,     // this node may grant and renew the key now
    kRedirect,  // the map gives the key to another node: REDIRECT with `epoch`
    kNotReady,  // the key is this node's but not grantable yet: RECOVERING
  };
  // Per bucket.
  enum BucketState : std::uint8_t {
    kForeign = 0,  // another node's in this map
    kOwned = 1,    // this node's, not active yet (hand-off or lock-delay pending)
    kActive = 2,   // this node's, and grantable
  };
  struct Member {
    std::string id;
    std::string address;
    std::uint32_t weight = 1;
  };

  // The map's epoch: the high half of every token issued under this gate.
  std::uint64_t epoch = 0;
  // Nothing is granted under an epoch below this: the epochs a previous run
  // of this node may have granted in (its persisted highest epoch + 1), so a
  // restarted node never issues a token its earlier run may have issued.
  std::uint64_t min_grant_epoch = 0;
  // The map's buckets and owners, and each bucket's state here. Null: no
  // map yet, every key is refused RECOVERING (a closed gate).
  std::shared_ptr<const RouterSnapshot> routing;
  std::vector<std::uint8_t> buckets;
  // The node's etcd lease deadline on the server's clock; a grant needs the
  // time before it (fail closed). Must not be empty.
  std::function<std::chrono::nanoseconds()> lease_deadline;
  // The server's clock, read when check() decides (Dispatcher::publish_gate()
  // sets it): the deadlines are compared with the later of it and the
  // caller's `now_ms`, which may have been read before a wait for the
  // shard's lock (otherwise a request that arrived inside the
  // primary lease could be granted after it ended). Empty: `now_ms` alone.
  std::function<std::chrono::nanoseconds()> clock;
  // Replication (docs/cluster.md, "Replication"): per bucket, non-zero when
  // the bucket has backups (this node is its primary and journals its
  // holders); empty without replication. A replicated bucket is granted and
  // renewed only before replica_deadline(bucket): the end of the primary
  // lease this node holds from every backup of the bucket, on the server's
  // clock. Must be set when `replicated` has a non-zero entry.
  std::vector<std::uint8_t> replicated;
  std::function<std::chrono::nanoseconds(std::size_t bucket)> replica_deadline;
  // The map's members in id order, for MAP replies.
  std::vector<Member> members;
  // How long a RECOVERING answer asks clients to wait.
  std::uint32_t retry_after_ms = 50;

  // A gate that refuses every key (RECOVERING) and answers MAP with no map:
  // before the first map, and after the cluster layer stops.
  [[nodiscard]] static std::shared_ptr<const ClusterGate> closed() {
    auto gate = std::make_shared<ClusterGate>();
    gate->lease_deadline = [] { return std::chrono::nanoseconds(0); };
    return gate;
  }

  [[nodiscard]] bool replicated_bucket(std::size_t bucket) const noexcept {
    return bucket < replicated.size() && replicated[bucket] != 0;
  }

  [[nodiscard]] std::size_t bucket_of(std::string_view key) const noexcept {
    return routing->bucket_of_hash(routing->hash(key));
  }

  // The verdict for `key` at `now_ms` (whole milliseconds of the server's
  // clock, rounded down). Never throws; cheap: one hash, one table load and
  // one clock reading of the deadline.
  [[nodiscard]] Verdict check(std::string_view key, std::int64_t now_ms) const noexcept {
    if (!routing) return Verdict::kNotReady;  // no map yet: closed
    const std::size_t bucket = bucket_of(key);
    const std::uint8_t state = bucket < buckets.size() ? buckets[bucket] : std::uint8_t{kForeign};
    if (state == kForeign) return Verdict::kRedirect;
    if (state != kActive || epoch < min_grant_epoch) return Verdict::kNotReady;
    // now_ms is rounded down, so the true time may be up to 1 ms later: err
    // towards failing closed; and it may be older than the decision.
    std::chrono::nanoseconds latest = std::chrono::milliseconds(now_ms + 1);
    if (clock) latest = std::max(latest, clock());
    if (!(latest < lease_deadline())) return Verdict::kNotReady;
    if (replicated_bucket(bucket) && !(latest < replica_deadline(bucket))) {
      return Verdict::kNotReady;
    }
    return Verdict::kGrant;
  }
};

}  // namespace shardlock::lease::internal
