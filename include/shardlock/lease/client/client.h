// client.h: LeaseClient and Lease, the client side of the shardlock lease
// service (the server is server/server.h; the wire format wire/protocol.h).
// The facade sits on top: the options, results, errors and datagram seam it
// shares with the call engine below it are in call.h, included here.
//
// Use it to take distributed leases with fencing tokens:
//
//   shardlock::lease::LeaseClientOptions options;
//   options.nodes = {"127.0.0.1:7420"};
//   shardlock::lease::LeaseClient client(options);
//   if (std::error_code ec = client.start()) { /* client.error_detail() */ }
//
//   shardlock::lease::LeaseOptions watch;
//   watch.watchdog = true;                              // renew at ttl / 3
//   watch.on_lost = [](const shardlock::lease::LeaseLost& lost) { stop_writing(); };
//   auto result = client.acquire("orders/42", 10s, 2s, watch);
//   if (!result) { /* result.error: busy, timeout, unreachable, recovering */ }
//   write_with_fence(result.lease.token());             // pass the token on
//   result.lease.release();                             // or let it go out of scope
//
// Design (details and measured numbers in docs/client.md)
//   * One UDP socket and one random 128-bit client id per LeaseClient. Every
//     acquire contends as an owner of its own (the client id with its low 32
//     bits a handle count; LeaseOptions::owner for a known one), so threads
//     sharing one LeaseClient exclude each other exactly as two processes
//     do: one client per process, shared by its threads, is the intended
//     use.
//   * Threads: one I/O thread receives every reply (recvmmsg), matches it to
//     its outstanding call by request id and drives retransmissions from a
//     timer heap. Callers send their first transmission themselves and sleep
//     until the I/O thread completes their call, so any number of threads can
//     have any number of calls outstanding. A watchdog thread, started with
//     the first Lease that needs it, renews leases and runs lease-lost
//     callbacks, never on the I/O thread.
//   * Retransmission: a call that gets no answer is sent again with the SAME
//     request id (so the server's dedup cache answers it idempotently and a
//     lost GRANTED can never become a second grant), after an exponentially
//     growing interval with +-25% jitter, until the call's deadline. Every
//     call returns by its deadline: request_timeout, plus the wait of an
//     ACQUIRE that waits.
//   * Expiry as the client sees it: the send time of the first transmission of
//     the granting (or renewing) request plus the TTL granted, minus a drift
//     margin (clock_drift_factor x TTL + clock_drift_allowance, as Redlock's
//     drift factor) for clock-rate differences between hosts. The server
//     started its clock later than that send time and rounds its deadline up,
//     so the client's view errs early. It is measured on LeaseClock
//     (CLOCK_BOOTTIME), which keeps running during suspend.
//   * Renewals never push the expiry past what the server may hold: a RENEW
//     to a shorter TTL pulls the expiry in when it is sent, and an answer
//     moves it forward only to (its send time + the TTL answered), bounded by
//     every newer renewal still unanswered. The server applies a holder's
//     requests in request-id order (older ones are stale), which is what
//     makes that bound hold under reordering.
//   * Routing: a key goes to its owner node through the Router (router.h),
//     over the configured nodes; with one node every key goes to it.
//   * Cluster mode (discover_cluster, docs/cluster.md): the configured nodes
//     are seeds. start() asks them for the cluster's map (MAP), and keys are
//     routed over the map's members by id and weight, as the nodes route
//     them. Every request carries the map's epoch. A REDIRECT from a node
//     with a newer map makes the client refresh its map (one refresh at a
//     time) and send the call to the new owner, within the call's deadline.
//     A lease renews at its key's owner under the current map (with
//     replication a backup that took over holds it; otherwise the owner
//     answers that it has no such lease), and releases at the node that
//     granted it and, if the map moved the key, at its new owner too.
//   * The datagram path goes through DatagramTransport, so tests can inject
//     loss, duplication and reordering in front of the real socket.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "shardlock/lease/client/call.h"
#include "shardlock/lease/wire/protocol.h"

