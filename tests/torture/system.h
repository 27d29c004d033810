// system.h: the system under test of a torture run, as the nemesis and the
// workers see it: one shardlockd behind a UdpProxy (run.cc), or a cluster of
// shardlockd nodes with etcd, each node behind its own proxies (cluster.h).
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "proxy.h"

namespace shardlock::torture {

// The nemesis's discrete faults.
enum class Fault : std::uint8_t {
  kKill,             // kill -9 of a server, then a restart (same port, data dir, id)
  kServerPause,      // SIGSTOP of a server, then SIGCONT
  kClientPause,      // SIGSTOP of a worker, then SIGCONT (run.cc)
  kJoin,             // cluster: an extra node joins, later leaves (SIGTERM)
  kDrain,            // cluster: a node is drained, later undrained
  kEtcdPartition,    // cluster: a node is cut off from etcd, later healed
  kClientPartition,  // cluster: the clients are cut off from a node, later healed
  // Cluster faults shorter than the etcd lease, and overlapping ones
  // (docs/cluster.md, "Torture: cluster mode").
  kShortPause,          // a node stopped for less than its etcd lease, maybe while a map moves
  kShortEtcdPartition,  // a node cut off from etcd for less than its lease, likewise
  kStalledDoubleDrain,  // a node stopped across two drains back to back (a skipped map's shape)
  kDoubleDrain,         // scale-down: two drains back to back, later undone
  kJoinDuringDrain,     // the extra node joins while a drain moves buckets
  kKillDuringHandoff,   // kill -9 of the drained node or an heir while the hand-off runs
  kRollingRestart,      // every node restarted in turn with a raised --max-ttl
  kSlowWatch,           // a node's etcd answers delayed while maps move
  kNodePartition,       // replication: two nodes cut off from each other, later healed
  kKillMidReplication,  // replication: kill -9 of a node whose datagrams to its peers were dropped
  kOneWayNodeCut,       // replication: one node's datagrams to a peer dropped, the peer's not
  kSlowEtcdLink,        // replication: a one-way cut while the cut node sees etcd late
  kReplaceNode,         // kill -9, data dir wiped, restarted at its address under a new id
  kTenantReload,        // tenants: SIGHUP reloads the rewritten tenant file, a lease held across
};
[[nodiscard]] const char* fault_name(Fault fault) noexcept;

class SystemUnderTest {
 public:
  virtual ~SystemUnderTest() = default;

  // Starts everything and waits until clients can be served. False, with
  // `error` set, when it cannot.
  [[nodiscard]] virtual bool start(std::string& error) = 0;
  // The worker arguments that point its clients at the system.
  [[nodiscard]] virtual std::vector<std::string> worker_arguments() const = 0;
  // The network faults of every client-facing proxy.
  virtual void set_network_faults(const ProxyFaults& faults) = 0;
  // Summed over every client-facing proxy.
  [[nodiscard]] virtual ProxyCounters counters() const = 0;
  // How long, at the most, one call of inject() blocks (the nemesis ends its
  // plan that long before the faults end, so every fault heals in time).
  [[nodiscard]] virtual std::int64_t longest_fault_ms() const = 0;
  // After the heal, the bound within which every client must be granted.
  [[nodiscard]] virtual std::int64_t liveness_bound_ms() const = 0;
  // Injects one server-side fault (not kClientPause), recorded in the
  // nemesis history, and heals it before returning. False, with `error`
  // set, when the system could not be brought back (the run cannot go on).
  [[nodiscard]] virtual bool inject(Fault fault, std::mt19937_64& random, std::string& error) = 0;
  // Stops every process and proxy.
  virtual void stop() = 0;
  // What failed by itself, one line each: a process that died (a crash, a
  // sanitizer report), or the harness's own watch on the system. Any of it
  // fails the run.
  [[nodiscard]] virtual std::string crashes() = 0;
};

}  // namespace shardlock::torture
