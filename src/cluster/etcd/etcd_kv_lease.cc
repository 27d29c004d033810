// See etcd_client.h: connect() and the calls of etcd's KV and Lease
// services.
//
// Unary calls (Range, Put, DeleteRange, Txn, LeaseGrant, LeaseRevoke) use
// gRPC's blocking API with a per-call deadline (EtcdClient::Impl::unary(),
// etcd_call.h). LeaseKeepAlive runs on gRPC's completion-queue API, because
// the stream stays open across calls while each keep-alive still needs its
// own deadline, which a blocking Read() cannot have. The Watch stream is in
// etcd_watch.cc; the error names and prefix_range_end() in etcd_client.cc.
#include <algorithm>
#include <charconv>
#include <utility>

#include "etcd_call.h"
#include "etcd_client.h"
#include "shardlock/lock_guard.h"

namespace shardlock::cluster {

namespace pb = etcd_call::pb;
using etcd_call::deadline_after;
using etcd_call::Endpoint;
using etcd_call::KeepAliveStream;
using etcd_call::set_error;
using etcd_call::to_key_value;
using std::chrono::milliseconds;

namespace etcd_call {

KeyValue to_key_value(const mvccpb::KeyValue& kv) {
  return KeyValue{kv.key(),          kv.value(),   kv.create_revision(),
                  kv.mod_revision(), kv.version(), kv.lease()};
}

std::string_view state_name(grpc_connectivity_state state) {
  switch (state) {
    case GRPC_CHANNEL_IDLE:
      return "idle";
    case GRPC_CHANNEL_CONNECTING:
      return "connecting";
    case GRPC_CHANNEL_READY:
      return "ready";
    case GRPC_CHANNEL_TRANSIENT_FAILURE:
      return "failing to connect";
    case GRPC_CHANNEL_SHUTDOWN:
      return "shut down";
  }
  return "unknown";
}

// ---------------------------------------------------------------------------
// The LeaseKeepAlive stream
// ---------------------------------------------------------------------------

// One open LeaseKeepAlive stream on one endpoint. At most one operation is
// in flight at a time, so every completion is the one being waited for. Not
// thread-safe: EtcdClient::Impl serialises its use.
class KeepAliveStream {
 public:
  // `token`: etcd's auth token for the stream (empty: none).
  KeepAliveStream(const Endpoint& endpoint, std::string token)
      : endpoint_(endpoint), token_(std::move(token)) {
    context_.set_wait_for_ready(true);  // see EtcdClient::Impl::unary()
    if (!token_.empty()) context_.AddMetadata("token", token_);
  }
  ~KeepAliveStream() { close(); }
  KeepAliveStream(const KeepAliveStream&) = delete;
  KeepAliveStream& operator=(const KeepAliveStream&) = delete;

  [[nodiscard]] const Endpoint& endpoint() const noexcept { return endpoint_; }
  [[nodiscard]] bool broken() const noexcept { return broken_; }
  // Whether the stream ended because etcd refused its token.
  [[nodiscard]] bool token_refused() const noexcept { return token_refused_; }
  [[nodiscard]] const std::string& token() const noexcept { return token_; }

  // One keep-alive, all of it (opening the stream if not yet open) before
  // `deadline`. On failure the stream is broken and closed, and `result`
  // says why.
  void keep_alive(std::int64_t lease_id, gpr_timespec deadline, EtcdResult<std::int64_t>& result) {
    if (!stream_) {
      stream_ = endpoint_.lease->AsyncLeaseKeepAlive(&context_, &queue_, tag(Op::kStart));
      ++in_flight_;
      if (!step(Op::kStart, deadline, result)) return;
    }
    pb::LeaseKeepAliveRequest request;
    request.set_id(lease_id);
    stream_->Write(request, tag(Op::kWrite));
    ++in_flight_;
    if (!step(Op::kWrite, deadline, result)) return;
    pb::LeaseKeepAliveResponse response;
    stream_->Read(&response, tag(Op::kRead));
    ++in_flight_;
    if (!step(Op::kRead, deadline, result)) return;
    if (response.id() != lease_id) {
      set_error(result, EtcdErrc::kProtocol,
                "etcd " + endpoint_.target + ": keep-alive answer for lease " +
                    std::to_string(response.id()) + ", asked for " + std::to_string(lease_id));
      fail();
      return;
    }
    if (response.ttl() <= 0) {
      set_error(result, EtcdErrc::kLeaseExpired,
                "etcd " + endpoint_.target + ": lease " + std::to_string(lease_id) +
                    " has expired or been revoked");
      return;
    }
    result.value = response.ttl();
  }

