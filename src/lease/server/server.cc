// LeaseServer: options, start-up (data dir, shards, sockets, back end) and
// the I/O threads. The request path from datagram to shard and back is the
// Dispatcher's (dispatcher.h).
//
// Threading: every I/O thread may serve any key. Each shard is guarded by its
// own shardlock::Mutex (critical sections: one hash lookup, a timer relink,
// at most a token-block fsync once per token_block grants), so threads only
// meet when they touch the same shard at the same moment. The alternative,
// one thread per shard, would need a cross-thread hand-off for every request
// whose datagram lands on the "wrong" thread (SO_REUSEPORT spreads clients,
// not keys) - a queue and a wake-up per request instead of an uncontended
// lock. Timers of shard s are driven by I/O thread s % io_threads.
#include "shardlock/lease/server/server.h"

#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <thread>

#include "server/dispatcher.h"
#include "server/io_loop.h"
#include "shardlock/internal/thread_annotations.h"
#include "shardlock/lease/duration.h"
#include "shardlock/lease/server/internal/cluster_control.h"
#include "shardlock/lease/server/internal/cluster_gate.h"
#include "shardlock/lease/server/internal/server_clock.h"
#include "shardlock/lease/server/internal/shard.h"
#include "shardlock/lease/server/internal/tenant_usage.h"
#include "shardlock/lease/server/internal/token_store.h"
#include "shardlock/lock_guard.h"
#include "shardlock/mutex.h"
#include "wire/udp.h"

namespace shardlock::lease {

using internal::Dispatcher;
using internal::OutDatagram;
using internal::Peer;
using internal::port_of;
using internal::Shard;
using internal::ShardTokens;
using internal::TokenStore;

namespace {

// Keeps floor + token_block far from wrapping, and a block's unused tokens
// (skipped at a restart) a negligible part of the 64-bit space.
constexpr std::uint64_t kMaxTokenBlock = std::uint64_t{1} << 40;

// A secret per-process seed for every hash of remote input (key -> shard,
// the shards' tables), so colliding keys or ids cannot be built offline. The
// key -> shard placement may change across restarts: every shard of a new
// run starts above the largest token any shard issued before (token_store),
// so a key's tokens still rise.
std::uint64_t secret_seed() {
  std::uint64_t seed = 0;
  if (::getrandom(&seed, sizeof seed, 0) != static_cast<ssize_t>(sizeof seed)) {
    seed = static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
           (static_cast<std::uint64_t>(::getpid()) << 32);
  }
  return seed;
}

// ceil(total / parts), at least 1: one shard's share of a server-wide bound.
std::size_t share(std::size_t total, std::size_t parts) {
  return std::max<std::size_t>(1, total / parts + (total % parts != 0 ? 1 : 0));
}

std::int64_t to_ms(std::chrono::nanoseconds ns) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(ns).count();
}

}  // namespace

struct LeaseServer::Impl final : internal::DatagramSink {
  explicit Impl(LeaseServerOptions o) : options(std::move(o)), clock(options.clock) {
    if (!options.log) {
      options.log = [](std::string_view line) {
        std::fprintf(stderr, "shardlock-lease: %.*s\n", static_cast<int>(line.size()), line.data());
      };
    }
  }
  ~Impl() override { stop(); }

  std::int64_t now_ms() const { return to_ms(clock.now()); }

  std::error_code fail(std::error_code ec, std::string detail) {
    error_detail = std::move(detail);
    close_sockets();
    store.reset();
    return ec;
  }

  std::error_code start();
  // start()'s steps: the options' bounds; the data dir (the raw counters'
  // `floor`, the lease bound an earlier run recorded); the shards' limits
  // at `now`; the dispatcher (and replicator, grant log) over `shards`;
  // the back end and the I/O threads.
  std::error_code check_options();
  std::error_code open_data_dir(internal::TokenMode mode, std::uint64_t& floor,
                                std::chrono::milliseconds& previous_bound);
  [[nodiscard]] internal::ShardLimits shard_limits(std::int64_t now) const;
  void make_dispatcher(std::uint64_t key_seed, std::chrono::milliseconds previous_bound,
                       std::vector<std::unique_ptr<Shard>> shards);
  std::error_code start_loops();
  std::error_code open_sockets();
  // A UDP socket on `addr`, added to fds, with SO_REUSEPORT if asked.
  std::error_code open_socket(int family, bool reuse_port, const sockaddr_storage& addr,
                              socklen_t addr_len, int& fd);
  // Takes this server's exclusive claim on `udp_port` (claim_fd).
  std::error_code claim_port(std::uint16_t udp_port);
  void stop();
  void close_sockets() {
    uring_loops.clear();
    for (const int fd : fds) ::close(fd);
    fds.clear();
    if (claim_fd >= 0) ::close(claim_fd);
    claim_fd = -1;
  }

