// TimerWheel on its own: a node fires at the first advance() whose now
// reaches its deadline, once; cancel and re-arm; deadlines more than a
// revolution away; slot indices wrapping; what fire() may do; and the wheel
// against a plain model over random schedules, cancels and advances.
#include "shardlock/lease/server/internal/timer_wheel.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <set>
#include <vector>

#include "shardlock/workload/zipf.h"

namespace shardlock::lease::internal {
namespace {

// Nodes live in an array that outlives the wheel (the wheel's destructor
// unlinks what is still armed); fire() reports indices.
template <std::size_t N>
struct Timers {
  std::array<TimerNode, N> nodes;

  std::size_t index_of(const TimerNode& node) const {
    return static_cast<std::size_t>(&node - nodes.data());
  }
  // Advances `wheel` to `now` and returns the indices fired, in firing order.
  std::vector<std::size_t> advance(TimerWheel& wheel, std::int64_t now) {
    std::vector<std::size_t> fired;
    wheel.advance(now, [&](TimerNode& node) {
      EXPECT_FALSE(node.linked()) << "fired while still linked";
      fired.push_back(index_of(node));
    });
    return fired;
  }
  // Arms nodes[0], nodes[1], ... at `deadlines`, in that order.
  void schedule_all(TimerWheel& wheel, std::initializer_list<std::int64_t> deadlines) {
    std::size_t i = 0;
    for (std::int64_t deadline : deadlines) wheel.schedule(nodes[i++], deadline);
  }
  // Advances one millisecond at a time through [from, to], checking each
  // node fires exactly at its deadline; returns the indices fired.
  std::vector<std::size_t> step_through(TimerWheel& wheel, std::int64_t from, std::int64_t to) {
    std::vector<std::size_t> all;
    for (std::int64_t now = from; now <= to; ++now) {
      for (std::size_t i : advance(wheel, now)) {
        all.push_back(i);
        EXPECT_EQ(nodes[i].deadline_ms, now) << "node " << i;
      }
    }
    return all;
  }
};

using Fired = std::vector<std::size_t>;

TEST(TimerWheelTest, FiresAtTheFirstAdvanceThatReachesTheDeadline) {
  Timers<3> t;
  TimerWheel wheel(1'000, 64);
  t.schedule_all(wheel, {1'010, 1'005, 1'005});
  EXPECT_EQ(wheel.size(), 3u);
  EXPECT_TRUE(t.nodes[0].linked());
  EXPECT_EQ(t.nodes[0].deadline_ms, 1'010);

  EXPECT_EQ(t.advance(wheel, 1'004), Fired{});
  EXPECT_EQ(t.advance(wheel, 1'005), (Fired{1, 2}));  // same deadline: scheduling order
  EXPECT_EQ(wheel.size(), 1u);
  EXPECT_EQ(t.advance(wheel, 1'009), Fired{});
  // One advance over several deadlines fires them in deadline order.
  wheel.schedule(t.nodes[1], 1'012);
  wheel.schedule(t.nodes[2], 1'011);
  EXPECT_EQ(t.advance(wheel, 1'020), (Fired{0, 2, 1}));
  EXPECT_EQ(wheel.size(), 0u);
  EXPECT_EQ(wheel.now(), 1'020);
  EXPECT_EQ(t.advance(wheel, 1'040), Fired{}) << "a node fires once";
}

TEST(TimerWheelTest, PastDeadlineFiresAtTheNextAdvance) {
  Timers<2> t;
  TimerWheel wheel(500, 16);
  t.schedule_all(wheel, {100, 500});  // long past, and now
  EXPECT_EQ(t.advance(wheel, 501), (Fired{0, 1}));
}

TEST(TimerWheelTest, AdvanceToThePastOrPresentIsIgnored) {
  Timers<1> t;
  TimerWheel wheel(200, 16);
  wheel.schedule(t.nodes[0], 150);
  EXPECT_EQ(t.advance(wheel, 200), Fired{});
  EXPECT_EQ(t.advance(wheel, 100), Fired{});
  EXPECT_EQ(wheel.now(), 200);
  EXPECT_EQ(t.advance(wheel, 201), Fired{0});
}

TEST(TimerWheelTest, CancelDisarmsAndRescheduleRelinks) {
  Timers<3> t;
  TimerWheel wheel(0, 16);
  t.schedule_all(wheel, {5, 5, 7});
  wheel.cancel(t.nodes[1]);
  EXPECT_FALSE(t.nodes[1].linked());
  wheel.cancel(t.nodes[1]);  // cancelling a disarmed node does nothing
  EXPECT_EQ(wheel.size(), 2u);
  // Re-arming a linked node moves it rather than linking it twice.
  wheel.schedule(t.nodes[0], 9);
  wheel.schedule(t.nodes[2], 3);
  EXPECT_EQ(wheel.size(), 2u);
  EXPECT_EQ(t.advance(wheel, 5), Fired{2});
  EXPECT_EQ(t.advance(wheel, 8), Fired{});
  EXPECT_EQ(t.advance(wheel, 9), Fired{0});
  EXPECT_EQ(wheel.size(), 0u);
}

// 8 slots: a deadline 100 ms out shares its slot with nearer ones and is
// passed over on every revolution until its own.
TEST(TimerWheelTest, FarFutureDeadlineWaitsForItsRevolution) {
  Timers<3> t;
  TimerWheel wheel(0, 8);
  // 100 % 8 == 4: the same slot as 4, and as 12 one revolution later.
  t.schedule_all(wheel, {100, 4, 12});
  EXPECT_EQ(t.step_through(wheel, 1, 99), (Fired{1, 2}));
  EXPECT_TRUE(t.nodes[0].linked());
  EXPECT_EQ(t.advance(wheel, 100), Fired{0});
}

TEST(TimerWheelTest, AJumpOverManyRevolutionsFiresEverythingDueOnce) {
  Timers<4> t;
  TimerWheel wheel(0, 8);
  t.schedule_all(wheel, {3, 30, 1'000, 1'001});  // the last is not due after the jump
  Fired fired = t.advance(wheel, 1'000);
  std::sort(fired.begin(), fired.end());
  EXPECT_EQ(fired, (Fired{0, 1, 2}));
  EXPECT_EQ(wheel.size(), 1u);
  EXPECT_EQ(t.advance(wheel, 1'001), Fired{3});
}

// Slot = tick & mask: starting just below a large power of two makes the
// slot index wrap from the last slot to 0 while time goes on.
TEST(TimerWheelTest, SlotIndexWrapsAroundWithTime) {
  constexpr std::int64_t kStart = (std::int64_t{1} << 40) - 3;
  Timers<4> t;
  TimerWheel wheel(kStart, 16);
  t.schedule_all(wheel, {kStart + 1, kStart + 3, kStart + 5, kStart + 7});
  EXPECT_EQ(t.step_through(wheel, kStart + 1, kStart + 8), (Fired{0, 1, 2, 3}));
}

TEST(TimerWheelTest, FireMayRearmItsNodeWhichThenWaitsForTheNextAdvance) {
  Timers<1> t;
  TimerWheel wheel(0, 16);
  wheel.schedule(t.nodes[0], 2);
  int calls = 0;
  auto rearm_in_the_past = [&](TimerNode& node) {
    ++calls;
    if (calls == 1) wheel.schedule(node, 1);  // already due: not in this advance
  };
  wheel.advance(5, rearm_in_the_past);
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(t.nodes[0].linked());
  wheel.advance(6, rearm_in_the_past);
  EXPECT_EQ(calls, 2);
  EXPECT_FALSE(t.nodes[0].linked());
}

TEST(TimerWheelTest, FireMayCancelADueNodeThatHasNotFiredYet) {
  Timers<2> t;
  TimerWheel wheel(0, 16);
  t.schedule_all(wheel, {1, 2});
  Fired fired;
  wheel.advance(3, [&](TimerNode& node) {
    fired.push_back(t.index_of(node));
    wheel.cancel(t.nodes[1]);
  });
  EXPECT_EQ(fired, Fired{0});
  EXPECT_FALSE(t.nodes[1].linked());
  EXPECT_EQ(wheel.size(), 0u);
}

// The wheel against a model (index -> deadline of armed nodes) over random
// operations on a small wheel, so far-future deadlines, revolutions and
// slot wrap-around all happen often. After every advance the fired set must
// be exactly the armed nodes due by then, minus those fire() cancelled
// first, each fired once; with spans under a revolution they fire in the
// order of the tick they were filed for.
TEST(TimerWheelTest, MatchesAModelOverRandomOperations) {
  constexpr std::size_t kNodes = 64;
  constexpr std::size_t kSlots = 16;
  Timers<kNodes> t;
  workload::SplitMix64 random(12);
  std::int64_t now = (std::int64_t{1} << 33) - 100;
  TimerWheel wheel(now, kSlots);
  std::map<std::size_t, std::int64_t> armed;     // the model: index -> deadline
  std::map<std::size_t, std::int64_t> due_tick;  // the tick each armed node fires at

  auto schedule = [&](std::size_t i, std::int64_t deadline) {
    wheel.schedule(t.nodes[i], deadline);
    armed[i] = deadline;
    due_tick[i] = deadline > wheel.now() ? deadline : wheel.now() + 1;
  };
  auto cancel = [&](std::size_t i) {
    wheel.cancel(t.nodes[i]);
    armed.erase(i);
    due_tick.erase(i);
  };

  for (int step = 0; step < 20'000; ++step) {
    const std::uint64_t op = random.uniform(10);
    const std::size_t i = static_cast<std::size_t>(random.uniform(kNodes));
    if (op < 5) {
      // Past, near, within a revolution, or several revolutions out.
      static constexpr std::int64_t kReach[] = {1, 4, kSlots, 5 * kSlots};
      const std::int64_t reach = kReach[random.uniform(4)];
      schedule(i, now - 3 + static_cast<std::int64_t>(random.uniform(reach + 3)));
    } else if (op < 7) {
      cancel(i);
    } else {
      static constexpr std::int64_t kSpan[] = {1, 3, kSlots - 1, 3 * kSlots};
      const std::int64_t span =
          1 + static_cast<std::int64_t>(random.uniform(kSpan[random.uniform(4)]));
      now += span;
      std::set<std::size_t> expected;
      for (const auto& [index, deadline] : armed) {
        if (deadline <= now) expected.insert(index);
      }
      std::set<std::size_t> cancelled_in_fire;
      Fired fired;
      std::vector<std::int64_t> fired_ticks;
      wheel.advance(now, [&](TimerNode& node) {
        const std::size_t index = t.index_of(node);
        fired.push_back(index);
        fired_ticks.push_back(due_tick.at(index));
        armed.erase(index);
        due_tick.erase(index);
        // Sometimes cancel another node or re-arm this one from fire().
        const std::uint64_t action = random.uniform(8);
        if (action == 0) {
          const std::size_t other = static_cast<std::size_t>(random.uniform(kNodes));
          if (armed.contains(other)) cancelled_in_fire.insert(other);
          cancel(other);
        } else if (action == 1) {
          schedule(index, now - 1 + static_cast<std::int64_t>(random.uniform(2 * kSlots)));
        }
      });
      std::set<std::size_t> fired_set(fired.begin(), fired.end());
      ASSERT_EQ(fired_set.size(), fired.size()) << "a node fired twice, step " << step;
      for (std::size_t c : cancelled_in_fire) {
        if (!fired_set.contains(c)) expected.erase(c);
      }
      ASSERT_EQ(fired_set, expected) << "step " << step << ", now " << now;
      if (span < static_cast<std::int64_t>(kSlots)) {
        EXPECT_TRUE(std::is_sorted(fired_ticks.begin(), fired_ticks.end())) << "step " << step;
      }
    }
    ASSERT_EQ(wheel.size(), armed.size()) << "step " << step;
    for (std::size_t n = 0; n < kNodes; ++n) {
      ASSERT_EQ(t.nodes[n].linked(), armed.contains(n)) << "node " << n << ", step " << step;
    }
  }
}

}  // namespace
}  // namespace shardlock::lease::internal
