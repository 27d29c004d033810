// Built against an installed shardlock through find_package(shardlock): one
// call into each installed layer, so a missing header, library or transitive
// dependency fails this build. Built twice (CMakeLists.txt): the locks alone,
// then with the lease component (liburing, libsodium), which also carries
// the cluster's map values.
#include <memory>
#include <mutex>
#include <string>

#include "shardlock/lock_table.h"
#include "shardlock/mutex.h"
#include "shardlock/router.h"
#include "shardlock/spin_lock.h"
#if defined(SHARDLOCK_CONSUMER_HAS_LEASE)
#include "shardlock/cluster/cluster_map.h"
#include "shardlock/lease/server/server.h"
// The pre-rooms path, through its forwarding header (kept for one release).
#include "shardlock/lease/client.h"
#endif

int main() {
  shardlock::SpinLock lock;
  int value = 0;
  {
    std::scoped_lock guard(lock);
    ++value;
  }

  shardlock::LockTable<shardlock::Mutex> table(64, 42);
  {
    auto guard = table.lock("consumer");
    ++value;
  }

  shardlock::Router router;
  if (router.add("node-a") != shardlock::RouterStatus::kOk) return 1;
  if (router.owner("consumer") != "node-a") return 1;

#if defined(SHARDLOCK_CONSUMER_HAS_LEASE)
  // The cluster's map types come with the lease component: no gRPC needed
  // to route over a map.
  std::unique_ptr<shardlock::cluster::ClusterRouting> routing;
  const shardlock::cluster::ClusterMap map{1, {{"node-a", "127.0.0.1:7700", 1}}};
  if (shardlock::cluster::ClusterRouting::build(map, routing) != shardlock::RouterStatus::kOk ||
      routing->owner_of("consumer") == nullptr) {
    return 1;
  }

  shardlock::lease::LeaseServerOptions options;
  options.lock_delay = std::chrono::milliseconds(0);
  shardlock::lease::LeaseServer server(options);
  if (server.start()) return 1;
  if (server.port() == 0) return 1;
  // A client type through the forwarding header's path.
  shardlock::lease::LeaseClientOptions client_options;
  client_options.nodes.push_back("127.0.0.1:" + std::to_string(server.port()));
  shardlock::lease::LeaseClient client(client_options);
  if (client.start()) return 1;
  server.stop();
#endif

  return (value == 2 && !lock.is_locked()) ? 0 : 1;
}