  // The loops' entry points (io_loop.h).
  void on_datagram(unsigned worker, std::span<const std::uint8_t> bytes, const Peer& peer,
                   std::vector<OutDatagram>& out) override {
    dispatcher->handle(worker, bytes, peer, out);
  }
  void on_oversized() override { dispatcher->count_oversized(); }
  void on_send_drop() override { dispatcher->count_send_drop(); }
  void on_batch_end(unsigned /*worker*/, std::vector<OutDatagram>& out) override {
    dispatcher->end_batch(out);
  }
  void on_tick(unsigned worker, std::vector<OutDatagram>& out) override {
    dispatcher->tick(worker, out);
    if (worker != 0) return;
    settle_lease_bound();
    // A backup that restarted (or a lost journal entry) starts its stream
    // over, with snapshots (server/replicator.h).
    if (replicator && replicator->restart_pending()) {
      dispatcher->replicate_buckets(replicator->restart_streams());
    }
  }
  void settle_lease_bound();
  void log(std::string_view line) override { options.log(line); }

  LeaseServerOptions options;
  // options.clock, or CLOCK_BOOTTIME (server_clock.h).
  internal::ServerClock clock;
  std::string error_detail;
  std::unique_ptr<TokenStore> store;
  // Declared before the dispatcher, which uses it, so it outlives it.
  std::unique_ptr<internal::Replicator> replicator;
  std::unique_ptr<internal::GrantLog> grant_log;      // outlives the dispatcher's shards
  std::shared_ptr<internal::TenantGate> tenant_gate;  // null: no sealing
  // Under a tenant file: each tenant's leases, waiters and watches over the
  // shards, and its bounds. Outlives the dispatcher's shards.
  std::unique_ptr<internal::TenantUsage> tenant_usage;
  std::unique_ptr<Dispatcher> dispatcher;
  std::vector<int> fds;
  int claim_fd = -1;  // abstract AF_UNIX socket: the claim on our UDP port
  std::vector<std::unique_ptr<internal::UringLoop>> uring_loops;
  std::vector<std::thread> threads;
  std::atomic<bool> stopping{false};
  bool started = false;
  IoBackend backend = IoBackend::kSocket;
  std::chrono::milliseconds lock_delay{0};
  // The data dir had never issued a token (TokenStore::fresh()), plain mode.
  bool fresh_data_dir = false;
  std::uint64_t token_floor = 0;  // TokenStore::token_floor() at start
  std::uint16_t port = 0;
  std::string listen;
  // When to lower the data dir's lease bound to this run's max TTL (set
  // before the threads start, then touched by I/O worker 0 only).
  std::optional<std::int64_t> lease_bound_settles_ms;
};

