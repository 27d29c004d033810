// ClientRouting: which configured node owns a key, for one LeaseClient.
// Private to src/lease/.
//
// Threading: assign() runs once, in LeaseClient::start(), before any other
// thread uses the client; node_for() then reads an immutable snapshot from
// any thread without locking.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "shardlock/lease/client/call.h"
#include "shardlock/router.h"

namespace shardlock::lease::internal {

// Key -> node index, through the Router over the configured node addresses.
// Every client must agree on the mapping, so the Router's seed and bucket
// count are fixed here: 2^16 buckets (128 KiB per client) balance a handful
// of nodes within ~1% and build in well under a millisecond, where the
// Router's default 2^22 would cost 8 MiB per LeaseClient.
class ClientRouting {
 public:
  static constexpr int kBucketBits = 16;

  // Routes over `nodes` (the configured "HOST:PORT" strings). With one node,
  // or if the Router refuses the list, every key goes to node 0.
  void assign(const std::vector<std::string>& nodes);

  // Never blocks: one hash and one table lookup in an immutable snapshot.
  [[nodiscard]] std::size_t node_for(std::string_view key) const noexcept {
    if (!snapshot_) return 0;
    const std::uint16_t owner = snapshot_->owner_index(key);
    return owner == RouterSnapshot::kNoOwner ? 0 : index_[owner];
  }

 private:
  std::unique_ptr<Router> router_;
  std::shared_ptr<const RouterSnapshot> snapshot_;
  std::vector<std::size_t> index_;
};

}  // namespace shardlock::lease::internal
