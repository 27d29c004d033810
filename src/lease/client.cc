// LeaseClient and Lease: the call engine (I/O thread, retransmission timers,
// reply matching, batching) and the watchdog. Design notes in client.h and
// docs/client.md.
#include "shardlock/lease/client.h"

#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <limits>
#include <mutex>
#include <queue>
#include <thread>
#include <unordered_map>
#include <utility>

#include "shardlock/internal/futex.h"
#include "shardlock/internal/thread_annotations.h"
#include "shardlock/lock_guard.h"
#include "shardlock/mutex.h"
#include "shardlock/router.h"
#include "shardlock/workload/zipf.h"

namespace shardlock::lease {
namespace internal {

using Clock = LeaseClock;
using std::chrono::milliseconds;

// How far below the server's deadline the client puts a lease's expiry.
struct DriftMargin {
  double factor = 0.01;
  Clock::duration allowance = std::chrono::milliseconds(2);

  // The expiry of a lease granted or renewed for `ttl` by a request first
  // sent at `sent`.
  [[nodiscard]] Clock::time_point expiry(Clock::time_point sent, milliseconds ttl) const noexcept {
    const auto scaled = std::chrono::duration_cast<Clock::duration>(ttl * factor);
    return sent + ttl - scaled - allowance;
  }
};

namespace {

std::int64_t to_ns(Clock::time_point t) noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

// Per-thread jitter source; seeded from the thread's stack address and the
// clock, which is plenty for spreading retransmissions.
std::uint64_t jitter_bits() noexcept {
  thread_local workload::SplitMix64 random(
      static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(&random)) ^
      static_cast<std::uint64_t>(to_ns(Clock::now())));
  return random.next();
}

// `interval` scaled by a uniform factor in [0.75, 1.25).
Clock::duration jittered(Clock::duration interval) noexcept {
  const auto half_range = interval.count() / 2;
  if (half_range <= 0) return interval;
  const auto offset =
      static_cast<Clock::rep>(jitter_bits() % static_cast<std::uint64_t>(half_range));
  return Clock::duration(interval.count() * 3 / 4 + offset);
}

std::error_code error_for(MessageType reply) noexcept {
  switch (reply) {
    case MessageType::kGranted:
    case MessageType::kRenewed:
    case MessageType::kReleased:
    case MessageType::kQueryReply:
    case MessageType::kStatsReply:
      return {};
    case MessageType::kBusy:
      return LeaseErrc::kBusy;
    case MessageType::kTimeout:
      return LeaseErrc::kTimeout;
    case MessageType::kRecovering:
      return LeaseErrc::kRecovering;
    case MessageType::kNotOwner:
      return LeaseErrc::kNotOwner;
    case MessageType::kExpired:
      return LeaseErrc::kExpired;
    default:
      return LeaseErrc::kServerError;
  }
}

// Whether `reply` can answer `request`; anything else is ignored (a stray or
// forged datagram must not complete a call).
bool answers(MessageType request, MessageType reply) noexcept {
  return reply_answers(request, reply);
}

bool carries_key(MessageType reply) noexcept { return reply_carries_key(reply); }

// Whether two resolved endpoints name one socket address (two spellings of
// one node: "localhost:7420" and "127.0.0.1:7420").
bool same_address(const Endpoint& a, const Endpoint& b) noexcept {
  if (a.address.ss_family != b.address.ss_family) return false;
  if (a.address.ss_family == AF_INET6) {
    const auto& x = reinterpret_cast<const sockaddr_in6&>(a.address);
    const auto& y = reinterpret_cast<const sockaddr_in6&>(b.address);
    return x.sin6_port == y.sin6_port && x.sin6_scope_id == y.sin6_scope_id &&
           std::memcmp(&x.sin6_addr, &y.sin6_addr, sizeof x.sin6_addr) == 0;
  }
  const auto& x = reinterpret_cast<const sockaddr_in&>(a.address);
  const auto& y = reinterpret_cast<const sockaddr_in&>(b.address);
  return x.sin_port == y.sin_port && x.sin_addr.s_addr == y.sin_addr.s_addr;
}

std::uint32_t clamp_ms(milliseconds d) noexcept {
  if (d.count() <= 0) return 0;
  return static_cast<std::uint32_t>(
      std::min<milliseconds::rep>(d.count(), std::numeric_limits<std::uint32_t>::max()));
}

}  // namespace

// Key -> node index, through the Router over the configured node addresses.
// Every client must agree on the mapping, so the Router's seed and bucket
// count are fixed here: 2^16 buckets (128 KiB per client) balance a handful
// of nodes within ~1% and build in well under a millisecond, where the
// Router's default 2^22 would cost 8 MiB per LeaseClient.
class ClientRouting {
 public:
  static constexpr int kBucketBits = 16;

  void assign(const std::vector<std::string>& nodes) {
    if (nodes.size() <= 1) return;  // one node owns everything
    std::vector<Node> members;
    members.reserve(nodes.size());
    for (const std::string& n : nodes) members.push_back(Node{n, 1});
    router_ = std::make_unique<Router>(RouterOptions{kDefaultRouterSeed, kBucketBits});
    if (router_->assign(members) != RouterStatus::kOk) {
      router_.reset();  // duplicate addresses: fall back to the first node
      return;
    }
    snapshot_ = router_->snapshot();
    // The snapshot sorts nodes by id; map its indices back to ours.
    for (const Node& member : snapshot_->nodes()) {
      const auto it = std::find(nodes.begin(), nodes.end(), member.id);
      index_.push_back(static_cast<std::size_t>(it - nodes.begin()));
    }
  }

  // Never blocks: one hash and one table lookup in an immutable snapshot.
  std::size_t node_for(std::string_view key) const noexcept {
    if (!snapshot_) return 0;
    const std::uint16_t owner = snapshot_->owner_index(key);
    return owner == RouterSnapshot::kNoOwner ? 0 : index_[owner];
  }