std::error_code LeaseServer::Impl::start() {
  if (started) return fail(ServerError::kAlreadyStarted, "start() called twice");
  started = true;
  if (const std::error_code ec = check_options()) return ec;
  const auto& o = options;
  // Tokens. The raw counters start above `floor`. A plain run issues them
  // as tokens, so it starts above every token any earlier run issued, in
  // either mode (token_floor); a cluster run composes epoch << 32 | counter
  // and its shards refuse every epoch at or below token_floor >> 32.
  std::uint64_t floor = 0;
  std::chrono::milliseconds previous_bound{0};
  const internal::TokenMode mode =
      o.start_closed ? internal::TokenMode::kCluster : internal::TokenMode::kPlain;
  if (const std::error_code ec = open_data_dir(mode, floor, previous_bound)) return ec;
  // The default lock-delay covers the longest lease any earlier run may have
  // granted: its max TTL, as recorded in the data dir, if that was longer.
  // A fresh data dir has no earlier lease to wait out (an explicit
  // lock_delay is still applied).
  lock_delay = o.lock_delay.value_or(fresh_data_dir ? std::chrono::milliseconds{0}
                                                    : std::max(o.max_ttl, previous_bound));
  if (lock_delay < previous_bound) {
    o.log("warning: lock-delay " + to_string(lock_delay) + " is shorter than the previous run's " +
          "max TTL " + to_string(previous_bound) + ": its leases may still be live");
  }

  const std::int64_t now = now_ms();
  if (o.tenants) {
    tenant_usage = std::make_unique<internal::TenantUsage>();
    tenant_usage->set_limits(*o.tenants);
  }
  const internal::ShardLimits limits = shard_limits(now);
  if (store && previous_bound > o.max_ttl) {
    lease_bound_settles_ms = now + std::max(lock_delay, previous_bound).count();
  }
  std::vector<std::unique_ptr<Shard>> shards;
  shards.reserve(o.shards);
  for (std::uint32_t i = 0; i < o.shards; ++i) {
    ShardTokens tokens =
        store ? ShardTokens(store.get(), i, floor,
                            mode == internal::TokenMode::kPlain ? floor + o.token_block : floor,
                            o.token_block, mode)
              : ShardTokens(0);
    shards.push_back(std::make_unique<Shard>(i, limits, tokens, now));
  }

  if (const std::error_code ec = open_sockets()) return ec;
  make_dispatcher(limits.hash_seed, previous_bound, std::move(shards));
  return start_loops();
}

std::error_code LeaseServer::Impl::check_options() {
  const auto& o = options;
  if (o.shards == 0 || o.shards > 65536) {
    return fail(ServerError::kBadOptions,
                "shards must be 1..65536, got " + std::to_string(o.shards));
  }
  if (o.max_ttl.count() <= 0 || o.max_ttl.count() > UINT32_MAX) {
    return fail(ServerError::kBadOptions, "max_ttl must be 1ms..49d, got " + to_string(o.max_ttl));
  }
  if (o.hot_keys_per_shard > LeaseServerOptions::kMaxHotKeysPerShard) {
    return fail(ServerError::kBadOptions,
                "hot_keys_per_shard must be 0.." +
                    std::to_string(LeaseServerOptions::kMaxHotKeysPerShard) + ", got " +
                    std::to_string(o.hot_keys_per_shard));
  }
  if (o.hot_key_half_life.count() < 0) {
    return fail(ServerError::kBadOptions, "hot_key_half_life must not be negative");
  }
  if (o.max_wait.count() < 0 || o.max_wait.count() > UINT32_MAX) {
    return fail(ServerError::kBadOptions, "max_wait must be 0..49d");
  }
  // At most the longest lease (u32 ms on the wire): start-up adds it to the
  // clock, which must not overflow.
  if (o.lock_delay && (o.lock_delay->count() < 0 || o.lock_delay->count() > UINT32_MAX)) {
    return fail(ServerError::kBadOptions,
                "lock_delay must be 0..49d, got " + to_string(*o.lock_delay));
  }
  if (o.busy_poll.count() < 0 || o.busy_poll > std::chrono::milliseconds(10)) {
    return fail(ServerError::kBadOptions,
                "busy_poll must be 0..10ms, got " + std::to_string(o.busy_poll.count()) + "us");
  }
  if (o.io_threads == 0 || o.io_threads > 256) {
    return fail(ServerError::kBadOptions, "io_threads must be 1..256");
  }
  if (o.tenants && o.tenants->empty()) {
    return fail(ServerError::kBadOptions, "tenants: the table has no tenant");
  }
  if (o.tenants && o.replication && !o.cluster_key) {
    // Tenant keys are the clients': none of them may seal node-to-node
    // datagrams, and an unsealed stream is open to anyone on the network.
    return fail(ServerError::kBadOptions, "tenants with replication need a cluster_key");
  }
  for (const auto& [name, value] : {std::pair<const char*, std::size_t>{"max_keys", o.max_keys},
                                    {"max_waiters", o.max_waiters},
                                    {"max_waiters_per_key", o.max_waiters_per_key},
                                    {"max_leases_per_client", o.max_leases_per_client},
                                    {"max_waiters_per_client", o.max_waiters_per_client},
                                    {"max_watches", o.max_watches},
                                    {"max_watches_per_key", o.max_watches_per_key},
                                    {"max_watches_per_client", o.max_watches_per_client}}) {
    if (value == 0) return fail(ServerError::kBadOptions, std::string(name) + " must be >= 1");
  }
  if (o.token_block == 0 || o.token_block > kMaxTokenBlock) {
    return fail(ServerError::kBadOptions,
                "token_block must be 1..2^40, got " + std::to_string(o.token_block));
  }

  return {};
}

