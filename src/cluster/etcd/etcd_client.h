// etcd_client.h: a small synchronous etcd v3 client (KV, Lease, Watch) over
// grpc++, with stubs generated at build time from etcd's own .proto files.
//
// This is what shardlockd's cluster mode uses to keep membership and the
// bucket map in etcd (docs/cluster.md); it never stores locks. Use it from a
// node's control path, never on the lease request path: every call is a
// network round trip.
//
// Internal, so it lives in src/cluster/etcd/ and is not installed: it exists for
// the daemon, its shape will follow what membership needs, and keeping it out
// of include/shardlock/ keeps gRPC and protobuf out of the package that
// find_package(shardlock) consumers link. No gRPC type appears here either
// (the stubs sit behind a pointer), so including it costs nothing.
//
// Semantics:
//  - TLS and etcd's user/password authentication are optional
//    (EtcdClientOptions::tls, ::credentials; docs/cluster.md, "etcd over
//    TLS"). With credentials, the first call authenticates (etcd's
//    Auth.Authenticate) and every call carries the token etcd gave; a call
//    etcd refuses because the token is invalid or expired authenticates
//    again and is sent once more (etcd refused it unapplied, so this is no
//    retry of a call that may have happened).
//  - Every call has a deadline (EtcdClientOptions::call_timeout): it waits
//    for a connection, and for etcd's answer, up to it and never longer.
//    With no connection by then it fails as kUnavailable, saying why the
//    connection fails (a refused port, a TLS handshake that failed), which
//    takes up to 250 ms more; connected but unanswered, as
//    kDeadlineExceeded.
//  - Nothing throws: every call returns an EtcdResult whose `error` is in
//    etcd_category() and whose `detail` carries gRPC's or etcd's own words.
//  - No call that etcd may have applied is retried behind the caller's back
//    (only one refused for its token, above); a put that timed out may or
//    may not have been applied. A call that fails as unreachable moves the
//    client to the next endpoint for the calls after it.
//  - All methods may be called from any thread, concurrently.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <variant>
#include <vector>

namespace shardlock::cluster {

// ---------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------

// Why an etcd call failed. The gRPC status codes map onto these; the
// client's own checks add the rest.
enum class EtcdErrc : std::uint8_t {
  kOk = 0,
  kBadEndpoint,           // an endpoint does not parse as HOST:PORT
  kUnavailable,           // no connection to etcd, or it broke (UNAVAILABLE)
  kDeadlineExceeded,      // connected, but no answer before the deadline (DEADLINE_EXCEEDED)
  kCancelled,             // the call was cancelled, e.g. by closing a watch (CANCELLED)
  kNotFound,              // etcd has no such lease (NOT_FOUND: "requested lease not found")
  kInvalidArgument,       // etcd refused the request (INVALID_ARGUMENT, e.g. an empty key)
  kFailedPrecondition,    // FAILED_PRECONDITION, e.g. a lease TTL etcd will not grant
  kCompacted,             // a watch's start revision is compacted (OUT_OF_RANGE, or a
                          // watch response's compact_revision)
  kPermissionDenied,      // PERMISSION_DENIED or UNAUTHENTICATED: the user lacks a role for the
                          // keys, or etcd wants credentials that were not given
  kResourceExhausted,     // RESOURCE_EXHAUSTED (too many requests, a request too large)
  kLeaseExpired,          // a keep-alive found the lease gone (etcd answered TTL 0)
  kProtocol,              // etcd's answer lacks what the request implies
  kServerError,           // any other gRPC status (INTERNAL, UNKNOWN, ...)
  kTlsConfig,             // a TLS file cannot be read, holds no PEM block of its kind, or the
                          // private key does not belong to the certificate
  kCertificateExpired,    // the client certificate is expired or not yet valid (checked before
                          // connecting: etcd only closes the connection on such a certificate)
  kAuthenticationFailed,  // etcd refused the user or password ("authentication failed,
                          // invalid user ID or password")
};
[[nodiscard]] std::string_view to_string(EtcdErrc e) noexcept;
[[nodiscard]] const std::error_category& etcd_category() noexcept;
[[nodiscard]] inline std::error_code make_error_code(EtcdErrc e) noexcept {
  return {static_cast<int>(e), etcd_category()};
}
// The EtcdErrc a gRPC status code (grpc::StatusCode's value) maps to.
[[nodiscard]] EtcdErrc errc_from_grpc_status(int grpc_status_code) noexcept;

// A value or the reason there is none.
template <class T>
struct EtcdResult {
  T value{};
  std::error_code error;
  std::string detail;  // etcd's or gRPC's message, or the client's reason; empty when ok

