// server.h: LeaseServer, the embeddable UDP lease server (shardlockd wraps it).
//
// Use it to serve leases with fencing tokens from any process:
//
//   shardlock::lease::LeaseServerOptions options;
//   options.bind_address = "127.0.0.1:0";
//   options.data_dir = "/var/lib/shardlockd";
//   shardlock::lease::LeaseServer server(options);
//   if (std::error_code ec = server.start()) { /* server.error_detail() */ }
//   use(server.port());
//   server.stop();
//
// Design (details and measured behaviour in docs/lease-server.md)
//   * State: `shards` independent shards; a key's shard is
//     XXH3_64bits_withSeed(key, secret per-process seed) % shards. Each shard owns its
//     lease table, FIFO waiters per key, 64-bit token counter, timer wheel and
//     bounded dedup cache, all behind one lock per shard, so any I/O thread
//     can serve any key and shards never wait on each other.
//   * I/O: `io_threads` threads, each with its own SO_REUSEPORT socket on the
//     same address and its own io_uring (multishot recvmsg on a provided
//     buffer ring, batched sendmsg) or, as a fallback, a recvmmsg/sendmmsg
//     loop. Thread t also drives the timers of shards t, t+T, t+2T, ...
//   * Tokens: strictly increasing per shard. With a data_dir they are
//     reserved in durable blocks, so after kill -9 every new token is greater
//     than every token issued before; see docs/lease-server.md for the exact
//     guarantees with and without a data dir.
//   * Lock-delay: for `lock_delay` after start() every ACQUIRE is answered
//     RECOVERING, because leases granted before a crash are unknown. A
//     fresh data dir has none, and grants at once.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "shardlock/lease/server/server_types.h"
#include "shardlock/lease/tenants.h"
#include "shardlock/lease/wire/auth.h"
#include "shardlock/lease/wire/protocol.h"
#include "shardlock/router.h"