 private:
  std::unique_ptr<Router> router_;
  std::shared_ptr<const RouterSnapshot> snapshot_;
  std::vector<std::size_t> index_;
};

// One outstanding request. Owned by ClientCore::pending_ from its first
// transmission until its completion is taken.
struct Call {
  MessageType type = MessageType::kQuery;
  std::uint64_t request_id = 0;
  std::string key;
  std::uint64_t token = 0;
  std::uint32_t ttl_ms = 0;
  std::uint32_t wait_ms = 0;
  std::uint32_t first_shard = 0;
  std::size_t node = 0;
  ClientId owner;            // the header's client id
  Clock::duration budget{};  // deadline - first transmission
  Clock::time_point first_sent;
  Clock::time_point deadline;
  Clock::time_point next_send;
  Clock::duration interval{};
  unsigned transmissions = 0;
  LeaseClient::Completion done;

  Message message() const noexcept {
    Message m;
    m.type = type;
    m.request_id = request_id;
    m.key = key;
    m.token = token;
    m.ttl_ms = ttl_ms;
    m.wait_ms = wait_ms;
    m.first_shard = first_shard;
    return m;
  }
};

struct TimerEntry {
  Clock::time_point when;
  std::uint64_t request_id;
  friend bool operator>(const TimerEntry& a, const TimerEntry& b) noexcept {
    return a.when > b.when;
  }
};

struct ReadyCompletion {
  LeaseClient::Completion done;
  CallResult result;
};

// Shared state of one Lease (the handle is Lease; the watchdog and the I/O
// thread's renewal completions hold it too).
struct LeaseState {
  enum class Status : std::uint8_t { kHeld, kReleased, kLost };

  // A RENEW sent and not yet superseded by a confirmed newer one: the server
  // may still apply it, so its TTL bounds the expiry.
  struct SentRenewal {
    std::uint64_t request_id = 0;
    Clock::time_point sent;  // no later than its first transmission
    milliseconds ttl{};
  };

  LeaseState(std::shared_ptr<ClientCore> owner_core, std::string lease_key,
             std::uint64_t lease_token, ClientId lease_owner, LeaseOptions lease_options,
             DriftMargin lease_margin, const CallResult& grant, milliseconds requested_ttl)
      : core(std::move(owner_core)),
        key(std::move(lease_key)),
        token(lease_token),
        owner(lease_owner),
        options(std::move(lease_options)),
        margin(lease_margin),
        expiry(margin.expiry(grant.first_sent, milliseconds(grant.ttl_ms))),
        ttl(requested_ttl),
        next_renew(grant.first_sent + std::chrono::duration_cast<Clock::duration>(
                                          milliseconds(grant.ttl_ms) * options.renew_fraction)),
        confirmed_request_id(grant.request_id) {}

  std::shared_ptr<ClientCore> core;
  const std::string key;
  const std::uint64_t token;
  const ClientId owner;
  const LeaseOptions options;
  const DriftMargin margin;

  mutable Mutex mutex;
  Status status SHARDLOCK_GUARDED_BY(mutex) = Status::kHeld;
  Clock::time_point expiry SHARDLOCK_GUARDED_BY(mutex);
  milliseconds ttl SHARDLOCK_GUARDED_BY(mutex);
  Clock::time_point next_renew SHARDLOCK_GUARDED_BY(mutex);
  bool renew_in_flight SHARDLOCK_GUARDED_BY(mutex) = false;
  // The grant's request id, then the newest confirmed renewal's.
  std::uint64_t confirmed_request_id SHARDLOCK_GUARDED_BY(mutex);
  std::vector<SentRenewal> unconfirmed SHARDLOCK_GUARDED_BY(mutex);
  // Set once when the lease becomes lost; the watchdog thread fires it.
  bool lost_fired SHARDLOCK_GUARDED_BY(mutex) = false;
  LeaseLost lost SHARDLOCK_GUARDED_BY(mutex);
  // Held by the watchdog thread while on_lost runs; release() and the
  // destructor take it after marking the lease released, so they return only
  // once a running callback has returned, and no callback starts after.
  Mutex callback_mutex;

  // Before a RENEW for `renew_ttl` leaves: once the server applies it, its
  // deadline may be as early as `now` + renew_ttl, so the expiry comes in now.
  void note_renewal_sent(std::uint64_t request_id, Clock::time_point now, milliseconds renew_ttl)
      SHARDLOCK_REQUIRES(mutex) {
    unconfirmed.push_back(SentRenewal{request_id, now, renew_ttl});
    expiry = std::min(expiry, margin.expiry(now, renew_ttl));
  }

  // Applies the answer to RENEW `request_id` for `requested` (from the
  // watchdog or Lease::renew()). Returns true when the lease has just become
  // lost.
  bool apply_renewal(const CallResult& r, std::uint64_t request_id, milliseconds requested,
                     Clock::time_point now) SHARDLOCK_REQUIRES(mutex) {
    if (status != Status::kHeld) return false;
    if (!r.error) {
      // An answer older than one already applied says nothing new: the
      // server applied the newer renewal after it.
      if (request_id <= confirmed_request_id) return false;
      confirmed_request_id = request_id;
      // The server ignores renewals older than this one from now on.
      std::erase_if(unconfirmed,
                    [&](const SentRenewal& sr) { return sr.request_id <= request_id; });
      const milliseconds answered(r.ttl_ms);
      Clock::time_point bound = margin.expiry(r.first_sent, answered);
      for (const SentRenewal& sr : unconfirmed)
        bound = std::min(bound, margin.expiry(sr.sent, sr.ttl));
      expiry = std::max(expiry, bound);
      ttl = requested;
      next_renew = r.first_sent +
                   std::chrono::duration_cast<Clock::duration>(answered * options.renew_fraction);
      return false;
    }
    if (r.error == LeaseErrc::kNotOwner || r.error == LeaseErrc::kExpired ||
        r.error == LeaseErrc::kServerError) {
      status = Status::kLost;
      lost = LeaseLost{key, token, r.error, r.error != LeaseErrc::kServerError};
      return true;
    }
    // No answer: try again at once; the expiry check catches a dead server.
    next_renew = now;
    return false;
  }
};

struct ClientCore : std::enable_shared_from_this<ClientCore> {
  explicit ClientCore(LeaseClientOptions o) : options(std::move(o)) {}

  ~ClientCore() {
    if (wake_fd_ >= 0) ::close(wake_fd_);
  }

  LeaseClientOptions options;
  std::string error_detail;
  ClientId id;
  std::vector<Endpoint> endpoints;
  ClientRouting routing;
  DriftMargin margin;
  std::unique_ptr<DatagramTransport> transport;