 private:
  enum class Op : std::uint8_t { kStart, kWrite, kRead, kFinish };
  // A completion-queue tag per operation: the address of its own byte.
  static void* tag(Op op) noexcept {
    static char tags[4];
    return &tags[static_cast<std::size_t>(op)];
  }

  // Waits for `op` to complete. False, with `result` set and the stream
  // closed, when it failed or the deadline passed first.
  bool step(Op op, gpr_timespec deadline, EtcdResult<std::int64_t>& result) {
    void* got = nullptr;
    bool ok = false;
    switch (queue_.AsyncNext(&got, &ok, deadline)) {
      case grpc::CompletionQueue::GOT_EVENT:
        --in_flight_;
        if (got == tag(op) && ok) return true;
        break;
      case grpc::CompletionQueue::TIMEOUT:
        set_deadline_error(result, endpoint_, "no keep-alive answer");
        fail();
        return false;
      case grpc::CompletionQueue::SHUTDOWN:
        break;
    }
    // The stream ended: its final status says why.
    const grpc::Status status = fail();
    token_refused_ = etcd_call::token_refused(status);
    if (status.ok()) {
      set_error(result, EtcdErrc::kUnavailable,
                "etcd " + endpoint_.target + ": keep-alive stream closed by etcd");
    } else {
      set_status_error(result, endpoint_, status);
    }
    return false;
  }

  // Cancels the call, collects what is in flight and the final status, and
  // shuts the queue down; the stream is unusable from here on.
  grpc::Status fail() {
    broken_ = true;
    return close();
  }

  grpc::Status close() {
    if (closed_) return final_status_;
    closed_ = true;
    context_.TryCancel();
    void* got = nullptr;
    bool ok = false;
    // After TryCancel every pending operation completes promptly.
    while (in_flight_ > 0 && queue_.Next(&got, &ok)) --in_flight_;
    if (stream_) {
      stream_->Finish(&final_status_, tag(Op::kFinish));
      queue_.Next(&got, &ok);
    }
    queue_.Shutdown();
    while (queue_.Next(&got, &ok)) {
    }
    return final_status_;
  }

  const Endpoint& endpoint_;
  const std::string token_;
  // context_ and queue_ outlive stream_, which lives in the call they own.
  grpc::ClientContext context_;
  grpc::CompletionQueue queue_;
  std::unique_ptr<
      grpc::ClientAsyncReaderWriter<pb::LeaseKeepAliveRequest, pb::LeaseKeepAliveResponse>>
      stream_;
  int in_flight_ = 0;
  bool broken_ = false;
  bool token_refused_ = false;
  bool closed_ = false;
  grpc::Status final_status_;
};

}  // namespace etcd_call

namespace {

// Reconnecting quickly matters more here than sparing a dead etcd a few
// SYNs: a cluster node must notice etcd is back well within a lease TTL.
// gRPC also takes GRPC_ARG_MIN_RECONNECT_BACKOFF_MS as the time one
// connection attempt gets to finish its HTTP/2 handshake, so that one stays
// generous (5 s): at 100 ms, attempts to a freshly restarted etcd time out
// before its SETTINGS frame arrives, again and again.
// The keep-alive pings find a silently dead connection (a partition) under
// a watch that would otherwise wait on it forever; 10 s stays above etcd's
// --grpc-keepalive-min-time (5 s), below which etcd drops the connection.
// TLS or not, as etcd_call::channel_credentials() says.
std::shared_ptr<grpc::Channel> make_channel(const std::string& target,
                                            const EtcdClientOptions& options) {
  grpc::ChannelArguments args;
  const int max_backoff = static_cast<int>(std::max<milliseconds::rep>(
      1, std::min<milliseconds::rep>(options.max_reconnect_backoff.count(), 1 << 30)));
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, std::min(100, max_backoff));
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 5'000);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, max_backoff);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10'000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5'000);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  return grpc::CreateCustomChannel(target, etcd_call::channel_credentials(options), args);
}

// "HOST:PORT" or "[V6]:PORT", optionally "http://"-prefixed (with `tls`,
// "https://"). On success `out` is the gRPC target.
bool parse_endpoint(std::string_view text, bool tls, std::string& out) {
  while (!text.empty() && text.front() == ' ') text.remove_prefix(1);
  while (!text.empty() && text.back() == ' ') text.remove_suffix(1);
  const std::string_view scheme = tls ? "https://" : "http://";
  if (text.starts_with(scheme)) text.remove_prefix(scheme.size());
  if (!text.empty() && text.back() == '/') text.remove_suffix(1);
  const std::size_t colon = text.rfind(':');
  if (colon == std::string_view::npos || colon == 0) return false;
  const std::string_view host = text.substr(0, colon);
  const std::string_view port = text.substr(colon + 1);
  if (host.front() == '[' ? host.back() != ']' || host.size() < 3
                          : host.find(':') != std::string_view::npos) {
    return false;
  }
  unsigned value = 0;
  const auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
  if (ec != std::errc{} || end != port.data() + port.size() || value == 0 || value > 65535) {
    return false;
  }
  out = std::string(text);
  return true;
}

}  // namespace