std::error_code LeaseServer::Impl::open_data_dir(internal::TokenMode mode, std::uint64_t& floor,
                                                 std::chrono::milliseconds& previous_bound) {
  const auto& o = options;
  if (!o.data_dir.empty()) {
    std::string detail;
    if (const std::error_code ec = TokenStore::open(o.data_dir, store, detail)) {
      return fail(ec, detail);
    }
    token_floor = store->token_floor();
    floor = mode == internal::TokenMode::kPlain ? std::max(store->floor(), token_floor)
                                                : store->floor();
    // A fresh dir in plain mode grants at once (below), so its tokens must
    // stand above any a wiped predecessor issued: they start at the
    // wall-clock floor. Cluster runs compose epochs from etcd instead, and
    // their start waits for the cluster (docs/cluster.md).
    fresh_data_dir = store->fresh() && mode == internal::TokenMode::kPlain;
    if (fresh_data_dir) {
      const auto wall_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                               std::chrono::system_clock::now().time_since_epoch())
                               .count();
      floor = std::max(floor, internal::wall_clock_token_floor(
                                  static_cast<std::uint64_t>(std::max<std::int64_t>(wall_ms, 0))));
    }
    if (floor > UINT64_MAX - o.token_block) {
      return fail(std::make_error_code(std::errc::value_too_large),
                  "data dir " + o.data_dir + ": token space exhausted (tokens issued up to " +
                      std::to_string(floor) + ")");
    }
    previous_bound = std::chrono::milliseconds(
        std::min<std::uint64_t>(store->previous_lease_bound_ms(), UINT32_MAX));
    // Until this run's lock-delay has outlasted the previous bound, a lease
    // of an earlier run may be live: keep the larger bound on disk.
    const auto bound = std::max(previous_bound, o.max_ttl);
    // A plain run's first block is its tokens; a cluster run's first token
    // reserves a block of its own, whose ceiling is the composed one.
    const std::uint64_t ceiling =
        mode == internal::TokenMode::kPlain ? floor + o.token_block : token_floor;
    if (const std::error_code ec =
            store->initialize(o.shards, mode, floor + o.token_block, ceiling,
                              static_cast<std::uint64_t>(bound.count()), detail)) {
      return fail(ec, detail);
    }
    const std::string previous_mode = store->used_in_cluster_mode() ? "cluster" : "plain";
    if (fresh_data_dir) {
      o.log("data dir " + o.data_dir + " is fresh (no lease was ever granted from it): " +
            (o.lock_delay ? "lock-delay " + to_string(*o.lock_delay) + " as asked"
                          : std::string("no lock-delay, ACQUIRE is granted at once")) +
            "; tokens start above the wall-clock floor " + std::to_string(floor));
    } else if (mode == internal::TokenMode::kPlain) {
      o.log("data dir " + o.data_dir + " (last used in " + previous_mode +
            " mode): tokens continue above " + std::to_string(floor));
    } else {
      o.log("data dir " + o.data_dir + " (last used in " + previous_mode +
            " mode): tokens continue above " + std::to_string(token_floor) +
            "; grants need an epoch above " + std::to_string(token_floor >> 32));
    }
  } else {
    o.log("no data dir: tokens restart from 1 and are only monotonic within this run");
  }
  return {};
}

