// A shard in cluster mode: every grant asks the ClusterGate first, tokens
// carry the epoch, and a key handed off refuses its waiters and renewals.
// Time and the gate are the test's.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "shardlock/lease/server/internal/cluster_gate.h"
#include "shardlock/lease/server/internal/shard.h"
#include "shardlock/lease/wire/epoch_token.h"
#include "shardlock/router.h"
#include "support/shard_driver.h"

namespace shardlock::lease::internal {
namespace {

constexpr ClientId kAlice{1, 1};
constexpr ClientId kBob{2, 2};

using shardlock::test_support::ShardDriver;
using Verdict = ClusterGate::Verdict;

// The shard, its clock and its deferred answers are the driver's
// (support/shard_driver.h); the fixture builds the gates and the requests.
class ShardGateTest : public ::testing::Test, public ShardDriver {
 protected:
  ShardGateTest() : ShardDriver(/*now_ms=*/1'000, ShardLimits{}, /*last_request_id=*/0) {
    Router router(RouterOptions{.bucket_bits = 8});
    const std::vector<Node> nodes = {Node{"a", 1}, Node{"b", 1}};
    EXPECT_EQ(router.assign(nodes), RouterStatus::kOk);
    routing_ = router.snapshot();
    // One key of each node's: "a" is this node.
    for (int i = 0; mine_.empty() || theirs_.empty(); ++i) {
      const std::string key = "key-" + std::to_string(i);
      (routing_->owner(key) == "a" ? mine_ : theirs_) = key;
    }
  }

  // A gate for epoch `epoch` where this node owns "a"'s buckets in `state`.
  // With `replicated`, "a"'s buckets have backups: the shard journals
  // their holders, and grants only before replica_deadline_.
  void gate(std::uint64_t epoch, std::uint8_t state = ClusterGate::kActive,
            std::uint64_t min_grant_epoch = 0, bool replicated = false) {
    auto g = std::make_shared<ClusterGate>();
    g->epoch = epoch;
    g->min_grant_epoch = min_grant_epoch;
    g->routing = routing_;
    g->buckets.assign(routing_->bucket_count(), ClusterGate::kForeign);
    for (std::size_t b = 0; b < routing_->bucket_count(); ++b) {
      if (routing_->nodes()[routing_->table()[b]].id == "a") g->buckets[b] = state;
    }
    g->lease_deadline = [this] { return deadline_; };
    if (replicated) {
      g->replicated.assign(routing_->bucket_count(), 0);
      for (std::size_t b = 0; b < routing_->bucket_count(); ++b) {
        g->replicated[b] = g->buckets[b] != ClusterGate::kForeign ? 1 : 0;
      }
      g->replica_deadline = [this](std::size_t) { return replica_deadline_; };
    }
    g->retry_after_ms = 33;
    shard_->set_gate(std::move(g));
  }

  Message send(const ClientId& client, MessageType type, const std::string& key,
               std::uint64_t token = 0, std::uint32_t wait = 0, std::uint64_t rid = 0,
               bool* answered = nullptr) {
    Message m;
    m.type = type;
    m.key = key;
    m.ttl_ms = 1000;
    m.wait_ms = wait;
    m.token = token;
    m.request_id = rid;
    Result r = ShardDriver::send(client, m);
    if (answered != nullptr) *answered = r.answered;
    r.reply.key = {};  // a view into `key`
    return r.reply;
  }

