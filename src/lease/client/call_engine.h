// CallEngine: moves a LeaseClient's calls to their replies. Private to
// src/lease/.
//
// It owns every outstanding Call: encodes and sends it, runs the I/O thread
// (receive, match replies by request id, retransmit from a timer heap, run
// completions) and packs the calls that completions issue into batch
// datagrams per node and owner.
//
// Threading: make_call(), submit() and post() may be called from any thread.
// stopping_, pending_, timers_ and posted_ are guarded by mutex_; the outbox,
// the send buffers and the redirect bookkeeping belong to the I/O thread
// alone. Completions run on the I/O thread with mutex_ not held.
//
// Redirects (cluster mode): a call answered REDIRECT leaves pending_ and is
// followed on the I/O thread once the round's completions have run. A node
// with a newer map than ours: the call is parked (in pending_, unsent, its
// timer at its deadline) until the map refresh it triggered ends, then sent
// to its owner under the new map. A call routed under an older map than the
// current one: sent to its owner now. A node behind ours: the call is sent
// to it again in kRedirectRetry. Each follow-up is a fresh request id, so a
// late answer to the old one completes nothing, and keeps the call's
// deadline. A RENEW is followed like the rest: the new owner took the key
// over with its holders (replicas) and renews it, or answers EXPIRED when
// it has no such holder; RELEASE is never redirected.
//
// Riding through a recovery or a failover: an acquire with a wait (wait_ms
// above 0) keeps trying until its wait ends, whichever call made it
// (LeaseClient, the C ABI, shardlockctl). Answered RECOVERING, it is sent
// again (fresh request id, the wait left) after the server's retry_after_ms
// with jitter (retry_delay()), and completes kRecovering only when that
// would be past its wait. Unanswered (cluster mode), the
// kSilentTransmissions-th timer-driven send and each one after refresh the
// map, so the call moves to the key's new owner once the cluster has
// published it, and ends
// kUnreachable only at its deadline. An acquire without a wait and every
// other call complete with the first answer, as before.
//
// What a reply means (ignore, malformed, follow, ride through, complete)
// and where a REDIRECT leads are decided by reply.h's pure functions; the
// engine only carries the decisions out.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <memory>
#include <queue>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "client/client_routing.h"
#include "client/cluster_directory.h"
#include "client/reply.h"
#include "shardlock/internal/thread_annotations.h"
#include "shardlock/lease/client/call.h"
#include "shardlock/lease/wire/envelope.h"
#include "shardlock/mutex.h"