namespace shardlock::lease {

// A node's STATS (LeaseClient::stats(), ping()).
struct ServerStatsReply {
  std::error_code error;
  std::uint32_t shard_count = 0;
  // The counters and gauges (StatCounter); a gauge the server did not send
  // (has_gauges() false: it predates them) reads 0.
  std::array<std::uint64_t, kStatCounterCount> counters{};
  std::size_t counters_sent = 0;  // how many values the server sent
  std::vector<std::uint64_t> shard_tokens;
  // From the first STATS request's first transmission to its answer.
  std::chrono::microseconds round_trip{0};

  [[nodiscard]] std::uint64_t counter(StatCounter c) const noexcept {
    return counters[static_cast<std::size_t>(c)];
  }
  [[nodiscard]] bool has_gauges() const noexcept { return counters_sent >= kStatCounterCount; }
  // "1.2.3", or "" from a server that predates the version gauge.
  [[nodiscard]] std::string version() const { return version_text(counter(StatCounter::kVersion)); }
};

// A node's busiest keys (LeaseClient::hot_keys()).
struct HotKeysReply {
  std::error_code error;
  // The busiest keys the server's sketches hold, most requests first, as
  // many as one datagram carries (about 30 with short keys).
  std::vector<HotKeyInfo> keys;
  // The decayed time the counts cover: a key's requests per second is
  // requests * 1000 / window (rate()).
  std::chrono::milliseconds window{0};
  [[nodiscard]] double rate(const HotKeyInfo& key) const noexcept {
    return window.count() > 0 ? key.requests * 1000.0 / static_cast<double>(window.count()) : 0.0;
  }
};

// A key's version as a watch compares it (protocol.h, "Watches"): the
// newest holder's token and the holder count; {0, 0} while nobody holds it.
// The default, a version no key has, asks for the state at once.
struct KeyVersion {
  std::uint64_t token = kNoVersionToken;
  std::uint32_t holders = 0;
  friend bool operator==(const KeyVersion&, const KeyVersion&) = default;
};

// A key's state as a watch reports it (LeaseClient::watch_once(), KeyWatch
// in watch.h).
struct WatchEvent {
  std::error_code error;                        // empty when the state below is the key's
  WireError wire_error = WireError::kInternal;  // error kServerError: the server's code
  std::uint32_t retry_after_ms = 0;             // kRecovering
  KeyVersion version;
  LeaseMode mode = LeaseMode::kExclusive;  // meaningless while free
  std::uint32_t permits = 0;               // a semaphore key's limit, else 0
  std::uint32_t waiters = 0;
  std::uint32_t holder_count = 0;  // all of them
  // The newest holders, oldest grant first, ending at the newest: every one
  // unless their values take more than a datagram (a crowded shared or
  // semaphore key); an exclusive holder is always listed.
  std::vector<HolderInfo> holders;
  [[nodiscard]] bool held() const noexcept { return holder_count > 0; }
};
// The WatchEvent a WATCH's answer `r` carries.
[[nodiscard]] WatchEvent watch_event(const CallResult& r);

// Who holds a key (LeaseClient::holders()).
struct HoldersReply {
  std::error_code error;
  WireError wire_error = WireError::kInternal;  // error kServerError: the server's code
  // Whether the server listed each holder. False when it predates
  // QUERY_HOLDERS (it dropped the request, or answered ERROR kNotARequest):
  // the summary below then comes from QUERY and `holders` is empty.
  bool listed = true;
  // The summary QUERY gives: held (some holder, pending ones included), the
  // mode (meaningless when not held), the newest grant's token, the longest
  // time any holder has left, the waiters, how many hold it, and a
  // semaphore key's limit (0 for a lock key).
  bool held = false;
  LeaseMode mode = LeaseMode::kExclusive;
  std::uint64_t token = 0;
  std::chrono::milliseconds ttl_left{0};
  std::uint32_t waiters = 0;
  std::uint32_t holder_count = 0;
  std::uint32_t permits = 0;
  // Each holder, oldest grant first, gathered a page at a time: a holder
  // that leaves between two pages may shift one that stays past the page
  // boundary, so a key whose holders change meanwhile can be listed short.
  std::vector<HolderInfo> holders;
};

class LeaseClient;
namespace internal {
struct ClientCore;
struct LeaseState;
}  // namespace internal

// ---------------------------------------------------------------------------
// Lease
// ---------------------------------------------------------------------------

// A held lease: key, fencing token and the expiry the client can prove.
// Move-only; empty after a move or default construction. Destroying a held
// Lease releases it, best effort (one RELEASE with retransmissions, not
// waited for); the destructor, like release(), waits for a lost callback
// that is running. Every Lease carries its own token (the server gives a
// holder that acquires again a fresh one), so releasing an old Lease never
// frees a newer grant of the same key. Its methods may be called from any thread, but a Lease is
// one object: do not call them concurrently with its destruction or a move.
class Lease {
 public:
  Lease() noexcept;
  Lease(Lease&&) noexcept;
  Lease& operator=(Lease&&) noexcept;
  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;
  ~Lease();

