// ClusterDirectory: a cluster-mode LeaseClient's view of the cluster's map
// (docs/cluster.md), and its refresh. Private to src/lease/.
//
// A map is an immutable ClusterMapView: the members (id, address, weight)
// and their epoch, a Router snapshot over the members, and each member's
// resolved endpoint. Routing reads the current view through a shared_ptr
// copied under a mutex and keeps using it however long it likes; a refresh
// builds a new view off to the side and swaps it in under the same mutex.
// No atomics: the mutex orders the view's construction before every read.
//
// The Router is configured exactly as the nodes' ClusterRouting::build()
// (src/cluster/etcd/membership.cc) configures theirs, so both sides agree on every
// key's owner: one Node{member id, member weight} per member, the default
// seed (kDefaultRouterSeed) and 2^16 buckets (ClientRouting::kBucketBits).
//
// Threading: current(), owner_of() and refresh() may be called from any
// thread. At most one refresh runs at a time; its MAP calls complete on the
// call engine's I/O thread, which is where the new view is built and where
// the engine is told (MapCaller::on_map_refreshed()) to send the calls it
// parked until then. Endpoints are interned for the directory's lifetime,
// so a `const Endpoint*` taken from any view stays valid as long as the
// client lives.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <unordered_map>
#include <vector>

#include "shardlock/internal/thread_annotations.h"
#include "shardlock/lease/client/call.h"
#include "shardlock/lock_guard.h"
#include "shardlock/mutex.h"
#include "shardlock/router.h"

namespace shardlock::lease::internal {

// What the directory needs from the call engine that owns it: one MAP call
// sent, and word that a refresh ended. The engine implements it, so the
// directory sits below the engine and never sees it.
class MapCaller {
 public:
  // Sends MAP to `to` for the page that starts at `first_member`; `done`
  // gets the answer (or the call's failure), on the engine's I/O thread.
  virtual void call_map(const Endpoint* to, std::uint32_t first_member, CallCompletion done) = 0;
  // A refresh ended, successful or not: send the calls parked for it.
  virtual void on_map_refreshed() = 0;

 protected:
  ~MapCaller() = default;
};

// One map, immutable once built.
struct ClusterMapView {
  std::uint64_t epoch = 0;
  std::vector<MapMember> members;          // sorted by id: the Router's node order
  std::vector<const Endpoint*> endpoints;  // endpoints[i]: members[i]'s address
  std::shared_ptr<const RouterSnapshot> router;

  // The index in `members` of the member that owns `key`.
  [[nodiscard]] std::size_t owner_index(std::string_view key) const noexcept {
    const std::uint16_t owner = router->owner_index(key);
    return owner == RouterSnapshot::kNoOwner ? 0 : owner;
  }
  [[nodiscard]] const Endpoint* owner_of(std::string_view key) const noexcept {
    return endpoints[owner_index(key)];
  }
};

// Resolved addresses, each resolved once and kept for the table's life, so
// pointers into it stay valid while map views come and go.
class EndpointTable {
 public:
  // Members must have this address family (that of the client's socket).
  explicit EndpointTable(int family) noexcept : family_(family) {}
  // The endpoint of `address`, resolved on first use (may block on DNS for a
  // host name); null when it does not resolve or is of another family, with
  // the reason in `detail`.
  const Endpoint* intern(const std::string& address, std::string& detail)
      SHARDLOCK_EXCLUDES(mutex_);

 private:
  const int family_;
  Mutex mutex_;
  std::deque<Endpoint> endpoints_ SHARDLOCK_GUARDED_BY(mutex_);  // a deque: never moves them
  std::unordered_map<std::string, const Endpoint*> by_address_ SHARDLOCK_GUARDED_BY(mutex_);
};

// Collects the pages of one map from one node's MAP_REPLYs.
class MapAssembler {
 public:
  enum class Step : std::uint8_t {
    kMore,    // ask for the next page: MAP with first_member = next_first_member()
    kDone,    // the map is complete: epoch() and members()
    kFailed,  // this node gave no usable map: error()
  };
  // Takes the answer to the last MAP sent to `node` (for error messages).
  Step add(const CallResult& page, std::string_view node);
  [[nodiscard]] std::uint32_t next_first_member() const noexcept {
    return static_cast<std::uint32_t>(members_.size());
  }
  [[nodiscard]] std::uint64_t epoch() const noexcept { return epoch_; }
  [[nodiscard]] std::vector<MapMember>& members() noexcept { return members_; }
  [[nodiscard]] const std::string& error() const noexcept { return error_; }

 private:
  // A node whose map changes between pages is asked again from the start,
  // at most this often.
  static constexpr int kMaxRestarts = 4;
  std::uint64_t epoch_ = 0;  // 0: no page yet
  std::uint32_t member_count_ = 0;
  int restarts_ = 0;
  std::vector<MapMember> members_;
  std::string error_;
};

// Builds the view of `members` at `epoch`: sorts them by id, resolves their
// addresses in `endpoints` and routes over them. False, with the reason in
// `detail`, for a map the Router refuses (a repeated id, a weight above
// RouterSnapshot::kMaxWeight) or with an address that does not resolve.
[[nodiscard]] bool build_view(std::uint64_t epoch, std::vector<MapMember> members,
                              EndpointTable& endpoints, std::shared_ptr<const ClusterMapView>& out,
                              std::string& detail);

class ClusterDirectory {
 public:
  // `seeds`: the configured nodes, asked at start and when no member answers.
  // `engine` sends the MAP calls; both must outlive the directory's use.
  ClusterDirectory(MapCaller& engine, std::vector<const Endpoint*> seeds, int family);

  // Fetches the first map from the seeds, in turn, and blocks until one
  // gives it or all have failed (then `detail` says why, seed by seed). The
  // engine must be running; not from its I/O thread.
  [[nodiscard]] std::error_code discover(std::string& detail) SHARDLOCK_EXCLUDES(mutex_);

  // The current map; null before discover() succeeded.
  [[nodiscard]] std::shared_ptr<const ClusterMapView> current() const SHARDLOCK_EXCLUDES(mutex_) {
    LockGuard lock(mutex_);
    return view_;
  }

  // Starts fetching a newer map, from `first` (the node that redirected,
  // whose map is newer), then the current members, then the seeds, and
  // `last` (a node that stopped answering) only after all of them, unless a
  // refresh is already running. When it ends, successful or not, the engine
  // sends the calls it parked for it (MapCaller::on_map_refreshed()). Never
  // blocks.
  void refresh(const Endpoint* first, const Endpoint* last = nullptr) SHARDLOCK_EXCLUDES(mutex_);

 private:
  struct Fetch;
  // Sends the MAP for the fetch's next page to its current source.
  void fetch_page(const std::shared_ptr<Fetch>& fetch);
  void on_page(const std::shared_ptr<Fetch>& fetch, const CallResult& page);
  // Adopts `view` if it is newer than the current one.
  void adopt(std::shared_ptr<const ClusterMapView> view) SHARDLOCK_EXCLUDES(mutex_);

  MapCaller& engine_;
  const std::vector<const Endpoint*> seeds_;
  EndpointTable endpoints_;

  mutable Mutex mutex_;
  std::shared_ptr<const ClusterMapView> view_ SHARDLOCK_GUARDED_BY(mutex_);
  bool refreshing_ SHARDLOCK_GUARDED_BY(mutex_) = false;
};

}  // namespace shardlock::lease::internal
