// ClusterDirectory, MapAssembler, build_view and EndpointTable; see
// cluster_directory.h.
#include "client/cluster_directory.h"

#include <sys/socket.h>

#include <algorithm>
#include <condition_variable>
#include <utility>

#include "client/client_routing.h"

namespace shardlock::lease::internal {

// ------------------------------------------------------------ EndpointTable

const Endpoint* EndpointTable::intern(const std::string& address, std::string& detail) {
  LockGuard lock(mutex_);
  if (const auto it = by_address_.find(address); it != by_address_.end()) return it->second;
  Endpoint endpoint;
  if (parse_endpoint(address, endpoint)) {
    detail = "member address '" + address + "' does not resolve";
    return nullptr;
  }
  if (endpoint.address.ss_family != family_) {
    detail = "member address '" + address + "' is not of the seeds' address family";
    return nullptr;
  }
  endpoints_.push_back(std::move(endpoint));
  const Endpoint* interned = &endpoints_.back();
  by_address_.emplace(address, interned);
  return interned;
}

// ------------------------------------------------------------- MapAssembler

MapAssembler::Step MapAssembler::add(const CallResult& page, std::string_view node) {
  const std::string name(node);
  if (page.error || page.reply != MessageType::kMapReply) {
    error_ = name + ": no map (" +
             (page.error ? page.error.message() : std::string(to_string(page.reply))) + ")";
    return Step::kFailed;
  }
  if (page.epoch == 0) {
    error_ = name + ": not a cluster node (its map has epoch 0)";
    return Step::kFailed;
  }
  if (epoch_ != 0 && (page.epoch != epoch_ || page.member_count != member_count_)) {
    // The map changed between two pages: read the new one from the start.
    if (++restarts_ > kMaxRestarts) {
      error_ = name + ": its map kept changing while it was read";
      return Step::kFailed;
    }
    epoch_ = 0;
    members_.clear();
    return Step::kMore;
  }
  if (page.member_count == 0 || page.member_count > RouterSnapshot::kMaxNodes) {
    error_ = name + ": a map of " + std::to_string(page.member_count) + " members";
    return Step::kFailed;
  }
  if (page.first_member != members_.size() || page.members.empty() ||
      members_.size() + page.members.size() > page.member_count) {
    error_ = name + ": a MAP_REPLY page that does not continue the map";
    return Step::kFailed;
  }
  epoch_ = page.epoch;
  member_count_ = page.member_count;
  members_.insert(members_.end(), page.members.begin(), page.members.end());
  return members_.size() == member_count_ ? Step::kDone : Step::kMore;
}

// --------------------------------------------------------------- build_view

bool build_view(std::uint64_t epoch, std::vector<MapMember> members, EndpointTable& endpoints,
                std::shared_ptr<const ClusterMapView>& out, std::string& detail) {
  // Exactly what ClusterRouting::build() does on the nodes: a Node per
  // member (id, weight), the default seed, 2^16 buckets.
  std::vector<Node> nodes;
  nodes.reserve(members.size());
  for (const MapMember& m : members) nodes.push_back(Node{m.id, m.weight});
  Router router(RouterOptions{kDefaultRouterSeed, ClientRouting::kBucketBits});
  if (const RouterStatus status = router.assign(nodes); status != RouterStatus::kOk) {
    detail = "a map the router refuses (" + std::string(to_string(status)) + ")";
    return false;
  }
  auto view = std::make_shared<ClusterMapView>();
  view->epoch = epoch;
  view->router = router.snapshot();  // outlives the Router
  // The snapshot keeps its nodes sorted by id; members follow its order, so
  // its owner indices are member indices.
  std::sort(members.begin(), members.end(),
            [](const MapMember& a, const MapMember& b) { return a.id < b.id; });
  for (const Node& node : view->router->nodes()) {
    const auto it =
        std::lower_bound(members.begin(), members.end(), node.id,
                         [](const MapMember& m, const std::string& id) { return m.id < id; });
    if (it == members.end() || it->id != node.id) {
      detail = "the router reordered the map's members";  // cannot happen: same ids
      return false;
    }
    const Endpoint* endpoint = endpoints.intern(it->address, detail);
    if (endpoint == nullptr) return false;
    view->members.push_back(*it);
    view->endpoints.push_back(endpoint);
  }
  out = std::move(view);
  return true;
}

// --------------------------------------------------------- ClusterDirectory

// One map fetch: the sources to ask in turn and the pages read so far.
struct ClusterDirectory::Fetch {
  std::vector<const Endpoint*> sources;
  std::size_t source = 0;
  MapAssembler assembler;
  std::string failures;  // "; "-separated, one per source that failed
  // discover(): called once the fetch ends (true: a map was adopted). A
  // refresh has none, and tells the engine instead.
  std::function<void(bool)> done;
};

ClusterDirectory::ClusterDirectory(MapCaller& engine, std::vector<const Endpoint*> seeds,
                                   int family)
    : engine_(engine), seeds_(std::move(seeds)), endpoints_(family) {}

std::error_code ClusterDirectory::discover(std::string& detail) {
  struct Outcome {
    std::mutex mutex;
    std::condition_variable cv;
    bool finished = false;
    bool ok = false;
  };
  auto outcome = std::make_shared<Outcome>();
  auto fetch = std::make_shared<Fetch>();
  fetch->sources = seeds_;
  fetch->done = [outcome](bool ok) {
    {
      std::lock_guard lock(outcome->mutex);
      outcome->finished = true;
      outcome->ok = ok;
    }
    outcome->cv.notify_one();
  };
  fetch_page(fetch);
  std::unique_lock lock(outcome->mutex);
  outcome->cv.wait(lock, [&] { return outcome->finished; });
  if (outcome->ok) return {};
  detail = "no seed gave the cluster's map: " + fetch->failures;
  return LeaseErrc::kUnreachable;
}

void ClusterDirectory::refresh(const Endpoint* first, const Endpoint* last) {
  auto fetch = std::make_shared<Fetch>();
  {
    LockGuard lock(mutex_);
    if (refreshing_) return;
    refreshing_ = true;
    // The node that redirected first (its map is newer), then the members
    // of ours, then the seeds; each once.
    const auto add = [&fetch, last](const Endpoint* e) {
      if (e != nullptr && e != last &&
          std::find(fetch->sources.begin(), fetch->sources.end(), e) == fetch->sources.end()) {
        fetch->sources.push_back(e);
      }
    };
    add(first);
    if (view_) {
      for (const Endpoint* e : view_->endpoints) add(e);
    }
    for (const Endpoint* e : seeds_) add(e);
    if (last != nullptr) fetch->sources.push_back(last);
  }
  fetch_page(fetch);
}

void ClusterDirectory::fetch_page(const std::shared_ptr<Fetch>& fetch) {
  engine_.call_map(fetch->sources[fetch->source], fetch->assembler.next_first_member(),
                   [this, fetch](const CallResult& page) { on_page(fetch, page); });
}

void ClusterDirectory::on_page(const std::shared_ptr<Fetch>& fetch, const CallResult& page) {
  const std::string& name = fetch->sources[fetch->source]->text;
  const MapAssembler::Step step = fetch->assembler.add(page, name);
  if (step == MapAssembler::Step::kMore) {
    fetch_page(fetch);
    return;
  }
  bool adopted = false;
  if (step == MapAssembler::Step::kDone) {
    std::shared_ptr<const ClusterMapView> view;
    std::string detail;
    if (build_view(fetch->assembler.epoch(), std::move(fetch->assembler.members()), endpoints_,
                   view, detail)) {
      adopt(std::move(view));
      adopted = true;
    } else {
      fetch->failures += name + ": " + detail;
    }
  } else {
    fetch->failures += fetch->assembler.error();
  }
  // The client is shutting down: no other source will answer either.
  const bool stopping = page.error == LeaseErrc::kNotStarted;
  if (!adopted && !stopping && ++fetch->source < fetch->sources.size()) {
    fetch->failures += "; ";
    fetch->assembler = MapAssembler{};
    fetch_page(fetch);
    return;
  }
  if (fetch->done) {
    fetch->done(adopted);
    return;
  }
  {
    LockGuard lock(mutex_);
    refreshing_ = false;
  }
  engine_.on_map_refreshed();
}

void ClusterDirectory::adopt(std::shared_ptr<const ClusterMapView> view) {
  LockGuard lock(mutex_);
  // Epochs only rise: an older map (from a node that is behind) is ignored.
  if (!view_ || view->epoch > view_->epoch) view_ = std::move(view);
}

}  // namespace shardlock::lease::internal
