// The checker's self-tests: each violation kind caught alone in a small
// hand-made history, and a clean history full of legal near-misses judged ok.
#include "checker.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

namespace shardlock::torture {
namespace {

constexpr std::int64_t ms(std::int64_t v) { return v * 1'000'000; }

Event make(std::int64_t t, EventKind kind) {
  Event e;
  e.t_ns = t;
  e.kind = kind;
  return e;
}

Event acquire_invoke(std::int64_t t, std::int64_t client, std::int64_t op, std::string key,
                     std::int64_t wait_ms = 1000) {
  Event e = make(t, EventKind::kAcquireInvoke);
  e.client = client, e.op = op, e.key = std::move(key), e.ttl_ms = 100, e.wait_ms = wait_ms;
  return e;
}
Event acquire_ok(std::int64_t t, std::int64_t client, std::int64_t op, std::string key,
                 std::uint64_t token, std::int64_t expiry) {
  Event e = make(t, EventKind::kAcquireOk);
  e.client = client, e.op = op, e.key = std::move(key), e.token = token, e.expiry_ns = expiry;
  return e;
}
Event acquire_fail(std::int64_t t, std::int64_t client, std::int64_t op, std::string key,
                   std::string error) {
  Event e = make(t, EventKind::kAcquireFail);
  e.client = client, e.op = op, e.key = std::move(key), e.error = std::move(error);
  return e;
}
Event with_token(Event e, std::int64_t client, std::string key, std::uint64_t token) {
  e.client = client, e.key = std::move(key), e.token = token;
  return e;
}
Event hold(std::int64_t t, std::int64_t client, std::string key, std::uint64_t token,
           std::int64_t expiry) {
  Event e = with_token(make(t, EventKind::kHold), client, std::move(key), token);
  e.expiry_ns = expiry;
  return e;
}
Event renew_invoke(std::int64_t t, std::int64_t client, std::int64_t op, std::string key,
                   std::uint64_t token) {
  Event e = with_token(make(t, EventKind::kRenewInvoke), client, std::move(key), token);
  e.op = op, e.ttl_ms = 100;
  return e;
}
Event renew_ok(std::int64_t t, std::int64_t client, std::int64_t op, std::string key,
               std::uint64_t token, std::int64_t expiry) {
  Event e = with_token(make(t, EventKind::kRenewOk), client, std::move(key), token);
  e.op = op, e.expiry_ns = expiry;
  return e;
}
Event release_invoke(std::int64_t t, std::int64_t client, std::int64_t op, std::string key,
                     std::uint64_t token) {
  Event e = with_token(make(t, EventKind::kReleaseInvoke), client, std::move(key), token);
  e.op = op;
  return e;
}
Event release_ok(std::int64_t t, std::int64_t client, std::int64_t op, std::string key,
                 std::uint64_t token) {
  Event e = with_token(make(t, EventKind::kReleaseOk), client, std::move(key), token);
  e.op = op;
  return e;
}
Event lost(std::int64_t t, std::int64_t client, std::string key, std::uint64_t token) {
  Event e = with_token(make(t, EventKind::kLost), client, std::move(key), token);
  e.error = "expired";
  return e;
}
Event write_accepted(std::int64_t t, std::int64_t client, std::string key, std::uint64_t token,
                     std::int64_t value) {
  Event e = with_token(make(t, EventKind::kWriteAccepted), client, std::move(key), token);
  e.value = value;
  return e;
}
Event write_rejected(std::int64_t t, std::int64_t client, std::string key, std::uint64_t token,
                     std::int64_t value, std::uint64_t highest) {
  Event e = with_token(make(t, EventKind::kWriteRejected), client, std::move(key), token);
  e.value = value, e.highest = highest;
  return e;
}
Event final_counter(std::int64_t t, std::string key, std::int64_t value) {
  Event e = make(t, EventKind::kFinalCounter);
  e.key = std::move(key), e.value = value;
  return e;
}
// `e` (an acquire event) in `mode`, with `permits` for kPermit.
Event in_mode(Event e, AcquireMode mode, std::int64_t permits = 0) {
  e.mode = mode, e.permits = permits;
  return e;
}
Event acquire_many_invoke(std::int64_t t, std::int64_t client, std::int64_t op,
                          std::vector<std::string> keys, std::int64_t wait_ms = 1000) {
  Event e = acquire_invoke(t, client, op, "", wait_ms);
  e.keys = std::move(keys);
  return e;
}
Event acquire_many_ok(std::int64_t t, std::int64_t client, std::int64_t op,
                      std::vector<std::string> keys, std::vector<std::uint64_t> tokens,
                      std::int64_t expiry) {
  Event e = acquire_ok(t, client, op, "", 0, expiry);
  e.keys = std::move(keys), e.tokens = std::move(tokens);
  return e;
}
Event server_start(std::int64_t t, std::int64_t incarnation, std::int64_t lock_delay_ms) {
  Event e = make(t, EventKind::kServerStart);
  e.incarnation = incarnation, e.lock_delay_ms = lock_delay_ms;
  return e;
}
Event server_event(std::int64_t t, EventKind kind, std::int64_t incarnation) {
  Event e = make(t, kind);
  e.incarnation = incarnation;
  return e;
}

// Exactly `count` violations of `kind` and none of any other kind.
void expect_only(const CheckReport& report, ViolationKind kind, std::size_t count = 1) {
  for (const auto& [k, n] : report.violation_counts) {
    EXPECT_EQ(n, k == kind ? count : 0) << to_string(k) << "\n" << report.text();
  }
  EXPECT_FALSE(report.ok());
  ASSERT_FALSE(report.examples.empty());
  for (const Violation& v : report.examples) EXPECT_EQ(v.kind, kind) << v.detail;
}

// Parses each line into `history`, and expects it to format back unchanged.
void parse_lines(const std::vector<std::string>& lines, std::vector<Event>& history) {
  for (const std::string& line : lines) {
    std::string error;
    std::optional<Event> e = parse_event(line, &error);
    ASSERT_TRUE(e.has_value()) << line << ": " << error;
    EXPECT_EQ(format_event(*e), line);
    history.push_back(std::move(*e));
  }
}

TEST(Checker, EmptyHistoryIsOk) {
  const CheckReport report = check({}, CheckOptions{});
  EXPECT_TRUE(report.ok()) << report.text();
  EXPECT_FALSE(report.liveness_checked);
  EXPECT_EQ(report.violation_counts.size(), 19u);  // every kind, at zero
}

// A history without grants, or without a healed event, has no violation
// and yet proves nothing: the harness must not call it a pass.
TEST(Checker, AHistoryWithoutGrantsOrAHealJudgesNothing) {
  EXPECT_FALSE(check({}, CheckOptions{}).judged_something());
  const std::vector<Event> refused = {
      make(ms(0), EventKind::kHealed),
      acquire_invoke(ms(10), 0, 1, "k", 0),
      acquire_fail(ms(20), 0, 1, "k", "recovering"),
  };
  const CheckReport none = check(refused, CheckOptions{});
  EXPECT_EQ(none.grants(), 0u);
  EXPECT_FALSE(none.judged_something());
  const std::vector<Event> unhealed = {
      acquire_invoke(ms(10), 0, 1, "k"),
      acquire_ok(ms(20), 0, 1, "k", 1, ms(500)),
  };
  const CheckReport granted = check(unhealed, CheckOptions{});
  EXPECT_EQ(granted.grants(), 1u);
  EXPECT_FALSE(granted.judged_something());
  std::vector<Event> healed = unhealed;
  healed.push_back(make(ms(0), EventKind::kHealed));
  EXPECT_TRUE(check(healed, CheckOptions{}).judged_something());
}

TEST(Checker, Overlap) {
  const std::vector<Event> history = {
      acquire_invoke(ms(0), 0, 1, "k"),
      acquire_ok(ms(1), 0, 1, "k", 1, ms(100)),
      acquire_invoke(ms(50), 1, 1, "k"),
      acquire_ok(ms(60), 1, 1, "k", 2, ms(200)),
  };
  const CheckReport report = check(history, CheckOptions{});
  ASSERT_NO_FATAL_FAILURE(expect_only(report, ViolationKind::kOverlap));
  EXPECT_EQ(report.examples[0].key, "k");
  EXPECT_NE(report.examples[0].detail.find("client 0 token 1"), std::string::npos);
  EXPECT_NE(report.examples[0].detail.find("client 1 token 2"), std::string::npos);
}

TEST(Checker, OverlapFromRenewalOrHoldExpiry) {
  // The grant alone ends at 50 ms; a renewal, then a hold, stretch it past 60.
  for (const EventKind stretch : {EventKind::kRenewOk, EventKind::kHold}) {
    const Event late = stretch == EventKind::kHold ? hold(ms(40), 0, "k", 1, ms(150))
                                                   : renew_ok(ms(40), 0, 2, "k", 1, ms(150));
    const std::vector<Event> history = {
        acquire_invoke(ms(0), 0, 1, "k"),  acquire_ok(ms(1), 0, 1, "k", 1, ms(50)),   late,
        acquire_invoke(ms(55), 1, 1, "k"), acquire_ok(ms(60), 1, 1, "k", 2, ms(200)),
    };
    expect_only(check(history, CheckOptions{}), ViolationKind::kOverlap);
  }
}

TEST(Checker, ARenewalToAShorterTtlEndsTheIntervalEarlier) {
  // Client 0 renews from an expiry at 150 ms down to one at 50 ms; the
  // server, which shortened the lease too, grants client 1 at 60 ms.
  const std::vector<Event> history = {
      acquire_invoke(ms(0), 0, 1, "k"),   acquire_ok(ms(1), 0, 1, "k", 1, ms(150)),
      renew_invoke(ms(10), 0, 2, "k", 1), renew_ok(ms(12), 0, 2, "k", 1, ms(50)),
      acquire_invoke(ms(20), 1, 1, "k"),  acquire_ok(ms(60), 1, 1, "k", 2, ms(200)),
  };
  const CheckReport report = check(history, CheckOptions{});
  EXPECT_TRUE(report.ok()) << report.text();
}

TEST(Checker, OverlapHiddenBehindTheSameClientsLongerGrant) {
  // Client 1 overlaps client 0's long grant, then client 0's second grant
  // overlaps client 1: the latest-ending interval so far is client 0's own,
  // so the sweep must also remember the latest-ending one of another client.
  const std::vector<Event> history = {
      acquire_invoke(ms(0), 0, 1, "k"),        acquire_invoke(ms(0), 1, 1, "k"),
      acquire_invoke(ms(0), 0, 2, "k"),        acquire_ok(ms(1), 0, 1, "k", 1, ms(100)),
      acquire_ok(ms(2), 1, 1, "k", 2, ms(50)), acquire_ok(ms(40), 0, 2, "k", 3, ms(60)),
  };
  expect_only(check(history, CheckOptions{}), ViolationKind::kOverlap, 2);
}

TEST(Checker, SameClientNeverConflictsWithItself) {
  // Three overlapping grants of one client, nested and staggered.
  const std::vector<Event> history = {
      acquire_invoke(ms(0), 0, 1, "k"),  acquire_ok(ms(1), 0, 1, "k", 1, ms(100)),
      acquire_invoke(ms(5), 0, 2, "k"),  acquire_ok(ms(10), 0, 2, "k", 2, ms(50)),
      acquire_invoke(ms(15), 0, 3, "k"), acquire_ok(ms(20), 0, 3, "k", 3, ms(150)),
  };
  const CheckReport report = check(history, CheckOptions{});
  EXPECT_TRUE(report.ok()) << report.text();
}

TEST(Checker, TokenOrder) {
  const std::vector<Event> history = {
      acquire_invoke(ms(0), 0, 1, "k"),    acquire_ok(ms(1), 0, 1, "k", 5, ms(10)),
      release_invoke(ms(5), 0, 2, "k", 5), release_ok(ms(6), 0, 2, "k", 5),
      acquire_invoke(ms(20), 1, 1, "k"),   acquire_ok(ms(21), 1, 1, "k", 3, ms(30)),
  };
  const CheckReport report = check(history, CheckOptions{});
  ASSERT_NO_FATAL_FAILURE(expect_only(report, ViolationKind::kTokenOrder));
  EXPECT_NE(report.examples[0].detail.find("token 5"), std::string::npos);
}

TEST(Checker, TokenOrderIgnoresConcurrentAcquires) {
  // Client 1 invoked before client 0's grant arrived: either order is legal.
  const std::vector<Event> history = {
      acquire_invoke(ms(0), 0, 1, "k"),
      acquire_invoke(ms(1), 1, 1, "k"),
      acquire_ok(ms(2), 0, 1, "k", 5, ms(10)),
      acquire_ok(ms(10), 1, 1, "k", 3, ms(30)),
      // An invocation at the very instant of a grant need not see it, even
      // when listed after it.
      acquire_invoke(ms(25), 3, 1, "j"),
      acquire_ok(ms(30), 3, 1, "j", 9, ms(40)),
      acquire_invoke(ms(30), 2, 1, "j"),
      acquire_ok(ms(40), 2, 1, "j", 8, ms(50)),
  };
  const CheckReport report = check(history, CheckOptions{});
  EXPECT_TRUE(report.ok()) << report.text();
}

TEST(Checker, DuplicateToken) {
  const std::vector<Event> history = {
      acquire_invoke(ms(0), 0, 1, "k"),
      acquire_invoke(ms(1), 1, 1, "k"),
      acquire_ok(ms(2), 0, 1, "k", 7, ms(3)),
      acquire_ok(ms(5), 1, 1, "k", 7, ms(10)),
  };
  expect_only(check(history, CheckOptions{}), ViolationKind::kDuplicateToken);
}

TEST(Checker, Fencing) {
  const std::vector<Event> history = {
      write_accepted(ms(1), 0, "k", 5, 1),
      write_accepted(ms(2), 1, "k", 3, 2),
      final_counter(ms(3), "k", 2),
  };
  expect_only(check(history, CheckOptions{}), ViolationKind::kFencing);
}

TEST(Checker, LostIncrement) {
  const std::vector<Event> skipped = {
      write_accepted(ms(1), 0, "k", 1, 1),
      write_accepted(ms(2), 0, "k", 1, 2),
      write_accepted(ms(3), 1, "k", 2, 4),
  };
  expect_only(check(skipped, CheckOptions{}), ViolationKind::kLostIncrement);

  const std::vector<Event> first_not_one = {write_accepted(ms(1), 0, "k", 1, 2)};
  expect_only(check(first_not_one, CheckOptions{}), ViolationKind::kLostIncrement);

  const std::vector<Event> final_short = {
      write_accepted(ms(1), 0, "k", 1, 1),
      write_accepted(ms(2), 0, "k", 1, 2),
      final_counter(ms(3), "k", 3),
  };
  expect_only(check(final_short, CheckOptions{}), ViolationKind::kLostIncrement);
}

TEST(Checker, LockDelay) {
  const std::vector<Event> history = {
      server_start(ms(0), 1, 1000),
      acquire_invoke(ms(10), 0, 1, "k"),
      acquire_ok(ms(20), 0, 1, "k", 1, ms(120)),
  };
  const CheckReport report = check(history, CheckOptions{});
  ASSERT_NO_FATAL_FAILURE(expect_only(report, ViolationKind::kLockDelay));
  EXPECT_NE(report.examples[0].detail.find("incarnation 1"), std::string::npos);
}

TEST(Checker, LockDelayUsesTheLatestStartBeforeTheInvocation) {
  const std::vector<Event> history = {
      server_start(ms(0), 1, 10),
      server_event(ms(500), EventKind::kServerKill, 1),
      server_start(ms(600), 2, 100),
      acquire_invoke(ms(650), 0, 1, "k"),
      acquire_ok(ms(699), 0, 1, "k", 1, ms(800)),
  };
  expect_only(check(history, CheckOptions{}), ViolationKind::kLockDelay);
}

TEST(Checker, Liveness) {
  std::vector<Event> history = {
      make(ms(1000), EventKind::kHealed),
      acquire_invoke(ms(1100), 0, 1, "k"),
      acquire_ok(ms(1500), 0, 1, "k", 1, ms(1600)),
      acquire_invoke(ms(1200), 1, 1, "j"),
      acquire_fail(ms(1300), 1, 1, "j", "timeout"),
      acquire_invoke(ms(19000), 1, 2, "j"),
      acquire_ok(ms(20000), 1, 2, "j", 2, ms(20100)),
      // Client 2 did nothing after the heal: nothing is owed to it.
      acquire_invoke(ms(10), 2, 1, "i"),
      acquire_fail(ms(20), 2, 1, "i", "busy"),
  };
  CheckReport report = check(history, CheckOptions{});
  EXPECT_TRUE(report.liveness_checked);
  ASSERT_NO_FATAL_FAILURE(expect_only(report, ViolationKind::kLiveness));
  EXPECT_NE(report.examples[0].detail.find("client 1"), std::string::npos);

  // A longer bound covers the late grant.
  report = check(history, CheckOptions{.liveness_bound_ms = 20000});
  EXPECT_TRUE(report.ok()) << report.text();

  // Without a heal there is nothing to measure from.
  history.erase(history.begin());
  report = check(history, CheckOptions{});
  EXPECT_FALSE(report.liveness_checked);
  EXPECT_TRUE(report.ok()) << report.text();
}

// A key nobody is granted after the heal, while every client keeps being
// served other keys: what a client stuck on a map whose owner of that key
// left looks like (each acquire of it unreachable).
TEST(Checker, KeyLiveness) {
  std::vector<Event> history = {
      make(ms(1000), EventKind::kHealed),
      acquire_invoke(ms(1100), 0, 1, "k"),
      acquire_ok(ms(1110), 0, 1, "k", 1, ms(1200)),
      acquire_invoke(ms(1300), 0, 2, "gone"),
      acquire_fail(ms(2300), 0, 2, "gone", "unreachable"),
      acquire_invoke(ms(2400), 1, 1, "gone"),
      acquire_fail(ms(3400), 1, 1, "gone", "unreachable"),
      acquire_invoke(ms(3500), 1, 2, "k"),
      acquire_ok(ms(3510), 1, 2, "k", 2, ms(3600)),
      // Asked for only after the bound: not judged.
      acquire_invoke(ms(30000), 1, 3, "late"),
      acquire_fail(ms(31001), 1, 3, "late", "unreachable"),
  };
  const CheckReport report = check(history, CheckOptions{});
  ASSERT_NO_FATAL_FAILURE(expect_only(report, ViolationKind::kKeyLiveness));
  EXPECT_EQ(report.examples[0].key, "gone");
  EXPECT_NE(report.examples[0].detail.find("2 failed acquires"), std::string::npos)
      << report.examples[0].detail;
  EXPECT_NE(report.examples[0].detail.find("unreachable"), std::string::npos);

  // Granted once after the heal, however late (here in a multi-key grant
  // after the bound): the key is served again.
  history.push_back(acquire_many_invoke(ms(40000), 1, 4, {"gone", "k"}));
  history.push_back(acquire_many_ok(ms(40010), 1, 4, {"gone", "k"}, {7, 8}, ms(40100)));
  EXPECT_TRUE(check(history, CheckOptions{}).ok()) << check(history, CheckOptions{}).text();
}

TEST(Checker, ParsesTextHistory) {
  const std::vector<std::string> lines = {
      "1000 server_start incarnation=1 lock_delay_ms=0",
      "2000 acquire_invoke client=0 op=1 key=k ttl_ms=100 wait_ms=0",
      "3000 acquire_ok client=0 op=1 key=k token=1 expiry_ns=100000",
      "4000 acquire_invoke client=1 op=1 key=k ttl_ms=100 wait_ms=0",
      "5000 acquire_fail client=1 op=1 key=k error=busy",
      "6000 acquire_invoke client=1 op=2 key=k ttl_ms=100 wait_ms=5000",
      "7000 acquire_ok client=1 op=2 key=k token=2 expiry_ns=200000",
      "8000 write_accepted client=1 key=k token=2 value=1",
      "9000 write_rejected client=0 key=k token=1 value=-1 highest=2",
      "10000 final_counter key=k value=1",
  };
  std::vector<Event> history;
  ASSERT_NO_FATAL_FAILURE(parse_lines(lines, history));
  const CheckReport report = check(history, CheckOptions{});
  expect_only(report, ViolationKind::kOverlap);
  EXPECT_EQ(report.operations.at("try-acquire ok"), 1u);
  EXPECT_EQ(report.operations.at("try-acquire busy"), 1u);
  EXPECT_EQ(report.operations.at("acquire ok"), 1u);
  EXPECT_EQ(report.operations.at("write accepted"), 1u);
  EXPECT_EQ(report.operations.at("read refused"), 1u);
  EXPECT_EQ(report.lease_operations, 3u);
}

// A clean run with every legal near-miss the checker must not flag.
std::vector<Event> tricky_clean_history() {
  return {
      server_start(ms(0), 1, 100),
      // Client 0 holds token 1, stretches it by a hold and a renewal, releases.
      acquire_invoke(ms(200), 0, 1, "k"),
      acquire_ok(ms(201), 0, 1, "k", 1, ms(300)),
      write_accepted(ms(210), 0, "k", 1, 1),
      hold(ms(250), 0, "k", 1, ms(300)),
      renew_invoke(ms(260), 0, 2, "k", 1),
      renew_ok(ms(261), 0, 2, "k", 1, ms(400)),
      // Client 1 waits meanwhile; its grant comes right after the release
      // invocation, long before token 1's known expiry.
      acquire_invoke(ms(340), 1, 1, "k"),
      release_invoke(ms(350), 0, 3, "k", 1),
      acquire_ok(ms(351), 1, 1, "k", 2, ms(500)),
      release_ok(ms(352), 0, 3, "k", 1),
      write_accepted(ms(355), 1, "k", 2, 2),
      // Client 0 waits again; client 1 loses its lease at 400, before its
      // expiry, so client 0's grant at 410 is legal.
      acquire_invoke(ms(360), 0, 4, "k"),
      lost(ms(400), 1, "k", 2),
      acquire_ok(ms(410), 0, 4, "k", 3, ms(600)),
      write_accepted(ms(420), 0, "k", 3, 3),
      // Client 0 re-acquires while still holding token 3: never a conflict.
      acquire_invoke(ms(455), 0, 5, "k"),
      acquire_ok(ms(460), 0, 5, "k", 4, ms(600)),
      write_accepted(ms(470), 0, "k", 4, 4),
      // A stale client's write and a refused read are fenced out, legally.
      write_rejected(ms(480), 1, "k", 2, 5, 4),
      write_rejected(ms(481), 1, "k", 2, -1, 4),
      // Client 3 invokes and never hears back (killed with its server call).
      acquire_invoke(ms(500), 3, 1, "k"),
      // Client 1's grant starts exactly when client 0's validity ends.
      acquire_invoke(ms(590), 1, 2, "k"),
      acquire_ok(ms(600), 1, 2, "k", 5, ms(800)),
      write_accepted(ms(610), 1, "k", 5, 5),
      // Client 2 invokes before a restart and hears back after it, inside the
      // new incarnation's lock delay: the grant is from before the restart.
      acquire_invoke(ms(840), 2, 1, "k"),
      server_event(ms(850), EventKind::kServerKill, 1),
      server_start(ms(900), 2, 100),
      acquire_ok(ms(905), 2, 1, "k", 6, ms(1000)),
      server_event(ms(920), EventKind::kServerReady, 2),
      make(ms(950), EventKind::kHealed),
      // Client 1 invokes inside the lock delay; its grant arrives as it ends.
      acquire_invoke(ms(950), 1, 3, "k"),
      acquire_ok(ms(1000), 1, 3, "k", 7, ms(1100)),
      write_accepted(ms(1010), 1, "k", 7, 6),
      release_invoke(ms(1050), 1, 4, "k", 7),
      release_ok(ms(1051), 1, 4, "k", 7),
      // A second key of its own, unaffected by the first.
      acquire_invoke(ms(1060), 2, 2, "j", 0),
      acquire_ok(ms(1061), 2, 2, "j", 8, ms(1200)),
      final_counter(ms(2000), "k", 6),
  };
}

TEST(Checker, TrickyButCorrectHistoryIsOk) {
  std::vector<Event> history = tricky_clean_history();
  CheckReport report = check(history, CheckOptions{});
  EXPECT_TRUE(report.ok()) << report.text();
  EXPECT_TRUE(report.liveness_checked);
  EXPECT_EQ(report.operations.at("acquire ok"), 7u);
  EXPECT_EQ(report.operations.at("try-acquire ok"), 1u);
  EXPECT_EQ(report.operations.at("acquire unfinished"), 1u);
  EXPECT_EQ(report.operations.at("renew ok"), 1u);
  EXPECT_EQ(report.operations.at("release ok"), 2u);
  EXPECT_EQ(report.operations.at("lost"), 1u);
  EXPECT_EQ(report.operations.at("write accepted"), 6u);
  EXPECT_EQ(report.operations.at("write rejected"), 1u);
  EXPECT_EQ(report.operations.at("read refused"), 1u);
  EXPECT_EQ(report.faults.at("server kill -9"), 1u);
  EXPECT_EQ(report.lease_operations, 11u);

  // The order of the input does not matter (the checker sorts by time).
  std::reverse(history.begin(), history.end());
  report = check(history, CheckOptions{});
  EXPECT_TRUE(report.ok()) << report.text();
}

TEST(Checker, OddHistoriesNeverCrash) {
  const std::vector<Event> history = {
      acquire_ok(ms(5), 0, 9, "k", 1, ms(1)),     // no invocation, expired at once
      renew_ok(ms(6), 4, 9, "k", 3, ms(10)),      // renews a grant never seen
      release_ok(ms(7), 4, 10, "k", 3),           // releases an unknown op
      lost(ms(8), 5, "x", 0),                     // loses an unknown grant
      acquire_fail(ms(9), 6, 1, "k", ""),         // fails an unknown op
      final_counter(ms(10), "never-written", 0),  // a key nobody wrote
      make(ms(11), EventKind::kNetFaultsOn),
      make(ms(12), EventKind::kNetFaultsOff),
  };
  const CheckReport report = check(history, CheckOptions{});
  EXPECT_TRUE(report.ok()) << report.text();
  EXPECT_EQ(report.operations.at("acquire failed"), 1u);
  EXPECT_EQ(report.faults.at("network faults"), 1u);
}

TEST(Checker, KeepsOnlyTheFirstExamplesButCountsAll) {
  std::vector<Event> history;
  for (int i = 0; i < 10; ++i) history.push_back(write_accepted(ms(i), 0, "k", 1, 2 * i + 1));
  const CheckReport report = check(history, CheckOptions{.max_examples = 3});
  ASSERT_NO_FATAL_FAILURE(expect_only(report, ViolationKind::kLostIncrement, 9));
  EXPECT_EQ(report.examples.size(), 3u);
  EXPECT_NE(report.examples[0].detail.find("value 3"), std::string::npos);
}

TEST(Checker, LargeCleanHistory) {
  // 20 keys, 7 clients taking turns on each: 300k events.
  std::vector<Event> history;
  std::uint64_t token = 0;
  for (int round = 0; round < 3000; ++round) {
    for (int k = 0; k < 20; ++k) {
      const std::string key = "key" + std::to_string(k);
      const std::int64_t client = (round + k) % 7;
      const std::int64_t t = ms(10) * round + k;
      const std::int64_t op = 2 * (round * 20 + k);  // unique per client
      ++token;
      history.push_back(acquire_invoke(t, client, op, key));
      history.push_back(acquire_ok(t + 1000, client, op, key, token, t + ms(9)));
      history.push_back(write_accepted(t + 2000, client, key, token, round + 1));
      history.push_back(release_invoke(t + 3000, client, op + 1, key, token));
      history.push_back(release_ok(t + 4000, client, op + 1, key, token));
    }
  }
  const CheckReport report = check(history, CheckOptions{});
  EXPECT_TRUE(report.ok()) << report.text();
  EXPECT_EQ(report.lease_operations, 2u * 3000 * 20);
}

// ---- Lease kinds: shared, permit, multi-key -------------------------------

constexpr AcquireMode kShared = AcquireMode::kShared;
constexpr AcquireMode kPermit = AcquireMode::kPermit;

TEST(CheckerKinds, SharedHoldersMayOverlap) {
  const std::vector<Event> history = {
      in_mode(acquire_invoke(ms(0), 0, 1, "k"), kShared),
      in_mode(acquire_ok(ms(1), 0, 1, "k", 1, ms(100)), kShared),
      in_mode(acquire_invoke(ms(10), 1, 1, "k"), kShared),
      in_mode(acquire_ok(ms(11), 1, 1, "k", 2, ms(150)), kShared),
      in_mode(acquire_invoke(ms(20), 2, 1, "k", 0), kShared),
      in_mode(acquire_ok(ms(21), 2, 1, "k", 3, ms(90)), kShared),
      // An exclusive holder after every shared one has ended.
      acquire_invoke(ms(30), 3, 1, "k"),
      acquire_ok(ms(150), 3, 1, "k", 4, ms(200)),
  };
  const CheckReport report = check(history, CheckOptions{});
  EXPECT_TRUE(report.ok()) << report.text();
  EXPECT_EQ(report.operations.at("shared acquire ok"), 2u);
  EXPECT_EQ(report.operations.at("shared try-acquire ok"), 1u);
  EXPECT_EQ(report.operations.at("acquire ok"), 1u);
}

TEST(CheckerKinds, ExclusiveOverlappingASharedHolderIsAnOverlap) {
  // The shared holder first, then the exclusive one; and the other way round.
  for (const bool shared_first : {true, false}) {
    const AcquireMode first = shared_first ? kShared : AcquireMode::kExclusive;
    const AcquireMode second = shared_first ? AcquireMode::kExclusive : kShared;
    const std::vector<Event> history = {
        in_mode(acquire_invoke(ms(0), 0, 1, "k"), first),
        in_mode(acquire_ok(ms(1), 0, 1, "k", 1, ms(100)), first),
        in_mode(acquire_invoke(ms(50), 1, 1, "k"), second),
        in_mode(acquire_ok(ms(60), 1, 1, "k", 2, ms(200)), second),
    };
    const CheckReport report = check(history, CheckOptions{});
    ASSERT_NO_FATAL_FAILURE(expect_only(report, ViolationKind::kOverlap));
    EXPECT_NE(report.examples[0].detail.find("shared"), std::string::npos)
        << report.examples[0].detail;
  }
}

TEST(CheckerKinds, ExclusiveOverlapsTheLongestOfManySharedHolders) {
  // Client 1's short shared grant ends before the exclusive one starts;
  // client 0's longer one does not, and two other shared ones overlap it
  // legally on the way.
  const std::vector<Event> history = {
      in_mode(acquire_invoke(ms(0), 0, 1, "k"), kShared),
      in_mode(acquire_ok(ms(1), 0, 1, "k", 1, ms(100)), kShared),
      in_mode(acquire_invoke(ms(0), 1, 1, "k"), kShared),
      in_mode(acquire_ok(ms(2), 1, 1, "k", 2, ms(40)), kShared),
      in_mode(acquire_invoke(ms(0), 4, 1, "k"), kShared),
      in_mode(acquire_ok(ms(3), 4, 1, "k", 3, ms(30)), kShared),
      acquire_invoke(ms(45), 2, 1, "k"),
      acquire_ok(ms(50), 2, 1, "k", 4, ms(200)),
  };
  const CheckReport report = check(history, CheckOptions{});
  ASSERT_NO_FATAL_FAILURE(expect_only(report, ViolationKind::kOverlap));
  EXPECT_NE(report.examples[0].detail.find("client 0 shared token 1"), std::string::npos)
      << report.examples[0].detail;
}

TEST(CheckerKinds, SharedAndPermitHoldersNeverShareAKey) {
  const std::vector<Event> history = {
      in_mode(acquire_invoke(ms(0), 0, 1, "k"), kPermit, 5),
      in_mode(acquire_ok(ms(1), 0, 1, "k", 1, ms(100)), kPermit, 5),
      in_mode(acquire_invoke(ms(10), 1, 1, "k"), kShared),
      in_mode(acquire_ok(ms(11), 1, 1, "k", 2, ms(100)), kShared),
  };
  expect_only(check(history, CheckOptions{}), ViolationKind::kOverlap);
}

TEST(CheckerKinds, ExclusiveOverlappingAPermitHolderIsAnOverlap) {
  const std::vector<Event> history = {
      in_mode(acquire_invoke(ms(0), 0, 1, "s"), kPermit, 2),
      in_mode(acquire_ok(ms(1), 0, 1, "s", 1, ms(100)), kPermit, 2),
      acquire_invoke(ms(10), 1, 1, "s"),
      acquire_ok(ms(11), 1, 1, "s", 2, ms(100)),
  };
  expect_only(check(history, CheckOptions{}), ViolationKind::kOverlap);
}

// Permit holders of "s" under limit `permits`, each [start, end) ms, one
// client each unless `clients` says otherwise.
std::vector<Event> permit_holders(std::int64_t permits,
                                  const std::vector<std::pair<int, int>>& spans,
                                  std::vector<std::int64_t> clients = {},
                                  std::vector<std::int64_t> limits = {}) {
  std::vector<Event> history;
  for (std::size_t n = 0; n < spans.size(); ++n) {
    const std::int64_t client = n < clients.size() ? clients[n] : static_cast<std::int64_t>(n);
    const std::int64_t limit = n < limits.size() ? limits[n] : permits;
    const auto op = static_cast<std::int64_t>(2 * n + 1);
    const auto token = static_cast<std::uint64_t>(n + 1);
    history.push_back(
        in_mode(acquire_invoke(ms(spans[n].first) - 1, client, op, "s"), kPermit, limit));
    history.push_back(
        in_mode(acquire_ok(ms(spans[n].first), client, op, "s", token, ms(spans[n].second + 50)),
                kPermit, limit));
    history.push_back(release_invoke(ms(spans[n].second), client, op + 1, "s", token));
    history.push_back(release_ok(ms(spans[n].second) + 1, client, op + 1, "s", token));
  }
  return history;
}

TEST(CheckerKinds, PermitHoldersUpToTheLimitMayOverlap) {
  // Two at a time all along; the third starts exactly as the second ends.
  CheckReport report = check(permit_holders(2, {{1, 100}, {10, 50}, {50, 120}}), CheckOptions{});
  EXPECT_TRUE(report.ok()) << report.text();
  EXPECT_EQ(report.operations.at("permit acquire ok"), 3u);
  // Three at once under a limit of three.
  report = check(permit_holders(3, {{1, 100}, {10, 50}, {20, 120}}), CheckOptions{});
  EXPECT_TRUE(report.ok()) << report.text();
}

TEST(CheckerKinds, PermitLimit) {
  // P + 1 = 3 holders at once from 50 to 60.
  CheckReport report = check(permit_holders(2, {{1, 100}, {10, 60}, {50, 120}}), CheckOptions{});
  ASSERT_NO_FATAL_FAILURE(expect_only(report, ViolationKind::kPermitLimit));
  EXPECT_EQ(report.examples[0].key, "s");
  EXPECT_NE(report.examples[0].detail.find("3 permit holders at 50000000 (limit 2)"),
            std::string::npos)
      << report.examples[0].detail;

  // Every holder that starts while P are open is one violation.
  report = check(permit_holders(1, {{1, 100}, {10, 60}, {20, 30}, {70, 80}}), CheckOptions{});
  expect_only(report, ViolationKind::kPermitLimit, 3);
}

TEST(CheckerKinds, PermitLimitCountsTwoPermitsOfOneClient) {
  // Client 0 holds two permits, client 1 a third, under a limit of 2.
  const CheckReport report =
      check(permit_holders(2, {{1, 100}, {10, 60}, {20, 120}}, {0, 0, 1}), CheckOptions{});
  expect_only(report, ViolationKind::kPermitLimit);
}

TEST(CheckerKinds, PermitLimitIsTheSmallestAnyOpenHolderWasGranted) {
  // Three open holders: fine under 3, 3, 3; not when one was granted under 2.
  CheckReport report =
      check(permit_holders(3, {{1, 100}, {10, 60}, {20, 120}}, {}, {3, 3, 3}), CheckOptions{});
  EXPECT_TRUE(report.ok()) << report.text();
  report = check(permit_holders(3, {{1, 100}, {10, 60}, {20, 120}}, {}, {3, 2, 3}), CheckOptions{});
  expect_only(report, ViolationKind::kPermitLimit);
}

TEST(CheckerKinds, AllOrNothingGrantCoversTheKeysAskedForInAnyOrder) {
  const std::vector<Event> history = {
      acquire_many_invoke(ms(0), 0, 1, {"a", "b", "c"}),
      acquire_many_ok(ms(1), 0, 1, {"c", "a", "b"}, {7, 5, 6}, ms(100)),
      // Tokens are per key: two keys of one grant may carry the same number.
      acquire_many_invoke(ms(200), 1, 1, {"d", "e"}, 0),
      acquire_many_ok(ms(201), 1, 1, {"d", "e"}, {5, 5}, ms(300)),
  };
  const CheckReport report = check(history, CheckOptions{});
  EXPECT_TRUE(report.ok()) << report.text();
  EXPECT_EQ(report.operations.at("multi acquire ok"), 1u);
  EXPECT_EQ(report.operations.at("multi try-acquire ok"), 1u);
  EXPECT_EQ(report.lease_operations, 2u);
}

TEST(CheckerKinds, AllOrNothing) {
  const std::vector<std::vector<Event>> broken = {
      // A key missing from the grant.
      {acquire_many_invoke(ms(0), 0, 1, {"a", "b", "c"}),
       acquire_many_ok(ms(1), 0, 1, {"a", "b"}, {1, 2}, ms(100))},
      // A key granted that was not asked for.
      {acquire_many_invoke(ms(0), 0, 1, {"a", "b"}),
       acquire_many_ok(ms(1), 0, 1, {"a", "b", "z"}, {1, 2, 3}, ms(100))},
      // Every key, but a token short.
      {acquire_many_invoke(ms(0), 0, 1, {"a", "b", "c"}),
       acquire_many_ok(ms(1), 0, 1, {"a", "b", "c"}, {1, 2}, ms(100))},
      // A multi-key acquire answered by a single-key grant.
      {acquire_many_invoke(ms(0), 0, 1, {"a", "b"}), acquire_ok(ms(1), 0, 1, "a", 1, ms(100))},
      // A single-key acquire answered by a multi-key grant.
      {acquire_invoke(ms(0), 0, 1, "a"), acquire_many_ok(ms(1), 0, 1, {"a", "b"}, {1, 2}, ms(100))},
  };
  for (const std::vector<Event>& history : broken) {
    const CheckReport report = check(history, CheckOptions{});
    ASSERT_NO_FATAL_FAILURE(expect_only(report, ViolationKind::kAllOrNothing));
    EXPECT_NE(report.examples[0].detail.find("asked for {a"), std::string::npos)
        << report.examples[0].detail;
  }
}

TEST(CheckerKinds, MultiKeyGrantsTakePartInOverlap) {
  const std::vector<Event> history = {
      acquire_many_invoke(ms(0), 0, 1, {"a", "b"}),
      acquire_many_ok(ms(1), 0, 1, {"a", "b"}, {5, 7}, ms(100)),
      release_invoke(ms(20), 0, 2, "a", 5),  // a is free from 20, b is not
      acquire_invoke(ms(30), 1, 1, "a"),
      acquire_ok(ms(31), 1, 1, "a", 6, ms(200)),
      acquire_invoke(ms(40), 2, 1, "b"),
      acquire_ok(ms(50), 2, 1, "b", 8, ms(200)),
  };
  const CheckReport report = check(history, CheckOptions{});
  ASSERT_NO_FATAL_FAILURE(expect_only(report, ViolationKind::kOverlap));
  EXPECT_EQ(report.examples[0].key, "b");
}

TEST(CheckerKinds, MultiKeyGrantsTakePartInTokenOrderAndDuplicates) {
  std::vector<Event> history = {
      acquire_many_invoke(ms(0), 0, 1, {"a", "b"}),
      acquire_many_ok(ms(1), 0, 1, {"a", "b"}, {5, 9}, ms(10)),
      // Client 1 asks for b after token 9 arrived and gets 8.
      acquire_invoke(ms(20), 1, 1, "b"),
      acquire_ok(ms(21), 1, 1, "b", 8, ms(30)),
  };
  CheckReport report = check(history, CheckOptions{});
  ASSERT_NO_FATAL_FAILURE(expect_only(report, ViolationKind::kTokenOrder));
  EXPECT_NE(report.examples[0].detail.find("had received token 9"), std::string::npos)
      << report.examples[0].detail;

  // The other way round: a multi-key grant below an earlier single one.
  history = {
      acquire_invoke(ms(0), 1, 1, "b"),
      acquire_ok(ms(1), 1, 1, "b", 8, ms(10)),
      acquire_many_invoke(ms(20), 0, 1, {"a", "b"}),
      acquire_many_ok(ms(21), 0, 1, {"a", "b"}, {5, 6}, ms(30)),
  };
  ASSERT_NO_FATAL_FAILURE(expect_only(check(history, CheckOptions{}), ViolationKind::kTokenOrder));

  history = {
      acquire_many_invoke(ms(0), 0, 1, {"a", "b"}),
      acquire_invoke(ms(0), 1, 1, "b"),
      acquire_many_ok(ms(1), 0, 1, {"a", "b"}, {5, 9}, ms(5)),
      acquire_ok(ms(6), 1, 1, "b", 9, ms(30)),
  };
  expect_only(check(history, CheckOptions{}), ViolationKind::kDuplicateToken);
}

TEST(CheckerKinds, TokenOrderHoldsForSharedHolders) {
  // Client 1's shared acquire is invoked after client 0's shared grant
  // arrived, so its token must be larger, though the two may overlap.
  std::vector<Event> history = {
      in_mode(acquire_invoke(ms(0), 0, 1, "k"), kShared),
      in_mode(acquire_ok(ms(1), 0, 1, "k", 5, ms(100)), kShared),
      in_mode(acquire_invoke(ms(10), 1, 1, "k"), kShared),
      in_mode(acquire_ok(ms(11), 1, 1, "k", 4, ms(100)), kShared),
  };
  ASSERT_NO_FATAL_FAILURE(expect_only(check(history, CheckOptions{}), ViolationKind::kTokenOrder));

  // Invoked before that grant arrived: either order is legal.
  history[2].t_ns = ms(1) - 1;
  std::sort(history.begin(), history.end(),
            [](const Event& a, const Event& b) { return a.t_ns < b.t_ns; });
  CheckReport report = check(history, CheckOptions{});
  EXPECT_TRUE(report.ok()) << report.text();

  // Two shared holders with one token.
  history[3].token = 5;
  expect_only(check(history, CheckOptions{}), ViolationKind::kDuplicateToken);
}

TEST(CheckerKinds, ParsesAndFormatsTheKinds) {
  const std::vector<std::string> lines = {
      "1000 acquire_invoke client=0 op=1 key=k ttl_ms=100 wait_ms=0 mode=shared",
      "2000 acquire_ok client=0 op=1 key=k token=1 expiry_ns=100000000 mode=shared",
      "3000 acquire_invoke client=1 op=1 key=s ttl_ms=100 wait_ms=5 mode=permit permits=2",
      "4000 acquire_fail client=1 op=1 key=s error=timeout mode=permit permits=2",
      "5000 acquire_invoke client=2 op=1 keys=a,b,c ttl_ms=100 wait_ms=10",
      "6000 acquire_ok client=2 op=1 keys=a,b,c tokens=4,5,6 expiry_ns=90000000",
      "7000 acquire_invoke client=2 op=2 keys=a,k ttl_ms=100 wait_ms=0",
      "8000 acquire_fail client=2 op=2 keys=a,k error=busy",
      "9000 hold client=2 key=b token=5 expiry_ns=95000000",
  };
  std::vector<Event> history;
  ASSERT_NO_FATAL_FAILURE(parse_lines(lines, history));
  EXPECT_EQ(history[0].mode, AcquireMode::kShared);
  EXPECT_EQ(history[2].mode, AcquireMode::kPermit);
  EXPECT_EQ(history[2].permits, 2);
  EXPECT_EQ(history[4].mode, AcquireMode::kExclusive);
  EXPECT_EQ(history[5].keys, (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(history[5].tokens, (std::vector<std::uint64_t>{4, 5, 6}));
  // An explicit mode=exclusive reads like no mode at all.
  const std::optional<Event> exclusive =
      parse_event("1 acquire_invoke client=0 op=1 key=k ttl_ms=1 wait_ms=0 mode=exclusive");
  ASSERT_TRUE(exclusive.has_value());
  EXPECT_EQ(format_event(*exclusive), "1 acquire_invoke client=0 op=1 key=k ttl_ms=1 wait_ms=0");

  const CheckReport report = check(history, CheckOptions{});
  EXPECT_TRUE(report.ok()) << report.text();
  EXPECT_EQ(report.operations.at("shared try-acquire ok"), 1u);
  EXPECT_EQ(report.operations.at("permit acquire timeout"), 1u);
  EXPECT_EQ(report.operations.at("multi acquire ok"), 1u);
  EXPECT_EQ(report.operations.at("multi try-acquire busy"), 1u);

  for (const char* bad : {
           "1 acquire_invoke client=0 op=1 key=k keys=a,b ttl_ms=1 wait_ms=0",  // both
           "1 acquire_invoke client=0 op=1 keys= ttl_ms=1 wait_ms=0",           // empty list
           "1 acquire_ok client=0 op=1 keys=a,b token=1 expiry_ns=1",           // token, not tokens
           "1 acquire_ok client=0 op=1 key=a tokens=1 expiry_ns=1",             // tokens, no keys
           "1 acquire_ok client=0 op=1 keys=a,b tokens=1,x expiry_ns=1",        // bad token
           "1 acquire_invoke client=0 op=1 key=k ttl_ms=1 wait_ms=0 mode=bogus",
           "1 hold client=0 keys=a,b token=1 expiry_ns=1",  // per key after the grant
           "1 hold client=0 key=a token=1 expiry_ns=1 mode=shared",
       }) {
    std::string error;
    EXPECT_FALSE(parse_event(bad, &error).has_value()) << bad;
    EXPECT_FALSE(error.empty()) << bad;
  }
}

// A clean run of every kind with the legal near-misses of each.
TEST(CheckerKinds, MixedKindsCleanHistoryIsOk) {
  std::vector<Event> history = {
      // Two shared readers of k overlap, then an exclusive writer follows.
      in_mode(acquire_invoke(ms(0), 0, 1, "k"), kShared),
      in_mode(acquire_ok(ms(1), 0, 1, "k", 1, ms(100)), kShared),
      in_mode(acquire_invoke(ms(2), 1, 1, "k"), kShared),
      in_mode(acquire_ok(ms(3), 1, 1, "k", 2, ms(100)), kShared),
      hold(ms(4), 1, "k", 2, ms(100)),
      release_invoke(ms(40), 0, 2, "k", 1),
      acquire_invoke(ms(41), 2, 1, "k"),
      lost(ms(60), 1, "k", 2),  // the second reader's renewal failed
      acquire_ok(ms(61), 2, 1, "k", 3, ms(150)),
      write_accepted(ms(62), 2, "k", 3, 1),
      release_invoke(ms(70), 2, 2, "k", 3),
      // A multi-key writer of k and j, each key with its own token; then a
      // shared reader of j after it let go.
      acquire_many_invoke(ms(65), 0, 3, {"k", "j"}),
      acquire_many_ok(ms(71), 0, 3, {"k", "j"}, {4, 1}, ms(200)),
      write_accepted(ms(72), 0, "k", 4, 2),
      write_accepted(ms(73), 0, "j", 1, 1),
      release_invoke(ms(80), 0, 4, "k", 4),
      release_invoke(ms(81), 0, 5, "j", 1),
      in_mode(acquire_invoke(ms(75), 3, 1, "j"), kShared),
      in_mode(acquire_ok(ms(81), 3, 1, "j", 2, ms(150)), kShared),
      // Semaphore s, limit 2: two holders, a third once one releases, and a
      // holder that asked again (a second permit of client 4).
      in_mode(acquire_invoke(ms(0), 4, 1, "s"), kPermit, 2),
      in_mode(acquire_ok(ms(1), 4, 1, "s", 1, ms(100)), kPermit, 2),
      in_mode(acquire_invoke(ms(0), 5, 1, "s"), kPermit, 2),
      in_mode(acquire_ok(ms(2), 5, 1, "s", 2, ms(100)), kPermit, 2),
      in_mode(acquire_invoke(ms(10), 6, 1, "s"), kPermit, 2),
      release_invoke(ms(30), 5, 2, "s", 2),
      in_mode(acquire_ok(ms(31), 6, 1, "s", 3, ms(100)), kPermit, 2),
      lost(ms(50), 6, "s", 3),
      in_mode(acquire_invoke(ms(51), 4, 2, "s"), kPermit, 2),
      in_mode(acquire_ok(ms(52), 4, 2, "s", 4, ms(100)), kPermit, 2),
      final_counter(ms(300), "k", 2),
      final_counter(ms(300), "j", 1),
  };
  std::sort(history.begin(), history.end(),
            [](const Event& a, const Event& b) { return a.t_ns < b.t_ns; });
  CheckReport report = check(history, CheckOptions{});
  EXPECT_TRUE(report.ok()) << report.text();
  EXPECT_EQ(report.operations.at("shared acquire ok"), 3u);
  EXPECT_EQ(report.operations.at("permit acquire ok"), 4u);
  EXPECT_EQ(report.operations.at("multi acquire ok"), 1u);
  EXPECT_EQ(report.operations.at("acquire ok"), 1u);

  std::reverse(history.begin(), history.end());
  report = check(history, CheckOptions{});
  EXPECT_TRUE(report.ok()) << report.text();
}

TEST(CheckerKinds, JsonAndTextCountTheNewKinds) {
  const CheckReport report = check(permit_holders(1, {{1, 100}, {10, 60}}), CheckOptions{});
  const std::string json = report.json();
  EXPECT_NE(json.find(R"("permit_limit":1)"), std::string::npos) << json;
  EXPECT_NE(json.find(R"("all_or_nothing":0)"), std::string::npos) << json;
  const std::string text = report.text();
  EXPECT_NE(text.find("permit_limit                1"), std::string::npos) << text;
}

TEST(Checker, JsonEscapesStrings) {
  CheckReport report;
  report.violation_counts[ViolationKind::kOverlap] = 1;
  report.examples.push_back(
      Violation{ViolationKind::kOverlap, "a\"b\\c", std::string("line\nbreak\x01tab\t")});
  report.operations["acquire ok"] = 2;
  const std::string json = report.json();
  EXPECT_EQ(json.front(), '{');
  EXPECT_EQ(json.back(), '}');
  EXPECT_EQ(json.find('\n'), std::string::npos);
  EXPECT_NE(json.find("\"ok\":false"), std::string::npos) << json;
  EXPECT_NE(json.find(R"("key":"a\"b\\c")"), std::string::npos) << json;
  EXPECT_NE(json.find(R"("detail":"line\u000abreak\u0001tab\u0009")"), std::string::npos) << json;
  EXPECT_NE(json.find(R"("overlap":1)"), std::string::npos) << json;
  EXPECT_NE(json.find(R"("operations":{"acquire ok":2})"), std::string::npos) << json;
  EXPECT_NE(json.find(R"("liveness_checked":false)"), std::string::npos) << json;
}

// A waiting acquire that gives up on a recovering or unreachable node before
// its wait is spent: what a client that stops at the first RECOVERING (or
// at a hint longer than its wait) looks like.
TEST(Checker, AWaitingAcquireGivesUpOnlyWhenItsWaitIsSpent) {
  std::vector<Event> history = {
      acquire_invoke(ms(0), 0, 1, "k", 2000),
      acquire_fail(ms(5), 0, 1, "k", "recovering"),
      acquire_invoke(ms(100), 1, 1, "k", 2000),
      acquire_fail(ms(900), 1, 1, "k", "unreachable"),
      // Spent waits (within the slack), a try, and other errors: all fine.
      acquire_invoke(ms(3000), 0, 2, "k", 1000),
      acquire_fail(ms(3960), 0, 2, "k", "recovering"),
      acquire_invoke(ms(5000), 1, 2, "k", 0),
      acquire_fail(ms(5001), 1, 2, "k", "recovering"),
      acquire_invoke(ms(6000), 1, 3, "k", 1000),
      acquire_fail(ms(6001), 1, 3, "k", "busy"),
  };
  const CheckReport report = check(history, CheckOptions{});
  ASSERT_NO_FATAL_FAILURE(expect_only(report, ViolationKind::kWait, 2));
  EXPECT_NE(report.examples[0].detail.find("recovering after 5 ms of a 2000 ms wait"),
            std::string::npos)
      << report.examples[0].detail;
}

TEST(Checker, TextNamesEveryKind) {
  const CheckReport report = check({}, CheckOptions{});
  const std::string text = report.text();
  for (const ViolationKind kind :
       {ViolationKind::kOverlap, ViolationKind::kTokenOrder, ViolationKind::kDuplicateToken,
        ViolationKind::kFencing, ViolationKind::kLostIncrement, ViolationKind::kLockDelay,
        ViolationKind::kLiveness, ViolationKind::kPermitLimit, ViolationKind::kAllOrNothing,
        ViolationKind::kOwner, ViolationKind::kKeyLiveness, ViolationKind::kWait,
        ViolationKind::kKept, ViolationKind::kOneLeader, ViolationKind::kTermOrder,
        ViolationKind::kObserverOrder, ViolationKind::kObservedLeader, ViolationKind::kDenied,
        ViolationKind::kIsolation}) {
    EXPECT_NE(text.find(to_string(kind)), std::string::npos) << text;
  }
  EXPECT_NE(text.find("OK"), std::string::npos);
}

// ---- tenants: rights refused within them, probes granted outside them ----

// `e` (an acquire event) as a probe outside the client's tenant's rights.
Event outside(Event e) {
  e.outside = true;
  return e;
}

TEST(CheckerTenants, PermissionDeniedWithinTheRightsIsDenied) {
  std::vector<Event> history = {
      acquire_invoke(ms(0), 0, 1, "t0/k"),
      acquire_fail(ms(5), 0, 1, "t0/k", "permission_denied"),
      acquire_invoke(ms(10), 1, 1, "shared/k"),
      acquire_ok(ms(12), 1, 1, "shared/k", 1, ms(100)),
      renew_invoke(ms(20), 1, 2, "shared/k", 1),
      with_token(make(ms(25), EventKind::kRenewFail), 1, "shared/k", 1),
      release_invoke(ms(30), 1, 3, "shared/k", 1),
      with_token(make(ms(31), EventKind::kReleaseFail), 1, "shared/k", 1),
  };
  history[5].op = 2, history[5].error = "permission_denied";
  history[7].op = 3, history[7].error = "expired";  // a refusal, but not for want of rights
  const CheckReport report = check(history, CheckOptions{});
  ASSERT_NO_FATAL_FAILURE(expect_only(report, ViolationKind::kDenied, 2));
  EXPECT_EQ(report.examples[0].key, "t0/k");
  EXPECT_NE(report.examples[0].detail.find("acquire invoked at 0 within its tenant's rights"),
            std::string::npos)
      << report.examples[0].detail;
  EXPECT_NE(report.examples[1].detail.find("renew invoked at 20000000"), std::string::npos)
      << report.examples[1].detail;
  EXPECT_EQ(report.operations.at("acquire permission_denied"), 1u);
}

TEST(CheckerTenants, ACampaignRefusedForWantOfRightsIsDenied) {
  Event invoked = acquire_invoke(ms(0), 0, 1, "shared/elect-0");
  invoked.kind = EventKind::kCampaignInvoke;
  Event failed = acquire_fail(ms(5), 0, 1, "shared/elect-0", "permission_denied");
  failed.kind = EventKind::kCampaignFail;
  const CheckReport report = check({invoked, failed}, CheckOptions{});
  ASSERT_NO_FATAL_FAILURE(expect_only(report, ViolationKind::kDenied));
  EXPECT_EQ(report.examples[0].key, "shared/elect-0");
}

// Probes refused (permission_denied, or lost to the network) are the design;
// they want no grant, so a key only probes ask for is no key_liveness case.
TEST(CheckerTenants, ProbesOutsideTheRightsMayBeRefused) {
  Event many_refused = outside(acquire_fail(ms(21), 0, 2, "", "permission_denied"));
  many_refused.keys = {"t0/k", "t1/j"};
  const std::vector<Event> history = {
      make(ms(0), EventKind::kHealed),
      outside(acquire_invoke(ms(10), 0, 1, "t1/k", 0)),
      outside(acquire_fail(ms(11), 0, 1, "t1/k", "permission_denied")),
      outside(acquire_many_invoke(ms(20), 0, 2, {"t0/k", "t1/j"}, 0)),
      many_refused,
      outside(acquire_invoke(ms(30), 0, 3, "t1/j", 0)),
      outside(acquire_fail(ms(1030), 0, 3, "t1/j", "unreachable")),
      acquire_invoke(ms(1100), 0, 4, "t0/k"),
      acquire_ok(ms(1110), 0, 4, "t0/k", 1, ms(1200)),
  };
  const CheckReport report = check(history, CheckOptions{});
  EXPECT_TRUE(report.ok()) << report.text();
  EXPECT_EQ(report.operations.at("outside try-acquire permission_denied"), 1u);
  EXPECT_EQ(report.operations.at("outside multi try-acquire permission_denied"), 1u);
  EXPECT_EQ(report.operations.at("outside try-acquire unreachable"), 1u);
}

// A tenant granted another tenant's key: isolation, and the holder it became
// takes part in the other properties (here it overlaps the key's owner).
TEST(CheckerTenants, AGrantOutsideTheRightsBreaksIsolation) {
  const std::vector<Event> history = {
      acquire_invoke(ms(0), 1, 1, "t1/k"),
      acquire_ok(ms(1), 1, 1, "t1/k", 1, ms(100)),
      outside(acquire_invoke(ms(10), 0, 1, "t1/k", 0)),
      outside(acquire_ok(ms(11), 0, 1, "t1/k", 2, ms(50))),
      release_invoke(ms(12), 0, 2, "t1/k", 2),
  };
  const CheckReport report = check(history, CheckOptions{});
  EXPECT_EQ(report.violation_counts.at(ViolationKind::kIsolation), 1u) << report.text();
  EXPECT_EQ(report.violation_counts.at(ViolationKind::kOverlap), 1u) << report.text();
  const auto isolation =
      std::find_if(report.examples.begin(), report.examples.end(),
                   [](const Violation& v) { return v.kind == ViolationKind::kIsolation; });
  ASSERT_NE(isolation, report.examples.end());
  EXPECT_EQ(isolation->key, "t1/k");
  EXPECT_NE(isolation->detail.find("client 0 asked outside its tenant's rights at 10000000 and "
                                   "was granted token 2 at 11000000"),
            std::string::npos)
      << isolation->detail;

  // Without the other tenant's holder: isolation alone.
  const std::vector<Event> alone(history.begin() + 2, history.end());
  ASSERT_NO_FATAL_FAILURE(expect_only(check(alone, CheckOptions{}), ViolationKind::kIsolation));
}

TEST(CheckerTenants, ParsesAndFormatsProbes) {
  const std::vector<std::string> lines = {
      "1000 acquire_invoke client=0 op=1 key=t1/k ttl_ms=100 wait_ms=0 outside=1",
      "2000 acquire_fail client=0 op=1 key=t1/k error=permission_denied outside=1",
      "3000 acquire_invoke client=0 op=2 keys=t0/a,t1/b ttl_ms=100 wait_ms=0 outside=1",
      "4000 acquire_ok client=0 op=2 keys=t0/a,t1/b tokens=1,2 expiry_ns=9000 outside=1",
      "5000 acquire_fail client=0 op=3 key=t1/s error=unreachable mode=permit permits=2 outside=1",
  };
  std::vector<Event> history;
  ASSERT_NO_FATAL_FAILURE(parse_lines(lines, history));
  for (const Event& e : history) EXPECT_TRUE(e.outside) << format_event(e);
  const std::optional<Event> inside =
      parse_event("1 acquire_invoke client=0 op=1 key=t0/k ttl_ms=1 wait_ms=0");
  ASSERT_TRUE(inside.has_value());
  EXPECT_FALSE(inside->outside);
  for (const char* bad : {
           "1 acquire_invoke client=0 op=1 key=k ttl_ms=1 wait_ms=0 outside=0",  // only 1
           "1 acquire_invoke client=0 op=1 key=k ttl_ms=1 wait_ms=0 outside=",
           "1 hold client=0 key=k token=1 expiry_ns=1 outside=1",  // acquires only
           "1 renew_fail client=0 op=1 key=k token=1 error=x outside=1",
       }) {
    std::string error;
    EXPECT_FALSE(parse_event(bad, &error).has_value()) << bad;
    EXPECT_FALSE(error.empty()) << bad;
  }
}

// ---- cluster mode: grants name their node, maps name each key's owner ----

constexpr std::uint64_t cluster_token(std::uint64_t epoch, std::uint64_t counter) {
  return epoch << 32 | counter;
}
Event from(Event e, std::string node) {
  e.node = std::move(node);
  return e;
}
Event map_event(std::int64_t t, std::uint64_t epoch,
                std::vector<std::pair<std::string, std::string>> owners) {
  Event e = make(t, EventKind::kMap);
  e.epoch = epoch, e.owners = std::move(owners);
  return e;
}
Event node_start(std::int64_t t, std::string node, std::int64_t incarnation,
                 std::int64_t lock_delay_ms) {
  return from(server_start(t, incarnation, lock_delay_ms), std::move(node));
}

// k moves from n1 (epoch 5) to n2 (epoch 9); each grant comes from the
// owner of its token's epoch, tokens rise across the owners.
std::vector<Event> clean_cluster_history() {
  return {
      map_event(ms(0), 5, {{"k", "n1"}, {"j", "n2"}}),
      acquire_invoke(ms(10), 0, 1, "k"),
      from(acquire_ok(ms(20), 0, 1, "k", cluster_token(5, 1), ms(120)), "n1"),
      release_invoke(ms(30), 0, 2, "k", cluster_token(5, 1)),
      map_event(ms(200), 9, {{"k", "n2"}, {"j", "n2"}}),
      acquire_invoke(ms(300), 1, 1, "k"),
      from(acquire_ok(ms(310), 1, 1, "k", cluster_token(9, 1), ms(410)), "n2"),
      // j in a multi-key grant from its owner.
      acquire_many_invoke(ms(320), 0, 3, {"j"}),
      from(acquire_many_ok(ms(330), 0, 3, {"j"}, {cluster_token(9, 1)}, ms(430)), "n2"),
  };
}

TEST(CheckerCluster, GrantsFromTheOwnerOfTheirTokensEpochAreOk) {
  const CheckReport report = check(clean_cluster_history(), CheckOptions{});
  EXPECT_TRUE(report.ok()) << report.text();
  EXPECT_EQ(report.maps, 2u);
}

// A grant by a node the map of its token's epoch does not give the key to:
// the old owner granting after the map moved the key, with a token in the
// new epoch, is what a node that missed its hand-off would do.
TEST(CheckerCluster, AGrantFromANodeThatDoesNotOwnTheKeyInItsEpochIsAnOwnerViolation) {
  std::vector<Event> history = clean_cluster_history();
  history.push_back(acquire_invoke(ms(500), 2, 1, "k"));
  history.push_back(from(acquire_ok(ms(510), 2, 1, "k", cluster_token(9, 2), ms(600)), "n1"));
  const CheckReport report = check(history, CheckOptions{});
  ASSERT_NO_FATAL_FAILURE(expect_only(report, ViolationKind::kOwner));
  EXPECT_EQ(report.examples[0].key, "k");
  EXPECT_NE(report.examples[0].detail.find("from node n1"), std::string::npos)
      << report.examples[0].detail;
  EXPECT_NE(report.examples[0].detail.find("gives the key to node n2"), std::string::npos)
      << report.examples[0].detail;
}

// A node replaced at its address under a new id (n1 -> n1r1).
// The workers still name that address n1, so a grant the map gives n1r1
// comes "from n1": the node_replaced event makes it n1r1's. Any other owner
// is still a violation.
TEST(CheckerCluster, AReplacedNodesGrantsAreItsSuccessorsWhenTheMapSaysSo) {
  std::vector<Event> history = clean_cluster_history();
  Event replaced;
  replaced.t_ns = ms(450);
  replaced.kind = EventKind::kNodeReplaced;
  replaced.node = "n1";
  replaced.peer = "n1r1";
  history.push_back(replaced);
  history.push_back(map_event(ms(460), 10, {{"k", "n1r1"}, {"j", "n2"}}));
  history.push_back(acquire_invoke(ms(500), 2, 1, "k"));
  history.push_back(from(acquire_ok(ms(510), 2, 1, "k", cluster_token(10, 1), ms(600)), "n1"));
  CheckReport report = check(history, CheckOptions{});
  EXPECT_TRUE(report.ok()) << report.text();
  EXPECT_EQ(report.faults.at("node replacement"), 1u);
  // j is n2's in epoch 10: a grant of it from n1's address is not n1r1's.
  history.push_back(acquire_invoke(ms(700), 3, 1, "j"));
  history.push_back(from(acquire_ok(ms(710), 3, 1, "j", cluster_token(10, 2), ms(800)), "n1"));
  ASSERT_NO_FATAL_FAILURE(expect_only(check(history, CheckOptions{}), ViolationKind::kOwner));
  // Without the node_replaced event, the first grant is a violation too.
  std::erase_if(history, [](const Event& e) { return e.kind == EventKind::kNodeReplaced; });
  expect_only(check(history, CheckOptions{}), ViolationKind::kOwner, 2);
}

TEST(CheckerCluster, AMultiKeyGrantIsJudgedPerKey) {
  std::vector<Event> history = clean_cluster_history();
  history.push_back(acquire_many_invoke(ms(500), 2, 1, {"j", "k"}));
  // n2 owns both in epoch 9, n1 neither.
  history.push_back(from(acquire_many_ok(ms(510), 2, 1, {"j", "k"},
                                         {cluster_token(9, 7), cluster_token(9, 8)}, ms(600)),
                         "n1"));
  expect_only(check(history, CheckOptions{}), ViolationKind::kOwner, 2);
}

TEST(CheckerCluster, ATokenWhoseEpochNoMapHadIsAnOwnerViolation) {
  std::vector<Event> history = clean_cluster_history();
  history.push_back(acquire_invoke(ms(500), 2, 1, "k"));
  history.push_back(from(acquire_ok(ms(510), 2, 1, "k", cluster_token(11, 1), ms(600)), "n2"));
  const CheckReport report = check(history, CheckOptions{});
  ASSERT_NO_FATAL_FAILURE(expect_only(report, ViolationKind::kOwner));
  EXPECT_NE(report.examples[0].detail.find("epoch 11 is no published map's"), std::string::npos)
      << report.examples[0].detail;
}

// Two holders on one key from two nodes: the overlap report names both.
TEST(CheckerCluster, AnOverlapAcrossNodesNamesBothNodes) {
  std::vector<Event> history = clean_cluster_history();
  history.push_back(acquire_invoke(ms(315), 2, 1, "k"));
  // n1 still grants k in epoch 5 after the move (a paused old owner): the
  // token is below n2's, and its interval overlaps client 1's.
  history.push_back(from(acquire_ok(ms(320), 2, 1, "k", cluster_token(5, 2), ms(420)), "n1"));
  const CheckReport report = check(history, CheckOptions{});
  EXPECT_EQ(report.violation_counts.at(ViolationKind::kOverlap), 1u) << report.text();
  EXPECT_EQ(report.violation_counts.at(ViolationKind::kTokenOrder), 1u) << report.text();
  EXPECT_EQ(report.violation_counts.at(ViolationKind::kOwner), 0u) << report.text();
  bool named = false;
  for (const Violation& v : report.examples) {
    if (v.kind != ViolationKind::kOverlap) continue;
    named = v.detail.find("from node n1") != std::string::npos &&
            v.detail.find("from node n2") != std::string::npos;
  }
  EXPECT_TRUE(named) << report.text();
}

// A node's restart delays only the grants it answers.
TEST(CheckerCluster, LockDelayBindsOnlyTheRestartedNode) {
  std::vector<Event> history = clean_cluster_history();
  history.push_back(node_start(ms(250), "n1", 2, 1000));
  EXPECT_TRUE(check(history, CheckOptions{}).ok());  // n2's grant at 310 is fine
  history.push_back(node_start(ms(280), "n2", 2, 1000));
  const CheckReport report = check(history, CheckOptions{});
  ASSERT_NO_FATAL_FAILURE(expect_only(report, ViolationKind::kLockDelay, 2));
  EXPECT_NE(report.examples[0].detail.find("from node n2"), std::string::npos);
}

// With replicas a returning node grants the buckets it took over complete
// at once: no lock_delay violation. A grant beside a
// live lease of its earlier run is still caught, as an overlap.
TEST(CheckerCluster, WithReplicasARestartedNodesEarlyGrantIsJudgedByOverlapNotLockDelay) {
  std::vector<Event> history = clean_cluster_history();
  history.push_back(node_start(ms(280), "n2", 2, 1000));
  CheckOptions replicated;
  replicated.replicas = 2;
  EXPECT_TRUE(check(history, replicated).ok()) << check(history, replicated).text();
  // Unreplicated, both of n2's grants (k at 310 ms, j at 330 ms) are within its lock-delay.
  ASSERT_NO_FATAL_FAILURE(
      expect_only(check(history, CheckOptions{}), ViolationKind::kLockDelay, 2));
  // n2's earlier run granted j until 900 ms; the restarted n2 grants it at 510.
  history.insert(history.begin() + 1, acquire_invoke(ms(100), 3, 1, "j"));
  history.insert(history.begin() + 2,
                 from(acquire_ok(ms(110), 3, 1, "j", cluster_token(5, 2), ms(900)), "n2"));
  history.push_back(acquire_invoke(ms(500), 2, 1, "j"));
  history.push_back(from(acquire_ok(ms(510), 2, 1, "j", cluster_token(9, 3), ms(600)), "n2"));
  const CheckReport report = check(history, replicated);
  const auto count_of = [&](ViolationKind kind) -> std::size_t {
    const auto it = report.violation_counts.find(kind);
    return it == report.violation_counts.end() ? 0 : it->second;
  };
  EXPECT_GT(count_of(ViolationKind::kOverlap), 0u) << report.text();
  EXPECT_EQ(count_of(ViolationKind::kLockDelay), 0u) << report.text();
}

TEST(CheckerCluster, ParsesAndFormatsTheClusterEvents) {
  const std::vector<std::string> lines = {
      "1 map epoch=7 owners=key-0:n1,key-1:n2",
      "2 server_start incarnation=1 lock_delay_ms=500 node=n1",
      "3 server_ready incarnation=1 node=n1",
      "4 acquire_ok client=0 op=1 key=key-0 token=30064771073 expiry_ns=9 node=n1",
      "5 acquire_ok client=0 op=2 keys=a,b tokens=1,2 expiry_ns=9 mode=shared node=n2",
      "6 node_join node=n4",
      "7 node_leave node=n4",
      "8 drain_on node=n2",
      "9 drain_off node=n2",
      "10 etcd_cut_on node=n3",
      "11 etcd_cut_off node=n3",
      "12 client_cut_on node=n1",
      "13 client_cut_off node=n1",
      "14 fault fault=stalled_double_drain",
      "15 fault fault=stalled_double_drain",
      "16 fault fault=kill_during_hand-off",
  };
  std::vector<Event> history;
  ASSERT_NO_FATAL_FAILURE(parse_lines(lines, history));
  EXPECT_EQ(history[0].epoch, 7u);
  EXPECT_EQ(history[0].owners,
            (std::vector<std::pair<std::string, std::string>>{{"key-0", "n1"}, {"key-1", "n2"}}));
  EXPECT_EQ(history[3].node, "n1");
  const CheckReport report = check(history, CheckOptions{});
  EXPECT_EQ(report.faults.at("node join"), 1u);
  EXPECT_EQ(report.faults.at("node leave"), 1u);
  EXPECT_EQ(report.faults.at("node drain"), 1u);
  EXPECT_EQ(report.faults.at("etcd partition"), 1u);
  EXPECT_EQ(report.faults.at("client partition"), 1u);
  EXPECT_EQ(report.faults.at("stalled double drain"), 2u);
  EXPECT_EQ(report.faults.at("kill during hand-off"), 1u);
  EXPECT_EQ(format_event(history[13]), lines[13]);
  for (const char* bad : {
           "1 map epoch=7 owners=key-0",                         // no owner
           "1 map owners=key-0:n1",                              // no epoch
           "1 node_join",                                        // no node
           "1 fault",                                            // no name
           "1 hold client=0 key=a token=1 expiry_ns=1 node=n1",  // not on a hold
       }) {
    std::string error;
    EXPECT_FALSE(parse_event(bad, &error).has_value()) << bad;
  }
}

// ---- replication: the kept property ----

// The replicated cluster of the kept tests: key k on n1 (backup n2), key j
// on n3 (backup n1), so every map names all its nodes.
Event replicated_map(std::int64_t t, std::uint64_t epoch, std::string k_primary,
                     std::string k_backup, std::string j_primary, std::string j_backup) {
  Event e = map_event(t, epoch, {{"k", std::move(k_primary)}, {"j", std::move(j_primary)}});
  e.backups = {{"k", std::move(k_backup)}, {"j", std::move(j_backup)}};
  return e;
}
Event node_event(std::int64_t t, EventKind kind, std::string node, std::int64_t incarnation = 1) {
  return from(server_event(t, kind, incarnation), std::move(node));
}
Event lost_because(Event e, std::string error) {
  e.error = std::move(error);
  return e;
}
CheckOptions replicated() {
  CheckOptions o;
  o.replicas = 2;
  o.replica_timeout_ms = 300;
  o.settle_ms = 5000;
  o.failover_slack_ms = 1000;
  o.clients_per_worker = 4;
  return o;
}

// Client 0 holds k (granted by n1 at 10 s, a 2 s TTL) when n1 is killed at
// 10.1 s and restarted; its backup n2 takes k over (epoch 4, where n1 is
// gone); the client's renewal then reaches n2.
std::vector<Event> kill_of_the_primary() {
  return {
      replicated_map(ms(0), 3, "n1", "n2", "n3", "n1"),
      acquire_invoke(ms(10'000), 0, 1, "k"),
      from(acquire_ok(ms(10'010), 0, 1, "k", cluster_token(3, 1), ms(12'000)), "n1"),
      node_event(ms(10'100), EventKind::kServerKill, "n1"),
      node_start(ms(10'101), "n1", 2, 2000),
      replicated_map(ms(10'450), 4, "n2", "n3", "n3", "n2"),
      node_event(ms(10'600), EventKind::kServerReady, "n1", 2),
  };
}

// n2 answers the renewal NOT_OWNER: the grant n1 answered never reached
// it, as when a primary answers GRANTED before its backup acknowledges.
TEST(CheckerKept, ARefusalByTheBackupThatTookOverIsAViolation) {
  std::vector<Event> history = kill_of_the_primary();
  history.push_back(lost_because(lost(ms(10'800), 0, "k", cluster_token(3, 1)), "not_owner"));
  const CheckReport report = check(history, replicated());
  ASSERT_NO_FATAL_FAILURE(expect_only(report, ViolationKind::kKept));
  EXPECT_EQ(report.kept_judged, 1u);
  EXPECT_EQ(report.examples[0].key, "k");
  EXPECT_NE(report.examples[0].detail.find("into kill -9 of n1"), std::string::npos)
      << report.examples[0].detail;
  // Without replication nothing promises the holder its lease.
  EXPECT_TRUE(check(history, CheckOptions{}).ok());
}

// The expiry passing unrenewed 1.5 s into the kill is a violation too:
// the failover (300 ms of silence, then the map) had the time to happen.
TEST(CheckerKept, AnExpiryLongAfterTheFailoverIsAViolation) {
  std::vector<Event> history = kill_of_the_primary();
  history.push_back(lost_because(lost(ms(11'700), 0, "k", cluster_token(3, 1)), "no_renewal"));
  expect_only(check(history, replicated()), ViolationKind::kKept);
}

// One node-to-node cut evicted both of k's replicas (the map that removes
// them gives k to n3, which never had it): after a single fault that is no
// excuse, and the loss is a violation.
TEST(CheckerKept, ACutThatCostBothReplicasIsAViolation) {
  std::vector<Event> history = {
      replicated_map(ms(0), 3, "n1", "n2", "n3", "n1"),
      acquire_invoke(ms(10'000), 0, 1, "k"),
      from(acquire_ok(ms(10'010), 0, 1, "k", cluster_token(3, 1), ms(12'000)), "n1"),
  };
  Event cut = make(ms(10'100), EventKind::kNodeCutOn);
  cut.node = "n1", cut.peer = "n2";
  history.push_back(cut);
  history.push_back(replicated_map(ms(10'450), 5, "n3", "n3", "n3", "n3"));
  history.back().backups.clear();
  cut.t_ns = ms(12'000), cut.kind = EventKind::kNodeCutOff;
  history.push_back(cut);
  history.push_back(lost_because(lost(ms(11'700), 0, "k", cluster_token(3, 1)), "no_renewal"));
  const CheckReport report = check(history, replicated());
  ASSERT_NO_FATAL_FAILURE(expect_only(report, ViolationKind::kKept));
  EXPECT_NE(report.examples[0].detail.find("n1 cut off from n2"), std::string::npos)
      << report.examples[0].detail;
}

// Near-misses: the same kill, and a loss the design allows.
TEST(CheckerKept, LossesTheDesignAllowsAreNoViolation) {
  struct Case {
    const char* why;
    std::vector<Event> extra;
  };
  const std::uint64_t token = cluster_token(3, 1);
  Event worker_pause = make(ms(10'300), EventKind::kClientPause);
  worker_pause.client = 0;  // worker 0: clients 0..3
  Event worker_resume = worker_pause;
  worker_resume.t_ns = ms(11'500), worker_resume.kind = EventKind::kClientResume;
  Event other_worker_pause = worker_pause;
  other_worker_pause.client = 1;
  Event client_cut = make(ms(10'200), EventKind::kClientCutOn);
  client_cut.node = "n2";
  const std::vector<Case> cases = {
      {"its expiry passed before a failover could be done (300 ms + slack)",
       {lost_because(lost(ms(10'900), 0, "k", token), "no_renewal")}},
      {"n1, back, took k again (a map that grew handed it off), and n1 refused it",
       {replicated_map(ms(11'000), 6, "n1", "n2", "n3", "n1"),
        lost_because(lost(ms(11'050), 0, "k", token), "expired")}},
      {"its worker was paused",
       {worker_pause, worker_resume, lost_because(lost(ms(11'700), 0, "k", token), "no_renewal")}},
      {"k's other replica died too (a second node fault within a failover)",
       {node_event(ms(10'300), EventKind::kServerKill, "n2"),
        lost_because(lost(ms(11'700), 0, "k", token), "no_renewal")}},
      {"the primary had started less than the settle time before",
       {node_start(ms(6'000), "n1", 1, 2000), node_event(ms(6'200), EventKind::kServerReady, "n1"),
        lost_because(lost(ms(11'700), 0, "k", token), "not_owner")}},
      {"a client partition was on",
       {client_cut, lost_because(lost(ms(11'700), 0, "k", token), "no_renewal")}},
  };
  for (const Case& c : cases) {
    std::vector<Event> history = kill_of_the_primary();
    history.insert(history.end(), c.extra.begin(), c.extra.end());
    const CheckReport report = check(history, replicated());
    EXPECT_TRUE(report.ok()) << c.why << "\n" << report.text();
    EXPECT_EQ(report.operations.at("lost"), 1u) << c.why;
  }
  // Another worker's pause excuses nothing.
  std::vector<Event> history = kill_of_the_primary();
  history.insert(history.end(), {other_worker_pause, worker_resume,
                                 lost_because(lost(ms(11'700), 0, "k", token), "no_renewal")});
  expect_only(check(history, replicated()), ViolationKind::kKept);
}

// A release refused (expired) while the client's own expiry is still
// ahead: the server no longer had the lease, found at the release.
TEST(CheckerKept, AReleaseRefusedBeforeTheExpiryIsALoss) {
  std::vector<Event> history = kill_of_the_primary();
  history.push_back(release_invoke(ms(10'800), 0, 2, "k", cluster_token(3, 1)));
  Event refused = release_invoke(ms(10'810), 0, 2, "k", cluster_token(3, 1));
  refused.kind = EventKind::kReleaseFail, refused.error = "expired";
  history.push_back(refused);
  const CheckReport report = check(history, replicated());
  ASSERT_NO_FATAL_FAILURE(expect_only(report, ViolationKind::kKept));
  EXPECT_NE(report.examples[0].detail.find("had the release refused"), std::string::npos)
      << report.examples[0].detail;
  // Released at the client's own expiry (12 s) or later: no held lease lost.
  for (Event& e : history) {
    const bool release = e.kind == EventKind::kReleaseInvoke || e.kind == EventKind::kReleaseFail;
    if (release) e.t_ns += ms(1'200);
  }
  EXPECT_TRUE(check(history, replicated()).ok());
}

// The node that came back took k at once and its backup handed k off:
// excused by default, judged with kept_excuses_rejoins off.
TEST(CheckerKept, AHandOffToANodeThatCameBackIsJudgedWhenStrict) {
  std::vector<Event> history = kill_of_the_primary();
  history.push_back(replicated_map(ms(11'000), 6, "n1", "n2", "n3", "n1"));
  history.push_back(lost_because(lost(ms(11'050), 0, "k", cluster_token(3, 1)), "expired"));
  EXPECT_TRUE(check(history, replicated()).ok());
  CheckOptions strict = replicated();
  strict.kept_excuses_rejoins = false;
  expect_only(check(history, strict), ViolationKind::kKept);
}

TEST(CheckerKept, ParsesAndFormatsTheReplicationEvents) {
  const std::vector<std::string> lines = {
      "1 map epoch=7 owners=key-0:n1,key-1:n2 backups=key-0:n2,key-1:n3",
      "2 map epoch=8 owners=key-0:n1",
      "3 node_cut_on node=n1 peer=n2",
      "4 node_cut_off node=n1 peer=n2",
  };
  std::vector<Event> history;
  ASSERT_NO_FATAL_FAILURE(parse_lines(lines, history));
  EXPECT_EQ(history[0].backups,
            (std::vector<std::pair<std::string, std::string>>{{"key-0", "n2"}, {"key-1", "n3"}}));
  EXPECT_TRUE(history[1].backups.empty());
  EXPECT_EQ(history[2].peer, "n2");
  EXPECT_EQ(check(history, CheckOptions{}).faults.at("node partition"), 1u);
  for (const char* bad : {
           "1 map epoch=7 owners=key-0:n1 backups=key-0",  // no backup node
           "3 node_cut_on node=n1",                        // no peer
           "1 hold client=0 key=a token=1 expiry_ns=1 backups=a:n1",
       }) {
    std::string error;
    EXPECT_FALSE(parse_event(bad, &error).has_value()) << bad;
  }
}

// ---- elections: campaigners' leadership as their clients saw it, observers ----

Event with_op(Event e, std::int64_t op) {
  e.op = op;
  return e;
}
Event campaign_invoke(std::int64_t t, std::int64_t client, std::int64_t op, std::string name) {
  Event e =
      with_op(with_token(make(t, EventKind::kCampaignInvoke), client, std::move(name), 0), op);
  e.ttl_ms = 100, e.wait_ms = 1000;
  return e;
}
Event elected(std::int64_t t, std::int64_t client, std::int64_t op, std::string name,
              std::uint64_t term) {
  return with_op(with_token(make(t, EventKind::kElected), client, std::move(name), term), op);
}
Event campaign_fail(std::int64_t t, std::int64_t client, std::int64_t op, std::string name) {
  Event e = with_op(with_token(make(t, EventKind::kCampaignFail), client, std::move(name), 0), op);
  e.error = "timeout";
  return e;
}
Event lead(std::int64_t t, std::int64_t client, std::string name, std::uint64_t term) {
  return with_token(make(t, EventKind::kLead), client, std::move(name), term);
}
Event resign_invoke(std::int64_t t, std::int64_t client, std::int64_t op, std::string name,
                    std::uint64_t term) {
  return with_op(with_token(make(t, EventKind::kResignInvoke), client, std::move(name), term), op);
}
// The election's lease lost: as a lost lease's event, of its own kind.
Event deposed(std::int64_t t, std::int64_t client, std::string name, std::uint64_t term) {
  Event e = lost(t, client, std::move(name), term);
  e.kind = EventKind::kDeposed;
  return e;
}
// An observer's report: `campaign` is "<client>.<op>" ("-" and term 0: no leader).
Event observe(std::int64_t t, std::int64_t observer, std::string name, std::uint64_t term,
              std::string campaign) {
  Event e = with_token(make(t, EventKind::kObserve), observer, std::move(name), term);
  e.leader = std::move(campaign);
  return e;
}

// One campaign of "e" that wins `term` and leads [won, until): invoked,
// elected, a lead just before `until`, then resigned at `until`.
std::vector<Event> leadership(std::int64_t client, std::int64_t op, std::uint64_t term,
                              std::int64_t invoked, std::int64_t won, std::int64_t until) {
  return {campaign_invoke(invoked, client, op, "e"), elected(won, client, op, "e", term),
          lead(won, client, "e", term), lead(until, client, "e", term),
          resign_invoke(until, client, op + 1, "e", term)};
}
std::vector<Event> joined(std::vector<std::vector<Event>> parts) {
  std::vector<Event> all;
  for (std::vector<Event>& part : parts) all.insert(all.end(), part.begin(), part.end());
  return all;
}

// Leaders one after another, touching; one deposed, whose lead recorded
// after its loss does not stretch its leadership; a win whose grant came
// too late for its campaign() (a timeout) that an observer saw anyway; an
// observer that skips a leader and reports no leader between two.
TEST(CheckerElection, LegalNearMissesAreOk) {
  std::vector<Event> history = joined({
      leadership(0, 1, 1, ms(0), ms(10), ms(50)),
      leadership(1, 1, 2, ms(5), ms(50), ms(90)),  // touches: 0 resigned at 50
      {campaign_invoke(ms(60), 0, 3, "e"), elected(ms(100), 0, 3, "e", 3), lead(ms(100), 0, "e", 3),
       deposed(ms(120), 0, "e", 3),
       lead(ms(160), 0, "e", 3)},  // after its loss: the cut at 120 wins
      leadership(1, 3, 5, ms(95), ms(130), ms(170)),
      {campaign_invoke(ms(175), 2, 1, "e"), campaign_fail(ms(300), 2, 1, "e")},  // won term 6
      leadership(0, 5, 7, ms(180), ms(320), ms(400)),
      {observe(ms(1), 9, "e", 0, "-"), observe(ms(20), 9, "e", 1, "0.1"),
       observe(ms(140), 9, "e", 5, "1.3"),  // skips 2 and 3
       observe(ms(175), 9, "e", 0, "-"), observe(ms(250), 9, "e", 6, "2.1"),
       observe(ms(330), 9, "e", 7, "0.5")},
      // Another name has its own terms and leaders, at the same time.
      {campaign_invoke(ms(0), 3, 1, "f"), elected(ms(15), 3, 1, "f", 1), lead(ms(15), 3, "f", 1),
       lead(ms(60), 3, "f", 1), observe(ms(30), 9, "f", 1, "3.1")},
      {make(ms(500), EventKind::kHealed)},
  });
  const CheckReport report = check(history, CheckOptions{});
  EXPECT_TRUE(report.ok()) << report.text();
  EXPECT_TRUE(report.judged_something());
  EXPECT_EQ(report.operations.at("campaign elected"), 6u);
  EXPECT_EQ(report.operations.at("campaign timeout"), 1u);
  EXPECT_EQ(report.operations.at("observe leader"), 5u);
  EXPECT_EQ(report.operations.at("observe no leader"), 2u);
  EXPECT_EQ(report.operations.at("deposed"), 1u);
  EXPECT_EQ(report.grants(), 6u);

  std::reverse(history.begin(), history.end());  // the input order does not matter
  EXPECT_TRUE(check(history, CheckOptions{}).ok());
}

TEST(CheckerElection, OneLeader) {
  // 1 still leads at 60 when 2 (queued before 1 won) is elected at 50.
  const std::vector<Event> history = joined({
      leadership(0, 1, 1, ms(0), ms(10), ms(60)),
      leadership(1, 1, 2, ms(5), ms(50), ms(90)),
  });
  const CheckReport report = check(history, CheckOptions{});
  ASSERT_NO_FATAL_FAILURE(expect_only(report, ViolationKind::kOneLeader));
  EXPECT_EQ(report.examples[0].key, "e");
  EXPECT_NE(report.examples[0].detail.find("client 0's campaign op 1 term 1 [10000000, 60000000)"
                                           " overlaps client 1's campaign op 1 term 2"),
            std::string::npos)
      << report.examples[0].detail;

  // Cut by its loss at 40, the first leadership ends before the second.
  std::vector<Event> cut = history;
  cut.push_back(deposed(ms(40), 0, "e", 1));
  EXPECT_TRUE(check(cut, CheckOptions{}).ok()) << check(cut, CheckOptions{}).text();
  // A win its client never confirmed with a lead is no leadership.
  const std::vector<Event> unconfirmed = {
      campaign_invoke(ms(0), 0, 1, "e"), elected(ms(10), 0, 1, "e", 1),
      campaign_invoke(ms(5), 1, 1, "e"), elected(ms(20), 1, 1, "e", 2),
      lead(ms(20), 1, "e", 2),           lead(ms(30), 1, "e", 2)};
  EXPECT_TRUE(check(unconfirmed, CheckOptions{}).ok());
}

TEST(CheckerElection, TermOrder) {
  // Invoked after term 5 was won, and won term 4: flagged once, though its
  // leadership also follows the first one's.
  const std::vector<Event> after_a_win = joined({
      leadership(0, 1, 5, ms(0), ms(10), ms(20)),
      leadership(1, 1, 4, ms(15), ms(30), ms(40)),
  });
  CheckReport report = check(after_a_win, CheckOptions{});
  ASSERT_NO_FATAL_FAILURE(expect_only(report, ViolationKind::kTermOrder));
  EXPECT_NE(report.examples[0].detail.find("won term 4"), std::string::npos)
      << report.examples[0].detail;

  // Queued before term 5 was won, but led only after that leadership ended.
  const std::vector<Event> after_a_leadership = joined({
      leadership(0, 1, 5, ms(0), ms(10), ms(20)),
      leadership(1, 1, 4, ms(5), ms(30), ms(40)),
  });
  report = check(after_a_leadership, CheckOptions{});
  ASSERT_NO_FATAL_FAILURE(expect_only(report, ViolationKind::kTermOrder));
  EXPECT_NE(report.examples[0].detail.find("began after"), std::string::npos)
      << report.examples[0].detail;

  // One term won by two concurrent campaigns.
  const std::vector<Event> twice = {campaign_invoke(ms(0), 0, 1, "e"),
                                    campaign_invoke(ms(0), 1, 1, "e"),
                                    elected(ms(10), 0, 1, "e", 3), elected(ms(11), 1, 1, "e", 3)};
  report = check(twice, CheckOptions{});
  ASSERT_NO_FATAL_FAILURE(expect_only(report, ViolationKind::kTermOrder));
  EXPECT_NE(report.examples[0].detail.find("which client 0's campaign op 1 had won"),
            std::string::npos)
      << report.examples[0].detail;
}

TEST(CheckerElection, ObserverOrder) {
  const std::vector<Event> history = joined({
      leadership(0, 1, 1, ms(0), ms(10), ms(20)),
      leadership(1, 1, 2, ms(5), ms(20), ms(30)),
      {observe(ms(25), 9, "e", 2, "1.1"), observe(ms(26), 9, "e", 1, "0.1"),  // older
       observe(ms(27), 9, "e", 0, "-"), observe(ms(28), 9, "e", 2, "1.1"),    // again
       observe(ms(29), 8, "e", 1, "0.1")},  // another observer: its own order
  });
  const CheckReport report = check(history, CheckOptions{});
  ASSERT_NO_FATAL_FAILURE(expect_only(report, ViolationKind::kObserverOrder, 2));
  EXPECT_NE(report.examples[0].detail.find("an older leader"), std::string::npos)
      << report.examples[0].detail;
  EXPECT_NE(report.examples[1].detail.find("the same leader twice"), std::string::npos)
      << report.examples[1].detail;
}

TEST(CheckerElection, ObservedLeader) {
  const std::vector<Event> history = joined({
      leadership(0, 1, 1, ms(0), ms(10), ms(20)),
      {campaign_invoke(ms(15), 1, 1, "e"), campaign_fail(ms(60), 1, 1, "e")},
      {observe(ms(12), 9, "e", 1, "0.7"),     // no such campaign
       observe(ms(13), 8, "e", 1, "nobody"),  // not a campaign's value
       observe(ms(14), 7, "e", 2, "0.1"),     // 0.1 won term 1, not 2
       observe(ms(14), 6, "e", 2, "1.1"),     // 1.1 was invoked only at 15
       observe(ms(16), 5, "e", 1, "1.1"),     // 1.1 never won, and term 1 is 0.1's
       observe(ms(17), 4, "f", 1, "0.1")},    // 0.1 campaigned for e, not f
  });
  const CheckReport report = check(history, CheckOptions{});
  ASSERT_NO_FATAL_FAILURE(expect_only(report, ViolationKind::kObservedLeader, 6));
  EXPECT_NE(report.examples[2].detail.find("won term 1"), std::string::npos)
      << report.examples[2].detail;
}

TEST(CheckerElection, ElectionLivenessCountsWinsAndReports) {
  const std::vector<Event> history = {
      make(ms(1000), EventKind::kHealed),
      campaign_invoke(ms(1100), 0, 1, "e"),
      elected(ms(1200), 0, 1, "e", 1),
      observe(ms(1300), 9, "e", 1, "0.1"),
      // Asks for a name nobody is elected to after the heal.
      campaign_invoke(ms(1100), 1, 1, "g"),
      campaign_fail(ms(2100), 1, 1, "g"),
  };
  const CheckReport report = check(history, CheckOptions{});
  EXPECT_EQ(report.violation_counts.at(ViolationKind::kLiveness), 1u) << report.text();
  EXPECT_EQ(report.violation_counts.at(ViolationKind::kKeyLiveness), 1u) << report.text();
  for (const Violation& v : report.examples) {
    EXPECT_TRUE(v.kind == ViolationKind::kKeyLiveness ? v.key == "g"
                                                      : v.detail.find("client 1 ") == 0)
        << v.detail;
  }
}

TEST(CheckerElection, ParsesAndFormatsTheElectionEvents) {
  const std::vector<std::string> lines = {
      "1000 campaign_invoke client=0 op=1 key=e ttl_ms=500 wait_ms=1000",
      "2000 elected client=0 op=1 key=e token=4",
      "2500 lead client=0 key=e token=4",
      "2600 observe client=1 key=e token=4 leader=0.1",
      "3000 resign_invoke client=0 op=2 key=e token=4",
      "3100 resign_fail client=0 op=2 key=e token=4 error=expired",
      "3200 observe client=1 key=e token=0 leader=-",
      "4000 campaign_invoke client=0 op=3 key=e ttl_ms=500 wait_ms=1000",
      "5000 campaign_fail client=0 op=3 key=e error=timeout",
      "6000 campaign_invoke client=0 op=4 key=e ttl_ms=500 wait_ms=1000",
      "7000 elected client=0 op=4 key=e token=9",
      "8000 deposed client=0 key=e token=9 error=no_renewal",
      "9000 resign_invoke client=0 op=5 key=e token=9",
      "9100 resign_ok client=0 op=5 key=e token=9",
  };
  std::vector<Event> history;
  ASSERT_NO_FATAL_FAILURE(parse_lines(lines, history));
  EXPECT_EQ(history[3].leader, "0.1");
  const CheckReport report = check(history, CheckOptions{});
  EXPECT_TRUE(report.ok()) << report.text();
  EXPECT_EQ(report.election_operations, 7u);  // 3 campaigns, 2 resigns, 2 reports
  EXPECT_NE(report.text().find("7 election operations"), std::string::npos) << report.text();
  EXPECT_NE(report.json().find(R"("election_operations":7)"), std::string::npos);
  for (const char* bad : {
           "1 observe client=1 key=e token=4",                  // no leader
           "1 elected client=0 op=1 key=e token=4 leader=0.1",  // leader on another kind
           "1 lead client=0 key=e",                             // no term
       }) {
    std::string error;
    EXPECT_FALSE(parse_event(bad, &error).has_value()) << bad;
  }
}

}  // namespace
}  // namespace shardlock::torture
