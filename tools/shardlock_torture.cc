// shardlock-torture: a Jepsen-style fault-injection test of the lease
// service on one machine. It runs the real shardlockd, lease clients in
// worker processes and a fenced resource, injects network faults, kill -9
// restarts and process pauses, then checks the history with a checker that
// shares no code with the client or server (tests/torture/).
//
// With --cluster-nodes N it runs etcd and N shardlockd nodes in one cluster
// and adds the cluster's faults (docs/cluster.md, "Torture: cluster mode").
// With --tenants N the one shardlockd runs with a tenant file, every client
// is one tenant's, and the checker also judges their rights
// (docs/reliability.md, "Tenants").
//
// Exit status: 0 no violation, 1 violations found, 2 usage, 3 the run could
// not be set up (or failed unexpectedly), 77 cluster mode without etcd
// installed (skipped).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>

#include "common/command_line.h"
#include "run.h"
#include "worker.h"
#ifdef SHARDLOCK_TORTURE_CLUSTER
#include "cluster.h"
#endif

namespace {

using shardlock::torture::TortureOptions;
using shardlock::torture::WorkerOptions;

constexpr int kExitUsage = shardlock::tools::kExitUsage;
constexpr int kExitNotSetUp = 3;

// The flags that are not TortureOptions fields as they stand.
struct RunFlags {
  // The proxy's network faults (TortureOptions::network).
  double loss = 0.05;
  double duplicate = 0.02;
  double reorder = 0.05;
  double delay = 0.05;
  int max_delay_ms = 20;
  bool quiet = false;           // no progress line
  std::string replica_timeout;  // TortureOptions::replica_timeout_ms, as a duration
};

// What runs and how hard: the server binary, the seed, the workers and
// their clients, the keys and the server's limits.
void add_workload_flags(CLI::App& app, TortureOptions& o) {
  app.add_option("--shardlockd", o.shardlockd, "path of the shardlockd binary")
      ->capture_default_str();
  app.add_option("--seed", o.seed, "seed of the nemesis, the proxy and the workload")
      ->capture_default_str();
  app.add_option("--seconds", o.fault_seconds,
                 "how long faults are injected (then they heal and liveness is judged)")
      ->capture_default_str()
      ->check(CLI::Range(1, 86400));
  app.add_option("--workers", o.workers, "worker processes (each can be paused)")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  app.add_option("--clients", o.clients_per_worker,
                 "lease clients per worker process (0: only the election workload)")
      ->capture_default_str()
      ->check(CLI::Range(0, 256));
  app.add_option("--threads-per-client", o.threads_per_client,
                 "lease clients (threads, each with its own history) that share one "
                 "LeaseClient, as a thread pool shares one client; each acquire is its own owner")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  app.add_option("--slow-retransmit-groups", o.slow_retransmit_groups,
                 "of each worker's LeaseClients (groups of --threads-per-client clients), how "
                 "many resend first after 600 ms instead of 5 ms, as a client built with a slow "
                 "initial retransmission does")
      ->capture_default_str()
      ->check(CLI::Range(0, 256));
  app.add_option("--keys", o.keys, "keys the clients contend for")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000000));
  app.add_option("--max-ttl-ms", o.max_ttl_ms,
                 "the server's max TTL (clients ask for half to all of it; also the lock-delay "
                 "and the pause length / 1.5)")
      ->capture_default_str()
      ->check(CLI::Range(50, 600000));
  app.add_option("--max-wait-ms", o.max_wait_ms, "longest wait of a waiting ACQUIRE")
      ->capture_default_str()
      ->check(CLI::Range(1, 600000));
}