EtcdResult<std::unique_ptr<EtcdClient>> EtcdClient::connect(const EtcdClientOptions& options) {
  EtcdResult<std::unique_ptr<EtcdClient>> result;
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  if (options.tls) {
    const EtcdStatus checked = etcd_call::check_client_certificate(*options.tls);
    if (!checked.ok()) {
      result.error = checked.error;
      result.detail = "etcd TLS: " + checked.detail;
      return result;
    }
  }
  std::string_view rest = options.endpoints;
  while (true) {
    const std::size_t comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    std::string target;
    if (!parse_endpoint(item, options.tls.has_value(), target)) {
      set_error(result, EtcdErrc::kBadEndpoint,
                "etcd endpoint '" + std::string(item) + "' is not HOST:PORT (in '" +
                    options.endpoints + "')");
      return result;
    }
    Endpoint endpoint;
    endpoint.target = target;
    endpoint.tls = options.tls.has_value();
    endpoint.channel = make_channel(target, options);
    endpoint.kv = pb::KV::NewStub(endpoint.channel);
    endpoint.lease = pb::Lease::NewStub(endpoint.channel);
    endpoint.watch = pb::Watch::NewStub(endpoint.channel);
    endpoint.auth = pb::Auth::NewStub(endpoint.channel);
    impl->endpoints.push_back(std::move(endpoint));
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  if (options.call_timeout <= milliseconds::zero()) {
    set_error(result, EtcdErrc::kBadEndpoint, "etcd client: call_timeout must be positive");
    return result;
  }
  result.value.reset(new EtcdClient(std::move(impl)));
  return result;
}

EtcdClient::EtcdClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

EtcdClient::~EtcdClient() {
  LockGuard lock(impl_->keep_alive_mutex);
  impl_->keep_alive.reset();
}

std::string EtcdClient::current_endpoint() const { return impl_->endpoint(impl_->pick()).target; }

EtcdResult<LeaseGrant> EtcdClient::grant_lease(std::int64_t ttl_seconds) {
  EtcdResult<LeaseGrant> result;
  pb::LeaseGrantRequest request;
  request.set_ttl(ttl_seconds);
  pb::LeaseGrantResponse response;
  if (!impl_->unary(result, [&](const Endpoint& e, grpc::ClientContext& context) {
        return e.lease->LeaseGrant(&context, request, &response);
      })) {
    return result;
  }
  if (!response.error().empty()) {
    set_error(result, EtcdErrc::kServerError, "etcd: lease grant: " + response.error());
    return result;
  }
  result.value = LeaseGrant{response.id(), response.ttl()};
  return result;
}

EtcdResult<std::int64_t> EtcdClient::keep_alive_once(std::int64_t lease_id) {
  EtcdResult<std::int64_t> result;
  const gpr_timespec deadline = deadline_after(impl_->options.call_timeout);
  LockGuard lock(impl_->keep_alive_mutex);
  // A stream left open by an earlier call may have died since (etcd
  // restarted); a keep-alive is idempotent, so such a failure is retried
  // once on a fresh stream, within the same deadline.
  // A stream etcd ended for its token alone is opened again likewise, with
  // a new token.
  for (int attempt = 0; attempt < 2; ++attempt) {
    const bool reused = impl_->keep_alive != nullptr;
    if (!impl_->keep_alive) {
      const std::size_t index = impl_->pick();
      std::string token;
      result = {};
      if (!impl_->token_for(result, impl_->endpoint(index), deadline, token)) return result;
      impl_->keep_alive =
          std::make_unique<KeepAliveStream>(impl_->endpoint(index), std::move(token));
    }
    result = {};
    impl_->keep_alive->keep_alive(lease_id, deadline, result);
    if (!impl_->keep_alive->broken()) return result;
    const std::size_t index = impl_->pick();
    if (&impl_->endpoint(index) == &impl_->keep_alive->endpoint() &&
        (result.error == EtcdErrc::kUnavailable || result.error == EtcdErrc::kDeadlineExceeded)) {
      impl_->moved_away_from(index);
    }
    const bool token_refused = impl_->keep_alive->token_refused();
    if (token_refused) impl_->drop_token(impl_->keep_alive->token());
    impl_->keep_alive.reset();
    if ((!reused && !token_refused) || result.error == EtcdErrc::kDeadlineExceeded) break;
  }
  return result;
}

EtcdStatus EtcdClient::revoke_lease(std::int64_t lease_id) {
  EtcdStatus result;
  pb::LeaseRevokeRequest request;
  request.set_id(lease_id);
  pb::LeaseRevokeResponse response;
  impl_->unary(result, [&](const Endpoint& e, grpc::ClientContext& context) {
    return e.lease->LeaseRevoke(&context, request, &response);
  });
  return result;
}

EtcdResult<std::int64_t> EtcdClient::put(std::string_view key, std::string_view value,
                                         std::int64_t lease_id) {
  EtcdResult<std::int64_t> result;
  pb::PutRequest request;
  request.set_key(std::string(key));
  request.set_value(std::string(value));
  request.set_lease(lease_id);
  pb::PutResponse response;
  if (impl_->unary(result, [&](const Endpoint& e, grpc::ClientContext& context) {
        return e.kv->Put(&context, request, &response);
      })) {
    result.value = response.header().revision();
  }
  return result;
}

namespace {

EtcdResult<RangeResult> range(EtcdClient::Impl& impl, std::string key, std::string range_end,
                              std::int64_t revision = 0) {
  EtcdResult<RangeResult> result;
  pb::RangeRequest request;
  request.set_key(std::move(key));
  request.set_range_end(std::move(range_end));
  request.set_revision(revision);  // 0: the newest
  pb::RangeResponse response;
  if (impl.unary(result, [&](const Endpoint& e, grpc::ClientContext& context) {
        return e.kv->Range(&context, request, &response);
      })) {
    result.value.revision = response.header().revision();
    result.value.kvs.reserve(static_cast<std::size_t>(response.kvs_size()));
    for (const mvccpb::KeyValue& kv : response.kvs()) {
      result.value.kvs.push_back(to_key_value(kv));
    }
  }
  return result;
}

}  // namespace

EtcdResult<RangeResult> EtcdClient::get(std::string_view key) {
  return range(*impl_, std::string(key), {});
}

EtcdResult<RangeResult> EtcdClient::get_at(std::string_view key, std::int64_t revision) {
  return range(*impl_, std::string(key), {}, revision);
}

EtcdResult<RangeResult> EtcdClient::get_prefix(std::string_view prefix) {
  // etcd reads key "\0" with range_end "\0" as every key.
  return range(*impl_, prefix.empty() ? std::string(1, '\0') : std::string(prefix),
               prefix_range_end(prefix));
}

EtcdResult<std::int64_t> EtcdClient::delete_key(std::string_view key) {
  EtcdResult<std::int64_t> result;
  pb::DeleteRangeRequest request;
  request.set_key(std::string(key));
  pb::DeleteRangeResponse response;
  if (impl_->unary(result, [&](const Endpoint& e, grpc::ClientContext& context) {
        return e.kv->DeleteRange(&context, request, &response);
      })) {
    result.value = response.deleted();
  }
  return result;
}

EtcdStatus EtcdClient::compact(std::int64_t revision) {
  EtcdStatus result;
  pb::CompactionRequest request;
  request.set_revision(revision);
  request.set_physical(true);  // answered once the history is gone
  pb::CompactionResponse response;
  impl_->unary(result, [&](const Endpoint& e, grpc::ClientContext& context) {
    return e.kv->Compact(&context, request, &response);
  });
  return result;
}

namespace {

// If `compare` holds, put key=value (under `lease_id`); otherwise read the
// key, to report what stood in the way.
EtcdResult<TxnResult> put_if(EtcdClient::Impl& impl, pb::Compare compare, std::string_view key,
                             std::string_view value, std::int64_t lease_id) {
  EtcdResult<TxnResult> result;
  pb::TxnRequest request;
  *request.add_compare() = std::move(compare);
  pb::PutRequest* put = request.add_success()->mutable_request_put();
  put->set_key(std::string(key));
  put->set_value(std::string(value));
  put->set_lease(lease_id);
  request.add_failure()->mutable_request_range()->set_key(std::string(key));
  pb::TxnResponse response;
  if (!impl.unary(result, [&](const Endpoint& e, grpc::ClientContext& context) {
        return e.kv->Txn(&context, request, &response);
      })) {
    return result;
  }
  result.value.applied = response.succeeded();
  result.value.revision = response.header().revision();
  if (!response.succeeded()) {
    if (response.responses_size() != 1 || !response.responses(0).has_response_range()) {
      set_error(result, EtcdErrc::kProtocol, "etcd: a failed transaction without its read");
      return result;
    }
    const pb::RangeResponse& read = response.responses(0).response_range();
    if (read.kvs_size() > 0) result.value.current = to_key_value(read.kvs(0));
  }
  return result;
}

}  // namespace

EtcdResult<TxnResult> EtcdClient::put_if_absent(std::string_view key, std::string_view value,
                                                std::int64_t lease_id) {
  pb::Compare compare;
  compare.set_key(std::string(key));
  compare.set_target(pb::Compare::CREATE);
  compare.set_result(pb::Compare::EQUAL);
  compare.set_create_revision(0);  // a oneof: setting 0 still selects the field
  return put_if(*impl_, std::move(compare), key, value, lease_id);
}

EtcdResult<TxnResult> EtcdClient::put_if_mod_revision(std::string_view key, std::string_view value,
                                                      std::int64_t expected_mod_revision) {
  pb::Compare compare;
  compare.set_key(std::string(key));
  compare.set_target(pb::Compare::MOD);
  compare.set_result(pb::Compare::EQUAL);
  compare.set_mod_revision(expected_mod_revision);
  return put_if(*impl_, std::move(compare), key, value, 0);
}

EtcdResult<TxnResult> EtcdClient::delete_if_leases(std::string_view key, std::int64_t key_lease,
                                                   std::string_view guard_key,
                                                   std::int64_t guard_lease) {
  EtcdResult<TxnResult> result;
  pb::TxnRequest request;
  for (const auto& [k, lease] : {std::pair{key, key_lease}, std::pair{guard_key, guard_lease}}) {
    pb::Compare* compare = request.add_compare();
    compare->set_key(std::string(k));
    compare->set_target(pb::Compare::LEASE);
    compare->set_result(pb::Compare::EQUAL);
    compare->set_lease(lease);
  }
  request.add_success()->mutable_request_delete_range()->set_key(std::string(key));
  pb::TxnResponse response;
  if (!impl_->unary(result, [&](const Endpoint& e, grpc::ClientContext& context) {
        return e.kv->Txn(&context, request, &response);
      })) {
    return result;
  }
  result.value.applied = response.succeeded();
  result.value.revision = response.header().revision();
  return result;
}

}  // namespace shardlock::cluster
