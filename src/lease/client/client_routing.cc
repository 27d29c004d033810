// ClientRouting; see client_routing.h.
#include "client/client_routing.h"

#include <netinet/in.h>

#include <algorithm>
#include <cstring>

namespace shardlock::lease::internal {

void ClientRouting::assign(const std::vector<std::string>& nodes) {
  if (nodes.size() <= 1) return;  // one node owns everything
  std::vector<Node> members;
  members.reserve(nodes.size());
  for (const std::string& n : nodes) members.push_back(Node{n, 1});
  router_ = std::make_unique<Router>(RouterOptions{kDefaultRouterSeed, kBucketBits});
  if (router_->assign(members) != RouterStatus::kOk) {
    router_.reset();  // duplicate addresses: fall back to the first node
    return;
  }
  snapshot_ = router_->snapshot();
  // The snapshot sorts nodes by id; map its indices back to ours.
  for (const Node& member : snapshot_->nodes()) {
    const auto it = std::find(nodes.begin(), nodes.end(), member.id);
    index_.push_back(static_cast<std::size_t>(it - nodes.begin()));
  }
}

}  // namespace shardlock::lease::internal
