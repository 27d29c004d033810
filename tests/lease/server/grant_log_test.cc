// The grant log: one line per lease event, rate-limited, and what
// a shard records in it.
#include "shardlock/lease/server/internal/grant_log.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "support/shard_driver.h"

namespace shardlock::lease::internal {
namespace {

using shardlock::test_support::ShardDriver;

constexpr ClientId kAlice{0x11, 0x22};
constexpr ClientId kBob{0x33, 0x44};

struct Lines {
  std::vector<std::string> all;
  std::function<void(std::string_view)> sink() {
    return [this](std::string_view line) { all.emplace_back(line); };
  }
};

TEST(GrantLog, ALineNamesTheEventKeyOwnerTokenAndTtl) {
  Lines lines;
  GrantLog log(lines.sink(), 100);
  log.record(LeaseEvent::kGrant, "orders/7", kAlice, (std::uint64_t{5} << 32) | 1, 30'000,
             /*cluster=*/true, 0);
  log.record(LeaseEvent::kRelease, "orders/7", kAlice, 9, 0, /*cluster=*/false, 0);
  ASSERT_EQ(lines.all.size(), 2U);
  EXPECT_EQ(lines.all[0],
            "grant key=orders/7 owner=00000000000000220000000000000011 token=21474836481 "
            "epoch=5 ttl_ms=30000");
  EXPECT_EQ(lines.all[1], "release key=orders/7 owner=00000000000000220000000000000011 token=9");
  EXPECT_EQ(log.logged(), 2U);
}

TEST(GrantLog, PastItsRateItCountsAndSaysHowManyItLeftOut) {
  Lines lines;
  GrantLog log(lines.sink(), 2);
  for (int i = 0; i < 5; ++i) log.record(LeaseEvent::kExpiry, "k", kBob, 1, 0, false, 1'000);
  EXPECT_EQ(lines.all.size(), 2U);
  EXPECT_EQ(log.left_out(), 3U);
  log.record(LeaseEvent::kExpiry, "k", kBob, 2, 0, false, 2'000);  // the next second
  ASSERT_EQ(lines.all.size(), 4U);
  EXPECT_EQ(lines.all[2], "grant log: 3 events not logged (more than 2 a second)");
  EXPECT_EQ(lines.all[3].rfind("expiry key=k ", 0), 0U) << lines.all[3];
}

// What a shard records: a grant, a waiter's hand-off, a release, an expiry.
TEST(GrantLog, AShardRecordsGrantsHandOffsReleasesAndExpiries) {
  Lines lines;
  GrantLog log(lines.sink(), 100);
  ShardDriver driver(/*now_ms=*/1'000);
  driver.shard().set_grant_log(&log);
  const auto send = [&](const ClientId& client, MessageType type, std::uint64_t request_id,
                        std::uint64_t token, std::uint32_t wait_ms) {
    Message m;
    m.type = type;
    m.key = "k";
    m.ttl_ms = 500;
    m.wait_ms = wait_ms;
    m.token = token;
    m.request_id = request_id;
    return driver.send(client, m).reply;
  };
  const Message alice = send(kAlice, MessageType::kAcquire, 1, 0, 0);
  ASSERT_EQ(alice.type, MessageType::kGranted);
  (void)send(kBob, MessageType::kAcquire, 1, 0, 10'000);  // queued
  ASSERT_EQ(send(kAlice, MessageType::kRelease, 2, alice.token, 0).type, MessageType::kReleased);
  ASSERT_EQ(driver.take_deferred().size(), 1U);  // Bob's GRANTED
  driver.advance_to(driver.now() + 600);
  ASSERT_EQ(lines.all.size(), 4U);
  EXPECT_EQ(lines.all[0].rfind("grant key=k owner=00000000000000220000000000000011 token=", 0), 0U)
      << lines.all[0];
  EXPECT_NE(lines.all[0].find(" ttl_ms=500"), std::string::npos);
  EXPECT_EQ(lines.all[0].find("epoch="), std::string::npos) << "not in cluster mode";
  EXPECT_EQ(lines.all[1].rfind("release key=k ", 0), 0U) << lines.all[1];
  EXPECT_EQ(lines.all[2].rfind("handoff key=k owner=00000000000000440000000000000033", 0), 0U)
      << lines.all[2];
  EXPECT_EQ(lines.all[3].rfind("expiry key=k owner=00000000000000440000000000000033", 0), 0U)
      << lines.all[3];
}

}  // namespace
}  // namespace shardlock::lease::internal