internal::ShardLimits LeaseServer::Impl::shard_limits(std::int64_t now) const {
  const auto& o = options;
  internal::ShardLimits limits;
  limits.max_ttl_ms = static_cast<std::uint32_t>(o.max_ttl.count());
  limits.max_wait_ms = static_cast<std::uint32_t>(o.max_wait.count());
  limits.dedup_capacity = o.dedup_entries_per_shard;
  limits.hot_keys = o.hot_keys_per_shard;
  limits.hot_key_half_life_ms = o.hot_key_half_life.count();
  // In cluster mode the gate enforces the lock-delay per bucket (see
  // LeaseServerOptions::start_closed): a bucket taken over complete grants
  // at once, the rest wait for it there.
  limits.recovering_until_ms = o.start_closed ? now : now + lock_delay.count();
  limits.max_keys = share(o.max_keys, o.shards);
  limits.max_waiters = share(o.max_waiters, o.shards);
  limits.max_waiters_per_key = o.max_waiters_per_key;
  limits.max_leases_per_client = share(o.max_leases_per_client, o.shards);
  limits.max_waiters_per_client = share(o.max_waiters_per_client, o.shards);
  limits.max_watches = share(o.max_watches, o.shards);
  limits.max_watches_per_key = o.max_watches_per_key;
  limits.max_watches_per_client = share(o.max_watches_per_client, o.shards);
  // One secret seed for the key hash, which places a key on a shard and
  // indexes the shard's tables (see Dispatcher).
  limits.hash_seed = secret_seed();
  limits.token_floor = token_floor;
  limits.tenant_usage = tenant_usage.get();
  return limits;
}

void LeaseServer::Impl::make_dispatcher(std::uint64_t key_seed,
                                        std::chrono::milliseconds previous_bound,
                                        std::vector<std::unique_ptr<Shard>> shards) {
  const auto& o = options;
  internal::DispatcherOptions d;
  if (o.tenants) {
    tenant_gate = std::make_shared<internal::TenantGate>(*o.tenants, /*scoped=*/true);
  } else if (o.auth_key) {
    tenant_gate =
        std::make_shared<internal::TenantGate>(TenantTable::single(*o.auth_key), /*scoped=*/false);
  }
  d.tenants = tenant_gate;
  d.clock = o.clock;
  d.log = o.log;
  d.key_seed = key_seed;
  d.workers = static_cast<unsigned>(fds.size());
  if (o.grant_log) {
    grant_log = std::make_unique<internal::GrantLog>(o.grant_log, o.grant_log_lines_per_second);
    d.grant_log = grant_log.get();
  }
  if (o.replication) {
    internal::ReplicatorOptions r;
    r.auth_key = o.cluster_key ? o.cluster_key : o.auth_key;
    r.relay_replies = o.relay_replies;
    // Every node backs the others up: an ack rides in the REPLICATE the
    // same batch sends back to its primary, a datagram fewer per batch.
    r.carry_acks = true;
    // This process among the node's runs, named in every node-to-node
    // datagram (replication::Addressing); only compared for equality.
    r.incarnation =
        static_cast<std::uint64_t>(std::chrono::system_clock::now().time_since_epoch().count());
    // Every lease an earlier run may have granted has ended by then, whatever
    // --lock-delay says.
    r.settled_at_ns =
        clock.now().count() +
        std::chrono::nanoseconds(std::max({lock_delay, previous_bound, o.max_ttl})).count();
    replicator = std::make_unique<internal::Replicator>(r, clock.now().count());
    d.replicator = replicator.get();
  }
  dispatcher = std::make_unique<Dispatcher>(std::move(d), std::move(shards));
  if (options.start_closed) {
    // Cluster mode: nothing is granted before the cluster layer says what.
    dispatcher->publish_gate(internal::ClusterGate::closed());
  }
}

