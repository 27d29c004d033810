#include "activation.h"

#include <algorithm>
#include <cassert>
#include <map>
#include <span>
#include <tuple>
#include <utility>

namespace shardlock::cluster {

BucketActivation::BucketActivation(ActivationOptions options) : options_(std::move(options)) {
  assert(valid_node_id(options_.node_id));
  assert(options_.lock_delay >= Time{0});
  lock_delay_ = options_.lock_delay;
  self_ = intern(options_.node_id);
  chains_.emplace_back();  // chain 0: settled
}

BucketActivation::NodeIndex BucketActivation::intern(std::string_view id) {
  if (auto found = find(id)) return *found;
  const auto index = static_cast<NodeIndex>(nodes_.size());
  nodes_.push_back(Node{.id = std::string(id),
                        .acked_epoch = 0,
                        .gone_at = std::nullopt,
                        .registered_at = std::nullopt});
  node_by_id_.emplace(std::string(id), index);
  return index;
}

std::optional<BucketActivation::NodeIndex> BucketActivation::find(std::string_view id) const {
  const auto it = node_by_id_.find(std::string(id));
  if (it == node_by_id_.end()) return std::nullopt;
  return it->second;
}

bool BucketActivation::released(NodeIndex node, Time now) const {
  const Node& n = nodes_[node];
  if (epoch_ != 0 && n.acked_epoch == epoch_) return true;
  return n.gone_at && now >= *n.gone_at + lock_delay_;
}

MapVerdict BucketActivation::on_map(const ClusterMap& map, Time now) {
  if (map.epoch <= epoch_) return MapVerdict::kStale;
  std::unique_ptr<ClusterRouting> routing;
  std::unique_ptr<ReplicaRouting> replicas;
  if (ClusterRouting::build(map, options_.router_options, routing) != RouterStatus::kOk ||
      ReplicaRouting::build(map, options_.router_options, replicas) != RouterStatus::kOk) {
    return MapVerdict::kUnroutable;
  }
  const bool first = routing_ == nullptr;
  if (!first && routing->bucket_count() != owner_.size()) return MapVerdict::kBucketCount;

  // The Router's member index -> our node index.
  std::vector<NodeIndex> node_of_member;
  node_of_member.reserve(map.members.size());
  for (const ClusterMember& member : map.members) node_of_member.push_back(intern(member.id));
  const std::span<const std::uint16_t> table = routing->snapshot().table();
  auto owner_in_new_map = [&](std::size_t bucket) {
    if (bucket >= table.size()) return kNoNode;  // an empty map has no table
    const std::uint16_t index = table[bucket];
    if (index == RouterSnapshot::kNoOwner || index >= node_of_member.size()) return kNoNode;
    return node_of_member[index];
  };

  hand_off_.clear();
  if (first) {
    owner_.assign(routing->bucket_count(), kNoNode);
    chain_of_bucket_.assign(routing->bucket_count(), 0);
    unseen_history_.assign(routing->bucket_count(), false);
  }
  const bool consecutive = !first && map.epoch == epoch_ + 1;
  if (!consecutive) {
    start_history_over(owner_in_new_map, now);
  } else {
    // A moved bucket's new chain: its old chain plus its old owner, minus its
    // new owner. Buckets move in groups (one leaving node's buckets to a few
    // heirs), so the result is cached per (old chain, old owner, new owner).
    std::map<std::tuple<ChainIndex, NodeIndex, NodeIndex>, ChainIndex> moved;
    for (std::size_t b = 0; b < owner_.size(); ++b) {
      const NodeIndex before = owner_[b];
      const NodeIndex after = owner_in_new_map(b);
      if (before == after) continue;
      if (before == self_) hand_off_.push_back(b);
      const auto key = std::make_tuple(chain_of_bucket_[b], before, after);
      auto it = moved.find(key);
      if (it == moved.end()) {
        std::vector<NodeIndex> chain = chains_[chain_of_bucket_[b]];
        if (before != kNoNode && std::find(chain.begin(), chain.end(), before) == chain.end()) {
          chain.push_back(before);
        }
        std::erase(chain, after);
        it = moved.emplace(key, add_chain(std::move(chain))).first;
      }
      chain_of_bucket_[b] = it->second;
      owner_[b] = after;
    }
  }
  epoch_ = map.epoch;
  previous_replicas_ = consecutive ? std::move(replicas_) : nullptr;
  replicas_ = std::move(replicas);
  routing_ = std::move(routing);
  compact_chains();
  // Acks of this epoch that arrived before the map did count now.
  release_settled(now);
  return MapVerdict::kAdopted;
}

template <typename OwnerInNewMap>
void BucketActivation::start_history_over(const OwnerInNewMap& owner_in_new_map, Time now) {
  // Every node known, alive or not: any of them may have owned any bucket in
  // the maps this node did not see. Nodes that were never seen at all (they
  // came and went in between) are covered by the lock-delay from now.
  std::vector<NodeIndex> known;
  for (NodeIndex node = 0; node < nodes_.size(); ++node) {
    if (node != self_) known.push_back(node);
  }
  std::map<NodeIndex, ChainIndex> chain_without;  // by new owner
  const bool earlier_wait_over = now >= history_known_from_;
  for (std::size_t b = 0; b < owner_.size(); ++b) {
    const NodeIndex before = owner_[b];
    const NodeIndex after = owner_in_new_map(b);
    if (before == self_ && after != self_) hand_off_.push_back(b);
    // A bucket this node owned before and owns now keeps its state: no other
    // node activated it in a map in between, since that needs this node's
    // acknowledgement of exactly that map, and this node never saw it.
    if (before == self_ && after == self_) {
      if (earlier_wait_over) unseen_history_[b] = false;  // else it keeps waiting, now longer
      continue;
    }
    auto it = chain_without.find(after);
    if (it == chain_without.end()) {
      std::vector<NodeIndex> chain = known;
      std::erase(chain, after);
      it = chain_without.emplace(after, add_chain(std::move(chain))).first;
    }
    chain_of_bucket_[b] = it->second;
    owner_[b] = after;
    unseen_history_[b] = true;
  }
  history_known_from_ = std::max(now + lock_delay_, options_.history_floor);
  ++history_restarts_;
}

BucketActivation::ChainIndex BucketActivation::add_chain(std::vector<NodeIndex> chain) {
  if (chain.empty()) return 0;
  chains_.push_back(std::move(chain));
  return static_cast<ChainIndex>(chains_.size() - 1);
}

void BucketActivation::on_taken_over(std::size_t bucket, std::string_view node, bool owner_active) {
  const std::optional<NodeIndex> index = find(node);
  if (!index || *index == self_ || bucket >= chain_of_bucket_.size()) return;
  if (owner_active) {
    chain_of_bucket_[bucket] = 0;  // chains_[0] is always empty
    unseen_history_[bucket] = false;
    return;
  }
  const ChainIndex chain = chain_of_bucket_[bucket];
  const std::vector<NodeIndex>& members = chains_[chain];
  if (std::find(members.begin(), members.end(), *index) == members.end()) return;
  std::vector<NodeIndex> rest = members;
  std::erase(rest, *index);
  // Buckets are taken over one by one, many from one primary: reuse the
  // chain made for the previous bucket with the same chain and node.
  if (taken_over_cache_.size() > 4096) taken_over_cache_.clear();
  const auto key = std::make_pair(chain, *index);
  auto it = taken_over_cache_.find(key);
  if (it == taken_over_cache_.end() || it->second >= chains_.size() ||
      chains_[it->second] != rest) {
    it = taken_over_cache_.insert_or_assign(key, add_chain(std::move(rest))).first;
  }
  chain_of_bucket_[bucket] = it->second;
}

std::optional<std::string> BucketActivation::previous_primary_backed_by_self(
    std::size_t bucket, std::size_t replicas) const {
  if (!previous_replicas_ || replicas < 2) return std::nullopt;
  const ReplicaRouting& before = *previous_replicas_;
  if (bucket >= before.snapshot().bucket_count()) return std::nullopt;
  // Any backup, not only the first: when the primary and the backups ranked
  // before this node left in one map, this node inherits the bucket, and it
  // acknowledged every grant they did. A learner backed it up too: it
  // acknowledged every grant since its snapshot.
  const std::vector<std::uint16_t> set = before.replicas_of(bucket, replicas);
  const auto self =
      std::find_if(set.begin() + (set.empty() ? 0 : 1), set.end(),
                   [&](std::uint16_t node) { return before.nodes()[node].id == options_.node_id; });
  if (set.size() < 2 || self == set.end()) return std::nullopt;
  return before.nodes()[set[0]].id;
}

void BucketActivation::raise_max_ttl(Time max_ttl) {
  lock_delay_ = std::max(lock_delay_, max_ttl + options_.lock_delay_margin);
}

void BucketActivation::on_handoff(std::string_view node_id, std::uint64_t epoch) {
  const NodeIndex node = intern(node_id);
  if (node == self_) return;
  Node& n = nodes_[node];
  if (epoch <= n.acked_epoch) return;
  n.acked_epoch = epoch;
  if (epoch_ != 0 && epoch == epoch_) release(node);
}

void BucketActivation::on_member_gone(std::string_view node_id, Time now) {
  const NodeIndex node = intern(node_id);
  if (node == self_) return;
  Node& n = nodes_[node];
  if (!n.gone_at) n.gone_at = now;
}

void BucketActivation::on_member_registered(std::string_view node_id, Time now) {
  const NodeIndex node = intern(node_id);
  if (node == self_) return;
  // The old incarnation's leases are over if the delay has passed: release
  // it first, so the buckets it blocked stay active. A released node is out
  // of every chain and re-enters one only by owning a bucket and losing it
  // again; then this incarnation must ack or go away again.
  if (released(node, now)) release(node);
  nodes_[node].gone_at.reset();
  nodes_[node].registered_at = now;
}

bool BucketActivation::incarnation_settled(std::string_view node, Time now) const {
  const std::optional<NodeIndex> index = find(node);
  if (!index) return false;
  const Node& n = nodes_[*index];
  return n.registered_at && now >= *n.registered_at + lock_delay_;
}

void BucketActivation::release(NodeIndex node) {
  // Sound for every chain at once: the current map gives none of a chain's
  // buckets to a node in that chain (on_map drops the new owner), so an ack
  // of the current map, or the end of the node's leases, lets go of them all.
  for (std::vector<NodeIndex>& chain : chains_) std::erase(chain, node);
}

void BucketActivation::release_settled(Time now) {
  for (NodeIndex node = 0; node < nodes_.size(); ++node) {
    if (node != self_ && released(node, now)) release(node);
  }
}

void BucketActivation::compact_chains() {
  std::vector<ChainIndex> renumbered(chains_.size(), 0);
  std::vector<bool> used(chains_.size(), false);
  for (ChainIndex chain : chain_of_bucket_) used[chain] = true;
  std::vector<std::vector<NodeIndex>> kept;
  kept.emplace_back();
  for (ChainIndex chain = 1; chain < chains_.size(); ++chain) {
    if (!used[chain] || chains_[chain].empty()) continue;
    renumbered[chain] = static_cast<ChainIndex>(kept.size());
    kept.push_back(std::move(chains_[chain]));
  }
  for (ChainIndex& chain : chain_of_bucket_) chain = renumbered[chain];
  chains_ = std::move(kept);
  taken_over_cache_.clear();
}

bool BucketActivation::owns(std::size_t bucket) const noexcept {
  return bucket < owner_.size() && owner_[bucket] == self_;
}

bool BucketActivation::may_grant(std::size_t bucket, Time now) const {
  if (!owns(bucket)) return false;
  if (unseen_history_[bucket] && now < history_known_from_) return false;
  for (NodeIndex node : chains_[chain_of_bucket_[bucket]]) {
    if (!released(node, now)) return false;
  }
  return true;
}

bool BucketActivation::ready_to_ack(std::uint64_t epoch,
                                    std::size_t live_leases_on_unowned_buckets) const noexcept {
  return epoch_ != 0 && epoch == epoch_ && live_leases_on_unowned_buckets == 0;
}

}  // namespace shardlock::cluster