  std::atomic<bool> started{false};
  std::atomic<std::uint64_t> next_request_id{1};
  std::atomic<std::uint64_t> sent{0};
  std::atomic<std::uint64_t> retransmits{0};

  // ---------------------------------------------------------------- start
  std::error_code start() {
    // start() is called once, before any other thread uses the core.
    if (started.load(std::memory_order_relaxed)) return LeaseErrc::kBadArgument;
    if (options.nodes.empty()) {
      error_detail = "no nodes configured";
      return LeaseErrc::kBadAddress;
    }
    int family = AF_UNSPEC;
    for (const std::string& node : options.nodes) {
      Endpoint e;
      if (parse_endpoint(node, e)) {
        error_detail = "bad node address '" + node + "' (want HOST:PORT)";
        return LeaseErrc::kBadAddress;
      }
      if (family != AF_UNSPEC && e.address.ss_family != family) {
        error_detail = "nodes mix IPv4 and IPv6 addresses";
        return LeaseErrc::kBadAddress;
      }
      family = e.address.ss_family;
      for (const Endpoint& seen : endpoints) {
        if (same_address(seen, e)) {
          error_detail = "nodes '" + seen.text + "' and '" + e.text +
                         "' are the same address: each server must be listed once";
          return LeaseErrc::kBadAddress;
        }
      }
      endpoints.push_back(std::move(e));
    }
    routing.assign(options.nodes);
    if (options.client_id) {
      id = *options.client_id;
    } else {
      std::array<std::uint64_t, 2> words{};
      if (::getrandom(words.data(), sizeof words, 0) != static_cast<ssize_t>(sizeof words)) {
        error_detail = "getrandom failed";
        return {errno, std::system_category()};
      }
      id = ClientId{words[0], words[1]};
    }
    // Request ids start at the wall-clock millisecond shifted left by 20,
    // plus 20 random bits. The server's dedup cache is keyed by (client id,
    // request id) and it ignores a holder's requests older than the last one
    // it applied, so another process acting for the same owner later
    // (shardlockctl renew --owner) must use higher ids than the one that took
    // the lease: it does unless that one made 2^20 calls per millisecond of
    // its life, or the wall clock stepped back. 2^41 ms (until 2039) << 20
    // stays below 2^62: no wrap-around for the life of the client.
    std::uint32_t random_bits = 0;
    if (::getrandom(&random_bits, sizeof random_bits, 0) !=
        static_cast<ssize_t>(sizeof random_bits)) {
      error_detail = "getrandom failed";
      return {errno, std::system_category()};
    }
    const auto wall_ms = std::chrono::duration_cast<milliseconds>(
                             std::chrono::system_clock::now().time_since_epoch())
                             .count();
    const std::uint64_t first_request_id =
        (static_cast<std::uint64_t>(std::max<std::int64_t>(wall_ms, 0)) << 20) |
        (random_bits & 0xFFFFFu);
    // Relaxed: published to the I/O thread by std::thread's start, and to
    // callers by the release store of `started` below.
    next_request_id.store(first_request_id + 1, std::memory_order_relaxed);
    if (!(options.clock_drift_factor >= 0.0 && options.clock_drift_factor < 1.0) ||
        options.clock_drift_allowance.count() < 0) {
      error_detail = "clock_drift_factor must be in [0, 1) and clock_drift_allowance >= 0";
      return LeaseErrc::kBadArgument;
    }
    margin.factor = options.clock_drift_factor;
    margin.allowance = options.clock_drift_allowance;
    if (options.max_batch == 0) options.max_batch = 1;
    options.max_batch = std::min(options.max_batch, kMaxBatch);
    if (options.initial_retransmit.count() <= 0) options.initial_retransmit = milliseconds(1);
    options.max_retransmit = std::max(options.max_retransmit, options.initial_retransmit);

    if (std::error_code ec = make_udp_transport(family, transport)) {
      error_detail = "cannot open a UDP socket: " + ec.message();
      return ec;
    }
    if (options.wrap_transport) transport = options.wrap_transport(std::move(transport));
    wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (wake_fd_ < 0) {
      error_detail = "eventfd failed";
      return {errno, std::system_category()};
    }
    started.store(true, std::memory_order_release);  // pairs with the acquire in submit()
    io_thread_ = std::thread([this] { io_loop(); });
    return {};
  }

  // Stops both threads and completes what is outstanding with kNotStarted.
  void shutdown() {
    {
      LockGuard lock(mutex_);
      stopping_ = true;
    }
    wake();
    if (io_thread_.joinable()) io_thread_.join();
    {
      std::lock_guard lock(watch_mutex_);
      watch_stop_ = true;
    }
    watch_cv_.notify_all();
    if (watch_thread_.joinable()) watch_thread_.join();
    std::vector<std::shared_ptr<LeaseState>> watched;
    {
      std::lock_guard lock(watch_mutex_);
      watched.swap(watched_);  // breaks the core <-> lease reference cycle
    }
  }

  // ---------------------------------------------------------------- calls
  std::unique_ptr<Call> make_call(MessageType type, std::string_view key) {
    auto call = std::make_unique<Call>();
    call->type = type;
    call->key = std::string(key);
    call->node = key.empty() ? 0 : routing.node_for(key);
    call->owner = id;
    call->budget = options.request_timeout;
    return call;
  }

  // Issues `call`. From the I/O thread it joins the outbox (sent, batched,
  // when the receive round ends); from any other thread it is sent now.
  void submit(std::unique_ptr<Call> call) {
    if (!started.load(std::memory_order_acquire)) {  // pairs with start()'s release
      complete_now(std::move(call), LeaseErrc::kNotStarted);
      return;
    }
    if (on_io_thread()) {
      outbox_.push_back(std::move(call));
      return;
    }
    const Clock::time_point now = Clock::now();
    arm(*call, now);
    const std::size_t length = encode_single(*call, tx_buffer());
    const std::size_t node = call->node;
    const Clock::time_point next_send = call->next_send;
    {
      LockGuard lock(mutex_);
      if (stopping_) {
        // Falls through to the completion below, outside the lock.
      } else {
        timers_.push({next_send, call->request_id});
        pending_.emplace(call->request_id, std::move(call));
      }
    }
    if (call) {
      complete_now(std::move(call), LeaseErrc::kNotStarted);
      return;
    }
    transmit(node, {tx_buffer().data(), length});
    // seq_cst pairs with the store in io_loop(), made under mutex_ before it
    // sleeps: either it saw our timer, or we see its planned wake time.
    if (to_ns(next_send) < planned_wake_ns_.load(std::memory_order_seq_cst)) wake();
  }