namespace shardlock::lease::internal {

using Clock = LeaseClock;

// `d` as the wire's 32-bit milliseconds: negative is 0, too long the maximum.
inline std::uint32_t clamp_ms(std::chrono::milliseconds d) noexcept {
  if (d.count() <= 0) return 0;
  return static_cast<std::uint32_t>(std::min<std::chrono::milliseconds::rep>(
      d.count(), std::numeric_limits<std::uint32_t>::max()));
}

// How long to wait before asking again a server that answered RECOVERING
// with `retry_after_ms`: that long (at least kMinRetryAfter), plus a random
// quarter of it (at most 250 ms more), so clients told the same time do not
// all come back at once. Never shorter than the server asked.
inline constexpr std::chrono::milliseconds kMinRetryAfter{10};
[[nodiscard]] Clock::duration retry_delay(std::uint32_t retry_after_ms) noexcept;

// The client's configuration as LeaseClient::start() resolved it. Written
// only by start(), before the I/O thread starts; read-only afterwards, from
// any thread.
struct ClientSetup {
  LeaseClientOptions options;
  // options.auth_key made ready for the envelope (envelope.h), once.
  std::optional<EnvelopeKey> envelope_key;
  // The form requests go in: kLegacy without a tenant, else
  // tenant_envelope_mode(options.encrypt, options.cipher) on this host.
  EnvelopeMode seal_mode = EnvelopeMode::kLegacy;
  ClientId id;
  std::vector<Endpoint> endpoints;  // one per options.nodes entry (cluster mode: the seeds)
  ClientRouting routing;            // over `endpoints`; unused in cluster mode
  std::unique_ptr<DatagramTransport> transport;
  // Cluster mode only (options.discover_cluster): the map and its refresh.
  // Internally synchronized.
  std::unique_ptr<ClusterDirectory> cluster;
};

// One outstanding request. Owned by CallEngine::pending_ from its first
// transmission until its completion is taken.
struct Call {
  MessageType type = MessageType::kQuery;
  std::uint64_t request_id = 0;
  std::string key;
  std::uint64_t token = 0;
  std::uint32_t ttl_ms = 0;
  std::uint32_t wait_ms = 0;
  std::uint32_t first_shard = 0;
  std::uint32_t first_member = 0;          // MAP
  std::uint32_t first_holder = 0;          // QUERY_HOLDERS
  std::uint32_t holders = 0;               // WATCH: the version's holder count
  LeaseMode mode = LeaseMode::kExclusive;  // ACQUIRE_MANY
  std::uint32_t permits = 0;               // ACQUIRE_PERMIT
  std::string value;                       // single-key ACQUIREs: the holder value
  // ACQUIRE_MANY: the keys as wire entries (encode_key_list()); `key` stays
  // empty, as the TIMEOUT answering it carries no key.
  std::uint8_t key_count = 0;
  std::vector<std::uint8_t> key_list;
  // Where it goes: a configured node, or a map member (cluster mode). Never
  // null once made; stable for the client's life.
  const Endpoint* to = nullptr;
  // Cluster mode: the epoch of the map it was routed with, sent in the
  // datagram's header (kFlagEpoch); nullopt before the first map.
  std::optional<std::uint64_t> epoch;
  // An acquire or a WATCH with a wait: when the wait ends (set on the first
  // transmission; zero for every other call). Until then RECOVERING is
  // ridden through, and each fresh request id carries the wait left.
  Clock::time_point wait_end;
  unsigned redirects = 0;    // REDIRECTs followed (at most kMaxRedirects)
  bool redirected = false;   // its last answer was a REDIRECT: its deadline fails it kRedirected
  bool parked = false;       // waiting for a map refresh; unsent, its timer is its deadline
  ClientId owner;            // the header's client id
  Clock::duration budget{};  // deadline - first transmission
  // The first transmission to its current node under its current request
  // id (a redirect or a RECOVERING ride-through moves it).
  Clock::time_point first_sent;
  bool unsent = false;         // a fresh request id its timer has not sent yet
  Clock::time_point deadline;  // set once, on the first transmission
  Clock::time_point next_send;
  Clock::duration interval{};
  unsigned transmissions = 0;
  // Timer-driven sends since its node last answered it (a redirect's
  // follow-up starts again from 0): kSilentTransmissions of them make the
  // engine suspect the node has left (cluster mode).
  unsigned unanswered_sends = 0;
  CallCompletion done;

  // What decides how its replies are read (decide_reply()).
  [[nodiscard]] CallShape shape() const noexcept {
    return CallShape{.type = type, .key = key, .key_count = key_count, .wait_end = wait_end};
  }

  [[nodiscard]] Message message() const noexcept {
    return Message{.type = type,
                   .request_id = request_id,
                   .value = value,
                   .key = key,
                   .token = token,
                   .ttl_ms = ttl_ms,
                   .wait_ms = wait_ms,
                   .mode = mode,
                   .permits = permits,
                   .holders = holders,
                   .key_count = key_count,
                   .key_list = key_list,
                   .first_shard = first_shard,
                   .first_member = first_member,
                   .first_holder = first_holder};
  }
};

class CallEngine final : public MapCaller {
 public:
  // `setup` must outlive the engine.
  explicit CallEngine(const ClientSetup& setup) noexcept : setup_(setup) {}
  ~CallEngine();
  CallEngine(const CallEngine&) = delete;
  CallEngine& operator=(const CallEngine&) = delete;

  // Whether start() succeeded; until then every call completes at once with
  // kNotStarted.
  [[nodiscard]] bool started() const noexcept {
    return started_.load(std::memory_order_acquire);  // pairs with start()'s release
  }
  // Request ids count up from `first`. Call before start().
  void set_first_request_id(std::uint64_t first) noexcept;
  // Opens the wake-up eventfd and starts the I/O thread; the setup must be
  // complete. Call once. Returns the errno of a failed eventfd().
  [[nodiscard]] std::error_code start();
  // Stops and joins the I/O thread: everything outstanding, and every call
  // submitted afterwards, completes with kNotStarted. Not from the I/O
  // thread.
  void stop();