  // True while held: not released, not lost, and the client-side expiry is
  // in the future. Never blocks.
  [[nodiscard]] bool valid() const noexcept;
  // False for an empty Lease.
  [[nodiscard]] bool empty() const noexcept { return state_ == nullptr; }

  [[nodiscard]] const std::string& key() const noexcept;
  [[nodiscard]] std::uint64_t token() const noexcept;
  // How the lease holds its key: exclusive, shared, or one of `permits()`.
  [[nodiscard]] LeaseMode mode() const noexcept;
  [[nodiscard]] std::uint32_t permits() const noexcept;  // 0 unless kPermit
  [[nodiscard]] ClientId owner() const noexcept;
  // The client-side expiry (LeaseClock); moves forward on each confirmed
  // renewal, and in at once when a renewal asks for a shorter TTL.
  [[nodiscard]] LeaseClock::time_point expiry() const noexcept;
  // The TTL the last grant or renewal asked for (what the watchdog renews
  // with).
  [[nodiscard]] std::chrono::milliseconds ttl() const noexcept;

  // RENEW for `ttl` (0: the current TTL). Blocks until answered or
  // request_timeout passes. On kNotOwner/kExpired the lease is lost (and the
  // lost callback fires). Returns kLeaseInactive when not held.
  std::error_code renew(std::chrono::milliseconds ttl = std::chrono::milliseconds{0});
  // RELEASE. Blocks like renew(). Afterwards the Lease is inactive whatever
  // the answer; the lost callback will not fire, and if it was running it has
  // returned (unless release() is called from that callback itself).
  std::error_code release();
  // Lets go of the handle without releasing the lease: it stays held on the
  // server until its TTL runs out (or someone releases it by key, token and
  // owner, as shardlockctl does). Stops the watchdog; the lost callback will
  // not fire. The Lease is empty afterwards.
  void detach() noexcept;

