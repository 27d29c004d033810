// TimerWheel: a hashed timing wheel (Varghese & Lauck, scheme 6) of
// intrusive timer nodes, for lease expiries and wait timeouts.
//
// Not API: the lease server's shards use it; tests drive it directly.
//
// Design
//   * Resolution 1 ms; `slots` (a power of two) lists, slot = deadline % slots.
//     A deadline more than one revolution away stays in its slot and is
//     skipped until its round comes, as in Netty's HashedWheelTimer.
//   * schedule / cancel are O(1) (unlink and relink a doubly linked node, no
//     allocation). advance(now) visits only the slots between the previous
//     now and this one (all of them once if a whole revolution passed), so
//     its cost is the elapsed ticks plus the nodes in those slots, never the
//     number of timers. With 4096 slots a 30 s lease is looked at ~8 times
//     before it fires.
//   * Nodes are owned by the caller (embedded in lease and waiter records)
//     and must be cancelled before they are destroyed.
//   * Not thread-safe: the owner (a shard) serialises every call.
#pragma once

#include <cassert>
#include <cstddef>
#include <cstdint>
#include <memory>

namespace shardlock::lease::internal {

struct TimerNode {
  TimerNode* prev = nullptr;
  TimerNode* next = nullptr;
  std::int64_t deadline_ms = 0;
  // What the owner embedded this node in (the wheel never reads it).
  std::uint8_t kind = 0;

  TimerNode() = default;
  TimerNode(const TimerNode&) = delete;
  TimerNode& operator=(const TimerNode&) = delete;
  ~TimerNode() { assert(!linked() && "cancel a TimerNode before destroying it"); }

  [[nodiscard]] bool linked() const noexcept { return next != nullptr; }
};

class TimerWheel {
 public:
  // `now_ms`: the current time; `slots` is rounded up to a power of two.
  explicit TimerWheel(std::int64_t now_ms, std::size_t slots = 4096)
      : mask_(round_up(slots) - 1), heads_(std::make_unique<TimerNode[]>(mask_ + 1)), now_(now_ms) {
    for (std::size_t i = 0; i <= mask_; ++i) heads_[i].prev = heads_[i].next = &heads_[i];
  }
  ~TimerWheel() {
    // Unlink whatever is left so the nodes' destructors do not assert.
    for (std::size_t i = 0; i <= mask_; ++i) {
      while (heads_[i].next != &heads_[i]) unlink(*heads_[i].next);
      heads_[i].prev = heads_[i].next = nullptr;
    }
  }
  TimerWheel(const TimerWheel&) = delete;
  TimerWheel& operator=(const TimerWheel&) = delete;

  // Arms `node` to fire at the first advance() whose now >= deadline_ms
  // (a past deadline fires at the next advance()). Re-arms a linked node.
  void schedule(TimerNode& node, std::int64_t deadline_ms) noexcept {
    if (node.linked()) unlink(node);
    node.deadline_ms = deadline_ms;
    // Never file a node in the slot being processed or an earlier one: it
    // would wait a whole revolution.
    const std::int64_t tick = deadline_ms > now_ ? deadline_ms : now_ + 1;
    link(heads_[static_cast<std::size_t>(tick) & mask_], node);
    ++size_;
  }

  // Disarms `node` if it is armed.
  void cancel(TimerNode& node) noexcept {
    if (node.linked()) unlink(node);
  }

  // Moves time to `now_ms` (ignored if not later) and calls fire(TimerNode&)
  // for every node due by then, unlinked before the call. `fire` may
  // schedule or cancel any node, including the one it was given.
  template <class Fire>
  void advance(std::int64_t now_ms, Fire&& fire) {
    if (now_ms <= now_) return;
    const std::int64_t from = now_ + 1;
    const std::int64_t span = now_ms - now_;
    const std::int64_t ticks =
        span > static_cast<std::int64_t>(mask_) ? static_cast<std::int64_t>(mask_) + 1 : span;
    now_ = now_ms;
    if (size_ == 0) return;
    // Gather every due node into a local list first, then fire them, so
    // `fire` can relink anything freely and nothing it schedules is visited
    // again in this call. Gathered nodes still count in size_ and stay
    // linked, so a `fire` that cancels a node not yet fired removes it here.
    TimerNode due;
    due.prev = due.next = &due;
    for (std::int64_t t = from; t < from + ticks; ++t) {
      TimerNode& head = heads_[static_cast<std::size_t>(t) & mask_];
      for (TimerNode* n = head.next; n != &head;) {
        TimerNode* next = n->next;
        if (n->deadline_ms <= now_ms) {
          n->prev->next = n->next;
          n->next->prev = n->prev;
          link(due, *n);
        }
        n = next;
      }
    }
    while (due.next != &due) {
      TimerNode& n = *due.next;
      unlink(n);
      fire(n);
    }
    due.prev = due.next = nullptr;
  }

  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] std::int64_t now() const noexcept { return now_; }

 private:
  static std::size_t round_up(std::size_t n) noexcept {
    std::size_t p = 1;
    while (p < n) p <<= 1;
    return p;
  }
  static void link(TimerNode& head, TimerNode& node) noexcept {
    node.prev = head.prev;
    node.next = &head;
    head.prev->next = &node;
    head.prev = &node;
  }
  void unlink(TimerNode& node) noexcept {
    node.prev->next = node.next;
    node.next->prev = node.prev;
    node.prev = node.next = nullptr;
    --size_;
  }

  std::size_t mask_;
  std::unique_ptr<TimerNode[]> heads_;  // sentinels of circular lists
  std::int64_t now_;
  std::size_t size_ = 0;
};

}  // namespace shardlock::lease::internal