namespace shardlock::lease {

namespace internal {
struct ClusterGate;
class ClusterControl;
}  // namespace internal

// Which datagram loop serves the socket.
enum class IoBackend : std::uint8_t {
  kAuto,    // io_uring when the kernel allows it, else kSocket (logged)
  kUring,   // io_uring only; start() fails if it is unavailable
  kSocket,  // recvmmsg/sendmmsg
};
[[nodiscard]] std::string_view to_string(IoBackend backend) noexcept;
// "auto", "uring", "socket"; nullopt otherwise.
[[nodiscard]] std::optional<IoBackend> parse_io_backend(std::string_view text) noexcept;

struct LeaseServerOptions {
  // "HOST:PORT": an IPv4 address or "[IPv6]"; port 0 picks a free port
  // (read it back with port()).
  std::string bind_address = "127.0.0.1:0";
  // Number of shards, 1..65536.
  std::uint32_t shards = 64;
  // Largest ttl_ms an ACQUIRE or RENEW may ask for; larger is ERROR.
  std::chrono::milliseconds max_ttl{60'000};
  // Largest wait_ms an ACQUIRE may ask for; larger is ERROR.
  std::chrono::milliseconds max_wait{300'000};
  // How long after start() ACQUIRE answers RECOVERING. nullopt = max_ttl,
  // or the max TTL of an earlier run recorded in data_dir if that is longer
  // (until this run has waited it out); 0 for a data dir that never issued
  // a token (LeaseServer::fresh_data_dir()). Zero is allowed (tests) and,
  // but for a fresh data dir, logged as a warning.
  std::optional<std::chrono::milliseconds> lock_delay;
  // Directory for the token high-water marks. Empty: tokens are kept in
  // memory only and restart from 1 (see docs/lease-server.md).
  std::string data_dir;
  // Tokens reserved per durable write, per shard.
  std::uint64_t token_block = 4096;
  // I/O threads (each with its own socket and loop), >= 1.
  unsigned io_threads = 1;
  IoBackend io = IoBackend::kAuto;
  // After a datagram, an I/O thread keeps polling its socket without
  // sleeping for this long before it blocks again (like SO_BUSY_POLL or
  // io_uring SQPOLL): a request that follows within the window skips the
  // wake-up, which is most of a loopback round trip. Costs CPU only while
  // traffic flows (at most this much spinning per idle gap); zero turns it
  // off. At most 10 ms.
  std::chrono::microseconds busy_poll{50};
  // Remembered answers per shard for retransmitted requests.
  std::size_t dedup_entries_per_shard = 4096;
  // Bounds on memory (each >= 1). A request past one is answered
  // ERROR(kLimitExceeded) and counted as kLimitRejections; nothing already
  // granted is touched. Server-wide bounds are enforced per shard as
  // ceil(bound / shards); keys spread over shards by a secret hash, so a
  // client cannot aim them at one shard. The per-client bounds are enforced
  // the same way, per shard, so one client id can reach up to
  // shards x ceil(bound / shards) in all (about the bound when it is much
  // larger than the shard count). A queued ACQUIRE handed the lease is
  // granted even if its client is at max_leases_per_client by then. Leases
  // count holders: a key with three shared holders counts three.
  std::size_t max_keys = 1'000'000;              // leases held, all keys
  std::size_t max_waiters = 1'000'000;           // queued ACQUIREs, all keys
  std::size_t max_waiters_per_key = 10'000;      // queued ACQUIREs on one key
  std::size_t max_leases_per_client = 100'000;   // leases held by one client id
  std::size_t max_waiters_per_client = 100'000;  // ACQUIREs queued by one client id
  // Parked WATCHes (a blocking QUERY, protocol.h "Watches"): each costs
  // about 200 bytes until it is answered, so these bound their memory.
  std::size_t max_watches = 100'000;            // parked WATCHes, all keys
  std::size_t max_watches_per_key = 10'000;     // parked WATCHes on one key
  std::size_t max_watches_per_client = 10'000;  // WATCHes parked by one client id
  // Slots of each shard's hot-key sketch (HOT_KEYS, shardlockctl top;
  // internal/hot_keys.h), 0..kMaxHotKeysPerShard: its memory is fixed at
  // start, about 300 bytes a slot. 0: no sketch, HOT_KEYS lists no keys.
  std::size_t hot_keys_per_shard = 16;
  static constexpr std::size_t kMaxHotKeysPerShard = 1024;
  // Its counts halve every hot_key_half_life after the start, so it follows
  // current traffic; 0: never (counts since the start).
  std::chrono::milliseconds hot_key_half_life{10'000};
  // Shared key for datagram authentication (auth.h). When set, every
  // datagram must carry a valid tag (the others are dropped and counted as
  // kAuthFailures) and every reply is sealed. When unset, sealed datagrams
  // are dropped and counted the same way.
  std::optional<AuthKey> auth_key;
  // Tenants (tenants.h, docs/security.md; --tenants FILE): every client
  // datagram must be sealed under its key id's tenant key (or next key),
  // and encrypted for a tenant with `encrypt`; a request outside the
  // tenant's prefixes and rights is answered ERROR(kPermissionDenied); the
  // top 32 bits of every owner id are forced to the tenant's key id, so one
  // tenant can never name another's lease. Replaces auth_key, which is a
  // table of one without the owner scoping. reload_tenants() swaps a new
  // table in while running.
  std::optional<TenantTable> tenants;
  // Cluster mode (src/cluster/etcd/cluster_node.h): start with a closed gate, so
  // every ACQUIRE, RENEW and QUERY is answered RECOVERING, and MAP with no
  // map, until the cluster layer publishes one
  // (internal::ClusterControl::publish_cluster_gate()).
  // The server's own lock-delay (lock_delay()) is then the cluster layer's
  // to enforce, per bucket: its gate keeps every bucket closed until it
  // ends, except those taken over complete from a settled primary, whose
  // snapshot holds every live lease (ClusterNode: a returning node grants those at once). The
  // shards do not refuse ACQUIRE by it.
  bool start_closed = false;
  // Replication (docs/cluster.md, "Replication"; cluster mode with
  // --replicas above 1): node-to-node replication streams on the lease
  // port, driven by the cluster layer through ClusterControl's
  // set_replica_layout() and take_over(). Needs start_closed.
  bool replication = false;
  // With replication: a grant's or release's answer that waits on one
  // backup is sent to the client by that backup, once it has applied it,
  // one network hop sooner than through the primary (docs/cluster.md,
  // "Answers from the backup"; --replies-from backup). Clients accept an
  // answer from any address (they match request ids); a client that hears
  // only the address it sent to (behind a NAT) gets its answer when it
  // retransmits: a retransmission's answer is never relayed.
  bool relay_replies = true;
  // The key that seals node-to-node replication datagrams (--cluster-key),
  // which clients never hold: with it a client's key (auth_key) can no
  // longer forge a REPLICATE or an ack. Unset: auth_key
  // seals them, as before, and without either they travel in clear.
  std::optional<AuthKey> cluster_key;
  // The clock every duration is measured on (lease expiry, waits,
  // lock-delay, and the cluster's etcd-lease deadline through now()),
  // injectable for tests. Default (empty): CLOCK_BOOTTIME, which keeps
  // counting while the machine is suspended, so a host that slept past a
  // lease, its lock-delay or its etcd lease wakes up knowing it.
  std::function<std::chrono::nanoseconds()> clock;
  // Where log lines go (one line per call, no trailing newline). Default:
  // stderr, prefixed with "shardlock-lease: ".
  std::function<void(std::string_view)> log;
  // The grant log: when set, one line per grant, hand-off,
  // release, expiry, abandoned ACQUIRE_MANY part and takeover, with key,
  // owner, token, epoch (cluster mode) and TTL, so "who held X at 10:02"
  // has an answer (docs/lease-server.md, "Grant log"). At most
  // grant_log_lines_per_second lines a second; the rest are counted and
  // the next line that fits says how many. Off (empty) by default:
  // shardlockd turns it on at --log-level debug. Called under a shard's
  // lock: quick, and never calling back into the server.
  std::function<void(std::string_view)> grant_log;
  std::uint32_t grant_log_lines_per_second = 1000;
};

class LeaseServer {
 public:
  explicit LeaseServer(LeaseServerOptions options);
  // Stops the server if it is running.
  ~LeaseServer();
  LeaseServer(const LeaseServer&) = delete;
  LeaseServer& operator=(const LeaseServer&) = delete;

  // Validates the options, opens (or creates) the data dir, binds the
  // sockets and starts the I/O threads. Returns once the server answers
  // datagrams, or an error with nothing left running; error_detail() then
  // holds a one-line explanation (file names, the option at fault). Call at
  // most once per object. A UDP port that another server (any io_threads, or
  // any other process) already holds fails with std::errc::address_in_use:
  // one shardlock server per port per network namespace, whatever its
  // address (0.0.0.0:P and 127.0.0.1:P exclude each other).
  [[nodiscard]] std::error_code start();

  // The bound UDP port; 0 before a successful start().
  [[nodiscard]] std::uint16_t port() const noexcept;
  // "HOST:PORT" as bound, e.g. "127.0.0.1:40123".
  [[nodiscard]] std::string listen_address() const;
  // The back end start() chose.
  [[nodiscard]] IoBackend backend() const noexcept;
  // The lock-delay start() applied: options.lock_delay, or by default the
  // larger of max_ttl and the max TTL the data dir records for earlier runs,
  // or 0 for a fresh data dir (fresh_data_dir()).
  [[nodiscard]] std::chrono::milliseconds lock_delay() const noexcept;
  // Whether start() found a data dir that had never issued a token, outside
  // cluster mode: no earlier lease can be live, so by default it grants at
  // once, and its tokens start above a wall-clock floor in case the dir was
  // wiped under live holders (docs/lease-server.md, "A fresh data dir").
  [[nodiscard]] bool fresh_data_dir() const noexcept;
  // Why start() failed.
  [[nodiscard]] const std::string& error_detail() const noexcept;
  // Counters and per-shard tokens; takes each shard lock briefly.
  [[nodiscard]] ServerStats stats() const;

  // Stops the I/O threads and closes the sockets. Blocks until the threads
  // have exited (a few milliseconds). Idempotent; safe before start().
  void stop();

  // The clock the server runs on (options.clock, or CLOCK_BOOTTIME). Time
  // spent suspended counts.
  [[nodiscard]] std::chrono::nanoseconds now() const;
  // Swaps in a new tenant table (a SIGHUP's reload of --tenants) without
  // dropping a lease, a waiter or a parked watch: each I/O thread uses it
  // from its next datagram; answers still owed to a tenant the new table
  // lacks are not sent. False, changing nothing, when the server was not
  // started with options.tenants.
  bool reload_tenants(TenantTable tenants);
  // Each tenant in force (options.tenants, or the single auth_key's
  // "default") with its counts; empty without either.
  [[nodiscard]] std::vector<TenantStats> tenant_stats() const;

  // Cluster mode and replication are driven through
  // internal::ClusterControl (internal/cluster_control.h), the cluster
  // layer's hooks into this server.

 private:
  friend class internal::ClusterControl;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace shardlock::lease