 private:
  friend class LeaseClient;
  Lease(std::shared_ptr<internal::ClientCore> core,
        std::shared_ptr<internal::LeaseState> state) noexcept;
  void release_in_background() noexcept;
  std::shared_ptr<internal::ClientCore> core_;  // keeps the client's engine alive
  std::shared_ptr<internal::LeaseState> state_;
};

// The outcome of acquire(): a Lease, or why not.
struct AcquireResult {
  std::error_code error;  // empty exactly when `lease` holds the grant
  Lease lease;
  std::uint32_t holder_ttl_left_ms = 0;         // kBusy: the holder's ttl left
  std::uint32_t retry_after_ms = 0;             // kRecovering
  WireError wire_error = WireError::kInternal;  // kServerError
  explicit operator bool() const noexcept { return !error; }
};

// The outcome of acquire_many(): one Lease per key (in the order asked), or
// none and why.
struct MultiAcquireResult {
  std::error_code error;                 // empty exactly when `leases` holds every key
  std::vector<Lease> leases;             // each with its own token, renewed and lost on its own
  std::string busy_key;                  // kBusy: the busy key the server named (BUSY_MANY)
  std::uint32_t holder_ttl_left_ms = 0;  // kBusy: its holder's ttl left
  std::uint32_t retry_after_ms = 0;      // kRecovering
  WireError wire_error = WireError::kInternal;  // kServerError
  explicit operator bool() const noexcept { return !error; }
};

// ---------------------------------------------------------------------------
// LeaseClient
// ---------------------------------------------------------------------------

class LeaseClient {
 public:
  using Clock = LeaseClock;
  using Completion = CallCompletion;

  explicit LeaseClient(LeaseClientOptions options);
  // Stops the threads; outstanding calls complete with kNotStarted; Leases
  // still alive become inert (their release is not sent). Must not run on
  // the client's own I/O or watchdog thread (from a completion or a lost
  // callback): it joins them.
  ~LeaseClient();
  LeaseClient(const LeaseClient&) = delete;
  LeaseClient& operator=(const LeaseClient&) = delete;

  // Resolves the nodes, opens the socket and starts the I/O thread. Call
  // once; on error error_detail() says which node or syscall failed. A
  // node address that is malformed or does not resolve is kBadAddress (the
  // detail gives the resolver's reason; parse_endpoint() tells the two
  // apart).
  [[nodiscard]] std::error_code start();
  [[nodiscard]] const std::string& error_detail() const noexcept;

  [[nodiscard]] ClientId client_id() const noexcept;
  // The node index (into options.nodes) that owns `key`. In cluster mode:
  // the index of its owner among the current map's members (sorted by id),
  // which a map refresh may change.
  [[nodiscard]] std::size_t node_for(std::string_view key) const noexcept;
  // "HOST:PORT" of the node that owns `key` now; empty before start().
  [[nodiscard]] std::string address_for(std::string_view key) const;
  // Cluster mode: the epoch and the members of the current map (0 and none
  // otherwise, or before start()).
  [[nodiscard]] std::uint64_t map_epoch() const noexcept;
  [[nodiscard]] std::vector<MapMember> map_members() const;

  // ---- blocking calls (any thread, concurrently) -------------------------