  // A fresh request id. Relaxed: ids need only be unique, which the RMW
  // guarantees.
  std::uint64_t new_request_id() noexcept {
    return next_request_id.fetch_add(1, std::memory_order_relaxed);
  }

  // Sets the request id (unless the caller reserved one), first-send time,
  // deadline and first retransmission.
  void arm(Call& call, Clock::time_point now) noexcept {
    if (call.request_id == 0) call.request_id = new_request_id();
    call.first_sent = now;
    call.transmissions = 1;
    call.deadline = now + call.budget;
    call.interval = options.initial_retransmit;
    call.next_send = std::min(now + jittered(call.interval), call.deadline);
  }

  void complete_now(std::unique_ptr<Call> call, LeaseErrc error) {
    CallResult r;
    r.error = error;
    r.first_sent = Clock::now();
    r.request_id = call->request_id;
    if (call->done) call->done(r);
  }

  // ---------------------------------------------------------------- encode
  static std::array<std::uint8_t, kMaxDatagramSize>& tx_buffer() noexcept {
    thread_local std::array<std::uint8_t, kMaxDatagramSize> buffer{};
    return buffer;
  }
  static Datagram& tx_datagram() noexcept {
    thread_local Datagram datagram;
    return datagram;
  }

  // Bytes a datagram's encoding may use: the rest is for the auth tag.
  std::size_t payload_limit() const noexcept {
    return kMaxDatagramSize - (options.auth_key ? kAuthTagSize : 0);
  }
  // Seals buffer[0, length) when authentication is on; returns the length to
  // send (0 stays 0: nothing to send).
  std::size_t seal(std::span<std::uint8_t> buffer, std::size_t length) const noexcept {
    if (!options.auth_key || length == 0) return length;
    return seal_datagram(buffer, length, *options.auth_key);
  }

  std::size_t encode_single(const Call& call, std::span<std::uint8_t> buffer) {
    const std::span<std::uint8_t> out = buffer.first(std::min(buffer.size(), payload_limit()));
    Datagram& d = tx_datagram();
    d.batch = false;
    d.client_id = call.owner;
    d.request_id = call.request_id;
    d.count = 0;
    (void)d.push(call.message());
    std::size_t written = 0;
    // A STATS reply carries as many shard tokens as the request's padding
    // leaves room for (anti-amplification), so STATS asks for a full page.
    const std::size_t pad_to = call.type == MessageType::kStats
                                   ? std::min(out.size(), kMaxDatagramSize)
                                   : max_reply_size(d);
    if (encode(d, out, written, pad_to) != ProtocolError::kOk) return 0;
    return seal(buffer, written);
  }

  void transmit(std::size_t node, std::span<const std::uint8_t> bytes) {
    if (bytes.empty()) return;
    sent.fetch_add(1, std::memory_order_relaxed);  // a statistic
    (void)transport->send(endpoints[node], bytes);
  }

  void wake() noexcept {
    const std::uint64_t one = 1;
    (void)!::write(wake_fd_, &one, sizeof one);
  }

  // Relaxed is enough: only the I/O thread can see its own id here, and it
  // stored that id itself before running any completion.
  bool on_io_thread() const noexcept {
    return std::this_thread::get_id() == io_thread_id_.load(std::memory_order_relaxed);
  }

  void post(std::function<void()> fn) {
    {
      LockGuard lock(mutex_);
      posted_.push_back(std::move(fn));
    }
    wake();
  }

  // ---------------------------------------------------------------- I/O loop
  void io_loop() {
    io_thread_id_.store(std::this_thread::get_id(),
                        std::memory_order_relaxed);  // see on_io_thread()
    std::vector<ReadyCompletion> ready;
    std::vector<std::function<void()>> posted;
    std::vector<std::pair<std::size_t, std::vector<std::uint8_t>>> resend;
    const auto deliver = [&](std::span<const std::uint8_t> bytes) { on_datagram(bytes, ready); };
    // Under load replies are usually waiting already: while the last round
    // read some, read again without poll() (one syscall fewer per round).
    std::size_t received = 0;
    for (;;) {
      int timeout_ms = -1;
      {
        LockGuard lock(mutex_);
        if (stopping_) break;
        drop_stale_timers();
        std::int64_t planned = std::numeric_limits<std::int64_t>::max();
        if (!timers_.empty()) {
          planned = to_ns(timers_.top().when);
          const auto wait = timers_.top().when - Clock::now();
          timeout_ms = wait <= Clock::duration::zero()
                           ? 0
                           : static_cast<int>(std::chrono::ceil<milliseconds>(wait).count());
        }
        if (!posted_.empty()) timeout_ms = 0;
        // seq_cst: see submit(). Skipped when not sleeping: 0 stays.
        if (received == 0) planned_wake_ns_.store(planned, std::memory_order_seq_cst);
      }
      const milliseconds poll_interval = transport->poll_interval();
      if (poll_interval.count() > 0 && (timeout_ms < 0 || timeout_ms > poll_interval.count())) {
        timeout_ms = static_cast<int>(poll_interval.count());
      }
      if (received == 0) {
        std::array<pollfd, 2> fds{};
        fds[0] = {transport->fd(), POLLIN, 0};
        fds[1] = {wake_fd_, POLLIN, 0};
        const int n = ::poll(fds.data(), fds.size(), timeout_ms);
        // Awake: submitters need not write the eventfd until the next sleep
        // (seq_cst, as the store before poll; see submit()).
        planned_wake_ns_.store(0, std::memory_order_seq_cst);
        if (n > 0 && (fds[1].revents & POLLIN)) {
          std::uint64_t value = 0;
          (void)!::read(wake_fd_, &value, sizeof value);
        }
      }
      received = transport->receive(deliver);
      {
        LockGuard lock(mutex_);
        posted.swap(posted_);
        collect_due_timers(Clock::now(), ready, resend);
      }
      if (!resend.empty()) {
        outgoing_.clear();
        for (const auto& [node, bytes] : resend) outgoing_.push_back({&endpoints[node], bytes});
        transmit_many();
        resend.clear();
      }
      for (ReadyCompletion& c : ready) c.done(c.result);
      ready.clear();
      for (auto& fn : posted) fn();
      posted.clear();
      flush_outbox();
    }
    // Complete everything still outstanding, including calls issued by
    // those completions (they fail at once: started stays true but stopping_
    // rejects them in flush_outbox()).
    for (int round = 0; round < 4; ++round) {
      std::vector<std::unique_ptr<Call>> calls;
      {
        LockGuard lock(mutex_);
        for (auto& [id_, call] : pending_) calls.push_back(std::move(call));
        pending_.clear();
        timers_ = {};
      }
      for (auto& call : outbox_) calls.push_back(std::move(call));
      outbox_.clear();
      if (calls.empty()) break;
      for (auto& call : calls) complete_now(std::move(call), LeaseErrc::kNotStarted);
    }
    outbox_.clear();
  }

