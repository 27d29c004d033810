// worker.h: one worker process of a torture run. It runs `clients` lease
// clients, each on its own thread with its own history, looping until
// end_ns over cycles of four kinds, picked per cycle by the client's seeded
// random stream. Each group of `threads_per_client` of them shares one
// LeaseClient, as the threads of a pool share one client: every acquire is
// an owner of its own, so the checker judges them as separate clients.
// The cycles:
//
//   exclusive  acquire a key of a small set (key-N), sometimes renew it,
//              read the key's counter from the fenced resource, write
//              counter + 1 with the lease's token, release;
//   shared     (read_fraction) a shared lease on such a key, one fenced read
//              of its counter (a reader never writes), a stay of up to
//              1/16 of the max TTL so readers overlap, release. The read
//              raises the key's fence to the reader's token, so an exclusive
//              holder that lost its lease cannot write under a reader; a
//              reader whose token is below a concurrent reader's is refused
//              ("read refused");
//   permit     (permit_fraction) one of `permits` permits of a semaphore key
//              (sem-N, a separate set: a key in use is a lock or a
//              semaphore, never both), held up to a quarter of the max TTL
//              (sometimes past the watchdog's first renewal), release;
//   multi      (multi_fraction) 2..3 distinct key-N keys exclusive (in
//              a cluster, keys the client's map gives one node, as
//              acquire_many requires), all-or-nothing, then each key's counter
//              incremented as an exclusive holder does, with that key's own
//              token, then each lease released.
//
// The stays are short so the exclusive cycles, which the write properties
// judge, keep most of the run's time. Every acquire is a try-acquire a
// quarter of the time, else waits a bounded time. Every step is recorded
// (history.h) in the client's own file, with the client-side expiry it
// relied on converted to CLOCK_MONOTONIC.
//
// Elections (`elections` > 0): names elect-0, elect-1, ..., each
// with `campaigners` campaigners and `observers` observers, every one on its
// own thread with its own LeaseClient. Role r of them (campaigners of a
// name first, then its observers, name after name) runs in worker
// r % workers as client election_base + r, so the nemesis's pauses hit
// leaders, waiting campaigners and observers alike.
//
//   campaigner  Election::campaign("<client>.<op>") with a TTL of half to
//               all the max and a wait of max_wait_ms; once elected, holds
//               for up to 3/4 of max_wait_ms (past the watchdog's renewals),
//               asking leading() every TTL/16 or so and recording each yes
//               as a lead event stamped before the question, so the history
//               never claims more leadership than the client had; stops at
//               the first no (a loss: on_lost records it as deposed), then
//               resigns, and pauses up to TTL/4 before campaigning again.
//               A campaign that ends without a win is recorded and retried.
//   observer    LeaderObserver::next() in a loop; each change it reports is
//               an observe event (the term and the value: which campaign).
//
// Tenants (`tenants` > 0; tenancy.h): LeaseClient g of the worker (its
// global index: index x groups per worker + g) is tenant g % tenants, and
// election role r's is tenant (election_base + r) % tenants, each with its
// key from tenant_dir. A lease client's keys are key-N and sem-N under its
// own prefix tT/ or, on a seeded half, under shared/; election names are
// shared/elect-N. A fiftieth of the cycles are probes outside the client's
// rights, each recorded outside=1: a try-acquire of another tenant's key-N,
// or, on a seeded half, an all-or-nothing one of a key of its own and
// another tenant's; a probe that is granted is released at once, unwritten.
// An acquire refused ERROR permission_denied is recorded with that error.
//
// Cluster mode (`cluster`): `server` lists the nodes' proxies as seeds, the
// clients discover the map and follow redirects (discover_cluster), and each
// grant is recorded with the node that answered it: the transport notes
// where every request id was sent, and a GRANTED's node is where its
// request went (each proxy forwards to one node only).
#pragma once

#include <cstdint>
#include <string>

namespace shardlock::torture {

struct WorkerOptions {
  int index = 0;               // the worker process's index
  int clients = 1;             // lease clients (threads) in this process
  int threads_per_client = 1;  // of them, how many share one LeaseClient
  // The first this-many LeaseClients resend first after 600 ms, not
  // initial_retransmit_ms (run.h).
  int slow_retransmit_groups = 0;
  std::string server;    // HOST:PORT the clients send to (the proxy); in
                         // cluster mode, the seeds, comma-separated
  bool cluster = false;  // discover the cluster's map from the seeds
  // Cluster mode: "id=HOST:PORT,..." naming each node by the address its
  // map entry (its proxy) has; a grant from an unnamed address is recorded
  // with the address.
  std::string node_names;
  std::string resource;     // the resource's abstract socket name
  std::string history_dir;  // where client-<n>.log files go
  std::uint64_t seed = 1;
  std::int64_t end_ns = 0;  // CLOCK_MONOTONIC time to stop at
  int keys = 8;
  int ttl_ms = 500;
  int max_wait_ms = 1000;
  int request_timeout_ms = 1000;
  int initial_retransmit_ms = 5;
  // Per million cycles: the client stalls for 1.5 x ttl_ms between its last
  // validity check and its write (Kleppmann's GC pause), so the write often
  // reaches the resource after another client took the key over.
  int stall_per_million = 0;
  // The mix of cycles (the rest are exclusive); their sum is at most 1.
  double read_fraction = 0.2;
  double permit_fraction = 0.1;
  double multi_fraction = 0.1;
  int permits = 2;      // P of every semaphore key
  int permit_keys = 2;  // semaphore keys sem-0 .. sem-(permit_keys - 1)
  // Elections (see above).
  int elections = 0;      // names
  int campaigners = 2;    // per name
  int observers = 1;      // per name
  int workers = 1;        // worker processes in the run (roles are dealt round-robin)
  int election_base = 0;  // the first election role's client index
  // Tenants (see above): 0 for none.
  int tenants = 0;
  bool encrypt = false;    // the even-numbered tenants encrypt
  std::string tenant_dir;  // the tenants' key files
};

// Runs the workload; returns the process exit status (0, or 3 on a setup
// failure such as an unreachable resource).
int run_worker(const WorkerOptions& options);

}  // namespace shardlock::torture