  // ACQUIRE `key` for `ttl`, waiting up to `wait` for a holder to let go (0:
  // answer BUSY at once). Blocks about wait + request_timeout at most. A wait
  // longer than the server takes in one request (its max_wait, or 49 days,
  // the wire's limit) is not an error: the client queues again with the
  // wait left after each TIMEOUT until its own wait is spent (so a key
  // freed between two rounds may go to a waiter queued behind). A grant's
  // client-side expiry counts from the request's first transmission, so one
  // that arrives past it (wait >= TTL, or a GRANTED recovered late by
  // retransmission) is renewed before it is returned (one more round trip;
  // its expiry then counts from the RENEW); if the renewal is refused (the
  // lease already ended at the server) it is released and returned as
  // kGrantExpired: a returned Lease is valid() when acquire() returns.
  // Every acquire is an owner of its own (LeaseOptions::owner): acquiring a
  // key this client already holds waits for that grant like any other
  // contender's (or is kBusy with no wait).
  [[nodiscard]] AcquireResult acquire(std::string_view key, std::chrono::milliseconds ttl,
                                      std::chrono::milliseconds wait,
                                      LeaseOptions lease_options = {});
  [[nodiscard]] AcquireResult try_acquire(std::string_view key, std::chrono::milliseconds ttl,
                                          LeaseOptions lease_options = {}) {
    return acquire(key, ttl, std::chrono::milliseconds{0}, std::move(lease_options));
  }
  // A shared (read) lease: held alongside other shared leases, never with an
  // exclusive one. Waits FIFO: behind a queued exclusive ACQUIRE it waits
  // for that one (writers do not starve). Each shared holder has its own
  // token, renewals and expiry. Otherwise as acquire().
  [[nodiscard]] AcquireResult acquire_shared(std::string_view key, std::chrono::milliseconds ttl,
                                             std::chrono::milliseconds wait,
                                             LeaseOptions lease_options = {});
  // One of at most `permits` leases on `key` (a counting semaphore, as
  // Curator's InterProcessSemaphoreV2 or Redisson's PermitExpirableSemaphore).
  // The limit is the first acquirer's until the key is idle; another limit
  // meanwhile is kServerError with wire_error kLeaseKindMismatch, and so is
  // a permit on a key held as a lock (or the reverse). `permits` outside
  // 1..kMaxPermits is kBadArgument before sending. Acquiring again gives
  // this client another permit. Otherwise as acquire().
  [[nodiscard]] AcquireResult acquire_permit(std::string_view key, std::uint32_t permits,
                                             std::chrono::milliseconds ttl,
                                             std::chrono::milliseconds wait,
                                             LeaseOptions lease_options = {});
  // Every key in `keys` (1..kMaxKeysPerRequest, distinct, all owned by one
  // node, else kBadArgument / kCrossNode before sending) in `mode`
  // (exclusive or shared), all or nothing: every Lease, or none and, when
  // busy, which key was. One ACQUIRE_MANY datagram carries them all, so
  // keys whose bytes do not fit in it are kBadArgument too. With a wait the
  // server takes the keys in its global order, so two overlapping
  // acquire_many() calls never deadlock. Each Lease has its own token and
  // is renewed, released and lost on its own (each with a copy of
  // `lease_options`). A grant that arrives expired releases every key
  // (kGrantExpired), as acquire().
  [[nodiscard]] MultiAcquireResult acquire_many(std::span<const std::string_view> keys,
                                                std::chrono::milliseconds ttl,
                                                std::chrono::milliseconds wait,
                                                LeaseMode mode = LeaseMode::kExclusive,
                                                LeaseOptions lease_options = {});
  // Raw RENEW/RELEASE by key and token, for an owner that holds no Lease
  // object (shardlockctl), as `owner` (default: client_id()): the owner the
  // lease was granted to (Lease::owner()).
  [[nodiscard]] CallResult renew(std::string_view key, std::uint64_t token,
                                 std::chrono::milliseconds ttl,
                                 std::optional<ClientId> owner = std::nullopt);
  [[nodiscard]] CallResult release(std::string_view key, std::uint64_t token,
                                   std::optional<ClientId> owner = std::nullopt);
  [[nodiscard]] CallResult query(std::string_view key);
  // Every holder of `key` (QUERY_HOLDERS, as many pages as it takes) with
  // the QUERY summary, in one blocking call. Against a server that predates
  // QUERY_HOLDERS it falls back to QUERY after the request goes unanswered
  // (request_timeout) and returns the summary with listed false.
  [[nodiscard]] HoldersReply holders(std::string_view key);
  // STATS of node `node` (an index into options.nodes, in cluster mode too),
  // every shard's token (paged as needed).
  [[nodiscard]] ServerStatsReply stats(std::size_t node = 0);
  // One STATS round trip to node `node`, asking for no shard tokens: the
  // counters and gauges (version, uptime, lock-delay left) and round_trip.
  // Blocks up to request_timeout; kUnreachable when no answer came.
  [[nodiscard]] ServerStatsReply ping(std::size_t node = 0);
  // HOT_KEYS of node `node`: its busiest keys (docs/lease-server.md, "Hot
  // keys"). Blocks up to request_timeout; a server that predates HOT_KEYS
  // drops it, so that is kUnreachable too.
  [[nodiscard]] HotKeysReply hot_keys(std::size_t node = 0);
  // One WATCH of `key` (a blocking query, protocol.h "Watches"): its state
  // as soon as its version differs from `since` (at once for the default
  // KeyVersion), or its state after `wait` with the same version. Blocks up
  // to wait + request_timeout; rides through RECOVERING, REDIRECT and a
  // silent node within that, like a waiting acquire. A wait above the
  // server's max_wait is kServerError kWaitOutOfRange. KeyWatch (watch.h)
  // loops over it: use that to follow a key.
  [[nodiscard]] WatchEvent watch_once(std::string_view key, KeyVersion since,
                                      std::chrono::milliseconds wait);