  void drop_stale_timers() SHARDLOCK_REQUIRES(mutex_) {
    while (!timers_.empty()) {
      const TimerEntry& top = timers_.top();
      const auto it = pending_.find(top.request_id);
      if (it != pending_.end() && it->second->next_send == top.when) break;
      timers_.pop();
    }
  }

  void collect_due_timers(Clock::time_point now, std::vector<ReadyCompletion>& ready,
                          std::vector<std::pair<std::size_t, std::vector<std::uint8_t>>>& resend)
      SHARDLOCK_REQUIRES(mutex_) {
    while (!timers_.empty() && timers_.top().when <= now) {
      const TimerEntry top = timers_.top();
      timers_.pop();
      const auto it = pending_.find(top.request_id);
      if (it == pending_.end() || it->second->next_send != top.when) continue;  // stale
      Call& call = *it->second;
      if (now >= call.deadline) {
        CallResult r;
        r.error = LeaseErrc::kUnreachable;
        r.first_sent = call.first_sent;
        r.request_id = call.request_id;
        r.transmissions = call.transmissions;
        ready.push_back({std::move(call.done), std::move(r)});
        pending_.erase(it);
        continue;
      }
      // Same request id: the server answers a retransmission from its dedup
      // cache, so a lost GRANTED is re-sent, never re-granted.
      ++call.transmissions;
      retransmits.fetch_add(1, std::memory_order_relaxed);  // a statistic
      call.interval = std::min<Clock::duration>(call.interval * 2, options.max_retransmit);
      call.next_send = std::min(now + jittered(call.interval), call.deadline);
      timers_.push({call.next_send, call.request_id});
      std::vector<std::uint8_t> bytes(kMaxDatagramSize);
      bytes.resize(encode_single(call, bytes));
      resend.emplace_back(call.node, std::move(bytes));
    }
  }

  // Matches the replies in one datagram to their calls.
  void on_datagram(std::span<const std::uint8_t> bytes, std::vector<ReadyCompletion>& ready) {
    if (options.auth_key) bytes = open_datagram(bytes, *options.auth_key);
    // Without a key, a sealed reply is refused too (the flag check below).
    if (bytes.empty() || decode(bytes, rx_) != ProtocolError::kOk ||
        (!options.auth_key && (rx_.flags & kFlagAuthenticated) != 0)) {
      malformed_.fetch_add(1, std::memory_order_relaxed);  // a statistic
      return;
    }
    LockGuard lock(mutex_);
    for (const Message& m : rx_.items()) {
      const auto it = pending_.find(m.request_id);
      if (it == pending_.end()) continue;  // a duplicate, or an answer that came too late
      Call& call = *it->second;
      if (!answers(call.type, m.type) || (carries_key(m.type) && m.key != call.key)) continue;
      CallResult r;
      r.error = error_for(m.type);
      r.reply = m.type;
      r.token = m.token;
      r.ttl_ms = m.ttl_ms;
      r.retry_after_ms = m.retry_after_ms;
      r.wire_error = m.error;
      r.held = m.held;
      r.waiters = m.waiters;
      r.first_sent = call.first_sent;
      r.request_id = call.request_id;
      r.transmissions = call.transmissions;
      if (m.type == MessageType::kStatsReply) {
        r.shard_count = m.shard_count;
        r.first_shard = m.first_shard;
        r.counters = m.counters;
        r.shard_tokens.reserve(m.shard_token_count());
        for (std::size_t i = 0; i < m.shard_token_count(); ++i)
          r.shard_tokens.push_back(m.shard_token(i));
      }
      ready.push_back({std::move(call.done), std::move(r)});
      pending_.erase(it);
    }
  }

  // Sends the calls issued by completions: packed into batch datagrams per
  // node (items of other owners than the first carry their owner, see
  // kItemFlagOwner), then every datagram of the round in one send_many().
  void flush_outbox() {
    if (outbox_.empty()) return;
    bool stopping = false;
    {
      LockGuard lock(mutex_);
      stopping = stopping_;
    }
    if (stopping) return;  // io_loop() fails them on its way out
    const Clock::time_point now = Clock::now();
    std::stable_sort(outbox_.begin(), outbox_.end(), [](const auto& a, const auto& b) {
      if (a->node != b->node) return a->node < b->node;
      if (a->owner.hi != b->owner.hi) return a->owner.hi < b->owner.hi;
      return a->owner.lo < b->owner.lo;
    });
    outgoing_.clear();
    std::size_t datagrams = 0;
    std::size_t begin = 0;
    while (begin < outbox_.size()) {
      const std::size_t node = outbox_[begin]->node;
      Datagram& d = tx_datagram();
      d.client_id = outbox_[begin]->owner;
      d.count = 0;
      std::size_t end = begin;
      while (end < outbox_.size() && outbox_[end]->node == node && d.count < options.max_batch) {
        arm(*outbox_[end], now);
        Message m = outbox_[end]->message();
        if (outbox_[end]->owner != d.client_id) m.owner = outbox_[end]->owner;
        (void)d.push(m);
        // The request is padded to its largest reply; items with an owner
        // can make the request itself the larger of the two.
        if (d.count > 1 && std::max(encoded_size(d), max_reply_size(d)) > payload_limit()) {
          --d.count;
          break;
        }
        ++end;
      }
      d.batch = d.count > 1;
      d.request_id = d.batch ? new_request_id() : outbox_[begin]->request_id;
      if (datagrams == out_buffers_.size()) out_buffers_.emplace_back();
      std::array<std::uint8_t, kMaxDatagramSize>& buffer = out_buffers_[datagrams++];
      std::size_t written = 0;
      if (encode_request(d, std::span(buffer).first(payload_limit()), written) !=
          ProtocolError::kOk) {
        written = 0;
      }
      written = seal(buffer, written);
      if (written > 0) outgoing_.push_back({&endpoints[node], {buffer.data(), written}});
      {
        LockGuard lock(mutex_);
        for (std::size_t i = begin; i < end; ++i) {
          timers_.push({outbox_[i]->next_send, outbox_[i]->request_id});
          const std::uint64_t request_id = outbox_[i]->request_id;
          pending_.emplace(request_id, std::move(outbox_[i]));
        }
      }
      begin = end;
    }
    outbox_.clear();
    transmit_many();
  }

