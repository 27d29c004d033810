// See etcd_client.h (EtcdClient::watch_prefix, EtcdWatch).
//
// Watch runs on gRPC's blocking API on its own thread; cancel() unblocks its
// Read() with ClientContext::TryCancel(). A broken stream is reopened, with
// backoff, from the revision after the last one delivered. With
// credentials, a stream carries the client's auth token; etcd checks it
// when the watch is created, and a watch it refuses for a stale token is
// created once more with a new one.
#include <algorithm>
#include <condition_variable>
#include <string>
#include <thread>
#include <utility>

#include "etcd_call.h"
#include "etcd_client.h"
#include "shardlock/lock_guard.h"

namespace shardlock::cluster {

namespace pb = etcd_call::pb;
using etcd_call::Endpoint;
using std::chrono::milliseconds;

struct EtcdWatch::State {
  EtcdClient::Impl* client = nullptr;
  std::string prefix;
  WatchCallback callback;
  std::thread thread;  // started by watch_prefix(), joined by cancel()

  Mutex mutex;
  // condition_variable_any waits on the annotated Mutex itself.
  std::condition_variable_any wake;
  bool stopping SHARDLOCK_GUARDED_BY(mutex) = false;
  // The open stream's context, for cancel() to TryCancel (null between
  // streams).
  grpc::ClientContext* context SHARDLOCK_GUARDED_BY(mutex) = nullptr;

  void run(std::int64_t start_revision);
  // One stream: false when the watch is over (stopped, or ended by etcd).
  bool run_stream(std::int64_t& next_revision, grpc::Status& status);
  // etcd refused to create the watch for its token on a stream since the
  // last one it created: the next refusal ends the watch (the watch thread
  // only).
  bool token_retry = false;
};

namespace {

// Whether a watch cancelled at its creation was refused for its token:
// etcd 3.4 says "permission denied" both for a stale token and for a user
// without read access to the prefix, so a new token is tried once; newer
// etcds name the invalid token.
bool refused_for_token(std::string_view reason) {
  return reason.find("permission denied") != std::string_view::npos ||
         reason.find("invalid auth token") != std::string_view::npos;
}

WatchUpdate error_update(EtcdErrc errc, std::string detail, std::int64_t revision) {
  WatchUpdate update;
  update.error = make_error_code(errc);
  update.detail = std::move(detail);
  update.revision = revision;
  return update;
}

}  // namespace

bool EtcdWatch::State::run_stream(std::int64_t& next_revision, grpc::Status& status) {
  const std::size_t index = client->pick();
  const Endpoint& target = client->endpoint(index);
  std::string token;
  EtcdStatus authenticated;
  if (!client->token_for(authenticated, target,
                         etcd_call::deadline_after(client->options.call_timeout), token)) {
    // Wrong credentials stay wrong: the watch ends. Anything else (etcd
    // unreachable) is retried like a broken stream.
    if (authenticated.error == EtcdErrc::kAuthenticationFailed) {
      callback(error_update(EtcdErrc::kAuthenticationFailed, authenticated.detail, 0));
      return false;
    }
    if (authenticated.error == EtcdErrc::kUnavailable) client->moved_away_from(index);
    return true;
  }
  grpc::ClientContext stream_context;
  stream_context.set_wait_for_ready(true);  // see EtcdClient::Impl::unary()
  if (!token.empty()) stream_context.AddMetadata("token", token);
  {
    LockGuard lock(mutex);
    if (stopping) return false;
    context = &stream_context;
  }
  auto stream = target.watch->Watch(&stream_context);
  pb::WatchRequest request;
  pb::WatchCreateRequest* create = request.mutable_create_request();
  create->set_key(prefix.empty() ? std::string(1, '\0') : prefix);
  create->set_range_end(prefix_range_end(prefix));
  create->set_start_revision(next_revision);
  bool more = true;
  bool reopen = false;
  if (stream->Write(request)) {
    pb::WatchResponse response;
    while (more && stream->Read(&response)) {
      const std::int64_t revision = response.header().revision();
      if (response.compact_revision() != 0) {
        callback(error_update(
            EtcdErrc::kCompacted,
            "etcd " + target.target + ": watch from revision " + std::to_string(next_revision) +
                " is compacted (oldest kept: " + std::to_string(response.compact_revision()) + ")",
            revision));
        more = false;
      } else if (response.canceled() && client->options.credentials && !token_retry &&
                 refused_for_token(response.cancel_reason())) {
        // Refused at creation for a token gone stale (etcd 3.4 says
        // "permission denied" for it): once more with a new one.
        token_retry = true;
        client->drop_token(token);
        more = false;
        reopen = true;
      } else if (response.canceled()) {
        callback(error_update(
            EtcdErrc::kServerError,
            "etcd " + target.target + ": watch cancelled by etcd: " + response.cancel_reason(),
            revision));
        more = false;
      } else if (response.created()) {
        token_retry = false;
        // From here on, a reconnect resumes where this stream started.
        if (next_revision == 0) next_revision = revision + 1;
      } else if (response.events_size() > 0) {
        WatchUpdate update;
        update.revision = revision;
        update.events.reserve(static_cast<std::size_t>(response.events_size()));
        for (const mvccpb::Event& event : response.events()) {
          update.events.push_back(WatchEvent{event.type() == mvccpb::Event::DELETE
                                                 ? WatchEventType::kDelete
                                                 : WatchEventType::kPut,
                                             etcd_call::to_key_value(event.kv())});
        }
        next_revision = update.events.back().kv.mod_revision + 1;
        callback(update);
      }
    }
  }
  if (!more) stream_context.TryCancel();
  status = stream->Finish();
  {
    LockGuard lock(mutex);
    context = nullptr;
    if (stopping) return false;
  }
  if (more && etcd_call::moves_to_next_endpoint(status)) client->moved_away_from(index);
  return more || reopen;
}

void EtcdWatch::State::run(std::int64_t start_revision) {
  std::int64_t next_revision = start_revision;
  milliseconds backoff{50};
  const milliseconds max_backoff =
      std::max(milliseconds{50}, client->options.max_reconnect_backoff);
  for (;;) {
    grpc::Status status;
    if (!run_stream(next_revision, status)) return;
    // The stream broke (etcd restarted, or is unreachable): wait a little,
    // then resume from next_revision.
    LockGuard lock(mutex);
    if (!stopping) wake.wait_for(mutex, backoff);
    if (stopping) return;
    backoff = std::min(backoff * 2, max_backoff);
  }
}

std::unique_ptr<EtcdWatch> EtcdClient::watch_prefix(std::string_view prefix,
                                                    std::int64_t start_revision,
                                                    WatchCallback callback) {
  auto state = std::make_unique<EtcdWatch::State>();
  state->client = impl_.get();
  state->prefix = std::string(prefix);
  state->callback = std::move(callback);
  EtcdWatch::State* raw = state.get();
  state->thread = std::thread([raw, start_revision] { raw->run(start_revision); });
  return std::unique_ptr<EtcdWatch>(new EtcdWatch(std::move(state)));
}

EtcdWatch::EtcdWatch(std::unique_ptr<State> state) : state_(std::move(state)) {}

EtcdWatch::~EtcdWatch() { cancel(); }

void EtcdWatch::cancel() {
  {
    LockGuard lock(state_->mutex);
    state_->stopping = true;
    if (state_->context != nullptr) state_->context->TryCancel();
  }
  state_->wake.notify_all();
  if (state_->thread.joinable()) state_->thread.join();
}

}  // namespace shardlock::cluster
