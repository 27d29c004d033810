// ClientRouting and same_address(); see client_routing.h.
#include "client_routing.h"

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

bool same_address(const Endpoint& a, const Endpoint& b) noexcept {
  if (a.address.ss_family != b.address.ss_family) return false;
  if (a.address.ss_family == AF_INET6) {
    const auto& x = reinterpret_cast<const sockaddr_in6&>(a.address);
    const auto& y = reinterpret_cast<const sockaddr_in6&>(b.address);
    return x.sin6_port == y.sin6_port && x.sin6_scope_id == y.sin6_scope_id &&
           std::memcmp(&x.sin6_addr, &y.sin6_addr, sizeof x.sin6_addr) == 0;
  }
  const auto& x = reinterpret_cast<const sockaddr_in&>(a.address);
  const auto& y = reinterpret_cast<const sockaddr_in&>(b.address);
  return x.sin_port == y.sin_port && x.sin_addr.s_addr == y.sin_addr.s_addr;
}

}  // namespace shardlock::lease::internal
