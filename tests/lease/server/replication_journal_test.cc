// ReplicationJournal: the entries of holders in replicated buckets, in the
// order they changed, moved out by take(); a loss drops them all for the
// caller to resend snapshots.
#include "shardlock/lease/server/internal/replication_journal.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "shardlock/router.h"

namespace shardlock::lease::internal {
namespace {

class ReplicationJournalTest : public ::testing::Test {
 protected:
  ReplicationJournalTest() {
    Router router(RouterOptions{.bucket_bits = 8});
    const std::vector<Node> nodes = {Node{"a", 1}, Node{"b", 1}};
    EXPECT_EQ(router.assign(nodes), RouterStatus::kOk);
    gate_.routing = router.snapshot();
    gate_.buckets.assign(gate_.routing->bucket_count(), ClusterGate::kActive);
    gate_.replicated.assign(gate_.routing->bucket_count(), 0);
    // Two keys: one in a replicated bucket, one not.
    for (int i = 0; replicated_key_.empty() || plain_key_.empty(); ++i) {
      const std::string key = "key-" + std::to_string(i);
      const std::size_t bucket = gate_.bucket_of(key);
      if (replicated_key_.empty()) {
        replicated_key_ = key;
        gate_.replicated[bucket] = 1;
      } else if (!gate_.replicated_bucket(bucket)) {
        plain_key_ = key;
      }
    }
  }

  JournaledHolder holder(const std::string& key, std::uint64_t token) const {
    return JournaledHolder{.key = key,
                           .owner = ClientId{3, 4},
                           .token = token,
                           .request_id = 17,
                           .mode = LeaseMode::kPermit,
                           .permits = 5,
                           .value = "v"};
  }

  ClusterGate gate_;
  std::string replicated_key_;
  std::string plain_key_;
  ReplicationJournal journal_;
};

TEST_F(ReplicationJournalTest, ReplicatesOnlyUnderAGateWithReplicatedBucketsAndRouting) {
  EXPECT_FALSE(ReplicationJournal::replicates(nullptr));
  EXPECT_TRUE(ReplicationJournal::replicates(&gate_));
  ClusterGate closed = gate_;
  closed.routing = nullptr;
  EXPECT_FALSE(ReplicationJournal::replicates(&closed));
  ClusterGate plain = gate_;
  plain.replicated.clear();
  EXPECT_FALSE(ReplicationJournal::replicates(&plain));
}

TEST_F(ReplicationJournalTest, RecordsHoldersOfReplicatedBucketsInOrder) {
  EXPECT_FALSE(journal_.pending());
  EXPECT_TRUE(journal_.record(gate_, replication::EntryKind::kGrant, holder(replicated_key_, 1),
                              /*ttl_ms=*/900));
  EXPECT_TRUE(journal_.record(gate_, replication::EntryKind::kGrant, holder(plain_key_, 2), 900));
  EXPECT_TRUE(
      journal_.record(gate_, replication::EntryKind::kRelease, holder(replicated_key_, 1), 0));
  EXPECT_TRUE(journal_.pending());
  EXPECT_FALSE(journal_.lost());

  std::vector<replication::Entry> out;
  journal_.take(out);
  ASSERT_EQ(out.size(), 2U);  // the unreplicated bucket's holder is not journaled
  EXPECT_EQ(out[0].kind, replication::EntryKind::kGrant);
  EXPECT_EQ(out[0].key, replicated_key_);
  EXPECT_EQ(out[0].bucket, gate_.bucket_of(replicated_key_));
  EXPECT_EQ(out[0].ttl_ms, 900U);
  EXPECT_EQ(out[1].kind, replication::EntryKind::kRelease);
  EXPECT_FALSE(journal_.pending());
  journal_.take(out);
  EXPECT_EQ(out.size(), 2U);  // nothing more
}

TEST_F(ReplicationJournalTest, AGrantEntryCarriesTheGrantAReleaseOnlyWhoAndWhich) {
  const replication::Entry grant =
      ReplicationJournal::entry(replication::EntryKind::kGrant, 7, holder("k", 9), 500);
  EXPECT_EQ(grant.bucket, 7U);
  EXPECT_EQ(grant.key, "k");
  EXPECT_EQ(grant.owner, (ClientId{3, 4}));
  EXPECT_EQ(grant.token, 9U);
  EXPECT_EQ(grant.request_id, 17U);
  EXPECT_EQ(grant.mode, LeaseMode::kPermit);
  EXPECT_EQ(grant.permits, 5U);
  EXPECT_EQ(grant.ttl_ms, 500U);
  EXPECT_EQ(grant.value, "v");
  const replication::Entry release =
      ReplicationJournal::entry(replication::EntryKind::kRelease, 7, holder("k", 9), 500);
  EXPECT_EQ(release.token, 9U);
  EXPECT_EQ(release.owner, (ClientId{3, 4}));
  EXPECT_EQ(release.request_id, 0U);
  EXPECT_EQ(release.ttl_ms, 0U);
  EXPECT_TRUE(release.value.empty());
}

}  // namespace
}  // namespace shardlock::lease::internal
