// CallEngine: submit and encode, the I/O loop, retransmission, reply
// matching and cross-owner batching. See call_engine.h.
#include "call_engine.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>

#include "shardlock/lease/auth.h"
#include "shardlock/lock_guard.h"
#include "shardlock/workload/zipf.h"
#include "udp.h"

namespace shardlock::lease::internal {
namespace {

using std::chrono::milliseconds;

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
    case MessageType::kGrantedMany:
    case MessageType::kRenewed:
    case MessageType::kReleased:
    case MessageType::kQueryReply:
    case MessageType::kStatsReply:
      return {};
    case MessageType::kBusy:
    case MessageType::kBusyMany:
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

std::array<std::uint8_t, kMaxDatagramSize>& tx_buffer() noexcept {
  thread_local std::array<std::uint8_t, kMaxDatagramSize> buffer{};
  return buffer;
}

Datagram& tx_datagram() noexcept {
  thread_local Datagram datagram;
  return datagram;
}

// Whether a reply that answers `call`'s type is well formed for this very
// call: a GRANTED_MANY must carry a token per key asked, and a BUSY_MANY
// must name one of them. Anything else would hand the caller leases it
// cannot match to keys.
bool fits_call(const Call& call, const Message& reply) noexcept {
  switch (reply.type) {
    case MessageType::kGrantedMany:
      return reply.listed_token_count() == call.key_count;
    case MessageType::kBusyMany:
      return reply.index < call.key_count;
    default:
      return true;
  }
}

}  // namespace

CallEngine::~CallEngine() {
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

void CallEngine::set_first_request_id(std::uint64_t first) noexcept {
  // Relaxed: published to the I/O thread by std::thread's start, and to
  // callers by the release store of started_ in start().
  next_request_id_.store(first, std::memory_order_relaxed);
}

std::error_code CallEngine::start() {
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) return {errno, std::system_category()};
  started_.store(true, std::memory_order_release);  // pairs with the acquire in started()
  io_thread_ = std::thread([this] { io_loop(); });
  return {};
}

void CallEngine::stop() {
  {
    LockGuard lock(mutex_);
    stopping_ = true;
  }
  wake();
  if (io_thread_.joinable()) io_thread_.join();
}

// ------------------------------------------------------------------ calls

std::unique_ptr<Call> CallEngine::make_call(MessageType type, std::string_view key) const {
  auto call = std::make_unique<Call>();
  call->type = type;
  call->key = std::string(key);
  call->node = key.empty() ? 0 : setup_.routing.node_for(key);
  call->owner = setup_.id;
  call->budget = setup_.options.request_timeout;
  return call;
}

void CallEngine::submit(std::unique_ptr<Call> call) {
  if (!started()) {
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

void CallEngine::post(std::function<void()> fn) {
  {
    LockGuard lock(mutex_);
    posted_.push_back(std::move(fn));
  }
  wake();
}

void CallEngine::arm(Call& call, Clock::time_point now) noexcept {
  if (call.request_id == 0) call.request_id = new_request_id();
  call.first_sent = now;
  call.transmissions = 1;
  call.deadline = now + call.budget;
  call.interval = setup_.options.initial_retransmit;
  call.next_send = std::min(now + jittered(call.interval), call.deadline);
}

void CallEngine::complete_now(std::unique_ptr<Call> call, LeaseErrc error) {
  CallResult r;
  r.error = error;
  r.first_sent = Clock::now();
  r.request_id = call->request_id;
  if (call->done) call->done(r);
}

// ----------------------------------------------------------------- encode

std::size_t CallEngine::payload_limit() const noexcept {
  return kMaxDatagramSize - (setup_.options.auth_key ? kAuthTagSize : 0);
}

std::size_t CallEngine::seal(std::span<std::uint8_t> buffer, std::size_t length) const noexcept {
  if (!setup_.options.auth_key || length == 0) return length;
  return seal_datagram(buffer, length, *setup_.options.auth_key);
}

bool CallEngine::fits_one_datagram(const Call& call) const {
  Datagram& d = tx_datagram();
  d.batch = false;
  d.client_id = call.owner;
  d.request_id = call.request_id;
  d.count = 0;
  (void)d.push(call.message());
  const std::size_t size = encoded_size(d);
  return size != 0 && std::max(size, max_reply_size(d)) <= payload_limit();
}

std::size_t CallEngine::encode_single(const Call& call, std::span<std::uint8_t> buffer) const {
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
  const std::size_t pad_to =
      call.type == MessageType::kStats ? std::min(out.size(), kMaxDatagramSize) : max_reply_size(d);
  if (encode(d, out, written, pad_to) != ProtocolError::kOk) return 0;
  return seal(buffer, written);
}

void CallEngine::transmit(std::size_t node, std::span<const std::uint8_t> bytes) {
  if (bytes.empty()) return;
  sent_.fetch_add(1, std::memory_order_relaxed);  // a statistic
  (void)setup_.transport->send(setup_.endpoints[node], bytes);
}

void CallEngine::transmit_many() {
  if (outgoing_.empty()) return;
  sent_.fetch_add(outgoing_.size(), std::memory_order_relaxed);  // a statistic
  setup_.transport->send_many(outgoing_);
  outgoing_.clear();
}

void CallEngine::wake() noexcept {
  const std::uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof one);
}

// Relaxed is enough: only the I/O thread can see its own id here, and it
// stored that id itself before running any completion.
bool CallEngine::on_io_thread() const noexcept {
  return std::this_thread::get_id() == io_thread_id_.load(std::memory_order_relaxed);
}

// --------------------------------------------------------------- I/O loop

std::size_t CallEngine::busy_poll(
    const std::function<void(std::span<const std::uint8_t>)>& deliver) {
  const auto window = setup_.options.busy_poll;
  if (window.count() <= 0) return 0;
  const Clock::time_point until = Clock::now() + window;
  do {
    if (const std::size_t n = setup_.transport->receive(deliver); n > 0) return n;
    idle_while_polling();
  } while (Clock::now() < until);
  return 0;
}

void CallEngine::io_loop() {
  io_thread_id_.store(std::this_thread::get_id(),
                      std::memory_order_relaxed);  // see on_io_thread()
  std::vector<ReadyCompletion> ready;
  std::vector<std::function<void()>> posted;
  Resends resend;
  const std::function<void(std::span<const std::uint8_t>)> deliver =
      [&](std::span<const std::uint8_t> bytes) { on_datagram(bytes, ready); };
  // Under load replies are usually waiting already: while the last round
  // read some, read again without poll() (one syscall fewer per round).
  std::size_t received = 0;
  for (;;) {
    int timeout_ms = -1;
    bool awaiting_replies = false;
    {
      LockGuard lock(mutex_);
      if (stopping_) break;
      awaiting_replies = !pending_.empty();
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
    const milliseconds poll_interval = setup_.transport->poll_interval();
    if (poll_interval.count() > 0 && (timeout_ms < 0 || timeout_ms > poll_interval.count())) {
      timeout_ms = static_cast<int>(poll_interval.count());
    }
    // Replies due soon: spin on the socket before sleeping (busy_poll).
    const std::size_t spun =
        received == 0 && awaiting_replies && timeout_ms != 0 ? busy_poll(deliver) : 0;
    if (received == 0 && spun == 0) {
      std::array<pollfd, 2> fds{};
      fds[0] = {setup_.transport->fd(), POLLIN, 0};
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
    received = spun > 0 ? spun : setup_.transport->receive(deliver);
    {
      LockGuard lock(mutex_);
      posted.swap(posted_);
      collect_due_timers(Clock::now(), ready, resend);
    }
    if (!resend.empty()) {
      outgoing_.clear();
      for (const auto& [node, bytes] : resend)
        outgoing_.push_back({&setup_.endpoints[node], bytes});
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
      for (auto& [request_id, call] : pending_) calls.push_back(std::move(call));
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

void CallEngine::drop_stale_timers() {
  while (!timers_.empty()) {
    const TimerEntry& top = timers_.top();
    const auto it = pending_.find(top.request_id);
    if (it != pending_.end() && it->second->next_send == top.when) break;
    timers_.pop();
  }
}

void CallEngine::collect_due_timers(Clock::time_point now, std::vector<ReadyCompletion>& ready,
                                    Resends& resend) {
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
    retransmits_.fetch_add(1, std::memory_order_relaxed);  // a statistic
    call.interval = std::min<Clock::duration>(call.interval * 2, setup_.options.max_retransmit);
    call.next_send = std::min(now + jittered(call.interval), call.deadline);
    timers_.push({call.next_send, call.request_id});
    std::vector<std::uint8_t> bytes(kMaxDatagramSize);
    bytes.resize(encode_single(call, bytes));
    resend.emplace_back(call.node, std::move(bytes));
  }
}

void CallEngine::on_datagram(std::span<const std::uint8_t> bytes,
                             std::vector<ReadyCompletion>& ready) {
  if (setup_.options.auth_key) bytes = open_datagram(bytes, *setup_.options.auth_key);
  // Without a key, a sealed reply is refused too (the flag check below).
  if (bytes.empty() || decode(bytes, rx_) != ProtocolError::kOk ||
      (!setup_.options.auth_key && (rx_.flags & kFlagAuthenticated) != 0)) {
    malformed_.fetch_add(1, std::memory_order_relaxed);  // a statistic
    return;
  }
  LockGuard lock(mutex_);
  for (const Message& m : rx_.items()) {
    const auto it = pending_.find(m.request_id);
    if (it == pending_.end()) continue;  // a duplicate, or an answer that came too late
    Call& call = *it->second;
    if (!reply_answers(call.type, m.type) || (reply_carries_key(m.type) && m.key != call.key))
      continue;
    if (!fits_call(call, m)) {
      // Decodes, but cannot be this call's answer: counted, and the call
      // waits for a good one (or its deadline).
      malformed_.fetch_add(1, std::memory_order_relaxed);  // a statistic
      continue;
    }
    CallResult r;
    r.error = error_for(m.type);
    r.reply = m.type;
    r.token = m.token;
    r.ttl_ms = m.ttl_ms;
    r.retry_after_ms = m.retry_after_ms;
    r.wire_error = m.error;
    r.held = m.held;
    r.waiters = m.waiters;
    r.mode = m.mode;
    r.holders = m.holders;
    r.permits = m.permits;
    r.busy_index = m.index;
    if (m.type == MessageType::kGrantedMany) {
      r.tokens.reserve(m.listed_token_count());
      for (std::size_t i = 0; i < m.listed_token_count(); ++i)
        r.tokens.push_back(m.listed_token(i));
    }
    r.first_sent = call.first_sent;
    r.request_id = call.request_id;
    r.transmissions = call.transmissions;
    if (m.type == MessageType::kStatsReply) {
      r.shard_count = m.shard_count;
      r.first_shard = m.first_shard;
      for (std::size_t i = 0; i < kStatCounterCount; ++i) r.counters[i] = m.counter_at(i);
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
void CallEngine::flush_outbox() {
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
    while (end < outbox_.size() && outbox_[end]->node == node &&
           d.count < setup_.options.max_batch) {
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
    if (written > 0) outgoing_.push_back({&setup_.endpoints[node], {buffer.data(), written}});
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

}  // namespace shardlock::lease::internal