  // A call of `type` for `key`, routed to the key's node (an empty key: the
  // first configured node), in the client's own name, with request_timeout
  // as its budget. Never blocks.
  [[nodiscard]] std::unique_ptr<Call> make_call(MessageType type, std::string_view key) const;
  // Routes `call` to the node that owns all of `keys` under the current
  // routing (and sets its epoch); false, leaving it unrouted, when they have
  // different owners. Never blocks.
  [[nodiscard]] bool route_keys(std::span<const std::string_view> keys, Call& call) const;
  // A map refresh ended: sends the calls parked for it to their owners under
  // the map now current. Called by ClusterDirectory; any thread.
  void on_map_refreshed() override;
  // One MAP page from `to` for the ClusterDirectory; any thread.
  void call_map(const Endpoint* to, std::uint32_t first_member, CallCompletion done) override;
  // Whether `call` encodes as one datagram within the size limit (with the
  // auth tag, when one is configured) and its padded reply fits too. An
  // ACQUIRE_MANY of many long keys may not.
  [[nodiscard]] bool fits_one_datagram(const Call& call) const;
  // A fresh request id, for a caller that must know it before submit().
  [[nodiscard]] std::uint64_t new_request_id() noexcept {
    // Relaxed: ids need only be unique, which the RMW guarantees.
    return next_request_id_.fetch_add(1, std::memory_order_relaxed);
  }
  // Issues `call`; its `done` runs exactly once, on the I/O thread (or on the
  // caller's, when the engine is not running). From the I/O thread the call
  // joins the outbox, sent batched when the receive round ends; from any
  // other thread it is sent now. Never waits for the reply.
  void submit(std::unique_ptr<Call> call);
  // Runs `fn` on the I/O thread soon.
  void post(std::function<void()> fn);

  // Statistics; relaxed counters.
  [[nodiscard]] std::uint64_t datagrams_sent() const noexcept {
    return sent_.load(std::memory_order_relaxed);
  }
  [[nodiscard]] std::uint64_t retransmissions() const noexcept {
    return retransmits_.load(std::memory_order_relaxed);
  }
  [[nodiscard]] std::uint64_t malformed_replies() const noexcept {
    return malformed_.load(std::memory_order_relaxed);
  }

 private:
  struct TimerEntry {
    Clock::time_point when;
    std::uint64_t request_id;
    friend bool operator>(const TimerEntry& a, const TimerEntry& b) noexcept {
      return a.when > b.when;
    }
  };
  struct ReadyCompletion {
    CallCompletion done;
    CallResult result;
  };
  // Encoded retransmissions of one round: (node, bytes).
  using Resends = std::vector<std::pair<const Endpoint*, std::vector<std::uint8_t>>>;
  // How long a call waits before it asks a node whose map is behind ours
  // again.
  static constexpr std::chrono::milliseconds kRedirectRetry{20};

  // Sets the request id (unless the caller reserved one), first-send time,
  // deadline (and wait_end), the wait left and first retransmission.
  void arm(Call& call, Clock::time_point now) noexcept;
  static void complete_now(std::unique_ptr<Call> call, LeaseErrc error);
  // Completes `call` with `error`, keeping what it learned on the way (its
  // transmissions, its node). Outside mutex_.
  static void fail(std::unique_ptr<Call> call, LeaseErrc error);

  // Bytes a datagram's encoding may use: the rest is for the auth tag.
  [[nodiscard]] std::size_t payload_limit() const noexcept;
  // Seals buffer[0, length) when authentication is on; returns the length to
  // send (0 stays 0: nothing to send).
  std::size_t seal(std::span<std::uint8_t> buffer, std::size_t length) const noexcept;
  std::size_t encode_single(const Call& call, std::span<std::uint8_t> buffer) const;
  void transmit(const Endpoint& to, std::span<const std::uint8_t> bytes);
  // Sends outgoing_ (I/O thread only).
  void transmit_many();
  void wake() noexcept;
  [[nodiscard]] bool on_io_thread() const noexcept;

  void io_loop();
  // Receives without sleeping for up to options.busy_poll; returns how many
  // datagrams were delivered (0: none came, or busy polling is off).
  std::size_t busy_poll(const std::function<void(std::span<const std::uint8_t>)>& deliver);
  void drop_stale_timers() SHARDLOCK_REQUIRES(mutex_);
  void collect_due_timers(Clock::time_point now, std::vector<ReadyCompletion>& ready,
                          Resends& resend) SHARDLOCK_REQUIRES(mutex_);
  // Matches the replies in one datagram to their calls.
  void on_datagram(std::span<const std::uint8_t> bytes, std::vector<ReadyCompletion>& ready);
  // Sends the calls issued by completions, batched.
  void flush_outbox();