  // ---- asynchronous calls -------------------------------------------------
  // `done` runs exactly once, on the I/O thread, by the call's deadline; it
  // must not block (no blocking client calls inside it). Calls made from
  // inside a completion are sent together when the receive round ends,
  // batched per node and owner (max_batch), the datagrams of one round in
  // one sendmmsg. Nothing is returned: errors arrive in done.
  //
  // `owner` makes the call on behalf of another owner identity over this
  // client's socket and I/O thread (default: client_id()). One process can
  // so drive many independent owners from one thread, as a load generator
  // does, the way redis-benchmark multiplexes its connections.
  void acquire_async(std::string_view key, std::chrono::milliseconds ttl,
                     std::chrono::milliseconds wait, Completion done,
                     std::optional<ClientId> owner = std::nullopt);
  // ACQUIRE_SHARED (mode kShared) or ACQUIRE_PERMIT (kPermit, with `permits`).
  void acquire_async(std::string_view key, LeaseMode mode, std::uint32_t permits,
                     std::chrono::milliseconds ttl, std::chrono::milliseconds wait, Completion done,
                     std::optional<ClientId> owner = std::nullopt);
  // ACQUIRE_MANY; the result's tokens (GRANTED_MANY) or busy_index (BUSY_MANY).
  void acquire_many_async(std::span<const std::string_view> keys, LeaseMode mode,
                          std::chrono::milliseconds ttl, std::chrono::milliseconds wait,
                          Completion done, std::optional<ClientId> owner = std::nullopt);
  void renew_async(std::string_view key, std::uint64_t token, std::chrono::milliseconds ttl,
                   Completion done, std::optional<ClientId> owner = std::nullopt);
  void release_async(std::string_view key, std::uint64_t token, Completion done,
                     std::optional<ClientId> owner = std::nullopt);
  // watch_once() without blocking: read the answer with watch_event().
  void watch_async(std::string_view key, KeyVersion since, std::chrono::milliseconds wait,
                   Completion done);
  // Runs `fn` on the I/O thread soon (for starting completion chains there).
  void post(std::function<void()> fn);

  // Datagrams sent and retransmissions made so far (relaxed counters).
  [[nodiscard]] std::uint64_t datagrams_sent() const noexcept;
  [[nodiscard]] std::uint64_t retransmissions() const noexcept;
  // Datagrams received that were not a valid reply: undecodable, or failing
  // (or lacking, when a key is set) the auth tag; and replies that decode
  // but cannot answer their call (a GRANTED_MANY without exactly one token
  // per key asked, a BUSY_MANY naming no key of it). Such a datagram or
  // reply completes nothing. A relaxed counter.
  [[nodiscard]] std::uint64_t malformed_replies() const noexcept;
  // What the transport saw besides replies: replies whose sealing does not
  // match this client's auth key (call.h). Zeros before start().
  [[nodiscard]] TransportCounters transport_counters() const noexcept;

 private:
  // acquire(), acquire_shared() and acquire_permit() (permits: kPermit only).
  AcquireResult acquire_one(std::string_view key, LeaseMode mode, std::uint32_t permits,
                            std::chrono::milliseconds ttl, std::chrono::milliseconds wait,
                            LeaseOptions lease_options);

  std::shared_ptr<internal::ClientCore> core_;
};

}  // namespace shardlock::lease
