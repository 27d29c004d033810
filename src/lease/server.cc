// LeaseServer: options, start-up (data dir, sockets, back end), the request
// path from decoded datagram to shard and back, and STATS.
//
// Threading: every I/O thread may serve any key. Each shard is guarded by its
// own shardlock::Mutex (critical sections: one hash lookup, a timer relink,
// at most a token-block fsync once per token_block grants), so threads only
// meet when they touch the same shard at the same moment. The alternative,
// one thread per shard, would need a cross-thread hand-off for every request
// whose datagram lands on the "wrong" thread (SO_REUSEPORT spreads clients,
// not keys) - a queue and a wake-up per request instead of an uncontended
// lock. Timers of shard s are driven by I/O thread s % io_threads.
#include "shardlock/lease/server.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#include <xxhash.h>

#include <atomic>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <thread>

#include "io_loop.h"
#include "shardlock/internal/thread_annotations.h"
#include "shardlock/lease/duration.h"
#include "shardlock/lease/internal/shard.h"
#include "shardlock/lease/internal/token_store.h"
#include "shardlock/lock_guard.h"
#include "shardlock/mutex.h"

namespace shardlock::lease {

using internal::DeferredReply;
using internal::OutDatagram;
using internal::Peer;
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

// One shard and its lock, padded to its own cache lines so neighbouring
// shards' locks do not false-share.
struct alignas(64) ShardSlot {
  Mutex mu;
  std::unique_ptr<Shard> shard SHARDLOCK_PT_GUARDED_BY(mu);
};

std::int64_t to_ms(std::chrono::nanoseconds ns) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(ns).count();
}

std::string format_peer(const sockaddr_storage& ss) {
  char host[INET6_ADDRSTRLEN] = {};
  if (ss.ss_family == AF_INET6) {
    const auto& a = reinterpret_cast<const sockaddr_in6&>(ss);
    ::inet_ntop(AF_INET6, &a.sin6_addr, host, sizeof host);
    return "[" + std::string(host) + "]:" + std::to_string(ntohs(a.sin6_port));
  }
  const auto& a = reinterpret_cast<const sockaddr_in&>(ss);
  ::inet_ntop(AF_INET, &a.sin_addr, host, sizeof host);
  return std::string(host) + ":" + std::to_string(ntohs(a.sin_port));
}

// "HOST:PORT" / "[V6]:PORT" -> host, port.
bool split_host_port(const std::string& address, std::string& host, std::string& port) {
  const std::size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon + 1 == address.size()) return false;
  host = address.substr(0, colon);
  port = address.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return !host.empty() && port.find_first_not_of("0123456789") == std::string::npos;
}

std::uint16_t port_of(const sockaddr_storage& ss) {
  return ntohs(ss.ss_family == AF_INET6 ? reinterpret_cast<const sockaddr_in6&>(ss).sin6_port
                                        : reinterpret_cast<const sockaddr_in&>(ss).sin_port);
}

}  // namespace

struct LeaseServer::Impl final : internal::DatagramSink {
  // Scratch space of one I/O thread, reused for every datagram.
  struct Worker {
    Datagram request;
    Datagram reply;
    std::vector<DeferredReply> deferred;
    std::vector<std::uint8_t> stats_tokens;
  };

  explicit Impl(LeaseServerOptions o) : options(std::move(o)) {
    if (!options.clock) {
      options.clock = [] { return std::chrono::steady_clock::now().time_since_epoch(); };
    }
    if (!options.log) {
      options.log = [](std::string_view line) {
        std::fprintf(stderr, "shardlock-lease: %.*s\n", static_cast<int>(line.size()), line.data());
      };
    }
  }
  ~Impl() override { stop(); }

  std::int64_t now_ms() const { return to_ms(options.clock()); }

  std::error_code fail(std::error_code ec, std::string detail) {
    error_detail = std::move(detail);
    close_sockets();
    store.reset();
    return ec;
  }

  std::error_code start();
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

  ShardSlot& slot_for(std::string_view key) {
    const std::uint64_t h = XXH3_64bits_withSeed(key.data(), key.size(), shard_seed);
    return *shards[h % shards.size()];
  }