  // Sends outgoing_ (I/O thread only).
  void transmit_many() {
    if (outgoing_.empty()) return;
    sent.fetch_add(outgoing_.size(), std::memory_order_relaxed);  // a statistic
    transport->send_many(outgoing_);
    outgoing_.clear();
  }

  // ---------------------------------------------------------------- watchdog
  void watch(std::shared_ptr<LeaseState> state) {
    std::lock_guard lock(watch_mutex_);
    if (watch_stop_) return;
    watched_.push_back(std::move(state));
    watch_dirty_ = true;
    if (!watch_thread_.joinable()) watch_thread_ = std::thread([this] { watch_loop(); });
    watch_cv_.notify_one();
  }

  void nudge_watchdog() {
    {
      std::lock_guard lock(watch_mutex_);
      watch_dirty_ = true;
    }
    watch_cv_.notify_one();
  }

  // Relaxed is enough: only the watchdog thread can see its own id here, and
  // it stored that id itself before running any callback.
  bool on_watchdog_thread() const noexcept {
    return std::this_thread::get_id() == watch_thread_id_.load(std::memory_order_relaxed);
  }

  void watch_loop() {
    watch_thread_id_.store(std::this_thread::get_id(),
                           std::memory_order_relaxed);  // see on_watchdog_thread()
    std::vector<std::shared_ptr<LeaseState>> leases;
    std::vector<std::pair<std::shared_ptr<LeaseState>, LeaseLost>> fire;
    std::unique_lock lock(watch_mutex_);
    while (!watch_stop_) {
      leases = watched_;
      watch_dirty_ = false;
      lock.unlock();
      const Clock::time_point now = Clock::now();
      Clock::time_point next = now + std::chrono::seconds(1);
      std::vector<const LeaseState*> finished;
      for (const auto& state : leases) {
        bool renew = false;
        milliseconds ttl{};
        Clock::time_point deadline;
        {
          LockGuard state_lock(state->mutex);
          if (state->status == LeaseState::Status::kHeld && now >= state->expiry) {
            state->status = LeaseState::Status::kLost;
            state->lost = LeaseLost{state->key, state->token, LeaseErrc::kExpired, false};
          }
          if (state->status == LeaseState::Status::kLost && !state->lost_fired) {
            state->lost_fired = true;
            fire.emplace_back(state, state->lost);
          }
          if (state->status != LeaseState::Status::kHeld) {
            finished.push_back(state.get());
            continue;
          }
          next = std::min(next, state->expiry);
          if (state->options.watchdog && !state->renew_in_flight) {
            if (now >= state->next_renew) {
              state->renew_in_flight = true;
              renew = true;
              ttl = state->ttl;
              deadline = state->expiry;
            } else {
              next = std::min(next, state->next_renew);
            }
          }
        }
        if (renew) issue_watchdog_renewal(state, ttl, deadline, now);
      }
      for (auto& [state, event] : fire) {
        if (!state->options.on_lost) continue;
        LockGuard gate(state->callback_mutex);
        {
          LockGuard state_lock(state->mutex);
          // release(), detach() or the destructor began: never call back.
          if (state->status == LeaseState::Status::kReleased) continue;
        }
        state->options.on_lost(event);
      }
      fire.clear();
      leases.clear();
      lock.lock();
      if (!finished.empty()) {
        std::erase_if(watched_, [&](const auto& s) {
          return std::find(finished.begin(), finished.end(), s.get()) != finished.end();
        });
      }
      if (!watch_dirty_ && !watch_stop_) watch_cv_.wait_until(lock, next);
    }
  }

  // A RENEW of `state` for `ttl` with its request id reserved and noted in
  // the state (its expiry comes in first if `ttl` is shorter).
  std::unique_ptr<Call> make_renewal(LeaseState& state, milliseconds ttl) {
    auto call = make_call(MessageType::kRenew, state.key);
    call->token = state.token;
    call->ttl_ms = clamp_ms(ttl);
    call->request_id = new_request_id();
    LockGuard state_lock(state.mutex);
    state.note_renewal_sent(call->request_id, Clock::now(), milliseconds(call->ttl_ms));
    return call;
  }

  void issue_watchdog_renewal(const std::shared_ptr<LeaseState>& state, milliseconds ttl,
                              Clock::time_point expiry, Clock::time_point now) {
    auto call = make_renewal(*state, ttl);
    // A renewal past the expiry is useless: the lease is lost by then.
    call->budget = std::min<Clock::duration>(
        options.request_timeout, std::max<Clock::duration>(expiry - now, Clock::duration(1)));
    std::weak_ptr<LeaseState> weak = state;
    const std::uint64_t request_id = call->request_id;
    const milliseconds requested(call->ttl_ms);
    call->done = [this, weak, request_id, requested](const CallResult& r) {
      const std::shared_ptr<LeaseState> s = weak.lock();
      if (!s) return;
      {
        LockGuard state_lock(s->mutex);
        s->renew_in_flight = false;
        (void)s->apply_renewal(r, request_id, requested, Clock::now());
      }
      nudge_watchdog();
    };
    submit(std::move(call));
  }

