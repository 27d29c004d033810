// etcd_call.h: what the etcd client's files with gRPC in them share: one
// endpoint's channel and stubs, EtcdClient::Impl (the endpoints, the one
// calls go to, the auth token, the unary-call runner) and how a failed call
// becomes an EtcdResult's error. etcd_kv_lease.cc holds connect(), the
// unary calls and the LeaseKeepAlive stream; etcd_watch.cc the Watch
// stream; etcd_security.cc the TLS files, the channel credentials and
// authentication. Not API: it includes the generated gRPC headers, which
// etcd_client.h keeps out.
#pragma once

#include <grpc/support/time.h>
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h"
#include "etcd_client.h"
#include "shardlock/internal/thread_annotations.h"
#include "shardlock/mutex.h"

namespace shardlock::cluster {
namespace etcd_call {

namespace pb = etcdserverpb;

// gRPC deadlines on the monotonic clock, so a wall-clock step moves none.
inline gpr_timespec deadline_after(std::chrono::milliseconds timeout) {
  return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                      gpr_time_from_millis(timeout.count(), GPR_TIMESPAN));
}

// etcd's KeyValue message as this client's KeyValue.
[[nodiscard]] KeyValue to_key_value(const mvccpb::KeyValue& kv);

// Fails `result` with `errc`, in gRPC's or etcd's words.
template <class T>
void set_error(EtcdResult<T>& result, EtcdErrc errc, std::string&& detail) {
  result.error = make_error_code(errc);
  result.detail = std::move(detail);
}

// One etcd endpoint: a channel and the four service stubs on it.
struct Endpoint {
  std::string target;
  bool tls = false;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<pb::KV::Stub> kv;
  std::unique_ptr<pb::Lease::Stub> lease;
  std::unique_ptr<pb::Watch::Stub> watch;
  std::unique_ptr<pb::Auth::Stub> auth;
};

// A channel state for people: "ready", "failing to connect", ...
[[nodiscard]] std::string_view state_name(grpc_connectivity_state state);

// Why the channel to `endpoint` fails to connect, in gRPC's words ("Ssl
// handshake failed: ... certificate verify failed"), with what that means
// for etcd; empty when it is not failing. A call that waits for a
// connection times out saying only "Deadline Exceeded", so this asks with
// one fail-fast call, which a failing channel answers at once with its
// last connection error (etcd_security.cc).
[[nodiscard]] std::string connection_failure(const Endpoint& endpoint);

// A call that ran out of time: kDeadlineExceeded when etcd was connected and
// did not answer in time, kUnavailable when there was no connection to it.
template <class T>
void set_deadline_error(EtcdResult<T>& result, const Endpoint& endpoint, std::string_view what) {
  const grpc_connectivity_state state = endpoint.channel->GetState(false);
  if (state == GRPC_CHANNEL_READY) {
    set_error(result, EtcdErrc::kDeadlineExceeded,
              "etcd " + endpoint.target + ": " + std::string(what) + " before the deadline");
    return;
  }
  std::string why = connection_failure(endpoint);
  set_error(result, EtcdErrc::kUnavailable,
            "etcd " + endpoint.target + ": no connection before the deadline (" +
                std::string(state_name(state)) + (why.empty() ? "" : ": " + why) + ")");
}

// The grpc::Status of a failed call, as an EtcdErrc and a detail that names
// the endpoint.
template <class T>
void set_status_error(EtcdResult<T>& result, const Endpoint& endpoint, const grpc::Status& status) {
  if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    set_deadline_error(result, endpoint, "no answer");
    return;
  }
  set_error(result, errc_from_grpc_status(static_cast<int>(status.error_code())),
            "etcd " + endpoint.target + ": " + status.error_message());
}

// The channel credentials `options` ask for: TLS with its certificates, or
// plaintext (etcd_security.cc).
[[nodiscard]] std::shared_ptr<grpc::ChannelCredentials> channel_credentials(
    const EtcdClientOptions& options);

// kCertificateExpired when the client certificate in `tls` is outside its
// validity period now, naming it and the date.
[[nodiscard]] EtcdStatus check_client_certificate(const EtcdTls& tls);

// Whether etcd refused a call for its token alone (invalid or expired,
// issued before the auth store changed, or none where one is now needed),
// so that a fresh token lets the same call through. etcd refuses such a
// call before applying it.
[[nodiscard]] bool token_refused(const grpc::Status& status);