  // Sends `d` to `peer` unless it is larger than `budget` bytes (before any
  // auth tag): then it is withheld and counted, so no source ever gets more
  // reply bytes than it sent.
  void send_reply(const Datagram& d, std::size_t budget, const Peer& peer,
                  std::vector<OutDatagram>& out) {
    if (encoded_size(d) > budget) {
      amplification_drops.fetch_add(1, std::memory_order_relaxed);  // relaxed: statistics
      return;
    }
    OutDatagram& o = out.emplace_back();
    std::size_t written = 0;
    const std::size_t room = o.bytes.size() - (options.auth_key ? kAuthTagSize : 0);
    if (encode(d, std::span(o.bytes).first(room), written) != ProtocolError::kOk) {
      out.pop_back();  // cannot happen for replies within the request's size
      return;
    }
    if (options.auth_key) written = seal_datagram(o.bytes, written, *options.auth_key);
    o.peer = peer;
    o.length = static_cast<std::uint16_t>(written);
  }

  void send_deferred(Worker& w, std::vector<OutDatagram>& out) {
    for (const DeferredReply& d : w.deferred) {
      if (d.type == MessageType::kError) {
        options.log("cannot issue a token to a waiter on a key; answered ERROR(internal)");
      }
      w.reply.count = 0;
      w.reply.batch = false;
      w.reply.client_id = d.client;
      (void)w.reply.push(d.message());
      w.reply.request_id = d.request_id;
      send_reply(w.reply, d.reply_credit, d.peer, out);
    }
    w.deferred.clear();
  }

  void fill_stats(Worker& w, const Message& request, std::size_t slack, Message& reply);

  // The loops' entry points: without memory a datagram or a tick is given
  // up (counted), never the I/O thread; the shards stay consistent on their
  // own (Shard::handle answers ERROR(kResourceExhausted)).
  void on_datagram(unsigned worker, std::span<const std::uint8_t> bytes, const Peer& peer,
                   std::vector<OutDatagram>& out) override {
    try {
      handle_datagram(worker, bytes, peer, out);
    } catch (const std::bad_alloc&) {
      allocation_failures.fetch_add(1, std::memory_order_relaxed);  // relaxed: statistics
    }
  }
  void handle_datagram(unsigned worker, std::span<const std::uint8_t> bytes, const Peer& peer,
                       std::vector<OutDatagram>& out);
  void on_oversized() override {
    // Relaxed: a statistic; STATS readers need no ordering with it.
    malformed.fetch_add(1, std::memory_order_relaxed);
  }
  void on_tick(unsigned worker, std::vector<OutDatagram>& out) override {
    try {
      tick(worker, out);
    } catch (const std::bad_alloc&) {
      allocation_failures.fetch_add(1, std::memory_order_relaxed);  // relaxed: statistics
    }
  }
  void tick(unsigned worker, std::vector<OutDatagram>& out);
  void log(std::string_view line) override { options.log(line); }

  LeaseServerOptions options;
  std::string error_detail;
  std::unique_ptr<TokenStore> store;
  std::vector<std::unique_ptr<ShardSlot>> shards;
  std::vector<std::unique_ptr<Worker>> workers;
  std::vector<int> fds;
  int claim_fd = -1;  // abstract AF_UNIX socket: the claim on our UDP port
  std::vector<std::unique_ptr<internal::UringLoop>> uring_loops;
  std::vector<std::thread> threads;
  std::atomic<bool> stopping{false};
  bool started = false;
  IoBackend backend = IoBackend::kSocket;
  std::chrono::milliseconds lock_delay{0};
  std::uint16_t port = 0;
  std::string listen;
  // Counted outside any shard. Relaxed: statistics only.
  std::atomic<std::uint64_t> malformed{0};
  std::atomic<std::uint64_t> version_errors{0};
  std::atomic<std::uint64_t> auth_failures{0};
  std::atomic<std::uint64_t> allocation_failures{0};
  std::atomic<std::uint64_t> amplification_drops{0};
  // Adds the counters kept outside the shards.
  void add_server_counters(std::array<std::uint64_t, kStatCounterCount>& counters) const {
    // Relaxed: statistics.
    counters[static_cast<std::size_t>(StatCounter::kMalformed)] +=
        malformed.load(std::memory_order_relaxed);
    counters[static_cast<std::size_t>(StatCounter::kErrors)] +=
        version_errors.load(std::memory_order_relaxed);
    counters[static_cast<std::size_t>(StatCounter::kAuthFailures)] +=
        auth_failures.load(std::memory_order_relaxed);
    counters[static_cast<std::size_t>(StatCounter::kAllocationFailures)] +=
        allocation_failures.load(std::memory_order_relaxed);
    counters[static_cast<std::size_t>(StatCounter::kAmplificationDrops)] +=
        amplification_drops.load(std::memory_order_relaxed);
  }
  // When to lower the data dir's lease bound to this run's max TTL (set
  // before the threads start, then touched by I/O worker 0 only).
  std::optional<std::int64_t> lease_bound_settles_ms;
  // Key -> shard placement seed (secret, per process; see secret_seed()).
  std::uint64_t shard_seed = 0;
};

