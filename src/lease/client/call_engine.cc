// CallEngine: submit and encode, the I/O loop, retransmission, reply
// matching and cross-owner batching. See call_engine.h.
#include "client/call_engine.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>

#include "shardlock/internal/random.h"
#include "shardlock/lease/wire/auth.h"
#include "shardlock/lock_guard.h"
#include "wire/udp.h"

namespace shardlock::lease::internal {
namespace {

using std::chrono::milliseconds;

std::int64_t to_ns(Clock::time_point t) noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

// Per-thread jitter source; seeded from the thread's stack address and the
// clock, which is plenty for spreading retransmissions.
std::uint64_t jitter_bits() noexcept {
  thread_local shardlock::internal::SplitMix64 random(
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

}  // namespace

Clock::duration retry_delay(std::uint32_t retry_after_ms) noexcept {
  const Clock::duration base =
      std::max<Clock::duration>(milliseconds(retry_after_ms), kMinRetryAfter);
  const auto spread = std::min<Clock::duration>(base / 4, milliseconds(250)).count();
  if (spread <= 0) return base;
  return base + Clock::duration(
                    static_cast<Clock::rep>(jitter_bits() % static_cast<std::uint64_t>(spread)));
}

namespace {

std::array<std::uint8_t, kMaxDatagramSize>& tx_buffer() noexcept {
  thread_local std::array<std::uint8_t, kMaxDatagramSize> buffer{};
  return buffer;
}

Datagram& tx_datagram() noexcept {
  thread_local Datagram datagram;
  return datagram;
}

// STATS, MAP, QUERY_HOLDERS and HOT_KEYS: their replies carry as many shard
// tokens, members, holders or keys as the request's padding leaves room for
// (anti-amplification), so they are padded to a whole datagram, alone.
bool asks_for_a_page(const Call& call) noexcept {
  return call.type == MessageType::kStats || call.type == MessageType::kMap ||
         call.type == MessageType::kQueryHolders || call.type == MessageType::kHotKeys ||
         call.type == MessageType::kWatch;
}

// What a result learns from its call whatever ended it: when it was sent,
// as which request and owner, how often, and to which node.
void stamp(CallResult& r, const Call& call) noexcept {
  r.first_sent = call.first_sent;
  r.request_id = call.request_id;
  r.owner = call.owner;
  r.transmissions = call.transmissions;
  r.node = call.to;
}

// The wait a fresh request id of a waiting acquire sent at `at` asks for:
// what is left of the call's, at least 1 ms (a wait of 0 would make it a
// try, answered BUSY at once).
std::uint32_t wait_left(const Call& call, Clock::time_point at) noexcept {
  return std::max<std::uint32_t>(1, clamp_ms(std::chrono::ceil<milliseconds>(call.wait_end - at)));
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
  call->owner = setup_.id;
  call->budget = setup_.options.request_timeout;
  // Before start() there is no node yet (the call then fails kNotStarted).
  if (setup_.endpoints.empty()) return call;
  call->to = &setup_.endpoints.front();
  if (setup_.cluster) {
    if (const auto view = setup_.cluster->current()) {
      call->epoch = view->epoch;
      if (!key.empty()) call->to = view->owner_of(key);
    }
  } else if (!key.empty()) {
    call->to = &setup_.endpoints[setup_.routing.node_for(key)];
  }
  return call;
}

bool CallEngine::route_keys(std::span<const std::string_view> keys, Call& call) const {
  if (keys.empty()) return false;
  if (setup_.cluster) {
    const auto view = setup_.cluster->current();
    if (!view) return false;
    const std::size_t owner = view->owner_index(keys.front());
    for (const std::string_view key : keys) {
      if (view->owner_index(key) != owner) return false;
    }
    call.to = view->endpoints[owner];
    call.epoch = view->epoch;
    return true;
  }
  const std::size_t node = setup_.routing.node_for(keys.front());
  for (const std::string_view key : keys) {
    if (setup_.routing.node_for(key) != node) return false;
  }
  call.to = &setup_.endpoints[node];
  return true;
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
  const Endpoint* to = call->to;
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
  transmit(*to, {tx_buffer().data(), length});
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
  ++call.transmissions;
  // A redirected call keeps the deadline of its first transmission.
  if (call.deadline == Clock::time_point{}) {
    call.deadline = now + call.budget;
    if (may_answer_later(call.message())) call.wait_end = now + milliseconds(call.wait_ms);
  }
  if (call.wait_end != Clock::time_point{}) call.wait_ms = wait_left(call, now);
  call.interval = setup_.options.initial_retransmit;
  call.next_send = std::min(now + jittered(call.interval), call.deadline);
}

void CallEngine::complete_now(std::unique_ptr<Call> call, LeaseErrc error) {
  CallResult r;
  r.error = error;
  r.first_sent = Clock::now();
  r.request_id = call->request_id;
  r.owner = call->owner;
  if (call->done) call->done(r);
}

void CallEngine::fail(std::unique_ptr<Call> call, LeaseErrc error) {
  CallResult r;
  r.error = error;
  stamp(r, *call);
  if (call->done) call->done(r);
}

// ----------------------------------------------------------------- encode

std::size_t CallEngine::payload_limit() const noexcept {
  return kMaxDatagramSize - (setup_.envelope_key ? envelope_overhead(setup_.seal_mode) : 0);
}

std::size_t CallEngine::seal(std::span<std::uint8_t> buffer, std::size_t length) const noexcept {
  if (!setup_.envelope_key || length == 0) return length;
  return seal_for(buffer, length, setup_.options.tenant.value_or(0), *setup_.envelope_key,
                  setup_.seal_mode);
}

bool CallEngine::fits_one_datagram(const Call& call) const {
  Datagram& d = tx_datagram();
  d.batch = false;
  d.client_id = call.owner;
  d.epoch = call.epoch;
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
  d.epoch = call.epoch;
  d.request_id = call.request_id;
  d.count = 0;
  (void)d.push(call.message());
  std::size_t written = 0;
  const std::size_t pad_to =
      asks_for_a_page(call) ? std::min(out.size(), kMaxDatagramSize) : max_reply_size(d);
  if (encode(d, out, written, pad_to) != ProtocolError::kOk) return 0;
  return seal(buffer, written);
}

void CallEngine::transmit(const Endpoint& to, std::span<const std::uint8_t> bytes) {
  if (bytes.empty()) return;
  sent_.fetch_add(1, std::memory_order_relaxed);  // a statistic
  (void)setup_.transport->send(to, bytes);
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
      for (const auto& [to, bytes] : resend) outgoing_.push_back({to, bytes});
      transmit_many();
      resend.clear();
    }
    for (ReadyCompletion& c : ready) c.done(c.result);
    ready.clear();
    if (silent_node_ != nullptr && setup_.cluster) {
      // A node that left sends no REDIRECT: only a newer map, asked of the
      // others, moves its keys' calls (on_map_refreshed()).
      setup_.cluster->refresh(nullptr, std::exchange(silent_node_, nullptr));
    }
    follow_redirects();
    retry_recovering();
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
    for (auto& [call, epoch] : redirected_) calls.push_back(std::move(call));
    redirected_.clear();
    for (auto& [call, delay] : recovering_) calls.push_back(std::move(call));
    recovering_.clear();
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
      // Answered REDIRECT last (a parked call, a node behind us): the node
      // was there, the owner was not reached.
      r.error = call.redirected ? LeaseErrc::kRedirected : LeaseErrc::kUnreachable;
      stamp(r, call);
      ready.push_back({std::move(call.done), std::move(r)});
      pending_.erase(it);
      continue;
    }
    // Same request id: the server answers a retransmission from its dedup
    // cache, so a lost GRANTED is re-sent, never re-granted.
    ++call.transmissions;
    if (call.unsent) {
      // A fresh request id's first send (resend_later()): a grant's expiry
      // counts from here, not from the old id's (a RECOVERING ride-through
      // may have waited longer than the TTL since).
      call.unsent = false;
      call.first_sent = now;
    }
    if (call.epoch && ++call.unanswered_sends >= kSilentTransmissions && follows_owner(call.type)) {
      silent_node_ = call.to;  // its owner may have left the cluster: see io_loop()
    }
    retransmits_.fetch_add(1, std::memory_order_relaxed);  // a statistic
    call.interval = std::min<Clock::duration>(call.interval * 2, setup_.options.max_retransmit);
    call.next_send = std::min(now + jittered(call.interval), call.deadline);
    timers_.push({call.next_send, call.request_id});
    std::vector<std::uint8_t> bytes(kMaxDatagramSize);
    bytes.resize(encode_single(call, bytes));
    resend.emplace_back(call.to, std::move(bytes));
  }
}

void CallEngine::on_datagram(std::span<const std::uint8_t> bytes,
                             std::vector<ReadyCompletion>& ready) {
  if (setup_.envelope_key) {
    // Only in the form and under the key id the requests went in.
    const std::optional<EnvelopeKeyId> id = peek_key_id(bytes);
    const bool ours =
        id && id->key_id == setup_.options.tenant.value_or(0) && id->mode == setup_.seal_mode;
    bytes =
        ours ? open_with(bytes, *setup_.envelope_key, rx_opened_) : std::span<const std::uint8_t>();
  }
  // Without a key, a sealed reply is refused too (the flag check below).
  if (bytes.empty() || decode(bytes, rx_) != ProtocolError::kOk ||
      (!setup_.envelope_key && (rx_.flags & kFlagAuthenticated) != 0)) {
    malformed_.fetch_add(1, std::memory_order_relaxed);  // a statistic
    return;
  }
  const Clock::time_point now = Clock::now();
  LockGuard lock(mutex_);
  for (const Message& m : rx_.items()) {
    const auto it = pending_.find(m.request_id);
    if (it == pending_.end()) continue;  // a duplicate, or an answer that came too late
    Call& call = *it->second;
    const ReplyDecision decision = decide_reply(call.shape(), m, now);
    switch (decision.verdict) {
      case ReplyVerdict::kIgnore:
        continue;
      case ReplyVerdict::kMalformed:
        malformed_.fetch_add(1, std::memory_order_relaxed);  // a statistic
        continue;
      case ReplyVerdict::kRedirect:
        redirected_.emplace_back(std::move(it->second), m.epoch);
        break;
      case ReplyVerdict::kRideThrough:
        recovering_.emplace_back(std::move(it->second),
                                 std::min(retry_delay(m.retry_after_ms), decision.latest_retry));
        break;
      case ReplyVerdict::kComplete: {
        CallResult r = result_of(m);
        stamp(r, call);
        ready.push_back({std::move(call.done), std::move(r)});
        break;
      }
    }
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
  // One datagram goes to one node with one epoch.
  std::stable_sort(outbox_.begin(), outbox_.end(), [](const auto& a, const auto& b) {
    if (a->to != b->to) return std::less<>{}(a->to, b->to);
    if (a->epoch != b->epoch) return a->epoch < b->epoch;
    if (a->owner.hi != b->owner.hi) return a->owner.hi < b->owner.hi;
    return a->owner.lo < b->owner.lo;
  });
  outgoing_.clear();
  std::size_t datagrams = 0;
  std::size_t begin = 0;
  while (begin < outbox_.size()) {
    const Endpoint* to = outbox_[begin]->to;
    Datagram& d = tx_datagram();
    d.client_id = outbox_[begin]->owner;
    d.epoch = outbox_[begin]->epoch;
    d.count = 0;
    std::size_t end = begin;
    while (end < outbox_.size() && outbox_[end]->to == to && outbox_[end]->epoch == d.epoch &&
           d.count < setup_.options.max_batch) {
      // A paging call travels alone, padded for a whole page.
      if (d.count > 0 && asks_for_a_page(*outbox_[end])) break;
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
      if (asks_for_a_page(*outbox_[end - 1])) break;
    }
    if (datagrams == out_buffers_.size()) out_buffers_.emplace_back();
    std::array<std::uint8_t, kMaxDatagramSize>& buffer = out_buffers_[datagrams++];
    std::size_t written = 0;
    if (asks_for_a_page(*outbox_[begin])) {
      written = encode_single(*outbox_[begin], buffer);  // reuses `d`; sealed
    } else {
      d.batch = d.count > 1;
      d.request_id = d.batch ? new_request_id() : outbox_[begin]->request_id;
      if (encode_request(d, std::span(buffer).first(payload_limit()), written) !=
          ProtocolError::kOk) {
        written = 0;
      }
      written = seal(buffer, written);
    }
    if (written > 0) outgoing_.push_back({to, {buffer.data(), written}});
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

// -------------------------------------------------------------- redirects

void CallEngine::call_map(const Endpoint* to, std::uint32_t first_member, CallCompletion done) {
  auto call = make_call(MessageType::kMap, {});
  call->to = to;
  call->first_member = first_member;
  call->done = std::move(done);
  submit(std::move(call));
}

void CallEngine::on_map_refreshed() {
  if (!on_io_thread()) {
    post([this] { on_map_refreshed(); });
    return;
  }
  std::vector<std::unique_ptr<Call>> calls;
  {
    LockGuard lock(mutex_);
    for (const std::uint64_t request_id : parked_) {
      const auto it = pending_.find(request_id);
      if (it == pending_.end() || !it->second->parked) continue;  // completed at its deadline
      calls.push_back(std::move(it->second));
      pending_.erase(it);
    }
  }
  parked_.clear();
  const auto view = setup_.cluster ? setup_.cluster->current() : nullptr;
  if (view) {
    // Calls still retransmitting to a node the new map no longer gives their
    // key (it left, or the key moved): sent to the new owner, with a fresh
    // request id. A grant the old node may still make for the old id is
    // never learned and expires by its TTL.
    LockGuard lock(mutex_);
    for (auto it = pending_.begin(); it != pending_.end();) {
      Call& call = *it->second;
      if (call.parked || !call.epoch || *call.epoch >= view->epoch || !follows_owner(call.type) ||
          owner_under(call, *view) == call.to) {
        ++it;  // a call whose node still owns the key keeps its request id
        continue;
      }
      calls.push_back(std::move(it->second));
      it = pending_.erase(it);
    }
  }
  for (auto& call : calls) {
    call->parked = false;
    if (!view) {
      fail(std::move(call), LeaseErrc::kRedirected);
    } else if (reroute(*call, *view)) {
      resend_now(std::move(call));
    } else {
      fail(std::move(call), LeaseErrc::kCrossNode);
    }
  }
}

const Endpoint* CallEngine::owner_under(const Call& call, const ClusterMapView& view) {
  if (call.type != MessageType::kAcquireMany) return view.owner_of(call.key);
  const KeyList keys(call.key_count, call.key_list);
  // The first key's owner; reroute() checks the rest.
  return keys.begin() == keys.end() ? nullptr : view.endpoints[view.owner_index(*keys.begin())];
}

bool CallEngine::follows_owner(MessageType type) noexcept {
  // A RENEW too: with replication the key's new owner holds the lease a
  // node that left granted (docs/cluster.md, "Replication"); without it,
  // the new owner answers that it has no such lease, as the old one would.
  return is_acquire(type) || type == MessageType::kQuery || type == MessageType::kQueryHolders ||
         type == MessageType::kWatch || type == MessageType::kRenew;
}

void CallEngine::follow_redirects() {
  // Following one may complete calls whose completions issue more; they
  // join the outbox, never this list.
  std::vector<std::pair<std::unique_ptr<Call>, std::uint64_t>> redirected;
  redirected.swap(redirected_);
  for (auto& [call, epoch] : redirected) follow_redirect(std::move(call), epoch);
}

void CallEngine::follow_redirect(std::unique_ptr<Call> call, std::uint64_t epoch) {
  call->redirected = true;
  const auto view = setup_.cluster ? setup_.cluster->current() : nullptr;
  const std::optional<std::uint64_t> map_epoch =
      view ? std::optional<std::uint64_t>(view->epoch) : std::nullopt;
  switch (next_redirect_step(epoch, call->epoch, map_epoch, call->redirects)) {
    case RedirectStep::kGiveUp:
      fail(std::move(call), LeaseErrc::kRedirected);
      return;
    case RedirectStep::kAskAgainSoon:
      resend_later(std::move(call), kRedirectRetry);  // within the deadline
      return;
    case RedirectStep::kAwaitNewerMap: {
      const Endpoint* from = call->to;
      park(std::move(call));
      setup_.cluster->refresh(from);
      return;
    }
    case RedirectStep::kGoToOwner:
      if (reroute(*call, *view)) {
        call->redirected = false;
        resend_now(std::move(call));
      } else {
        fail(std::move(call), LeaseErrc::kCrossNode);
      }
      return;
  }
}

void CallEngine::retry_recovering() {
  std::vector<std::pair<std::unique_ptr<Call>, Clock::duration>> recovering;
  recovering.swap(recovering_);
  for (auto& [call, delay] : recovering) {
    // Answered: the node is there, whatever a REDIRECT said before.
    call->redirected = false;
    resend_later(std::move(call), delay);
  }
}

bool CallEngine::reroute(Call& call, const ClusterMapView& view) {
  call.epoch = view.epoch;
  if (call.type != MessageType::kAcquireMany) {
    call.to = view.owner_of(call.key);
    return true;
  }
  std::optional<std::size_t> owner;
  for (const std::string_view key : KeyList(call.key_count, call.key_list)) {
    const std::size_t index = view.owner_index(key);
    if (owner && *owner != index) return false;
    owner = index;
  }
  if (!owner) return false;
  call.to = view.endpoints[*owner];
  return true;
}

void CallEngine::resend_now(std::unique_ptr<Call> call) {
  call->request_id = new_request_id();
  call->unanswered_sends = 0;
  outbox_.push_back(std::move(call));  // flush_outbox() arms and sends it
}

void CallEngine::resend_later(std::unique_ptr<Call> call, Clock::duration delay) {
  call->request_id = new_request_id();
  call->unanswered_sends = 0;
  // The timer sends it as a retransmission, which doubles the interval:
  // start from half the first one.
  call->interval = setup_.options.initial_retransmit / 2;
  call->next_send = std::min(Clock::now() + delay, call->deadline);
  call->unsent = true;  // its first_sent is set when the timer sends it
  if (call->wait_end != Clock::time_point{}) call->wait_ms = wait_left(*call, call->next_send);
  keep_pending(std::move(call));
}

void CallEngine::keep_pending(std::unique_ptr<Call> call) {
  {
    LockGuard lock(mutex_);
    if (!stopping_) {
      timers_.push({call->next_send, call->request_id});
      const std::uint64_t request_id = call->request_id;
      pending_.emplace(request_id, std::move(call));
      return;
    }
  }
  complete_now(std::move(call), LeaseErrc::kNotStarted);
}

void CallEngine::park(std::unique_ptr<Call> call) {
  call->request_id = new_request_id();
  call->parked = true;
  call->next_send = call->deadline;  // its timer only fails it at the deadline
  parked_.push_back(call->request_id);
  keep_pending(std::move(call));
}

}  // namespace shardlock::lease::internal