// The single-node faults: the network between the clients and the server,
// kills and pauses of the processes, stalls inside a client.
void add_fault_flags(CLI::App& app, TortureOptions& o, RunFlags& flags) {
  app.add_option("--loss", flags.loss, "probability a datagram is lost (each direction)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 0.9));
  app.add_option("--duplicate", flags.duplicate, "probability a datagram is duplicated")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--reorder", flags.reorder, "probability a datagram is held back behind the next")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--delay", flags.delay, "probability a datagram is delayed")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--max-delay-ms", flags.max_delay_ms, "longest delay of a delayed datagram")
      ->capture_default_str()
      ->check(CLI::Range(0, 10000));
  app.add_option("--kills", o.kills, "kill -9 and restarts of the server")
      ->capture_default_str()
      ->check(CLI::Range(0, 1000));
  app.add_option("--server-pauses", o.server_pauses, "SIGSTOPs of the server (1.5 x max TTL)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1000));
  app.add_option("--client-pauses", o.client_pauses, "SIGSTOPs of a worker (1.5 x max TTL)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1000));
  app.add_option("--stall-per-million", o.stall_per_million,
                 "per cycle, the chance (in millionths) a client stalls 1.5 x max TTL between "
                 "its last validity check and its write (Kleppmann's pause; fencing must refuse "
                 "the late write)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1000000));
}

// The mix of lease kinds the clients take, and the election workload.
void add_lease_mix_flags(CLI::App& app, TortureOptions& o) {
  app.add_option("--read-fraction", o.read_fraction,
                 "share of client cycles that take a shared (read) lease and only read")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--permit-fraction", o.permit_fraction,
                 "share of client cycles that take one of --permits permits of a semaphore key")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--multi-fraction", o.multi_fraction,
                 "share of client cycles that take 2..3 keys all-or-nothing and write each")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--permits", o.permits, "permits (P) of every semaphore key")
      ->capture_default_str()
      ->check(CLI::Range(1, 65535));
  app.add_option("--permit-keys", o.permit_keys, "semaphore keys the permit cycles contend for")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000000));
  app.add_option("--elections", o.elections,
                 "election workload: this many names (elect-N), each with --campaigners clients "
                 "that campaign, lead a while and resign, and --observers clients that follow "
                 "the leader; checks one leader per name at a time as the clients saw it, "
                 "rising terms, and every observer's leaders in term order and each one granted")
      ->capture_default_str()
      ->check(CLI::Range(0, 1000));
  app.add_option("--campaigners", o.campaigners, "campaigners per election name")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  app.add_option("--observers", o.observers, "observers (LeaderObserver) per election name")
      ->capture_default_str()
      ->check(CLI::Range(0, 64));
}

// How the run is judged and reported.
void add_report_flags(CLI::App& app, TortureOptions& o, RunFlags& flags) {
  app.add_option("--liveness-bound-ms", o.liveness_bound_ms,
                 "after the heal, every client must acquire within this (0: lock-delay + "
                 "4 x max TTL + 2 s)")
      ->capture_default_str()
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{86400000}));
  app.add_option("--keep-history", o.history_dir, "keep the history files in this directory");
  app.add_flag("--json", o.json, "print the report as one JSON object");
  app.add_flag("--quiet", flags.quiet, "no progress line");
  app.add_flag("--unsafe-no-lock-delay", o.unsafe_no_lock_delay,
               "run the server with --lock-delay 0 (unsafe: to show the checker catches it)");
}

// A cluster fault that happens `count` times: only with --cluster-nodes.
void add_cluster_fault(CLI::App& app, CLI::Option* cluster_nodes, const char* name, int& count,
                       const char* help) {
  app.add_option(name, count, help)
      ->capture_default_str()
      ->check(CLI::Range(0, 1000))
      ->needs(cluster_nodes);
}