std::error_code LeaseServer::Impl::start() {
  if (started) return fail(ServerError::kAlreadyStarted, "start() called twice");
  started = true;
  const auto& o = options;
  if (o.shards == 0 || o.shards > 65536) {
    return fail(ServerError::kBadOptions,
                "shards must be 1..65536, got " + std::to_string(o.shards));
  }
  if (o.max_ttl.count() <= 0 || o.max_ttl.count() > UINT32_MAX) {
    return fail(ServerError::kBadOptions, "max_ttl must be 1ms..49d, got " + to_string(o.max_ttl));
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
  if (o.io_threads == 0 || o.io_threads > 256) {
    return fail(ServerError::kBadOptions, "io_threads must be 1..256");
  }
  for (const auto& [name, value] : {std::pair<const char*, std::size_t>{"max_keys", o.max_keys},
                                    {"max_waiters", o.max_waiters},
                                    {"max_waiters_per_key", o.max_waiters_per_key},
                                    {"max_leases_per_client", o.max_leases_per_client},
                                    {"max_waiters_per_client", o.max_waiters_per_client}}) {
    if (value == 0) return fail(ServerError::kBadOptions, std::string(name) + " must be >= 1");
  }
  if (o.token_block == 0 || o.token_block > kMaxTokenBlock) {
    return fail(ServerError::kBadOptions,
                "token_block must be 1..2^40, got " + std::to_string(o.token_block));
  }

  // Tokens.
  std::uint64_t floor = 0;
  std::chrono::milliseconds previous_bound{0};
  if (!o.data_dir.empty()) {
    std::string detail;
    if (const std::error_code ec = TokenStore::open(o.data_dir, store, detail)) {
      return fail(ec, detail);
    }
    floor = store->floor();
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
    if (const std::error_code ec = store->initialize(
            o.shards, floor + o.token_block, static_cast<std::uint64_t>(bound.count()), detail)) {
      return fail(ec, detail);
    }
    o.log("data dir " + o.data_dir + ": tokens continue above " + std::to_string(floor));
  } else {
    o.log("no data dir: tokens restart from 1 and are only monotonic within this run");
  }
  // The default lock-delay covers the longest lease any earlier run may have
  // granted: its max TTL, as recorded in the data dir, if that was longer.
  lock_delay = o.lock_delay.value_or(std::max(o.max_ttl, previous_bound));
  if (lock_delay < previous_bound) {
    o.log("warning: lock-delay " + to_string(lock_delay) + " is shorter than the previous run's " +
          "max TTL " + to_string(previous_bound) + ": its leases may still be live");
  }

  const std::int64_t now = now_ms();
  internal::ShardLimits limits;
  limits.max_ttl_ms = static_cast<std::uint32_t>(o.max_ttl.count());
  limits.max_wait_ms = static_cast<std::uint32_t>(o.max_wait.count());
  limits.dedup_capacity = o.dedup_entries_per_shard;
  limits.recovering_until_ms = now + lock_delay.count();
  limits.max_keys = share(o.max_keys, o.shards);
  limits.max_waiters = share(o.max_waiters, o.shards);
  limits.max_waiters_per_key = o.max_waiters_per_key;
  limits.max_leases_per_client = share(o.max_leases_per_client, o.shards);
  limits.max_waiters_per_client = share(o.max_waiters_per_client, o.shards);
  shard_seed = secret_seed();
  limits.hash_seed = secret_seed();
  if (store && previous_bound > o.max_ttl) {
    lease_bound_settles_ms = now + std::max(lock_delay, previous_bound).count();
  }
  shards.reserve(o.shards);
  for (std::uint32_t i = 0; i < o.shards; ++i) {
    auto slot = std::make_unique<ShardSlot>();
    ShardTokens tokens =
        store ? ShardTokens(store.get(), i, floor, floor + o.token_block, o.token_block)
              : ShardTokens(0);
    LockGuard lock(slot->mu);
    slot->shard = std::make_unique<Shard>(i, limits, tokens, now);
    shards.push_back(std::move(slot));
  }

  if (const std::error_code ec = open_sockets()) return ec;

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

  if (lock_delay.count() == 0) {
    o.log("warning: lock-delay is 0: leases granted before a restart may overlap new ones");
  }
  o.log("listening on " + listen + " (udp), " + std::to_string(o.shards) + " shards, " +
        std::to_string(o.io_threads) + " I/O thread(s), back end " +
        std::string(backend == IoBackend::kUring ? "io_uring (multishot recvmsg, buffer ring)"
                                                 : "socket (recvmmsg/sendmmsg)") +
        ", max ttl " + to_string(o.max_ttl) + ", lock-delay " + to_string(lock_delay) +
        ", datagram auth " + (o.auth_key ? "on" : "off"));

  for (unsigned t = 0; t < fds.size(); ++t) workers.push_back(std::make_unique<Worker>());
  for (unsigned t = 0; t < fds.size(); ++t) {
    if (backend == IoBackend::kUring) {
      threads.emplace_back([this, t] { uring_loops[t]->run(t, *this, stopping); });
    } else {
      threads.emplace_back([this, t] { internal::run_socket_loop(fds[t], t, *this, stopping); });
    }
  }
  return {};
}

std::error_code LeaseServer::Impl::open_sockets() {
  std::string host;
  std::string service;
  if (!split_host_port(options.bind_address, host, service)) {
    return fail(ServerError::kBadAddress, "bind address must be HOST:PORT or [V6]:PORT, got \"" +
                                              options.bind_address + "\"");
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (const int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &found); rc != 0) {
    return fail(ServerError::kBadAddress,
                "cannot resolve \"" + options.bind_address + "\": " + ::gai_strerror(rc));
  }
  sockaddr_storage addr{};
  std::memcpy(&addr, found->ai_addr, found->ai_addrlen);
  const socklen_t addr_len = found->ai_addrlen;
  const int family = found->ai_family;
  ::freeaddrinfo(found);

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
  listen = format_peer(addr);
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

void LeaseServer::Impl::fill_stats(Worker& w, const Message& request, std::size_t slack,
                                   Message& reply) {
  reply.type = MessageType::kStatsReply;
  reply.shard_count = static_cast<std::uint32_t>(shards.size());
  reply.first_shard = request.first_shard;
  for (const auto& slot : shards) {
    LockGuard lock(slot->mu);
    const auto& c = slot->shard->counters();
    for (std::size_t i = 0; i < kStatCounterCount; ++i) reply.counters[i] += c[i];
  }
  add_server_counters(reply.counters);
  w.stats_tokens.clear();
  for (std::size_t s = request.first_shard; s < shards.size() && w.stats_tokens.size() + 8 <= slack;
       ++s) {
    std::uint64_t token = 0;
    {
      LockGuard lock(shards[s]->mu);
      token = shards[s]->shard->last_token();
    }
    for (int b = 0; b < 8; ++b)
      w.stats_tokens.push_back(static_cast<std::uint8_t>(token >> (8 * b)));
  }
  reply.shard_tokens_le = w.stats_tokens;
}

void LeaseServer::Impl::handle_datagram(unsigned worker, std::span<const std::uint8_t> bytes,
                                        const Peer& peer, std::vector<OutDatagram>& out) {
  Worker& w = *workers[worker];
  // A sealed datagram reaching a server without a key fails too: it cannot
  // be checked, and its sender expects sealed replies.
  bool rejected =
      bytes.size() > kHeaderFlagsOffset && (bytes[kHeaderFlagsOffset] & kFlagAuthenticated) != 0;
  if (options.auth_key) {
    bytes = open_datagram(bytes, *options.auth_key);
    rejected = bytes.empty();
  }
  if (rejected) {
    auth_failures.fetch_add(1, std::memory_order_relaxed);  // relaxed: statistics
    return;
  }
  const ProtocolError err = decode(bytes, w.request);
  w.reply.count = 0;
  w.reply.batch = w.request.batch;
  w.reply.client_id = w.request.client_id;
  w.reply.request_id = w.request.request_id;

  if (err == ProtocolError::kUnsupportedVersion) {
    // Answer in our version so the sender learns why; only if it fits.
    version_errors.fetch_add(1, std::memory_order_relaxed);  // relaxed: statistics
    Message m;
    m.type = MessageType::kError;
    m.request_id = w.request.request_id;
    m.error = WireError::kUnsupportedVersion;
    w.reply.batch = false;
    (void)w.reply.push(m);
    send_reply(w.reply, bytes.size(), peer, out);
    return;
  }
  if (err != ProtocolError::kOk) {
    malformed.fetch_add(1, std::memory_order_relaxed);  // relaxed: statistics
    return;
  }

  const std::size_t bound = max_immediate_reply_size(w.request);
  if (bound > bytes.size()) {
    // Not padded for its replies: answering could amplify. ERROR items are
    // smaller than request items, but not than reply-type items sent here
    // (RELEASED has an empty body): send_reply() withholds what does not fit.
    for (const Message& m : w.request.items()) {
      Message e;
      e.type = MessageType::kError;
      e.request_id = m.request_id;
      e.error = WireError::kRequestTooSmall;
      (void)w.reply.push(e);
    }
    send_reply(w.reply, bytes.size(), peer, out);
    return;
  }
  // The padding beyond the bound pays either for queued ACQUIREs' later
  // answers (deferred_reply_credit) or for one STATS page, never both.
  std::size_t stats_slack = bytes.size() - bound;
  for (const Message& m : w.request.items()) {
    if (may_answer_later(m)) stats_slack = 0;
  }
  const std::int64_t now = now_ms();
  for (std::size_t i = 0; i < w.request.count; ++i) {
    const Message& m = w.request.messages[i];
    Message r;
    r.request_id = m.request_id;
    if (m.type == MessageType::kStats) {
      fill_stats(w, m, stats_slack, r);
      stats_slack = 0;  // one page per datagram
    } else if (!is_request(m.type)) {
      r.type = MessageType::kError;
      r.error = WireError::kNotARequest;
    } else {
      ShardSlot& slot = slot_for(m.key);
      LockGuard lock(slot.mu);
      const ClientId owner = m.owner.value_or(w.request.client_id);
      const auto credit = static_cast<std::uint16_t>(
          std::min(deferred_reply_credit(w.request, bytes.size(), i), kMaxDatagramSize));
      if (!slot.shard->handle(owner, peer, m, now, r, w.deferred, credit)) continue;
      if (r.type == MessageType::kError && r.error == WireError::kInternal) {
        options.log("shard " + std::to_string(slot.shard->index()) +
                    ": cannot issue a token: " + slot.shard->last_error());
      }
    }
    (void)w.reply.push(r);
  }
  if (w.reply.count > 0) send_reply(w.reply, bytes.size(), peer, out);
  send_deferred(w, out);
}

void LeaseServer::Impl::tick(unsigned worker, std::vector<OutDatagram>& out) {
  Worker& w = *workers[worker];
  const std::int64_t now = now_ms();
  for (std::size_t s = worker; s < shards.size(); s += workers.size()) {
    LockGuard lock(shards[s]->mu);
    shards[s]->shard->advance(now, w.deferred);
  }
  send_deferred(w, out);
  if (worker == 0 && lease_bound_settles_ms && now >= *lease_bound_settles_ms) {
    // Every lease of an earlier run has expired by now; from here on only
    // this run's max TTL bounds what a restart must wait for.
    lease_bound_settles_ms.reset();
    std::string detail;
    if (store->record_lease_bound(static_cast<std::uint64_t>(options.max_ttl.count()), detail)) {
      options.log("cannot record the lease bound: " + detail);
    }
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
const std::string& LeaseServer::error_detail() const noexcept { return impl_->error_detail; }
void LeaseServer::stop() { impl_->stop(); }

ServerStats LeaseServer::stats() const {
  ServerStats s;
  for (const auto& slot : impl_->shards) {
    LockGuard lock(slot->mu);
    const auto& c = slot->shard->counters();
    for (std::size_t i = 0; i < kStatCounterCount; ++i) s.counters[i] += c[i];
    s.shard_tokens.push_back(slot->shard->last_token());
  }
  impl_->add_server_counters(s.counters);
  return s;
}

}  // namespace shardlock::lease