std::error_code LeaseServer::Impl::start_loops() {
  const auto& o = options;
  // Back end.
  backend = o.io == IoBackend::kSocket ? IoBackend::kSocket : IoBackend::kUring;
  if (backend == IoBackend::kUring) {
    for (const int fd : fds) {
      std::unique_ptr<internal::UringLoop> loop;
      std::string detail;
      if (const std::error_code ec = internal::UringLoop::create(fd, loop, detail)) {
        uring_loops.clear();
        if (o.io == IoBackend::kUring)
          return fail(ec, "io_uring requested but unavailable: " + detail);
        o.log("io_uring unavailable (" + detail + "); falling back to recvmmsg/sendmmsg");
        backend = IoBackend::kSocket;
        break;
      }
      uring_loops.push_back(std::move(loop));
    }
  }

  if (lock_delay.count() == 0 && !fresh_data_dir) {
    o.log("warning: lock-delay is 0: leases granted before a restart may overlap new ones");
  }
  o.log("listening on " + listen + " (udp), " + std::to_string(o.shards) + " shards, " +
        std::to_string(o.io_threads) + " I/O thread(s), back end " +
        std::string(backend == IoBackend::kUring ? "io_uring (multishot recvmsg, buffer ring)"
                                                 : "socket (recvmmsg/sendmmsg)") +
        ", max ttl " + to_string(o.max_ttl) + ", lock-delay " + to_string(lock_delay) +
        ", datagram auth " + (o.auth_key ? "on" : "off") + ", busy-poll " +
        std::to_string(o.busy_poll.count()) + "us");

  for (unsigned t = 0; t < fds.size(); ++t) {
    if (backend == IoBackend::kUring) {
      threads.emplace_back(
          [this, t] { uring_loops[t]->run(t, *this, stopping, options.busy_poll); });
    } else {
      threads.emplace_back(
          [this, t] { internal::run_socket_loop(fds[t], t, *this, stopping, options.busy_poll); });
    }
  }
  return {};
}

std::error_code LeaseServer::Impl::open_sockets() {
  sockaddr_storage addr{};
  socklen_t addr_len = 0;
  std::string detail;
  if (!internal::resolve_udp_address(options.bind_address, /*passive=*/true,
                                     /*allow_port_zero=*/true, addr, addr_len, detail)) {
    return fail(ServerError::kBadAddress, "bind address: " + detail);
  }
  const int family = addr.ss_family;

  // One server per port: a second one (SO_REUSEPORT or not) would split the
  // lease table. The claim settles races between shardlock servers; the
  // exclusive bind below catches any other holder of the port.
  if (port_of(addr) != 0) {
    if (const std::error_code ec = claim_port(port_of(addr))) return ec;
  }
  // Bound without SO_REUSEPORT, this fails while any socket holds the port
  // (a reuseport group, or 0.0.0.0 when we bind 127.0.0.1 and the reverse),
  // and for port 0 it picks a port no one holds.
  int exclusive = -1;
  if (const std::error_code ec = open_socket(family, false, addr, addr_len, exclusive)) return ec;
  socklen_t len = sizeof addr;
  ::getsockname(exclusive, reinterpret_cast<sockaddr*>(&addr), &len);
  listen = internal::format_address(addr);
  if (claim_fd < 0) {
    if (const std::error_code ec = claim_port(port_of(addr))) return ec;
  }
  if (options.io_threads > 1) {
    // The reuseport group cannot join an exclusive socket; the claim keeps
    // other shardlock servers out while the port is briefly free.
    ::close(exclusive);
    fds.pop_back();
    for (unsigned t = 0; t < options.io_threads; ++t) {
      int fd = -1;
      if (const std::error_code ec = open_socket(family, true, addr, addr_len, fd)) return ec;
    }
  }
  port = port_of(addr);
  return {};
}

std::error_code LeaseServer::Impl::open_socket(int family, bool reuse_port,
                                               const sockaddr_storage& addr, socklen_t addr_len,
                                               int& fd) {
  fd = ::socket(family, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    const std::error_code ec(errno, std::generic_category());
    return fail(ec, "socket: " + ec.message());
  }
  fds.push_back(fd);
  const int one = 1;
  if (reuse_port && ::setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one) != 0) {
    const std::error_code ec(errno, std::generic_category());
    return fail(ec, "SO_REUSEPORT: " + ec.message());
  }
  // Best effort: bigger buffers absorb bursts between loop wake-ups.
  const int bytes = 4 << 20;
  (void)::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof bytes);
  (void)::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof bytes);
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&addr), addr_len) != 0) {
    const std::error_code ec(errno, std::generic_category());
    std::string detail = "bind " + options.bind_address + ": " + ec.message();
    if (ec == std::errc::address_in_use) {
      detail += " (another process holds UDP port " + std::to_string(port_of(addr)) + ")";
    }
    return fail(ec, detail);
  }
  return {};
}