  // Blocks the calling thread until `call` completes.
  CallResult call_sync(std::unique_ptr<Call> call) {
    struct Waiter {
      std::atomic<std::uint32_t> done{0};
      CallResult result;
    };
    auto waiter = std::make_shared<Waiter>();
    call->done = [waiter](const CallResult& r) {
      waiter->result = r;
      // Release pairs with the acquire load below: the result is visible
      // before `done` reads 1.
      waiter->done.store(1, std::memory_order_release);
      shardlock::internal::futex_wake(&waiter->done, 1);
    };
    submit(std::move(call));
    while (waiter->done.load(std::memory_order_acquire) == 0) {
      shardlock::internal::futex_wait(&waiter->done, 0);
    }
    return std::move(waiter->result);
  }

  std::atomic<std::uint64_t> malformed_{0};

 private:
  int wake_fd_ = -1;
  std::thread io_thread_;
  std::atomic<std::thread::id> io_thread_id_{};
  std::atomic<std::thread::id> watch_thread_id_{};
  std::atomic<std::int64_t> planned_wake_ns_{0};

  Mutex mutex_;
  bool stopping_ SHARDLOCK_GUARDED_BY(mutex_) = false;
  std::unordered_map<std::uint64_t, std::unique_ptr<Call>> pending_ SHARDLOCK_GUARDED_BY(mutex_);
  std::priority_queue<TimerEntry, std::vector<TimerEntry>, std::greater<>> timers_
      SHARDLOCK_GUARDED_BY(mutex_);
  std::vector<std::function<void()>> posted_ SHARDLOCK_GUARDED_BY(mutex_);

  // I/O thread only.
  std::vector<std::unique_ptr<Call>> outbox_;
  // A deque: growing it keeps earlier buffers in place, and outgoing_ points
  // into them until the round is sent.
  std::deque<std::array<std::uint8_t, kMaxDatagramSize>> out_buffers_;
  std::vector<DatagramTransport::Outgoing> outgoing_;
  Datagram rx_;

  std::mutex watch_mutex_;
  std::condition_variable watch_cv_;
  bool watch_stop_ = false;
  bool watch_dirty_ = false;
  std::vector<std::shared_ptr<LeaseState>> watched_;
  std::thread watch_thread_;
};

}  // namespace internal

using internal::Call;
using internal::ClientCore;
using internal::LeaseState;
using Clock = LeaseClock;
using std::chrono::milliseconds;

namespace {

std::error_code check_key(std::string_view key) noexcept {
  if (key.size() < kMinKeyLength || key.size() > kMaxKeyLength) return LeaseErrc::kBadArgument;
  return {};
}

CallResult failed(LeaseErrc e) {
  CallResult r;
  r.error = e;
  r.first_sent = Clock::now();
  return r;
}

}  // namespace

// ------------------------------------------------------------------- Lease

Lease::Lease() noexcept = default;
Lease::Lease(std::shared_ptr<LeaseState> state) noexcept : state_(std::move(state)) {}
Lease::Lease(Lease&& other) noexcept = default;
Lease& Lease::operator=(Lease&& other) noexcept {
  if (this != &other) {
    release_in_background();
    state_ = std::move(other.state_);
  }
  return *this;
}
Lease::~Lease() { release_in_background(); }

namespace {

// Marks `state` released (returning whether it was still held or lost, so a
// RELEASE is worth sending), then waits for a lost callback that is running,
// unless this is the callback's own thread.
bool close_lease(LeaseState& state) {
  bool was_active = false;
  {
    LockGuard lock(state.mutex);
    was_active = state.status != LeaseState::Status::kReleased;
    state.status = LeaseState::Status::kReleased;
  }
  if (!state.core->on_watchdog_thread()) {
    LockGuard gate(state.callback_mutex);  // the watchdog checks kReleased under it
  }
  return was_active;
}

// One RELEASE of the lease's own token, not waited for. The token is this
// Lease's alone (the server re-grants with a new token), so it can free no
// other grant.
void send_release(LeaseState& state) noexcept {
  try {
    auto call = state.core->make_call(MessageType::kRelease, state.key);
    call->token = state.token;
    call->done = [](const CallResult&) {};
    state.core->submit(std::move(call));
  } catch (...) {
    // Best effort: an allocation failure here leaves the lease to expire.
  }
}

}  // namespace

void Lease::release_in_background() noexcept {
  if (!state_) return;
  if (close_lease(*state_)) send_release(*state_);
  state_.reset();
}

void Lease::detach() noexcept {
  if (!state_) return;
  (void)close_lease(*state_);
  state_.reset();
}

bool Lease::valid() const noexcept {
  if (!state_) return false;
  LockGuard lock(state_->mutex);
  return state_->status == LeaseState::Status::kHeld && Clock::now() < state_->expiry;
}

const std::string& Lease::key() const noexcept {
  static const std::string kEmpty;
  return state_ ? state_->key : kEmpty;
}
std::uint64_t Lease::token() const noexcept { return state_ ? state_->token : 0; }
ClientId Lease::owner() const noexcept { return state_ ? state_->owner : ClientId{}; }
LeaseClock::time_point Lease::expiry() const noexcept {
  if (!state_) return {};
  LockGuard lock(state_->mutex);
  return state_->expiry;
}
milliseconds Lease::ttl() const noexcept {
  if (!state_) return {};
  LockGuard lock(state_->mutex);
  return state_->ttl;
}

std::error_code Lease::renew(milliseconds ttl) {
  if (!state_) return LeaseErrc::kLeaseInactive;
  {
    LockGuard lock(state_->mutex);
    if (state_->status != LeaseState::Status::kHeld) return LeaseErrc::kLeaseInactive;
    if (ttl.count() <= 0) ttl = state_->ttl;
  }
  auto call = state_->core->make_renewal(*state_, ttl);
  const std::uint64_t request_id = call->request_id;
  const milliseconds requested(call->ttl_ms);
  const CallResult r = state_->core->call_sync(std::move(call));
  bool lost = false;
  {
    LockGuard lock(state_->mutex);
    lost = state_->apply_renewal(r, request_id, requested, Clock::now());
  }
  if (lost) state_->core->nudge_watchdog();
  return r.error;
}

std::error_code Lease::release() {
  if (!state_) return LeaseErrc::kLeaseInactive;
  if (!close_lease(*state_)) return LeaseErrc::kLeaseInactive;
  auto call = state_->core->make_call(MessageType::kRelease, state_->key);
  call->token = state_->token;
  return state_->core->call_sync(std::move(call)).error;
}

// ------------------------------------------------------------- LeaseClient