  // ---- Redirects (I/O thread only) ----
  // Follows the REDIRECTs this round received (redirected_).
  void follow_redirects();
  // Sends again, after their delay, the waiting acquires this round's
  // RECOVERING answers left within their wait (recovering_).
  void retry_recovering();
  void follow_redirect(std::unique_ptr<Call> call, std::uint64_t epoch);
  // Routes `call` under `view`; false when its ACQUIRE_MANY keys now have
  // different owners (the caller then fails it kCrossNode).
  static bool reroute(Call& call, const ClusterMapView& view);
  // Sends `call` again with a fresh request id: now, batched with the round's
  // outbox, or after `delay` through its retransmission timer.
  void resend_now(std::unique_ptr<Call> call);
  void resend_later(std::unique_ptr<Call> call, Clock::duration delay);
  // Keeps `call` (fresh id, unsent) until on_map_refreshed() or its deadline.
  void park(std::unique_ptr<Call> call);
  // Whether a call of `type` follows its key's owner to another node when
  // the map changes under it (not RENEW and RELEASE, which belong to the
  // node that granted the lease, nor MAP and STATS).
  static bool follows_owner(MessageType type) noexcept;
  // The node `view` gives `call`'s key (an ACQUIRE_MANY: its first key).
  static const Endpoint* owner_under(const Call& call, const ClusterMapView& view);
  // Puts `call` in pending_ with its timer at next_send; fails it
  // kNotStarted when the engine is stopping.
  void keep_pending(std::unique_ptr<Call> call) SHARDLOCK_EXCLUDES(mutex_);

  const ClientSetup& setup_;

  std::atomic<bool> started_{false};
  std::atomic<std::uint64_t> next_request_id_{1};
  std::atomic<std::uint64_t> sent_{0};
  std::atomic<std::uint64_t> retransmits_{0};
  std::atomic<std::uint64_t> malformed_{0};

  int wake_fd_ = -1;
  std::thread io_thread_;  // started by start(), joined by stop()
  std::atomic<std::thread::id> io_thread_id_{};
  // When the sleeping I/O thread plans to wake (ns of Clock; 0 while awake):
  // a submitter whose first retransmission is due earlier writes the eventfd.
  std::atomic<std::int64_t> planned_wake_ns_{0};

  Mutex mutex_;
  bool stopping_ SHARDLOCK_GUARDED_BY(mutex_) = false;
  std::unordered_map<std::uint64_t, std::unique_ptr<Call>> pending_ SHARDLOCK_GUARDED_BY(mutex_);
  std::priority_queue<TimerEntry, std::vector<TimerEntry>, std::greater<>> timers_
      SHARDLOCK_GUARDED_BY(mutex_);
  std::vector<std::function<void()>> posted_ SHARDLOCK_GUARDED_BY(mutex_);

  // I/O thread only.
  std::vector<std::unique_ptr<Call>> outbox_;
  // Calls answered REDIRECT in this round, with the redirecting node's epoch.
  std::vector<std::pair<std::unique_ptr<Call>, std::uint64_t>> redirected_;
  // Waiting acquires answered RECOVERING in this round, with their delay.
  std::vector<std::pair<std::unique_ptr<Call>, Clock::duration>> recovering_;
  // Request ids of the parked calls (some may have completed at their
  // deadline since).
  std::vector<std::uint64_t> parked_;
  // Cluster mode: a node that left a call unanswered through
  // kSilentTransmissions timer-driven sends (dead, or gone from the map),
  // and on every further one: the map is refreshed from the others (I/O
  // thread only). A dead node's buckets move when a backup takes them over
  // (a few hundred ms) or its member key ends (up to the etcd lease), so one
  // refresh is often too early to move the call; the sends' growing
  // interval paces the refreshes.
  const Endpoint* silent_node_ = nullptr;
  // The second: 60 ms after the first send at the default 20 ms retransmit
  // (with the third, a failover probe's second try found the new owner
  // only at 140 ms, and the median kill-to-grant was 0.505 s).
  static constexpr unsigned kSilentTransmissions = 2;
  // A deque: growing it keeps earlier buffers in place, and outgoing_ points
  // into them until the round is sent.
  std::deque<std::array<std::uint8_t, kMaxDatagramSize>> out_buffers_;
  std::vector<DatagramTransport::Outgoing> outgoing_;
  Datagram rx_;
  std::array<std::uint8_t, kMaxDatagramSize> rx_opened_{};  // an opened reply
};

}  // namespace shardlock::lease::internal