  [[nodiscard]] bool ok() const noexcept { return !error; }
};
using EtcdStatus = EtcdResult<std::monostate>;

// ---------------------------------------------------------------------------
// Values
// ---------------------------------------------------------------------------

struct KeyValue {
  std::string key;
  std::string value;
  std::int64_t create_revision = 0;  // revision of the put that created this key
  std::int64_t mod_revision = 0;     // revision of its latest put
  std::int64_t version = 0;          // puts since it was created (1 after the first)
  std::int64_t lease = 0;            // 0: not attached to a lease

  friend bool operator==(const KeyValue&, const KeyValue&) = default;
};

// The answer to a read: the keys found, and the store's revision when read.
struct RangeResult {
  std::vector<KeyValue> kvs;
  std::int64_t revision = 0;  // the response header's revision
};

struct LeaseGrant {
  std::int64_t id = 0;
  std::int64_t ttl_seconds = 0;  // as granted; etcd may raise a TTL below its minimum
};

// A conditional put's outcome. `applied` false is an answer, not an error:
// the condition did not hold, and `current` is the key as it was then (empty
// when it was absent).
struct TxnResult {
  bool applied = false;
  std::int64_t revision = 0;  // the store's revision after the transaction
  std::optional<KeyValue> current;
};

enum class WatchEventType : std::uint8_t { kPut, kDelete };

struct WatchEvent {
  WatchEventType type = WatchEventType::kPut;
  KeyValue kv;  // for kDelete: the key, with mod_revision the deletion's revision
};

// What a watch callback receives: the events of one etcd revision range, in
// revision order, or (with `error` set) the reason the watch ended. After an
// error the callback is not called again.
struct WatchUpdate {
  std::vector<WatchEvent> events;
  std::int64_t revision = 0;  // the response header's revision
  std::error_code error;
  std::string detail;
};
using WatchCallback = std::function<void(const WatchUpdate&)>;

// ---------------------------------------------------------------------------
// The client
// ---------------------------------------------------------------------------

// TLS towards etcd: the PEM text of etcdctl's --cacert, --cert and --key
// files (read_etcd_tls_files() reads them).
struct EtcdTls {
  // The CA certificates etcd's certificate must verify against; empty:
  // gRPC's default roots (the system's).
  std::string ca_pem;
  // This client's certificate chain and its private key, for an etcd with
  // --client-cert-auth: both or neither. etcd takes the certificate's CN as
  // the user when a call carries no token.
  std::string cert_pem;
  std::string key_pem;
  // Where cert_pem came from, for messages (a file name).
  std::string cert_source;
};

// Reads the CA file (may be empty: the default roots), the client
// certificate and its key (both empty, or both given) into an EtcdTls.
// kTlsConfig, naming the file, when one cannot be read, holds no PEM block
// of its kind, or the key does not belong to the certificate. Reads files
// only: no I/O to etcd.
[[nodiscard]] EtcdResult<EtcdTls> read_etcd_tls_files(const std::string& ca_file,
                                                      const std::string& cert_file,
                                                      const std::string& key_file);

// etcd's user/password authentication.
struct EtcdCredentials {
  std::string user;
  std::string password;
};

struct EtcdClientOptions {
  // "HOST:PORT[,HOST:PORT...]"; an "http://" (or, with `tls`, "https://")
  // prefix on an entry is accepted (etcd prints its URLs so).
  std::string endpoints;
  // Set: every endpoint is reached over TLS (grpc::SslCredentials). Unset:
  // plaintext.
  std::optional<EtcdTls> tls{};
  // Set: authenticate as this user, and send the token on every call.
  std::optional<EtcdCredentials> credentials{};
  // The deadline of every call, from the moment it starts.
  std::chrono::milliseconds call_timeout{2000};
  // How soon a broken connection is retried, at the longest. gRPC's default
  // grows to two minutes, which would outlast an etcd restart by far.
  std::chrono::milliseconds max_reconnect_backoff{1000};
};

class EtcdWatch;

class EtcdClient {
 public:
  // Parses the endpoints and sets up (lazy) channels; connects (and
  // authenticates) on the first call. kBadEndpoint when an endpoint does
  // not parse, kCertificateExpired when the client certificate is outside
  // its validity period now; no I/O happens here.
  [[nodiscard]] static EtcdResult<std::unique_ptr<EtcdClient>> connect(
      const EtcdClientOptions& options);

  ~EtcdClient();
  EtcdClient(const EtcdClient&) = delete;
  EtcdClient& operator=(const EtcdClient&) = delete;

