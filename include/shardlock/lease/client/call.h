// call.h: what a call to the lease service is, shared by the client's call
// engine (below) and its facade, LeaseClient and Lease (client.h, above):
// the options, a call's result, the errors, the client's clock, the datagram
// seam (DatagramTransport) and the owner-id helpers. Include client.h to
// use the client; this header is what the parts under it need.
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
#include "shardlock/lease/wire/envelope.h"
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
// kBadAddress for text that breaks that rule (or port 0), kUnreachable when
// the host name does not resolve (the resolver's reason in `detail`, e.g.
// `cannot resolve "db1:7420": Name or service not known`).
[[nodiscard]] std::error_code parse_endpoint(std::string_view text, Endpoint& out,
                                             std::string& detail);
[[nodiscard]] std::error_code parse_endpoint(std::string_view text, Endpoint& out);

// What a transport saw besides the replies it delivered, for error messages
// (an "unreachable" that is really a key mismatch or nothing listening):
struct TransportCounters {
  // Replies whose sealing does not match this client's: sealed replies to a
  // client without an auth key, unsealed ones to a client with one. (A
  // shardlockd never answers a request it cannot authenticate: a client with
  // the wrong key, or none, sees silence, not these.)
  std::uint64_t auth_mismatches = 0;
};

// What probe_port() learned about a node that did not answer.
enum class PortProbe : std::uint8_t {
  kRefused,   // its host says nothing listens on the port (ICMP port unreachable)
  kSilent,    // no refusal within the wait: something holds the port and drops
              // what it gets (a shardlockd with another --auth-key), or a
              // firewall or a host that is down swallows it
  kAnswered,  // a datagram came back
  kUnknown,   // the probe could not be sent
};
// Sends `to` one empty datagram from a connected socket and waits up to
// `wait` for a refusal. A diagnostic for error messages after a call went
// unanswered; the server counts the datagram as malformed. Blocks.
[[nodiscard]] PortProbe probe_port(const Endpoint& to, std::chrono::milliseconds wait);

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
  // What it saw besides replies (relaxed counters; any thread). Transports
  // that do not look return zeros.
  [[nodiscard]] virtual TransportCounters counters() const noexcept { return {}; }
};

// A non-blocking UDP socket of `family` (AF_INET or AF_INET6), bound to an
// ephemeral port. Receives up to 32 datagrams per recvmmsg. Counts (see
// counters()) the replies sealed when `sealed` is false, or not sealed when
// it is true: against the client's own setting.
[[nodiscard]] std::error_code make_udp_transport(int family,
                                                 std::unique_ptr<DatagramTransport>& out,
                                                 bool sealed = false);

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
  // The client's identity; random (getrandom) when empty. It is the owner of
  // the raw calls (renew(), release(), and the async calls given no owner),
  // never of a Lease: each acquire contends as a fresh owner of its own
  // (LeaseOptions::owner). Set it only to act for an owner that already
  // exists (shardlockctl renew/release --owner).
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
  // A tenant's key id (tenants.h, docs/security.md): requests are sealed
  // under auth_key and name it (envelope.h), encrypted when `encrypt`, and
  // the client's owner ids carry it in their top 32 bits, as the server
  // scopes them. Needs auth_key. Unset: the single shared key's seal.
  std::optional<std::uint32_t> tenant;
  bool encrypt = false;
  // With `tenant`: the suite its datagrams are sealed in (envelope.h).
  // kAuto: AES-256-GCM where this CPU has AES-NI (aes_gcm_available()),
  // else BLAKE2b / XChaCha20-Poly1305. kPortable: always the latter, for a
  // server without AES-NI (which drops AES datagrams as auth failures).
  // kAes: AES-256-GCM, and start() fails (kBadArgument) where this CPU
  // lacks it. Without `tenant`, kAes is kBadArgument (the legacy seal has
  // no suite) and the others change nothing.
  EnvelopeCipher cipher = EnvelopeCipher::kAuto;
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

// One holder of a key (HOLDERS_REPLY; LeaseClient::holders()), owned.
struct HolderInfo {
  ClientId owner;
  std::uint64_t token = 0;
  std::chrono::milliseconds ttl_left{0};  // as the server counted it, rounded down
  // Taken by an ACQUIRE_MANY that has not completed: no lease yet, and it
  // may yet be given up.
  bool pending = false;
  std::string value;  // what its acquire attached; empty: nothing
  friend bool operator==(const HolderInfo&, const HolderInfo&) = default;
};