  std::shared_ptr<const RouterSnapshot> routing_;
  std::chrono::nanoseconds deadline_ = std::chrono::hours(1);
  std::chrono::nanoseconds replica_deadline_ = std::chrono::hours(1);
  std::string mine_;
  std::string theirs_;
};

TEST_F(ShardGateTest, AnotherNodesKeyIsRedirectedWithTheEpoch) {
  gate(7);
  const Message r = send(kAlice, MessageType::kAcquire, theirs_);
  EXPECT_EQ(r.type, MessageType::kRedirect);
  EXPECT_EQ(r.epoch, 7U);
  EXPECT_EQ(send(kAlice, MessageType::kQuery, theirs_).type, MessageType::kRedirect);
  EXPECT_EQ(shard_->leases(), 0U);
  EXPECT_EQ(shard_->counters()[static_cast<std::size_t>(StatCounter::kRedirects)], 2U);
}

TEST_F(ShardGateTest, OwnKeysAreGrantedWithTheEpochInTheHighHalf) {
  gate(7);
  const Message first = send(kAlice, MessageType::kAcquire, mine_);
  ASSERT_EQ(first.type, MessageType::kGranted);
  EXPECT_EQ(first.token, cluster::compose_token(7, 1));
  ASSERT_EQ(send(kAlice, MessageType::kRelease, mine_, first.token).type, MessageType::kReleased);
  EXPECT_EQ(send(kBob, MessageType::kAcquire, mine_).token, cluster::compose_token(7, 2));
}

TEST_F(ShardGateTest, ANewEpochStartsTheCounterAgainAboveEveryEarlierToken) {
  gate(7);
  std::uint64_t last = 0;
  for (int i = 0; i < 5; ++i) {
    const Message g = send(kAlice, MessageType::kAcquire, mine_);
    ASSERT_EQ(g.type, MessageType::kGranted);
    last = g.token;
    ASSERT_EQ(send(kAlice, MessageType::kRelease, mine_, g.token).type, MessageType::kReleased);
  }
  gate(9);
  const Message next = send(kBob, MessageType::kAcquire, mine_);
  ASSERT_EQ(next.type, MessageType::kGranted);
  EXPECT_EQ(next.token, cluster::compose_token(9, 1));
  EXPECT_GT(next.token, last);
}

TEST_F(ShardGateTest, AnInactiveBucketOrAnOldEpochOrADeadEtcdLeaseAnswersRecovering) {
  gate(7, ClusterGate::kOwned);
  Message r = send(kAlice, MessageType::kAcquire, mine_);
  EXPECT_EQ(r.type, MessageType::kRecovering);
  EXPECT_EQ(r.retry_after_ms, 33U);

  gate(7, ClusterGate::kActive, /*min_grant_epoch=*/8);
  EXPECT_EQ(send(kAlice, MessageType::kAcquire, mine_).type, MessageType::kRecovering);

  gate(8, ClusterGate::kActive, 8);
  deadline_ = std::chrono::milliseconds(now_);  // the etcd lease deadline is now: closed
  EXPECT_EQ(send(kAlice, MessageType::kAcquire, mine_).type, MessageType::kRecovering);
  deadline_ = std::chrono::milliseconds(now_ + 2);
  EXPECT_EQ(send(kAlice, MessageType::kAcquire, mine_).type, MessageType::kGranted);
  EXPECT_EQ(shard_->leases(), 1U);
}

TEST_F(ShardGateTest, AHandedOffKeyRefusesRenewButTakesRelease) {
  gate(7);
  const Message g = send(kAlice, MessageType::kAcquire, mine_);
  ASSERT_EQ(g.type, MessageType::kGranted);
  gate(8, ClusterGate::kForeign);  // the map moved every bucket away
  const Message renewed = send(kAlice, MessageType::kRenew, mine_, g.token);
  EXPECT_EQ(renewed.type, MessageType::kRedirect);
  EXPECT_EQ(renewed.epoch, 8U);
  // The lease is still counted until it ends...
  EXPECT_EQ(shard_->count_leases([&](std::string_view key) { return key == mine_; }), 1U);
  EXPECT_EQ(shard_->count_leases([](std::string_view) { return false; }), 0U);
  // ...and a release ends it early.
  EXPECT_EQ(send(kAlice, MessageType::kRelease, mine_, g.token).type, MessageType::kReleased);
  EXPECT_EQ(shard_->count_leases([](std::string_view) { return true; }), 0U);
}

TEST_F(ShardGateTest, WaitersOfAHandedOffKeyAreRedirectedNotGranted) {
  gate(7);
  const Message g = send(kAlice, MessageType::kAcquire, mine_);
  ASSERT_EQ(g.type, MessageType::kGranted);
  bool answered = true;
  (void)send(kBob, MessageType::kAcquire, mine_, 0, /*wait=*/5000, /*rid=*/77, &answered);
  ASSERT_FALSE(answered);  // queued
  gate(8, ClusterGate::kForeign);
  now_ += 1001;  // Alice's lease expires
  shard_->advance(now_, deferred_);
  ASSERT_EQ(deferred_.size(), 1U);
  EXPECT_EQ(deferred_[0].type, MessageType::kRedirect);
  EXPECT_EQ(deferred_[0].message().epoch, 8U);
  EXPECT_EQ(shard_->leases(), 0U);
  EXPECT_EQ(shard_->queued_waiters(), 0U);
  // Bob's retransmission learns the same, not "still queued".
  deferred_.clear();
  const Message again = send(kBob, MessageType::kAcquire, mine_, 0, 5000, 77, &answered);
  EXPECT_TRUE(answered);
  EXPECT_EQ(again.type, MessageType::kRedirect);
  EXPECT_EQ(again.epoch, 8U);
}

TEST_F(ShardGateTest, AWatchOfAKeyThatMovesIsRedirectedAtTheNextAdvance) {
  gate(7);
  EXPECT_EQ(send(kAlice, MessageType::kWatch, theirs_, 0, 5000).type, MessageType::kRedirect);
  bool answered = true;
  (void)send(kBob, MessageType::kWatch, mine_, 0, /*wait=*/5000, /*rid=*/78, &answered);
  ASSERT_FALSE(answered);  // parked: the key is free, as Bob saw it
  EXPECT_EQ(shard_->parked_watches(), 1U);
  gate(8, ClusterGate::kForeign);
  shard_->advance(now_ + 1, deferred_);  // the next tick
  ASSERT_EQ(deferred_.size(), 1U);
  EXPECT_EQ(deferred_[0].type, MessageType::kRedirect);
  EXPECT_EQ(deferred_[0].request_id, 78U);
  EXPECT_EQ(deferred_[0].message().epoch, 8U);
  EXPECT_EQ(shard_->parked_watches(), 0U);
}

TEST_F(ShardGateTest, AMultiKeyPartOfAnotherNodeIsRefusedByProbe) {
  gate(7);
  MultiAcquire m;
  m.client = kAlice;
  m.request_id = 1;
  m.ttl_ms = 1000;
  MultiAcquire::Part part;
  part.key = theirs_;
  part.hash = shard_->key_hash(theirs_);
  std::uint32_t ttl_left = 0;
  EXPECT_EQ(shard_->probe(m, part, now_, ttl_left, deferred_), Shard::PartState::kRedirect);
  part.key = mine_;
  part.hash = shard_->key_hash(mine_);
  EXPECT_EQ(shard_->probe(m, part, now_, ttl_left, deferred_), Shard::PartState::kFree);
  gate(7, ClusterGate::kOwned);
  EXPECT_EQ(shard_->probe(m, part, now_, ttl_left, deferred_), Shard::PartState::kNotReady);
}

TEST_F(ShardGateTest, WithoutAGateTokensAreTheBareCounter) {
  const Message g = send(kAlice, MessageType::kAcquire, theirs_);
  ASSERT_EQ(g.type, MessageType::kGranted);
  EXPECT_EQ(g.token, 1U);
}

// ---- Replication (docs/cluster.md, "Replication") --------------------------

TEST_F(ShardGateTest, AReplicatedBucketJournalsEveryHolderAddedAndDroppedInOrder) {
  gate(5, ClusterGate::kActive, 0, /*replicated=*/true);
  const Message granted = send(kAlice, MessageType::kAcquire, mine_);
  ASSERT_EQ(granted.type, MessageType::kGranted);
  // Bob queues behind Alice and is handed the key when she releases.
  bool answered = true;
  (void)send(kBob, MessageType::kAcquire, mine_, 0, 5000, 0, &answered);
  EXPECT_FALSE(answered);
  ASSERT_EQ(send(kAlice, MessageType::kRelease, mine_, granted.token).type, MessageType::kReleased);
  ASSERT_EQ(deferred_.size(), 1U);
  const std::uint64_t bobs = deferred_[0].token;
  // Renewals are not journaled; expiry is.
  ASSERT_EQ(send(kBob, MessageType::kRenew, mine_, bobs).type, MessageType::kRenewed);
  now_ += 2'000;
  shard_->advance(now_, deferred_);

  std::vector<replication::Entry> journal;
  shard_->take_journal(journal);
  ASSERT_EQ(journal.size(), 4U);
  const std::uint32_t bucket = static_cast<std::uint32_t>(shard_->gate()->bucket_of(mine_));
  EXPECT_EQ(journal[0].kind, replication::EntryKind::kGrant);
  EXPECT_EQ(journal[0].owner, kAlice);
  EXPECT_EQ(journal[0].token, granted.token);
  EXPECT_EQ(journal[0].bucket, bucket);
  EXPECT_EQ(journal[0].key, mine_);
  EXPECT_EQ(journal[0].ttl_ms, 1000U);
  EXPECT_EQ(journal[1].kind, replication::EntryKind::kRelease);
  EXPECT_EQ(journal[1].token, granted.token);
  EXPECT_EQ(journal[2].kind, replication::EntryKind::kGrant);
  EXPECT_EQ(journal[2].owner, kBob);
  EXPECT_EQ(journal[2].token, bobs);
  EXPECT_EQ(journal[3].kind, replication::EntryKind::kRelease);
  EXPECT_EQ(journal[3].owner, kBob);
  journal.clear();
  shard_->take_journal(journal);
  EXPECT_TRUE(journal.empty());
}

// An exclusive holder acquiring its key again (a contender, not a
// second grant) journals nothing, so a backup knows one holder: the first
// grant's. Before the owner contract the new grant replaced the old token, and the
// journal had to end the old holder first, or a backup kept both and its
// takeover installed the old one and refused the live one.
TEST_F(ShardGateTest, TheExclusiveHolderAcquiringAgainIsBusyAndJournalsNothing) {
  gate(5, ClusterGate::kActive, 0, /*replicated=*/true);
  const Message first = send(kAlice, MessageType::kAcquire, mine_);
  ASSERT_EQ(first.type, MessageType::kGranted);
  const Message again = send(kAlice, MessageType::kAcquire, mine_);
  EXPECT_EQ(again.type, MessageType::kBusy);
  std::vector<replication::Entry> journal;
  shard_->take_journal(journal);
  ASSERT_EQ(journal.size(), 1U);
  EXPECT_EQ(journal[0].kind, replication::EntryKind::kGrant);
  EXPECT_EQ(journal[0].token, first.token);
  replication::BackupStream backup(replication::StreamTiming{}, 0);
  (void)backup.on_replicate(replication::ReplicateHeader{1, 5, 1, 0}, journal, 0);
  const auto holders = backup.bucket_holders(journal[0].bucket);
  ASSERT_EQ(holders.size(), 1U);
  EXPECT_EQ(holders[0].second.token, first.token);
}

// The holder's value goes to the backups with its grant, in the
// journal and in a snapshot alike.
TEST_F(ShardGateTest, AHolderValueIsJournaledAndSnapshotted) {
  gate(5, ClusterGate::kActive, 0, /*replicated=*/true);
  Message m;
  m.type = MessageType::kAcquire;
  m.key = mine_;
  m.ttl_ms = 1000;
  m.request_id = 1;
  m.value = "10.0.0.7:5432";
  Message reply;
  ASSERT_TRUE(shard_->handle(kAlice, Peer{}, m, now_, reply, deferred_));
  ASSERT_EQ(reply.type, MessageType::kGranted);
  std::vector<replication::Entry> journal;
  shard_->take_journal(journal);
  ASSERT_EQ(journal.size(), 1U);
  EXPECT_EQ(journal[0].value, "10.0.0.7:5432");
  std::vector<replication::Entry> snapshot;
  EXPECT_TRUE(shard_->snapshot_all(snapshot));
  ASSERT_EQ(snapshot.size(), 1U);
  EXPECT_EQ(snapshot[0].value, "10.0.0.7:5432");
  EXPECT_EQ(snapshot[0].token, reply.token);
}

TEST_F(ShardGateTest, AnUnreplicatedBucketJournalsNothing) {
  gate(5);
  const Message granted = send(kAlice, MessageType::kAcquire, mine_);
  ASSERT_EQ(granted.type, MessageType::kGranted);
  std::vector<replication::Entry> journal;
  shard_->take_journal(journal);
  EXPECT_TRUE(journal.empty());
}

TEST_F(ShardGateTest, PastThePrimaryLeaseAReplicatedKeyIsNeitherGrantedNorRenewed) {
  gate(5, ClusterGate::kActive, 0, /*replicated=*/true);
  const Message granted = send(kAlice, MessageType::kAcquire, mine_);
  ASSERT_EQ(granted.type, MessageType::kGranted);
  replica_deadline_ = std::chrono::milliseconds(now_);  // the backups' lease ran out
  EXPECT_EQ(send(kAlice, MessageType::kRenew, mine_, granted.token).type, MessageType::kRecovering);
  EXPECT_EQ(send(kBob, MessageType::kAcquire, mine_).type, MessageType::kRecovering);
  // RELEASE is never gated.
  EXPECT_EQ(send(kAlice, MessageType::kRelease, mine_, granted.token).type, MessageType::kReleased);
  replica_deadline_ = std::chrono::hours(1);
  EXPECT_EQ(send(kBob, MessageType::kAcquire, mine_).type, MessageType::kGranted);
}

// A replicated grant's first answer may have been dropped unsent (its
// backups changed, Replicator::set_layout()), so its retransmission is
// answered from the dedup cache only while the bucket may be granted here.
// Before, a partitioned primary answered it after a backup that never had
// the grant took the key over (the replication end-to-end partition test found two holders).
TEST_F(ShardGateTest, AGrantsRetransmissionIsAnsweredOnlyWhileTheKeyIsGrantableHere) {
  gate(5, ClusterGate::kActive, 0, /*replicated=*/true);
  const Message granted = send(kAlice, MessageType::kAcquire, mine_, 0, 0, 77);
  ASSERT_EQ(granted.type, MessageType::kGranted);
  replica_deadline_ = std::chrono::milliseconds(now_);  // the backups' lease ran out
  EXPECT_EQ(send(kAlice, MessageType::kAcquire, mine_, 0, 0, 77).type, MessageType::kRecovering);
  gate(6, ClusterGate::kForeign, 0, /*replicated=*/true);  // the key moved away
  EXPECT_EQ(send(kAlice, MessageType::kAcquire, mine_, 0, 0, 77).type, MessageType::kRedirect);
  gate(7, ClusterGate::kActive, 0, /*replicated=*/true);
  replica_deadline_ = std::chrono::hours(1);
  const Message again = send(kAlice, MessageType::kAcquire, mine_, 0, 0, 77);
  EXPECT_EQ(again.type, MessageType::kGranted);
  EXPECT_EQ(again.token, granted.token);
  // Unreplicated too: a key that moved away is the new owner's to answer.
  gate(8, ClusterGate::kForeign);
  EXPECT_EQ(send(kAlice, MessageType::kAcquire, mine_, 0, 0, 77).type, MessageType::kRedirect);
}

// An ACQUIRE refused while its bucket is not active yet is asked again
// under a fresh request id (every client rides through so). A copy of the
// refused one still in flight when the bucket goes active must get the
// refusal again, not a grant: that grant would reach no call and keep the
// key for its TTL, and the client's next request (the same owner) would
// wait behind it until TIMEOUT (the e2e return test, seen in CI).
TEST_F(ShardGateTest, ALateCopyOfARefusedAcquireIsRefusedAgainAndTakesNothing) {
  gate(5, ClusterGate::kOwned);  // owned, not active yet
  EXPECT_EQ(send(kAlice, MessageType::kAcquire, mine_, 0, 0, 41).type, MessageType::kRecovering);
  gate(6);  // active
  EXPECT_EQ(send(kAlice, MessageType::kAcquire, mine_, 0, 0, 41).type, MessageType::kRecovering);
  const Message granted = send(kAlice, MessageType::kAcquire, mine_, 0, 0, 42);
  ASSERT_EQ(granted.type, MessageType::kGranted);
  ASSERT_EQ(send(kAlice, MessageType::kRelease, mine_, granted.token).type, MessageType::kReleased);
  // A REDIRECT likewise.
  gate(7, ClusterGate::kForeign);
  EXPECT_EQ(send(kBob, MessageType::kAcquire, mine_, 0, 0, 43).type, MessageType::kRedirect);
  gate(8);
  EXPECT_EQ(send(kBob, MessageType::kAcquire, mine_, 0, 0, 43).type, MessageType::kRedirect);
  EXPECT_EQ(send(kBob, MessageType::kAcquire, mine_, 0, 0, 44).type, MessageType::kGranted);
}

TEST_F(ShardGateTest, ASnapshotListsEveryHolderOfTheBucket) {
  gate(5, ClusterGate::kActive, 0, /*replicated=*/true);
  const Message a = send(kAlice, MessageType::kAcquireShared, mine_);
  const Message b = send(kBob, MessageType::kAcquireShared, mine_);
  ASSERT_EQ(b.type, MessageType::kGranted);
  const Message other = send(kAlice, MessageType::kAcquire, mine_ + "/other");
  std::vector<replication::Entry> snapshot;
  EXPECT_TRUE(shard_->snapshot_all(snapshot));
  const std::size_t bucket = shard_->gate()->bucket_of(mine_);
  std::vector<replication::Entry> of_bucket;
  for (const replication::Entry& e : snapshot) {
    EXPECT_EQ(e.bucket, shard_->gate()->bucket_of(e.key));
    if (e.key == mine_) of_bucket.push_back(e);
  }
  ASSERT_EQ(of_bucket.size(), 2U);
  EXPECT_EQ(of_bucket[0].bucket, bucket);
  EXPECT_EQ(of_bucket[0].token, a.token);
  EXPECT_EQ(of_bucket[0].mode, LeaseMode::kShared);
  EXPECT_EQ(of_bucket[1].token, b.token);
  EXPECT_EQ(snapshot.size(), other.type == MessageType::kGranted ? 3U : 2U);
}

// A node that registers again after an eviction publishes a closed gate
// (no routing) until its buckets are active again, and keeps its holders
// meanwhile. A snapshot taken then (to a backup of the next map) must still
// list them: one listing none made the backup count the bucket caught up
// and empty, and it took the bucket over without a live holder (simulation
// seed 8106: two holders).
TEST_F(ShardGateTest, ASnapshotUnderAClosedGateStillListsEveryHolder) {
  gate(5, ClusterGate::kActive, 0, /*replicated=*/true);
  const Message a = send(kAlice, MessageType::kAcquire, mine_);
  ASSERT_EQ(a.type, MessageType::kGranted);
  const std::size_t bucket = shard_->gate()->bucket_of(mine_);
  shard_->set_gate(ClusterGate::closed());
  std::vector<replication::Entry> snapshot;
  EXPECT_TRUE(shard_->snapshot_all(snapshot));
  ASSERT_EQ(snapshot.size(), 1U);
  EXPECT_EQ(snapshot[0].key, mine_);
  EXPECT_EQ(snapshot[0].bucket, bucket);
  EXPECT_EQ(snapshot[0].token, a.token);
  // A shard that never had a routing has no holders to list, and says so.
  Shard fresh(1, ShardLimits{}, ShardTokens{}, now_);
  fresh.set_gate(ClusterGate::closed());
  snapshot.clear();
  EXPECT_TRUE(fresh.snapshot_all(snapshot));
  EXPECT_TRUE(snapshot.empty());
}

TEST_F(ShardGateTest, AnInheritedHolderKeepsItsTokenAnswersItsRetransmissionAndRenews) {
  gate(9, ClusterGate::kActive, 0, /*replicated=*/true);
  const replication::ReplicaHolder inherited{
      kAlice, cluster::compose_token(8, 3), 77, LeaseMode::kExclusive, 0, 1000, "primary-a:80"};
  ASSERT_TRUE(shard_->inherit(mine_, inherited, now_ + 5'000));
  {
    // Its value came along.
    Message q;
    q.type = MessageType::kQueryHolders;
    q.key = mine_;
    q.request_id = 900;
    HolderPage page{.room = kMaxDatagramSize, .entries = {}};
    Message r;
    ASSERT_TRUE(shard_->handle(kBob, Peer{}, q, now_, r, deferred_, kMaxDatagramSize, &page));
    ASSERT_EQ(r.holder_list_count, 1u);
    EXPECT_EQ(HolderList(r).begin()->value, "primary-a:80");
    EXPECT_EQ(HolderList(r).begin()->token, inherited.token);
  }
  // The ACQUIRE the old primary granted, retransmitted: the same grant.
  const Message again = send(kAlice, MessageType::kAcquire, mine_, 0, 0, 77);
  ASSERT_EQ(again.type, MessageType::kGranted);
  EXPECT_EQ(again.token, inherited.token);
  EXPECT_GT(again.ttl_ms, 4'000U);  // the takeover's expiry, not the TTL asked
  // Others are busy; the holder renews and releases with its token.
  EXPECT_EQ(send(kBob, MessageType::kAcquire, mine_).type, MessageType::kBusy);
  EXPECT_EQ(send(kAlice, MessageType::kRenew, mine_, inherited.token).type, MessageType::kRenewed);
  // A replica never holds an exclusive lease beside another: refused.
  EXPECT_FALSE(shard_->inherit(
      mine_,
      replication::ReplicaHolder{kBob, inherited.token + 1, 5, LeaseMode::kExclusive, 0, 1, ""},
      now_ + 5'000));
  EXPECT_EQ(send(kAlice, MessageType::kRelease, mine_, inherited.token).type,
            MessageType::kReleased);
  // New grants are above every inherited token: the new epoch.
  const Message next = send(kBob, MessageType::kAcquire, mine_);
  ASSERT_EQ(next.type, MessageType::kGranted);
  EXPECT_GT(next.token, inherited.token);
}

TEST_F(ShardGateTest, AnInheritedHolderExpiresAtTheTakeoversDeadline) {
  gate(9, ClusterGate::kActive, 0, /*replicated=*/true);
  ASSERT_TRUE(shard_->inherit(
      mine_, replication::ReplicaHolder{kAlice, 5, 1, LeaseMode::kExclusive, 0, 1000, ""},
      now_ + 3'000));
  now_ += 2'999;
  shard_->advance(now_, deferred_);
  EXPECT_EQ(send(kBob, MessageType::kAcquire, mine_).type, MessageType::kBusy);
  now_ += 2;
  shard_->advance(now_, deferred_);
  EXPECT_EQ(send(kBob, MessageType::kAcquire, mine_).type, MessageType::kGranted);
}

}  // namespace
}  // namespace shardlock::lease::internal