std::error_code LeaseServer::Impl::claim_port(std::uint16_t udp_port) {
  // Abstract AF_UNIX names live in the network namespace, as ports do, and
  // vanish with the process, even on kill -9. Keyed by the port alone:
  // [::]:P, 0.0.0.0:P and 127.0.0.1:P overlap in the kernel's view too.
  claim_fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (claim_fd < 0) {
    const std::error_code ec(errno, std::generic_category());
    return fail(ec, "cannot claim UDP port " + std::to_string(udp_port) + ": " + ec.message());
  }
  sockaddr_un name{};
  name.sun_family = AF_UNIX;
  const int n = std::snprintf(name.sun_path + 1, sizeof name.sun_path - 1,
                              "shardlock-lease/udp-port/%u", unsigned{udp_port});
  const auto name_len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
  if (::bind(claim_fd, reinterpret_cast<const sockaddr*>(&name), name_len) != 0) {
    const std::error_code ec(errno, std::generic_category());
    if (ec == std::errc::address_in_use) {
      return fail(ec, "bind " + options.bind_address +
                          ": another shardlock server already "
                          "serves UDP port " +
                          std::to_string(udp_port) +
                          " on this host (network namespace); refusing to split the lease table");
    }
    return fail(ec, "cannot claim UDP port " + std::to_string(udp_port) + ": " + ec.message());
  }
  return {};
}

void LeaseServer::Impl::stop() {
  // Relaxed: the join below is what orders the threads' exit with us.
  stopping.store(true, std::memory_order_relaxed);
  for (std::thread& t : threads) t.join();
  threads.clear();
  close_sockets();
}

void LeaseServer::Impl::settle_lease_bound() {
  // Touched by I/O worker 0 only.
  if (!lease_bound_settles_ms || now_ms() < *lease_bound_settles_ms) return;
  // Every lease of an earlier run has expired by now; from here on only this
  // run's max TTL bounds what a restart must wait for.
  lease_bound_settles_ms.reset();
  std::string detail;
  if (store->record_lease_bound(static_cast<std::uint64_t>(options.max_ttl.count()), detail)) {
    options.log("cannot record the lease bound: " + detail);
  }
}

LeaseServer::LeaseServer(LeaseServerOptions options)
    : impl_(std::make_unique<Impl>(std::move(options))) {}
LeaseServer::~LeaseServer() = default;

std::error_code LeaseServer::start() { return impl_->start(); }
std::uint16_t LeaseServer::port() const noexcept { return impl_->port; }
std::string LeaseServer::listen_address() const { return impl_->listen; }
IoBackend LeaseServer::backend() const noexcept { return impl_->backend; }
std::chrono::milliseconds LeaseServer::lock_delay() const noexcept { return impl_->lock_delay; }
bool LeaseServer::fresh_data_dir() const noexcept { return impl_->fresh_data_dir; }
const std::string& LeaseServer::error_detail() const noexcept { return impl_->error_detail; }
void LeaseServer::stop() { impl_->stop(); }

std::chrono::nanoseconds LeaseServer::now() const { return impl_->clock.now(); }

std::vector<TenantStats> LeaseServer::tenant_stats() const {
  if (!impl_->tenant_gate) return {};
  std::vector<TenantStats> stats = impl_->tenant_gate->stats();
  if (impl_->tenant_usage) {
    for (TenantStats& t : stats) {
      const internal::TenantUsage::Counts now = impl_->tenant_usage->of(t.key_id);
      t.leases = now.leases;
      t.waiters = now.waiters;
      t.watches = now.watches;
    }
  }
  return stats;
}

bool LeaseServer::reload_tenants(TenantTable tenants) {
  if (!impl_->options.tenants || !impl_->tenant_gate || !impl_->tenant_usage) return false;
  // Bounds first: a tenant the new table adds is bounded before its first
  // datagram is admitted.
  impl_->tenant_usage->set_limits(tenants);
  impl_->tenant_gate->replace(std::move(tenants), /*scoped=*/true);
  return true;
}