// Whether a call that failed with `status` moves the client on to the next
// endpoint: that etcd was unreachable, or did not answer in time.
inline bool moves_to_next_endpoint(const grpc::Status& status) {
  return status.error_code() == grpc::StatusCode::UNAVAILABLE ||
         status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
}

// The open LeaseKeepAlive stream (etcd_kv_lease.cc).
class KeepAliveStream;

}  // namespace etcd_call

// The client behind EtcdClient: the endpoints, the one calls go to, the
// auth token, and the LeaseKeepAlive stream keep_alive_once() reuses.
struct EtcdClient::Impl {
  using Endpoint = etcd_call::Endpoint;

  EtcdClientOptions options;
  std::vector<Endpoint> endpoints;  // fixed after connect(): read without locking
  // Which endpoint calls go to (modulo the count). Relaxed: it is only a
  // hint, and guards no data; a call racing a move uses either endpoint.
  std::atomic<std::size_t> current{0};

  Mutex keep_alive_mutex;
  std::unique_ptr<etcd_call::KeepAliveStream> keep_alive SHARDLOCK_GUARDED_BY(keep_alive_mutex);

  // With options.credentials: the token every call carries. Held across
  // the Authenticate call, so that one thread authenticates and the
  // others, which need the token too, wait for it (at most a call
  // deadline). Nothing else is locked inside it.
  Mutex token_mutex;
  // Unset: not authenticated yet (or the token was refused). Empty: etcd
  // has authentication disabled, so calls carry none.
  std::optional<std::string> auth_token SHARDLOCK_GUARDED_BY(token_mutex);

  // The token for a call to `target` that must be done by `deadline`
  // (empty: send none), authenticating first when there is none. False,
  // with `result` failed, when authentication failed (etcd_security.cc).
  template <class T>
  bool token_for(EtcdResult<T>& result, const Endpoint& target, gpr_timespec deadline,
                 std::string& out) {
    if (!options.credentials) {
      out.clear();
      return true;
    }
    EtcdResult<std::string> got = current_token(target, deadline);
    if (!got.ok()) {
      result.error = got.error;
      result.detail = std::move(got.detail);
      return false;
    }
    out = std::move(got.value);
    return true;
  }
  EtcdResult<std::string> current_token(const Endpoint& target, gpr_timespec deadline);
  // etcd refused `stale`: the next token_for() authenticates again, unless
  // another call has done so already.
  void drop_token(const std::string& stale);

  std::size_t pick() const noexcept { return current.load(std::memory_order_relaxed); }
  const Endpoint& endpoint(std::size_t index) const noexcept {
    return endpoints[index % endpoints.size()];
  }
  // After a call to endpoint `index` failed as unreachable, the calls after
  // it go to the next one (unless another call moved on already).
  void moved_away_from(std::size_t index) noexcept {
    current.compare_exchange_strong(index, index + 1, std::memory_order_relaxed);
  }

  // Runs `call(stub endpoint, context)` with the call deadline (and the
  // auth token); on failure fills `result`'s error. True on success. A
  // call refused for its token alone is sent once more with a new one,
  // within the same deadline.
  template <class T, class Call>
  bool unary(EtcdResult<T>& result, Call&& call) {
    const std::size_t index = pick();
    const Endpoint& target = endpoint(index);
    const gpr_timespec deadline = etcd_call::deadline_after(options.call_timeout);
    for (int attempt = 0;; ++attempt) {
      std::string token;
      if (!token_for(result, target, deadline, token)) {
        if (result.error == EtcdErrc::kUnavailable) moved_away_from(index);
        return false;
      }
      grpc::ClientContext context;
      context.set_deadline(deadline);
      // Wait for a connection (up to the deadline) rather than fail fast:
      // with the blocking API only a thread inside a call polls gRPC's
      // sockets, and fail-fast calls on a channel that is failing to
      // connect return without polling, so a reconnection in progress
      // would never see etcd's handshake and would time out (seen after an
      // etcd restart: every attempt timed out before the server's SETTINGS
      // frame).
      context.set_wait_for_ready(true);
      if (!token.empty()) context.AddMetadata("token", token);
      const grpc::Status status = call(target, context);
      if (status.ok()) return true;
      if (attempt == 0 && options.credentials && etcd_call::token_refused(status)) {
        drop_token(token);
        continue;
      }
      if (etcd_call::moves_to_next_endpoint(status)) moved_away_from(index);
      etcd_call::set_status_error(result, target, status);
      return false;
    }
  }
};

}  // namespace shardlock::cluster