  // --- leases ---------------------------------------------------------------
  // A new lease of `ttl_seconds` (etcd raises it to its minimum, 2 s by
  // default).
  [[nodiscard]] EtcdResult<LeaseGrant> grant_lease(std::int64_t ttl_seconds);
  // One keep-alive: resets the lease's TTL and returns the TTL it now has.
  // Sent on a LeaseKeepAlive stream that stays open between calls and is
  // reopened after it breaks. kLeaseExpired when the lease is gone. Calls
  // are serialised with each other (one stream), not with other methods.
  [[nodiscard]] EtcdResult<std::int64_t> keep_alive_once(std::int64_t lease_id);
  // Revokes the lease; every key attached to it is deleted. kNotFound when
  // the lease does not exist (any more).
  [[nodiscard]] EtcdStatus revoke_lease(std::int64_t lease_id);

  // --- keys -----------------------------------------------------------------
  // Puts key=value, attached to `lease_id` when non-zero (kNotFound when that
  // lease does not exist). Returns the revision of the put.
  [[nodiscard]] EtcdResult<std::int64_t> put(std::string_view key, std::string_view value,
                                             std::int64_t lease_id = 0);
  // The key, if present (kvs empty otherwise: absence is not an error).
  [[nodiscard]] EtcdResult<RangeResult> get(std::string_view key);
  // The key as it was at `revision` (etcd's MVCC history): kCompacted when
  // etcd no longer keeps that revision, kvs empty when the key did not
  // exist then. The answer's `revision` is still the store's current one.
  [[nodiscard]] EtcdResult<RangeResult> get_at(std::string_view key, std::int64_t revision);
  // Every key that starts with `prefix`, in key order. An empty prefix
  // means every key.
  [[nodiscard]] EtcdResult<RangeResult> get_prefix(std::string_view prefix);
  // Deletes the key; returns how many keys were deleted (0 or 1).
  [[nodiscard]] EtcdResult<std::int64_t> delete_key(std::string_view key);
  // Compacts etcd's history up to `revision` (etcdctl compact): reads and
  // watches of earlier revisions get kCompacted from then on.
  [[nodiscard]] EtcdStatus compact(std::int64_t revision);

  // --- transactions -----------------------------------------------------------
  // Puts key=value (under `lease_id` when non-zero) only if the key does not
  // exist (its create_revision is 0), atomically.
  [[nodiscard]] EtcdResult<TxnResult> put_if_absent(std::string_view key, std::string_view value,
                                                    std::int64_t lease_id = 0);
  // Puts key=value only if the key's mod_revision is `expected_mod_revision`
  // (0: only if absent), atomically. The put keeps no lease.
  [[nodiscard]] EtcdResult<TxnResult> put_if_mod_revision(std::string_view key,
                                                          std::string_view value,
                                                          std::int64_t expected_mod_revision);

  // Deletes `key` only if it is attached to `key_lease` and `guard_key` to
  // `guard_lease`, atomically (Compare on LEASE, etcd 3.3 and later).
  [[nodiscard]] EtcdResult<TxnResult> delete_if_leases(std::string_view key, std::int64_t key_lease,
                                                       std::string_view guard_key,
                                                       std::int64_t guard_lease);

  // --- watches ----------------------------------------------------------------
  // Watches every key starting with `prefix`, from `start_revision` (0: from
  // now on), on a thread of its own, until the returned EtcdWatch is
  // cancelled or destroyed. The callback runs on that thread, one update at
  // a time, events in revision order. When the connection breaks the watch
  // reconnects by itself and resumes after the last revision delivered, so
  // no event is lost or repeated; it ends, with one error update, only when
  // etcd cancels it (kCompacted when the history it needs is gone).
  // The callback must not destroy the EtcdWatch. The EtcdClient must outlive
  // the watch.
  [[nodiscard]] std::unique_ptr<EtcdWatch> watch_prefix(std::string_view prefix,
                                                        std::int64_t start_revision,
                                                        WatchCallback callback);

  // The endpoint the next call goes to ("HOST:PORT").
  [[nodiscard]] std::string current_endpoint() const;

  struct Impl;

 private:
  explicit EtcdClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// A running watch. Destroying it cancels it.
class EtcdWatch {
 public:
  ~EtcdWatch();
  EtcdWatch(const EtcdWatch&) = delete;
  EtcdWatch& operator=(const EtcdWatch&) = delete;

  // Stops the watch and joins its thread; no callback runs after it
  // returns. Idempotent. Must not be called from the callback.
  void cancel();

  struct State;

 private:
  friend class EtcdClient;
  explicit EtcdWatch(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

// The end of the key range holding every key that starts with `prefix`
// (etcd's range_end): the prefix with its last byte below 0xff incremented
// and the rest dropped; "\0" (every key) for an empty or all-0xff prefix.
[[nodiscard]] std::string prefix_range_end(std::string_view prefix);

}  // namespace shardlock::cluster

template <>
struct std::is_error_code_enum<shardlock::cluster::EtcdErrc> : std::true_type {};