// Cluster mode (--cluster-nodes) and its membership, etcd and drain faults;
// returns --cluster-nodes, which the other cluster flags need.
CLI::Option* add_cluster_flags(CLI::App& app, TortureOptions& o) {
  CLI::Option* cluster_nodes =
      app.add_option("--cluster-nodes", o.cluster_nodes,
                     "cluster mode: run a real etcd and this many shardlockd nodes in one cluster "
                     "(each behind its own proxy, which it advertises; workers discover the map "
                     "from the proxies), and add the cluster faults below; --kills and "
                     "--server-pauses then hit random nodes, each pause longer than the etcd lease "
                     "TTL. 0: one shardlockd")
          ->capture_default_str()
          ->check(CLI::Range(0, 16));
  app.add_option("--etcd-lease-ttl", o.etcd_lease_ttl_s,
                 "cluster mode: the nodes' etcd lease TTL in seconds (etcd's minimum is 2)")
      ->capture_default_str()
      ->check(CLI::Range(2, 600))
      ->needs(cluster_nodes);
  app.add_option("--joins", o.joins,
                 "cluster mode: an extra node joins, then leaves with SIGTERM (membership changes)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1000))
      ->needs(cluster_nodes);
  app.add_option("--drains", o.drains,
                 "cluster mode: a node is drained (etcd key /shardlock/NAME/drain/ID), then "
                 "undrained")
      ->capture_default_str()
      ->check(CLI::Range(0, 1000))
      ->needs(cluster_nodes);
  app.add_option("--etcd-partitions", o.etcd_partitions,
                 "cluster mode: a node's connections to etcd are reset and refused for 2 x the "
                 "etcd lease TTL + 1 s (a TCP proxy between each node and etcd)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1000))
      ->needs(cluster_nodes);
  app.add_option("--client-partitions", o.client_partitions,
                 "cluster mode: every datagram between the clients and a node is dropped for "
                 "2 x max TTL")
      ->capture_default_str()
      ->check(CLI::Range(0, 1000))
      ->needs(cluster_nodes);
  // Faults shorter than the etcd lease, and overlapping ones.
  add_cluster_fault(
      app, cluster_nodes, "--short-pauses", o.short_pauses,
      "cluster mode: SIGSTOP of a node for a seeded 0.2..0.6 x the etcd lease TTL (it "
      "keeps its lease); on a seeded half, another node is drained meanwhile, so the "
      "map moves under it, and undrained later");
  add_cluster_fault(
      app, cluster_nodes, "--short-etcd-partitions", o.short_etcd_partitions,
      "cluster mode: a node cut off from etcd for a seeded 0.2..0.6 x the etcd lease TTL "
      "(it keeps its lease); on a seeded half, another node is drained meanwhile");
  add_cluster_fault(
      app, cluster_nodes, "--stalled-double-drains", o.stalled_double_drains,
      "cluster mode (3+ nodes): a node V stalls while node A is drained, A "
      "acknowledges the hand-off, node B grants A's buckets until shortly before V's "
      "stall ends and is drained too; the stall ends once B's map is out, so V reads the "
      "last map only (it skips a map, which once let V grant beside a live lease). The "
      "stall, seeded: V stopped (SIGSTOP) for at most 0.55..0.7 x the etcd lease TTL, or "
      "V's etcd answers held back in its TCP proxy 0.3 x it from A's map on. Starts a "
      "lock-delay after the cluster was last whole; both drains are undone later");
  add_cluster_fault(
      app, cluster_nodes, "--double-drains", o.double_drains,
      "cluster mode (3+ nodes): scale-down by two, a second node drained as soon as the "
      "map without the first is out; both undone later");
  add_cluster_fault(
      app, cluster_nodes, "--joins-during-drains", o.joins_during_drains,
      "cluster mode: the extra node joins as soon as a drained node's map is out; later "
      "the node is undrained and the extra node leaves");
  add_cluster_fault(app, cluster_nodes, "--kills-during-handoffs", o.kills_during_handoffs,
                    "cluster mode: kill -9 and restart, as soon as a drained node's map is out, of "
                    "that node (mid hand-off) or of a seeded heir; undrained later");
  add_cluster_fault(app, cluster_nodes, "--rolling-restarts", o.rolling_restarts,
                    "cluster mode: every node in a seeded order stopped (SIGTERM) and started with "
                    "--max-ttl raised by half the run's max TTL (and kept for later restarts)");
  add_cluster_fault(
      app, cluster_nodes, "--slow-watches", o.slow_watches,
      "cluster mode: a node's etcd answers delayed by a seeded 0.1..0.3 x the etcd lease "
      "TTL in its TCP proxy while one or (on a seeded half, with 3+ nodes) two other "
      "nodes are drained and undrained, so its map watch lags");
  return cluster_nodes;
}

// Replication (--replicas) and the faults between nodes.
void add_replication_flags(CLI::App& app, CLI::Option* cluster_nodes, TortureOptions& o,
                           RunFlags& flags) {
  // Replication (docs/cluster.md, "Replication").
  app.add_option("--replicas", o.replicas,
                 "cluster mode: every node runs with --replicas N (each bucket on a primary and "
                 "N - 1 backups); 1: no replication")
      ->capture_default_str()
      ->check(CLI::Range(1, 3))
      ->needs(cluster_nodes);
  flags.replica_timeout = std::to_string(o.replica_timeout_ms) + "ms";
  app.add_option("--replica-timeout", flags.replica_timeout,
                 "cluster mode with --replicas: the nodes' --replica-timeout (a replica not heard "
                 "from for this long is evicted), e.g. 300ms")
      ->capture_default_str()
      ->needs(cluster_nodes);
  app.add_flag("--strict-kept", o.strict_kept,
               "the kept property does not excuse a hand-off to a node that came back into the "
               "map (a restarted node takes its buckets back at once today, and its backup's "
               "holders are lost)")
      ->needs(cluster_nodes);
  add_cluster_fault(
      app, cluster_nodes, "--kills-mid-replication", o.kills_mid_replication,
      "cluster mode with --replicas 2+: kill -9 and restart of a node half the replica "
      "timeout after its peers stopped receiving its datagrams, so no backup has what "
      "it granted meanwhile (a correct node answered none of it; shows the checker "
      "biting on a SHARDLOCK_FAULT_EARLY_GRANT build)");
  add_cluster_fault(
      app, cluster_nodes, "--one-way-node-cuts", o.one_way_node_cuts,
      "cluster mode with --replicas 2+: one node's datagrams to a seeded peer dropped "
      "(the peer's still reach it) for 3 x the replica timeout + 1 s, so the peer "
      "evicts it and takes its buckets over while it still hears the peer");
  add_cluster_fault(
      app, cluster_nodes, "--slow-etcd-links", o.slow_etcd_links,
      "cluster mode with --replicas 2+: a one-way node cut while the cut node's etcd "
      "answers are delayed by a seeded 0.1..0.3 x the etcd lease TTL, so it learns of "
      "its eviction late");
  add_cluster_fault(
      app, cluster_nodes, "--node-replacements", o.node_replacements,
      "cluster mode: kill -9 of a node, its data dir wiped, and a start at the same "
      "address and port under a new id (n1 -> n1r1), as a lost disk is replaced; the "
      "workers still name that address by its first id (node_replaced in the history)");
  add_cluster_fault(app, cluster_nodes, "--node-partitions", o.node_partitions,
                    "cluster mode: every datagram between two nodes (both directions) dropped for "
                    "longer than the replica timeout (3 x it + 1 s), then healed; the nodes still "
                    "reach etcd and the clients");
}

// Tenants (docs/reliability.md, "Tenants"): the server with a tenant file,
// the clients dealt over the tenants, and the reload fault.
void add_tenant_flags(CLI::App& app, TortureOptions& o) {
  CLI::Option* tenants =
      app.add_option("--tenants", o.tenants,
                     "run shardlockd with --tenants: this many tenants (2 or more), each with its "
                     "own key and key prefix tN/ and all of them sharing shared/ (so exclusion "
                     "on a shared key is judged across tenants); the LeaseClients are dealt "
                     "round-robin over them, and now and then a client probes another tenant's "
                     "key, which must be refused. Fails the run on a refusal within a client's "
                     "rights (denied) or a grant outside them (isolation). One node only. "
                     "0: no tenants")
          ->capture_default_str()
          ->check(CLI::Range(0, 1000));
  app.add_flag("--encrypt", o.encrypt,
               "with --tenants: the even-numbered tenants (t0, t2, ...) encrypt their datagrams, "
               "the others only authenticate them, so shared keys are contended in both forms")
      ->needs(tenants);
  app.add_option("--tenant-reloads", o.tenant_reloads,
                 "with --tenants: SIGHUPs of the server after its tenant file is rewritten (the "
                 "same tenants in a seeded order), each with a lease of t0 held across it that "
                 "must stay renewable; a lost lease or a reload that did not take fails the run")
      ->capture_default_str()
      ->check(CLI::Range(0, 1000))
      ->needs(tenants);
}

// The hidden worker mode: this binary, started by the run.
CLI::App* add_worker_subcommand(CLI::App& app, WorkerOptions& w) {
  CLI::App* worker = app.add_subcommand("worker", "")->group("");
  worker->add_option("--index", w.index)->required();
  worker->add_option("--clients", w.clients)->required();
  worker->add_option("--threads-per-client", w.threads_per_client);
  worker->add_option("--slow-retransmit-groups", w.slow_retransmit_groups);
  worker->add_option("--server", w.server)->required();
  worker->add_flag("--cluster", w.cluster);
  worker->add_option("--node-names", w.node_names);
  worker->add_option("--resource", w.resource)->required();
  worker->add_option("--history", w.history_dir)->required();
  worker->add_option("--seed", w.seed)->required();
  worker->add_option("--end-ns", w.end_ns)->required();
  worker->add_option("--keys", w.keys)->required();
  worker->add_option("--ttl-ms", w.ttl_ms)->required();
  worker->add_option("--max-wait-ms", w.max_wait_ms)->required();
  worker->add_option("--stall-per-million", w.stall_per_million);
  worker->add_option("--read-fraction", w.read_fraction);
  worker->add_option("--permit-fraction", w.permit_fraction);
  worker->add_option("--multi-fraction", w.multi_fraction);
  worker->add_option("--permits", w.permits);
  worker->add_option("--permit-keys", w.permit_keys);
  worker->add_option("--elections", w.elections);
  worker->add_option("--campaigners", w.campaigners);
  worker->add_option("--observers", w.observers);
  worker->add_option("--workers", w.workers);
  worker->add_option("--election-base", w.election_base);
  worker->add_option("--tenants", w.tenants);
  worker->add_option("--tenant-dir", w.tenant_dir);
  worker->add_flag("--encrypt", w.encrypt);
  return worker;
}

// Checks the flags against each other and reads --replica-timeout into `o`;
// the usage error's exit status (the reason printed), or nullopt.
std::optional<int> check_flags(TortureOptions& o, const RunFlags& flags) {
  if (o.read_fraction + o.permit_fraction + o.multi_fraction > 1.0) {
    std::fprintf(stderr,
                 "shardlock-torture: --read-fraction + --permit-fraction + --multi-fraction "
                 "exceed 1\n");
    return kExitUsage;
  }
  if (o.clients_per_worker == 0 && o.elections == 0) {
    std::fprintf(stderr, "shardlock-torture: --clients 0 needs --elections\n");
    return kExitUsage;
  }
  if (o.cluster_nodes == 1) {
    std::fprintf(stderr, "shardlock-torture: --cluster-nodes needs at least 2 nodes (0: one)\n");
    return kExitUsage;
  }
  if (o.cluster_nodes == 2 && o.stalled_double_drains + o.double_drains > 0) {
    std::fprintf(stderr,
                 "shardlock-torture: --stalled-double-drains and --double-drains need "
                 "--cluster-nodes 3 or more\n");
    return kExitUsage;
  }
  {
    const auto timeout = shardlock::tools::parse_duration_flag(
        "--replica-timeout", flags.replica_timeout, shardlock::tools::ZeroDuration::kRejected);
    if (!timeout.error.empty()) {
      std::fprintf(stderr, "shardlock-torture: %s\n", timeout.error.c_str());
      return kExitUsage;
    }
    o.replica_timeout_ms = static_cast<int>(timeout.value.count());
  }
  if (o.node_partitions + o.kills_mid_replication + o.one_way_node_cuts + o.slow_etcd_links > 0 &&
      o.replicas < 2) {
    std::fprintf(stderr,
                 "shardlock-torture: --node-partitions, --kills-mid-replication, "
                 "--one-way-node-cuts and --slow-etcd-links need --replicas 2 or more\n");
    return kExitUsage;
  }
  if (o.tenants == 1) {
    std::fprintf(stderr,
                 "shardlock-torture: --tenants needs at least 2 tenants (0: none), or no key "
                 "is shared across tenants\n");
    return kExitUsage;
  }
  if (o.tenants > 0 && o.cluster_nodes > 0) {
    std::fprintf(stderr, "shardlock-torture: --tenants runs one node only (no --cluster-nodes)\n");
    return kExitUsage;
  }
  if (o.cluster_nodes > 0 && o.unsafe_no_data_dir) {
    std::fprintf(stderr, "shardlock-torture: a cluster node needs its data dir\n");
    return kExitUsage;
  }
  return std::nullopt;
}

int run(int argc, char** argv) {
  CLI::App app{
      "shardlock-torture: kill, pause and partition a shardlockd and its clients (exclusive, "
      "shared, permit and multi-key leases), then check that no exclusive holder shared its key, "
      "no semaphore had more than its permits, multi-key grants were all-or-nothing, tokens "
      "only rose, the fenced resource lost no increment, nothing was granted during "
      "lock-delay, and every client recovered. With --cluster-nodes, the same against a cluster "
      "of shardlockd nodes and etcd (docs/cluster.md, \"Torture: cluster mode\"), plus that "
      "every grant came from its key's owner in the map of its token's epoch. With --elections, "
      "leader elections too: one leader per name at a time, terms rising, observers' leaders in "
      "term order. With --tenants, tenants with their own keys and prefixes and a shared one: "
      "no refusal within a tenant's rights, no grant outside them"};
  app.set_version_flag("--version", "shardlock-torture 0.1.0");
  TortureOptions o;
  const std::filesystem::path self_dir = std::filesystem::path(argv[0]).parent_path();
  o.shardlockd = (self_dir / "shardlockd").string();
  RunFlags flags;
  add_workload_flags(app, o);
  add_fault_flags(app, o, flags);
  add_lease_mix_flags(app, o);
  add_report_flags(app, o, flags);
  CLI::Option* cluster_nodes = add_cluster_flags(app, o);
  add_replication_flags(app, cluster_nodes, o, flags);
  add_tenant_flags(app, o);
  app.add_flag("--unsafe-no-data-dir", o.unsafe_no_data_dir,
               "run the server without a data dir, so tokens restart after kill -9 (unsafe: to "
               "show the checker catches it)");

  WorkerOptions w;
  CLI::App* worker = add_worker_subcommand(app, w);

  // Judges a kept history again (--keep-history), with the run's flags
  // (--cluster-nodes, --replicas, --max-ttl-ms, ...) before the subcommand.
  std::string history;
  CLI::App* check = app.add_subcommand(
      "check", "judge a history directory kept by an earlier run (--keep-history) again");
  check->add_option("history", history, "the history directory")->required();

  if (const auto status =
          shardlock::tools::parse_command_line(app, argc, argv, "shardlock-torture")) {
    return *status;
  }
  if (worker->parsed()) return shardlock::torture::run_worker(w);
  if (const auto status = check_flags(o, flags)) return *status;
#ifdef SHARDLOCK_TORTURE_CLUSTER
  const shardlock::torture::ClusterFactory make_cluster = shardlock::torture::make_cluster;
#else
  const shardlock::torture::ClusterFactory make_cluster = nullptr;
  if (o.cluster_nodes > 0) {
    std::fprintf(stderr, "shardlock-torture: this build has no cluster mode (no grpc++)\n");
    return kExitUsage;
  }
#endif
  if (check->parsed()) {
    const std::int64_t bound = o.liveness_bound_ms > 0
                                   ? o.liveness_bound_ms
                                   : shardlock::torture::default_liveness_bound_ms(o);
    return shardlock::torture::check_history(history, o, bound);
  }
  o.network = {flags.loss, flags.duplicate, flags.reorder, flags.delay, flags.max_delay_ms};
  o.progress = !flags.quiet;
  if (!std::filesystem::exists(o.shardlockd)) {
    std::fprintf(stderr, "shardlock-torture: no shardlockd at %s (use --shardlockd)\n",
                 o.shardlockd.c_str());
    return kExitUsage;
  }
  try {
    return shardlock::torture::run_torture(o, make_cluster);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "shardlock-torture: %s\n", e.what());
    return kExitNotSetUp;
  }
}

}  // namespace

int main(int argc, char** argv) {
  return shardlock::tools::run_main("shardlock-torture", kExitNotSetUp, run, argc, argv);
}