LeaseClient::LeaseClient(LeaseClientOptions options)
    : core_(std::make_shared<ClientCore>(std::move(options))) {}

LeaseClient::~LeaseClient() { core_->shutdown(); }

std::error_code LeaseClient::start() { return core_->start(); }
const std::string& LeaseClient::error_detail() const noexcept { return core_->error_detail; }
ClientId LeaseClient::client_id() const noexcept { return core_->id; }
std::size_t LeaseClient::node_for(std::string_view key) const noexcept {
  return core_->routing.node_for(key);
}

AcquireResult LeaseClient::acquire(std::string_view key, milliseconds ttl, milliseconds wait,
                                   LeaseOptions lease_options) {
  AcquireResult result;
  if (std::error_code ec = check_key(key)) {
    result.error = ec;
    return result;
  }
  if (ttl.count() <= 0 || wait.count() < 0 || !(lease_options.renew_fraction > 0.0) ||
      !(lease_options.renew_fraction < 1.0)) {
    result.error = LeaseErrc::kBadArgument;
    return result;
  }
  auto call = core_->make_call(MessageType::kAcquire, key);
  call->ttl_ms = internal::clamp_ms(ttl);
  call->wait_ms = internal::clamp_ms(wait);
  call->budget += wait;
  const CallResult r = core_->call_sync(std::move(call));
  result.error = r.error;
  result.holder_ttl_left_ms = r.reply == MessageType::kBusy ? r.ttl_ms : 0;
  result.retry_after_ms = r.retry_after_ms;
  result.wire_error = r.wire_error;
  if (r.error) return result;
  const bool watched = lease_options.watchdog || static_cast<bool>(lease_options.on_lost);
  auto state = std::make_shared<LeaseState>(core_, std::string(key), r.token, core_->id,
                                            std::move(lease_options), core_->margin, r, ttl);
  bool expired = false;
  {
    LockGuard lock(state->mutex);
    expired = Clock::now() >= state->expiry;
  }
  if (expired) {
    // Waited too long, or the GRANTED came back late: the lease may still
    // stand on the server for a moment, but the client cannot prove it.
    (void)close_lease(*state);
    send_release(*state);
    result.error = LeaseErrc::kGrantExpired;
    return result;
  }
  if (watched) core_->watch(state);
  result.lease = Lease(std::move(state));
  return result;
}

CallResult LeaseClient::renew(std::string_view key, std::uint64_t token, milliseconds ttl) {
  if (check_key(key) || ttl.count() <= 0) return failed(LeaseErrc::kBadArgument);
  auto call = core_->make_call(MessageType::kRenew, key);
  call->token = token;
  call->ttl_ms = internal::clamp_ms(ttl);
  return core_->call_sync(std::move(call));
}

CallResult LeaseClient::release(std::string_view key, std::uint64_t token) {
  if (check_key(key)) return failed(LeaseErrc::kBadArgument);
  auto call = core_->make_call(MessageType::kRelease, key);
  call->token = token;
  return core_->call_sync(std::move(call));
}

CallResult LeaseClient::query(std::string_view key) {
  if (check_key(key)) return failed(LeaseErrc::kBadArgument);
  return core_->call_sync(core_->make_call(MessageType::kQuery, key));
}

ServerStatsReply LeaseClient::stats(std::size_t node) {
  ServerStatsReply out;
  if (node >= core_->options.nodes.size()) {
    out.error = LeaseErrc::kBadArgument;
    return out;
  }
  // Page through the shard tokens; bounded by the shard count the server
  // reports (and a hard cap, should a server never make progress).
  for (int page = 0; page < 65536; ++page) {
    auto call = core_->make_call(MessageType::kStats, {});
    call->node = node;
    call->first_shard = static_cast<std::uint32_t>(out.shard_tokens.size());
    const CallResult r = core_->call_sync(std::move(call));
    if (r.error) {
      out.error = r.error;
      return out;
    }
    out.shard_count = r.shard_count;
    out.counters = r.counters;
    out.shard_tokens.insert(out.shard_tokens.end(), r.shard_tokens.begin(), r.shard_tokens.end());
    if (out.shard_tokens.size() >= out.shard_count || r.shard_tokens.empty()) break;
  }
  return out;
}

void LeaseClient::acquire_async(std::string_view key, milliseconds ttl, milliseconds wait,
                                Completion done, std::optional<ClientId> owner) {
  if (check_key(key) || ttl.count() <= 0 || wait.count() < 0) {
    done(failed(LeaseErrc::kBadArgument));
    return;
  }
  auto call = core_->make_call(MessageType::kAcquire, key);
  call->ttl_ms = internal::clamp_ms(ttl);
  call->wait_ms = internal::clamp_ms(wait);
  call->budget += wait;
  call->done = std::move(done);
  if (owner) call->owner = *owner;
  core_->submit(std::move(call));
}

void LeaseClient::renew_async(std::string_view key, std::uint64_t token, milliseconds ttl,
                              Completion done, std::optional<ClientId> owner) {
  if (check_key(key) || ttl.count() <= 0) {
    done(failed(LeaseErrc::kBadArgument));
    return;
  }
  auto call = core_->make_call(MessageType::kRenew, key);
  call->token = token;
  call->ttl_ms = internal::clamp_ms(ttl);
  call->done = std::move(done);
  if (owner) call->owner = *owner;
  core_->submit(std::move(call));
}

void LeaseClient::release_async(std::string_view key, std::uint64_t token, Completion done,
                                std::optional<ClientId> owner) {
  if (check_key(key)) {
    done(failed(LeaseErrc::kBadArgument));
    return;
  }
  auto call = core_->make_call(MessageType::kRelease, key);
  call->token = token;
  call->done = std::move(done);
  if (owner) call->owner = *owner;
  core_->submit(std::move(call));
}

void LeaseClient::post(std::function<void()> fn) { core_->post(std::move(fn)); }

std::uint64_t LeaseClient::datagrams_sent() const noexcept {
  return core_->sent.load(std::memory_order_relaxed);  // a statistic
}
std::uint64_t LeaseClient::malformed_replies() const noexcept {
  return core_->malformed_.load(std::memory_order_relaxed);  // a statistic
}
std::uint64_t LeaseClient::retransmissions() const noexcept {
  return core_->retransmits.load(std::memory_order_relaxed);  // a statistic
}

}  // namespace shardlock::lease