// One of a server's busiest keys (HOT_KEYS_REPLY; LeaseClient::hot_keys()),
// owned.
struct HotKeyInfo {
  std::string key;
  std::uint32_t requests = 0;  // decayed request count: an upper bound
  std::uint32_t error = 0;     // requests - error: a lower bound
  std::uint32_t busy = 0;      // BUSY answers, counted alike
  std::uint32_t holders = 0;   // now
  std::uint32_t waiters = 0;   // now
  friend bool operator==(const HotKeyInfo&, const HotKeyInfo&) = default;
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
  std::uint32_t waiters = 0;                    // QUERY_REPLY, HOLDERS_REPLY
  LeaseMode mode = LeaseMode::kExclusive;       // QUERY_REPLY, HOLDERS_REPLY
  std::uint32_t holders = 0;                    // QUERY_REPLY, HOLDERS_REPLY: all of them
  std::uint32_t permits = 0;                    // ... a semaphore key's limit
  std::vector<std::uint64_t> tokens;            // GRANTED_MANY: one per key, in request order
  std::uint8_t busy_index = 0;                  // BUSY_MANY: the first busy key's index
  // When the call's first transmission left; a grant's expiry counts from it.
  LeaseClock::time_point first_sent;
  std::uint64_t request_id = 0;  // the call's request id
  // The owner the call was made as: an async acquire given no owner makes a
  // fresh one, which its renew_async()/release_async() must then name.
  ClientId owner;
  unsigned transmissions = 0;  // 1 + retransmissions
  // STATS_REPLY: one page of the server's counters and shard tokens.
  std::uint32_t shard_count = 0;
  std::uint32_t first_shard = 0;
  std::array<std::uint64_t, kStatCounterCount> counters{};
  std::size_t counters_sent = 0;  // values the server sent (21: it predates the gauges)
  std::vector<std::uint64_t> shard_tokens;
  // REDIRECT, MAP_REPLY: the node's map epoch. MAP_REPLY: one page of the
  // map's members (first_member onward) and how many it has in all.
  std::uint64_t epoch = 0;
  std::uint32_t member_count = 0;
  std::uint32_t first_member = 0;
  std::vector<MapMember> members;
  // HOLDERS_REPLY: one page of the key's holders, first_holder onward.
  std::uint32_t first_holder = 0;
  std::vector<HolderInfo> holder_list;
  // HOT_KEYS_REPLY: the busiest keys, most requests first, and the decayed
  // time their counts cover.
  std::uint32_t window_ms = 0;
  std::vector<HotKeyInfo> hot_keys;
  // The node the call was last sent to (null if it never was): the one that
  // answered, when an answer came. Owned by the client, valid while it lives.
  const Endpoint* node = nullptr;
};

// How an asynchronous call delivers its answer (LeaseClient::Completion).
using CallCompletion = std::function<void(const CallResult&)>;

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
  // A value the grant attaches to its holder (the leader's
  // address, a host name and pid): at most kMaxHolderValueLength bytes (more
  // is kBadArgument), returned by holders() with the holder, kept through
  // renewals, replicated with the grant. Empty: none. Single-key acquires
  // only (acquire_many() refuses one with kBadArgument). A server that
  // predates values drops the request: the acquire ends kUnreachable.
  std::string value;
  // Who the lease's owner is. Empty (the default): a fresh owner for this
  // acquire alone (handle_owner() of the client's id and a per-client
  // count), so two acquires of one key through one client, from one thread
  // or many, exclude each other exactly as two processes do: the second
  // waits in FIFO order or is refused. Set it to act as a known owner (a
  // tool that takes a lease another process renews and releases by owner,
  // shardlockctl acquire --owner). An owner that holds a key exclusively
  // and acquires it again under a new request id is a contender like any
  // other (docs/lease-server.md, "One owner, one grant"), never re-granted.
  std::optional<ClientId> owner;
};

// The owner of a client's `handle`-th handle: `client` with the low 32 bits
// of its `lo` word replaced by `handle`, so owner_client() (protocol.h) of
// every handle is the client's and the server's per-client bounds
// (max_leases_per_client, ...) count a client's handles together. The
// Python client derives its owners the same way.
[[nodiscard]] constexpr ClientId handle_owner(ClientId client, std::uint32_t handle) noexcept {
  const ClientId base = owner_client(client);
  return ClientId{.lo = base.lo | handle, .hi = base.hi};
}

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
