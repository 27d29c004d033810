// Leader election against a real LeaseServer on loopback: one leader at a
// time, terms rising, observers seeing every change in order, resign and a
// lost leadership's callback.
#include "shardlock/lease/client/election.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "poll_until.h"
#include "shardlock/lease/server/server.h"
#include "support/loopback_server.h"

namespace shardlock::lease {
namespace {

using namespace std::chrono_literals;
using shardlock::test_support::poll_until;

class ElectionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = shardlock::test_support::start_loopback_server();
    ASSERT_TRUE(server_);
  }
  std::unique_ptr<LeaseClient> client(std::optional<ClientId> id = std::nullopt) {
    LeaseClientOptions options;
    options.nodes = {"127.0.0.1:" + std::to_string(server_->port())};
    options.client_id = id;
    auto c = std::make_unique<LeaseClient>(options);
    EXPECT_FALSE(c->start());
    return c;
  }
  std::unique_ptr<LeaseServer> server_;
};

TEST_F(ElectionTest, TwoCampaignersAndAnObserverSeeOneLeaderAtATimeInTermOrder) {
  auto ca = client();
  auto cb = client();
  auto co = client();
  LeaderObserver observer(*co, "sched");
  const auto none = observer.next(5s);
  ASSERT_TRUE(none);
  EXPECT_FALSE(none->leader);

  Election a(*ca, "sched");
  Election b(*cb, "sched");
  ASSERT_FALSE(a.campaign("host-a:1"));
  EXPECT_TRUE(a.leading());
  const auto first = observer.next(5s);
  ASSERT_TRUE(first && first->leader);
  EXPECT_EQ(first->leader->value, "host-a:1");
  EXPECT_EQ(first->leader->term, a.term());
  EXPECT_EQ(first->leader->owner, a.owner());
  EXPECT_EQ(owner_client(a.owner()), owner_client(ca->client_id()));

  std::atomic<bool> b_elected{false};
  std::thread campaigner([&] {
    EXPECT_FALSE(b.campaign("host-b:2"));
    b_elected = true;
  });
  ASSERT_TRUE(poll_until([&] { return ca->query("sched").waiters == 1; }, 5s));
  EXPECT_FALSE(b_elected.load());
  EXPECT_FALSE(b.leading());
  const std::uint64_t a_term = a.term();
  EXPECT_FALSE(a.resign());
  campaigner.join();
  EXPECT_TRUE(b.leading());
  EXPECT_FALSE(a.leading());
  EXPECT_GT(b.term(), a_term);

  // The hand-off went straight from A to B: the observer's next change is
  // B (possibly after a "none" if its watch re-armed in between).
  std::optional<LeaderChange> change;
  for (int i = 0; i < 2; ++i) {
    change = observer.next(5s);
    ASSERT_TRUE(change);
    if (change->leader) break;
  }
  ASSERT_TRUE(change->leader);
  EXPECT_EQ(change->leader->value, "host-b:2");
  EXPECT_EQ(change->leader->term, b.term());
  const auto leader = a.leader();
  ASSERT_TRUE(leader);
  EXPECT_EQ(leader->value, "host-b:2");
  EXPECT_FALSE(observer.next(300ms)) << "renewals are no change of leader";
}

TEST_F(ElectionTest, ACampaignWaitsItsWaitAndASecondCampaignWhileLeadingIsBusy) {
  auto ca = client();
  auto cb = client();
  Election a(*ca, "job");
  Election b(*cb, "job");
  ASSERT_FALSE(a.campaign("a"));
  EXPECT_EQ(a.campaign("a"), LeaseErrc::kBusy);
  EXPECT_EQ(b.campaign("b", 200ms), LeaseErrc::kTimeout);
  EXPECT_FALSE(b.leading());
  EXPECT_EQ(b.term(), 0u);
  EXPECT_EQ(b.resign(), LeaseErrc::kLeaseInactive);
  Election bad(*cb, "job");
  EXPECT_EQ(bad.campaign(std::string(kMaxHolderValueLength + 1, 'x'), 0ms),
            LeaseErrc::kBadArgument);
}

TEST_F(ElectionTest, ALostLeadershipCallsBackOnceAndTheNextCampaignerIsElected) {
  auto ca = client();
  auto cb = client();
  ElectionOptions options;
  options.ttl = 600ms;
  Election a(*ca, "svc", options);
  std::atomic<int> lost{0};
  a.on_lost([&](const LeaseLost& l) {
    EXPECT_TRUE(l.refused_by_server);
    lost.fetch_add(1);
  });
  ASSERT_FALSE(a.campaign("a"));
  const std::uint64_t term = a.term();
  // Someone with A's identity ends the lease at the server (as
  // `shardlockctl release --owner` can): A's next renewal is refused.
  auto impostor = client(a.owner());
  EXPECT_FALSE(impostor->release("svc", term).error);
  ASSERT_TRUE(poll_until([&] { return lost.load() == 1; }, 5s));
  EXPECT_FALSE(a.leading());
  Election b(*cb, "svc", options);
  ASSERT_FALSE(b.campaign("b", 5s));
  EXPECT_GT(b.term(), term);
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(lost.load(), 1);
}

TEST_F(ElectionTest, ACampaignThatWaitsLongerThanTheTtlIsElected) {
  auto ca = client();
  auto cb = client();
  ElectionOptions options;
  options.ttl = 300ms;
  Election a(*ca, "long", options);
  Election b(*cb, "long", options);
  ASSERT_FALSE(a.campaign("a"));
  std::thread resign_later([&] {
    std::this_thread::sleep_for(800ms);  // renewed by the watchdog meanwhile
    EXPECT_FALSE(a.resign());
  });
  EXPECT_FALSE(b.campaign("b", 5s));
  resign_later.join();
  EXPECT_TRUE(b.leading());
  EXPECT_GT(b.term(), 0u);
}

}  // namespace
}  // namespace shardlock::lease
