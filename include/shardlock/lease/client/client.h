// client.h: LeaseClient and Lease, the client side of the shardlock lease
// service (the server is server.h; the wire format protocol.h).
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
//   * One UDP socket and one random 128-bit client id per LeaseClient. The id
//     is the owner of every lease the client takes: two LeaseClients exclude
//     each other, two threads of one LeaseClient do not (the server answers a
//     repeated ACQUIRE by the holder with the same grant). Use a LeaseClient
//     per independent owner, or the LockTable inside one process.
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
//     A lease renews and releases at the node that granted it.
//   * The datagram path goes through DatagramTransport, so tests can inject
//     loss, duplication and reordering in front of the real socket.
#pragma once

#include <sys/socket.h>

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "shardlock/lease/wire/auth.h"
#include "shardlock/lease/wire/protocol.h"

namespace shardlock::lease {

// The clock of client-side lease expiry: CLOCK_BOOTTIME. Unlike
// CLOCK_MONOTONIC (std::chrono::steady_clock) it keeps counting while the
// machine is suspended, and the server's leases expire during a suspend too.
struct LeaseClock {
  using duration = std::chrono::nanoseconds;
  using rep = duration::rep;
  using period = duration::period;
  using time_point = std::chrono::time_point<LeaseClock>;
  static constexpr bool is_steady = true;
  [[nodiscard]] static time_point now() noexcept;
};

// ---------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------

// Why a client call did not succeed. Also a std::error_code category.
enum class LeaseErrc : std::uint8_t {
  kOk = 0,
  kBusy,           // held by another owner (BUSY, ACQUIRE with no wait)
  kTimeout,        // the wait ran out before the lease was handed over (TIMEOUT)
  kUnreachable,    // no answer before the call's deadline
  kRecovering,     // the server is in its lock-delay after a start (RECOVERING)
  kNotOwner,       // RENEW/RELEASE by someone who does not hold the lease
  kExpired,        // RENEW/RELEASE of a lease the server no longer has
  kServerError,    // the server answered ERROR (see the result's wire_error)
  kBadArgument,    // refused before sending: key length, TTL of 0, ...
  kNotStarted,     // start() has not succeeded, or the client is shutting down
  kBadAddress,     // a node address does not parse or resolve
  kLeaseInactive,  // the Lease is empty, released or already lost
  kGrantExpired,   // granted, but the grant's client-side expiry had passed on arrival
  kCrossNode,      // acquire_many() keys owned by different nodes (refused before sending)
  // A cluster node answered REDIRECT (not the key's owner) and the client
  // could not reach the owner: more than kMaxRedirects redirects, still
  // redirected at the call's deadline, or not in cluster mode
  // (discover_cluster off).
  kRedirected,
};
// The most REDIRECTs one call follows before it fails with kRedirected. One
// from a node whose map is behind the client's does not count: the call
// waits for that node to catch up, within its deadline.
inline constexpr unsigned kMaxRedirects = 8;
[[nodiscard]] std::string_view to_string(LeaseErrc e) noexcept;
[[nodiscard]] const std::error_category& lease_category() noexcept;
[[nodiscard]] inline std::error_code make_error_code(LeaseErrc e) noexcept {
  return {static_cast<int>(e), lease_category()};
}

// ---------------------------------------------------------------------------
// The datagram seam
// ---------------------------------------------------------------------------

// A UDP peer address, resolved once.
struct Endpoint {
  sockaddr_storage address{};
  socklen_t length = 0;
  std::string text;  // "HOST:PORT" as configured
};
// Resolves "HOST:PORT" or "[IPv6]:PORT" (numeric or a host name). Returns
// kBadAddress for anything else.
[[nodiscard]] std::error_code parse_endpoint(std::string_view text, Endpoint& out);

// The I/O path of a LeaseClient: every datagram it sends or receives passes
// through one of these. The default is a plain UDP socket
// (make_udp_transport); tests wrap it to lose, duplicate or reorder
// datagrams without touching the product code around it.
class DatagramTransport {
 public:
  virtual ~DatagramTransport() = default;
  // Sends one datagram. Called from any thread, concurrently. A failure is
  // returned for counting only; the caller treats it as a lost datagram.
  virtual std::error_code send(const Endpoint& to, std::span<const std::uint8_t> bytes) = 0;
  struct Outgoing {
    const Endpoint* to;
    std::span<const std::uint8_t> bytes;
  };
  // Sends several datagrams (the I/O thread's batch); the default calls
  // send() for each, the UDP transport makes one sendmmsg per 64.
  virtual void send_many(std::span<const Outgoing> datagrams) {
    for (const Outgoing& d : datagrams) (void)send(*d.to, d.bytes);
  }
  // Hands every datagram that is ready now to `deliver`, without blocking;
  // returns how many were read. Called only from the client's I/O thread.
  virtual std::size_t receive(
      const std::function<void(std::span<const std::uint8_t>)>& deliver) = 0;
  // A descriptor that polls readable when receive() has work. May also
  // return -1 with a non-zero poll_interval().
  [[nodiscard]] virtual int fd() const noexcept = 0;
  // How often the I/O thread must call receive() even when fd() is quiet, for
  // transports that hold datagrams back (reordering); zero means never.
  [[nodiscard]] virtual std::chrono::milliseconds poll_interval() const noexcept { return {}; }
};

// A non-blocking UDP socket of `family` (AF_INET or AF_INET6), bound to an
// ephemeral port. Receives up to 32 datagrams per recvmmsg.
[[nodiscard]] std::error_code make_udp_transport(int family,
                                                 std::unique_ptr<DatagramTransport>& out);

// ---------------------------------------------------------------------------
// Options and results
// ---------------------------------------------------------------------------

struct LeaseClientOptions {
  // "HOST:PORT" of every node. Keys are routed to their owner with the
  // Router; one node is the usual case. All nodes share one address family.
  // With discover_cluster: seeds, asked for the cluster's map.
  std::vector<std::string> nodes;
  // Cluster mode (docs/cluster.md): start() asks the seeds in `nodes`, in
  // turn, for the cluster's map (MAP, paged) until one answers with a map
  // (epoch > 0); when none does it fails with kUnreachable, and
  // error_detail() gives each seed's reason ("not a cluster node" for one
  // that answered epoch 0). Keys are then routed over the map's members,
  // every request carries the map's epoch, and REDIRECTs are followed. The
  // members must share the seeds' address family; addresses are resolved on
  // the client's I/O thread, so maps should hold numeric addresses.
  bool discover_cluster = false;
  // The owner identity; random (getrandom) when empty. Set it only to act for
  // an owner that already exists (shardlockctl renew/release --owner).
  std::optional<ClientId> client_id;
  // How long a call without a wait retransmits before it gives up as
  // kUnreachable. An ACQUIRE that waits gets its wait on top.
  std::chrono::milliseconds request_timeout{2000};
  // First retransmission interval; doubled on each retry up to the maximum,
  // each interval jittered by +-25%.
  std::chrono::milliseconds initial_retransmit{20};
  std::chrono::milliseconds max_retransmit{400};
  // Calls issued from the I/O thread (inside async completions) are sent
  // when the completions of one receive round are done, packed up to this
  // many per datagram (1 = never batch).
  std::size_t max_batch = kMaxBatch;
  // While calls are outstanding, the I/O thread polls its socket without
  // sleeping for up to this long before it blocks in poll(): a reply that
  // lands within the window skips the wake-up. Costs CPU only while waiting
  // for replies; zero turns it off. At most 10 ms.
  std::chrono::microseconds busy_poll{50};
  // Shared key for datagram authentication (auth.h); must match the
  // servers'. When set, requests are sealed and replies whose tag does not
  // verify are dropped, so a forged GRANTED is never believed.
  std::optional<AuthKey> auth_key;
  // Client-side expiry = send time + TTL - (clock_drift_factor x TTL +
  // clock_drift_allowance): the allowance for this host's clock running
  // faster than the server's, plus scheduling. The defaults are Redlock's
  // (1% and 2 ms). The factor must be in [0, 1).
  double clock_drift_factor = 0.01;
  std::chrono::milliseconds clock_drift_allowance{2};
  // Wraps the default UDP transport (tests: fault injection). Null: none.
  std::function<std::unique_ptr<DatagramTransport>(std::unique_ptr<DatagramTransport>)>
      wrap_transport;
};

// One member of a cluster map (MAP_REPLY), owned.
struct MapMember {
  std::string id;
  std::string address;  // "HOST:PORT"
  std::uint32_t weight = 1;
  friend bool operator==(const MapMember&, const MapMember&) = default;
};

// The answer to one call, as the async interface delivers it and the sync
// helpers below read it.
struct CallResult {
  std::error_code error;                        // empty when the server said yes
  MessageType reply = MessageType::kError;      // the reply type (when one came)
  std::uint64_t token = 0;                      // GRANTED, QUERY_REPLY
  std::uint32_t ttl_ms = 0;                     // GRANTED/RENEWED ttl; BUSY/QUERY ttl left
  std::uint32_t retry_after_ms = 0;             // RECOVERING
  WireError wire_error = WireError::kInternal;  // ERROR
  bool held = false;                            // QUERY_REPLY
  std::uint32_t waiters = 0;                    // QUERY_REPLY
  LeaseMode mode = LeaseMode::kExclusive;       // QUERY_REPLY
  std::uint32_t holders = 0;                    // QUERY_REPLY
  std::uint32_t permits = 0;                    // QUERY_REPLY: a semaphore key's limit
  std::vector<std::uint64_t> tokens;            // GRANTED_MANY: one per key, in request order
  std::uint8_t busy_index = 0;                  // BUSY_MANY: the first busy key's index
  // When the call's first transmission left; a grant's expiry counts from it.
  LeaseClock::time_point first_sent;
  std::uint64_t request_id = 0;  // the call's request id
  unsigned transmissions = 0;    // 1 + retransmissions
  // STATS_REPLY: one page of the server's counters and shard tokens.
  std::uint32_t shard_count = 0;
  std::uint32_t first_shard = 0;
  std::array<std::uint64_t, kStatCounterCount> counters{};
  std::vector<std::uint64_t> shard_tokens;
  // REDIRECT, MAP_REPLY: the node's map epoch. MAP_REPLY: one page of the
  // map's members (first_member onward) and how many it has in all.
  std::uint64_t epoch = 0;
  std::uint32_t member_count = 0;
  std::uint32_t first_member = 0;
  std::vector<MapMember> members;
  // The node the call was last sent to (null if it never was): the one that
  // answered, when an answer came. Owned by the client, valid while it lives.
  const Endpoint* node = nullptr;
};

// What a lease-lost callback learns.
struct LeaseLost {
  std::string key;
  std::uint64_t token = 0;
  // kExpired: the client-side expiry passed with no confirmed renewal (the
  //   server did not answer in time, or the watchdog was off);
  // kNotOwner / kExpired from the server: the renewal was refused (in
  // cluster mode a REDIRECT counts as kExpired: the node handed the key off);
  // kServerError: the renewal was answered with ERROR.
  std::error_code reason;
  bool refused_by_server = false;
};

// How a Lease looks after itself. The defaults: no watchdog, no callback.
struct LeaseOptions {
  // Renew automatically at renew_fraction x TTL after each confirmed grant
  // or renewal, retrying until the client-side expiry.
  bool watchdog = false;
  double renew_fraction = 1.0 / 3.0;  // in (0, 1)
  // Called exactly once if the lease is lost: a renewal is refused or fails,
  // or the client-side expiry passes with no renewal. Never called after
  // release() or destruction of the Lease began. Runs on the client's
  // watchdog thread; it may call the client, and should not block for long.
  std::function<void(const LeaseLost&)> on_lost;
};

struct ServerStatsReply {
  std::error_code error;
  std::uint32_t shard_count = 0;
  std::array<std::uint64_t, kStatCounterCount> counters{};
  std::vector<std::uint64_t> shard_tokens;
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
  explicit Lease(std::shared_ptr<internal::LeaseState> state) noexcept;
  void release_in_background() noexcept;
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
  using Completion = std::function<void(const CallResult&)>;

