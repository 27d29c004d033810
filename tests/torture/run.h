// run.h: one shardlock-torture run — the system under test, the nemesis
// that injects faults into it, and the checker's verdict.
//
//   * shardlockd runs as a child process with a data dir; the nemesis
//     kill -9s and restarts it on the same port, and pauses it (SIGSTOP)
//     for longer than the max TTL.
//   * Worker processes (this binary again, in worker mode; worker.h) run the
//     lease clients; the nemesis pauses whole workers for longer than the
//     max TTL (Kleppmann's paused client).
//   * A UdpProxy (proxy.h) between the clients and the server loses,
//     duplicates, reorders and delays datagrams during the fault phase.
//   * A FencedResource (resource.h) in this process holds the counters.
//   * With tenants (tenancy.h), the server runs with a tenant file the run
//     writes, every LeaseClient is one tenant's, and the nemesis also makes
//     the server reload that file (SIGHUP) while a lease is held across it.
//   * Then the faults heal, the run goes on long enough to judge liveness,
//     and the history is read back and checked (checker.h), which shares no
//     code with the lease client or server.
//
// Cluster mode (cluster_nodes >= 2; cluster.h): a real etcd and that many
// shardlockd nodes in one cluster, each behind its own UdpProxy (the
// address it advertises, so the map sends clients through it) and its own
// TcpProxy to etcd; the workers discover the map from the proxies. The
// nemesis also kill -9s and pauses nodes, adds and removes a node, drains
// nodes, and partitions a node from etcd or from the clients.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include "checker.h"
#include "proxy.h"
#include "recorder.h"
#include "system.h"