ServerStats LeaseServer::stats() const {
  ServerStats stats = impl_->dispatcher ? impl_->dispatcher->stats() : ServerStats{};
  if (impl_->store) impl_->store->add_stats(stats);
  return stats;
}

// ---- ClusterControl (internal/cluster_control.h) ----

namespace internal {

void ClusterControl::publish_cluster_gate(std::shared_ptr<const ClusterGate> gate) {
  if (server_->impl_->dispatcher) server_->impl_->dispatcher->publish_gate(std::move(gate));
}

std::size_t ClusterControl::count_leases(
    const std::function<bool(std::string_view key)>& pred) const {
  return server_->impl_->dispatcher ? server_->impl_->dispatcher->count_leases(pred) : 0;
}

std::uint64_t ClusterControl::token_floor() const noexcept { return server_->impl_->token_floor; }

bool ClusterControl::needs_new_epoch() const {
  return server_->impl_->dispatcher && server_->impl_->dispatcher->needs_new_epoch();
}

std::error_code ClusterControl::set_replica_layout(std::uint64_t epoch,
                                                   const RouterSnapshot& routing,
                                                   const std::vector<bool>& learners,
                                                   std::uint16_t self, std::size_t replicas,
                                                   const std::vector<std::string>& addresses) {
  LeaseServer::Impl& s = *server_->impl_;
  // Not fail(): the server keeps running as it was.
  if (!s.replicator || !s.dispatcher) {
    s.error_detail = "replication is off, or the server is not started";
    return ServerError::kBadOptions;
  }
  std::vector<Peer> peers(addresses.size());
  for (std::size_t i = 0; i < addresses.size(); ++i) {
    sockaddr_storage address{};
    socklen_t length = 0;
    std::string detail;
    if (!resolve_udp_address(addresses[i], /*passive=*/false,
                             /*allow_port_zero=*/false, address, length, detail)) {
      s.error_detail = "replica address " + addresses[i] + ": " + detail;
      return ServerError::kBadOptions;
    }
    std::memcpy(&peers[i].addr, &address, std::min<std::size_t>(length, sizeof peers[i].addr));
    peers[i].len = length;
  }
  const ReplicaLayout layout = replica_layout(epoch, routing, learners, self, replicas, peers);
  s.dispatcher->replicate_buckets(s.replicator->set_layout(layout, s.clock.now().count()));
  return {};
}

bool ClusterControl::replica_primary_settled(const std::string& primary,
                                             std::uint32_t bucket) const {
  return server_->impl_->replicator && server_->impl_->replicator->primary_settled(primary, bucket);
}

ReplicaProgress ClusterControl::replica_progress() const {
  if (!server_->impl_->replicator) return {};
  return server_->impl_->replicator->progress();
}

std::chrono::nanoseconds ClusterControl::replica_lease_until(std::size_t bucket) const noexcept {
  if (!server_->impl_->replicator) return std::chrono::nanoseconds::max();
  return server_->impl_->replicator->lease_until(bucket);
}

std::vector<std::string> ClusterControl::silent_replicas(std::chrono::milliseconds silence) const {
  if (!server_->impl_->replicator) return {};
  return server_->impl_->replicator->silent_peers(
      server_->impl_->clock.now().count(),
      std::chrono::duration_cast<std::chrono::nanoseconds>(silence).count());
}

std::optional<std::size_t> ClusterControl::take_over(const std::string& primary,
                                                     std::uint32_t bucket,
                                                     std::chrono::milliseconds hold,
                                                     bool* owner_active) {
  LeaseServer::Impl& s = *server_->impl_;
  if (!s.replicator || !s.dispatcher) return std::nullopt;
  const std::chrono::nanoseconds now = s.clock.now();
  std::vector<std::pair<std::string, replication::ReplicaHolder>> holders;
  if (!s.replicator->takeover(primary, bucket, now.count(), holders, owner_active)) {
    return std::nullopt;
  }
  const std::int64_t expiry_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(now).count() + hold.count() + 1;
  return s.dispatcher->inherit(holders, expiry_ms);  // nullopt: failed closed
}

}  // namespace internal

}  // namespace shardlock::lease