  explicit LeaseClient(LeaseClientOptions options);
  // Stops the threads; outstanding calls complete with kNotStarted; Leases
  // still alive become inert (their release is not sent). Must not run on
  // the client's own I/O or watchdog thread (from a completion or a lost
  // callback): it joins them.
  ~LeaseClient();
  LeaseClient(const LeaseClient&) = delete;
  LeaseClient& operator=(const LeaseClient&) = delete;

  // Resolves the nodes, opens the socket and starts the I/O thread. Call
  // once; on error error_detail() says which node or syscall failed.
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
  // answer BUSY at once). Blocks at most wait + request_timeout. A grant that
  // arrives after its own client-side expiry (wait >= TTL, or a GRANTED
  // recovered late by retransmission) is released and returned as
  // kGrantExpired: a returned Lease is valid() when acquire() returns.
  // Acquiring a key this client already holds gives a new grant with a new
  // token; the older Lease then finds itself superseded (lost) at its next
  // renewal.
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
  // object (shardlockctl). The caller's client id must be the owner's.
  [[nodiscard]] CallResult renew(std::string_view key, std::uint64_t token,
                                 std::chrono::milliseconds ttl);
  [[nodiscard]] CallResult release(std::string_view key, std::uint64_t token);
  [[nodiscard]] CallResult query(std::string_view key);
  // STATS of node `node` (an index into options.nodes, in cluster mode too),
  // every shard's token (paged as needed).
  [[nodiscard]] ServerStatsReply stats(std::size_t node = 0);

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

 private:
  // acquire(), acquire_shared() and acquire_permit() (permits: kPermit only).
  AcquireResult acquire_one(std::string_view key, LeaseMode mode, std::uint32_t permits,
                            std::chrono::milliseconds ttl, std::chrono::milliseconds wait,
                            LeaseOptions lease_options);

  std::shared_ptr<internal::ClientCore> core_;
};

// Splits "HOST:PORT,HOST:PORT,..." (the tools' --server) into node
// addresses, skipping empty items.
[[nodiscard]] std::vector<std::string> split_node_list(std::string_view text);

// A fresh random owner identity (getrandom); all zero if that fails.
[[nodiscard]] ClientId random_client_id() noexcept;

// 32 lowercase hex digits, hi then lo.
[[nodiscard]] std::string to_hex(const ClientId& id);
// Parses 32 hex digits (either case); nullopt otherwise.
[[nodiscard]] std::optional<ClientId> parse_client_id(std::string_view hex) noexcept;

}  // namespace shardlock::lease

template <>
struct std::is_error_code_enum<shardlock::lease::LeaseErrc> : std::true_type {};