namespace shardlock::torture {

struct TortureOptions {
  std::string shardlockd;  // the daemon's path
  std::uint64_t seed = 1;
  int fault_seconds = 20;      // how long faults are injected
  int workers = 4;             // worker processes
  int clients_per_worker = 4;  // lease clients per worker
  int threads_per_client = 1;  // of them, how many share one LeaseClient
  // Of each worker's LeaseClients, how many retransmit slowly (a first
  // resend after 600 ms, as a documented client argument allows): hole 1
  // was reached through a client like that.
  int slow_retransmit_groups = 0;
  int keys = 8;
  int max_ttl_ms = 1000;               // the server's --max-ttl; clients ask for up to this
  int max_wait_ms = 1000;              // the longest wait an ACQUIRE asks for
  ProxyFaults network;                 // during the fault phase
  int kills = 2;                       // kill -9 + restart of the server
  int server_pauses = 1;               // SIGSTOP of the server for 1.5 x max TTL
  int client_pauses = 2;               // SIGSTOP of a worker for 1.5 x max TTL
  int stall_per_million = 2000;        // per cycle: a client stalls 1.5 x max TTL before writing
  std::int64_t liveness_bound_ms = 0;  // 0: lock-delay + 4 x max TTL + 2 s
  std::string history_dir;             // keep the history here (default: a temp dir, removed)
  bool json = false;
  bool progress = true;
  // The workload's mix of lease kinds (worker.h); the rest is exclusive.
  double read_fraction = 0.2;    // shared (read) leases
  double permit_fraction = 0.1;  // permits of semaphore keys
  double multi_fraction = 0.1;   // multi-key all-or-nothing leases
  int permits = 2;               // P of every semaphore key
  int permit_keys = 2;           // semaphore keys
  // The election workload (worker.h, "Elections"): names, and campaigners
  // and observers per name, dealt round-robin over the workers.
  int elections = 0;
  int campaigners = 2;
  int observers = 1;
  // Deliberately unsafe servers, to show the checker bites.
  bool unsafe_no_lock_delay = false;  // --lock-delay 0
  bool unsafe_no_data_dir = false;    // tokens restart from 1 after kill -9
  // Cluster mode: 0 runs one shardlockd; N >= 2 runs N nodes and etcd.
  int cluster_nodes = 0;
  int etcd_lease_ttl_s = 2;   // the nodes' --etcd-lease-ttl (etcd's minimum is 2 s)
  int joins = 0;              // an extra node joins, then leaves (SIGTERM)
  int drains = 0;             // a node is drained, then undrained
  int etcd_partitions = 0;    // a node is cut off from etcd past its lease, then healed
  int client_partitions = 0;  // the clients are cut off from a node, then healed
  // Faults shorter than the etcd lease, and overlapping ones (cluster.h).
  int short_pauses = 0;           // a node SIGSTOPped for less than its etcd lease
  int short_etcd_partitions = 0;  // a node cut off from etcd for less than its lease
  int stalled_double_drains = 0;  // a node stopped across two back-to-back drains
  int double_drains = 0;          // two drains back to back (scale-down by two)
  int joins_during_drains = 0;    // the extra node joins while a drain moves buckets
  int kills_during_handoffs = 0;  // kill -9 of the drained node or an heir mid hand-off
  int rolling_restarts = 0;       // every node restarted in turn, --max-ttl raised
  int slow_watches = 0;           // a node's etcd answers delayed while maps move
  // Replication: every node runs with --replicas and
  // --replica-timeout; 1 is no replication.
  int replicas = 1;
  int replica_timeout_ms = 300;
  int node_partitions = 0;  // two nodes cut off from each other past the replica timeout
  // kill -9 of a node half a replica timeout after its peers stopped
  // receiving its datagrams: no backup has what it granted meanwhile.
  int kills_mid_replication = 0;
  // A node's datagrams to a peer dropped one way only, past the
  // replica timeout (the peer evicts it while it still hears the peer); and
  // the same with the cut node's etcd link delayed, so it sees the map that
  // evicted it late (hole 1's two ways in).
  int one_way_node_cuts = 0;
  int slow_etcd_links = 0;
  // A node killed -9, its data dir wiped, and started again at its address
  // (same proxy, same server port) under a new id, as the runbook says a
  // lost disk is (hole 5: a backup matched the new node's stream to the
  // dead id's replica by address).
  int node_replacements = 0;
  bool strict_kept = false;  // CheckOptions::kept_excuses_rejoins off
  // Tenants (tenancy.h), one node only: 0 runs the server without a key;
  // N >= 2 runs it with --tenants, each tenant with its own key and prefix
  // and all of them sharing "shared/", the LeaseClients dealt over them.
  int tenants = 0;
  bool encrypt = false;    // the even-numbered tenants encrypt
  int tenant_reloads = 0;  // SIGHUP reloads of the rewritten tenant file, a lease held across
};

// Builds cluster mode's system under test (cluster.h: make_cluster) in the
// run's scratch directory, recording into the nemesis history.
using ClusterFactory = std::unique_ptr<SystemUnderTest> (*)(const TortureOptions& options,
                                                            const std::filesystem::path& scratch,
                                                            const Recorder& nemesis);

// The exit status of a cluster run where etcd is not installed.
inline constexpr int kExitSkipped = 77;

// Runs and prints the report (a table, or JSON) to stdout. Returns the exit
// status: 0 no violation, 1 violations, 3 the run could not be set up,
// kExitSkipped cluster mode without etcd. Cluster mode needs `make_cluster`
// (the tool passes it where the build has the cluster layer; the harness
// library itself links no gRPC).
int run_torture(const TortureOptions& options, ClusterFactory make_cluster = nullptr);

// After the heal, the bound within which every client must be granted:
// for one node a lock-delay + 4 x max TTL + 2 s; for a cluster, a bucket's
// new owner waits out the lock-delay (max TTL + etcd lease TTL + margin)
// after the old owner's etcd lease ends, and a map change takes up to an
// etcd lease TTL to notice; then the clients' retries.
[[nodiscard]] std::int64_t default_liveness_bound_ms(const TortureOptions& options);

// The checker's options for a run with `options`: what the kept property
// needs to know of the nodes (replicas, timeouts) and the workers.
[[nodiscard]] CheckOptions check_options(const TortureOptions& options,
                                         std::int64_t liveness_bound_ms);

// Judges a kept history directory again (the tool's `check`), as a run with
// `options` would; prints the report. 0 clean, 1 violations, 3 unreadable.
int check_history(const std::string& dir, const TortureOptions& options,
                  std::int64_t liveness_bound_ms);

}  // namespace shardlock::torture
