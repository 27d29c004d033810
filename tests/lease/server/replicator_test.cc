// One node's replication streams (server/replicator.h): two Replicators, a
// primary and its backup, exchanging real datagrams by hand, with an
// injected clock.
#include "server/replicator.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lease/server/test_peer.h"

namespace shardlock::lease::internal {
namespace {

// (buckets caught up, buckets backed up)
std::pair<std::size_t, std::size_t> caught_up_of(const Replicator& r) {
  const ReplicaProgress p = r.progress();
  return {p.caught_up, p.backed};
}

using replication::Entry;
using replication::EntryKind;

constexpr std::int64_t kMs = 1'000'000;
constexpr std::uint32_t kBucket = 3;

Peer loopback(std::uint16_t port) { return test_support::peer_on_port(port); }

Entry grant(std::string key, std::uint64_t token) {
  Entry e;
  e.kind = EntryKind::kGrant;
  e.bucket = kBucket;
  e.key = std::move(key);
  e.owner = ClientId{1, 2};
  e.token = token;
  e.request_id = 10;
  e.ttl_ms = 2000;
  return e;
}

ReplicatorOptions options(std::optional<AuthKey> key = std::nullopt) {
  ReplicatorOptions o;
  o.auth_key = key;
  return o;
}

// Moves datagrams between `nodes` (each a replicator and its port) until
// none is left, starting with `wire` as sent by the node on port `from`;
// returns what is for none of them (released client replies).
std::vector<OutDatagram> shuttle(const std::vector<std::pair<Replicator*, std::uint16_t>>& nodes,
                                 std::uint16_t from, const std::vector<OutDatagram>& wire,
                                 std::int64_t now) {
  std::vector<OutDatagram> clients;
  std::vector<std::pair<std::uint16_t, OutDatagram>> in_flight;
  for (const OutDatagram& d : wire) in_flight.emplace_back(from, d);
  while (!in_flight.empty()) {
    std::vector<std::pair<std::uint16_t, OutDatagram>> next;
    for (const auto& [sender, d] : in_flight) {
      const std::uint16_t port = ntohs(d.peer.addr.v4.sin_port);
      const auto node = std::find_if(nodes.begin(), nodes.end(),
                                     [port](const auto& n) { return n.second == port; });
      if (node == nodes.end()) {
        clients.push_back(d);
        continue;
      }
      std::vector<OutDatagram> out;
      EXPECT_TRUE(node->first->on_datagram({d.bytes.data(), d.length},
                                           test_support::peer_on_port(sender), now, out));
      for (const OutDatagram& o : out) next.emplace_back(port, o);
    }
    in_flight = std::move(next);
  }
  return clients;
}

// ReplicatorTest::through_refusal() for any primary (port 1001) and backup
// (port 1002).
std::vector<OutDatagram> through_refusal_of(Replicator& primary, Replicator& backup,
                                            const std::vector<OutDatagram>& wire,
                                            std::int64_t now) {
  std::vector<OutDatagram> refusals;
  for (const OutDatagram& d : wire) {
    EXPECT_TRUE(backup.on_datagram({d.bytes.data(), d.length}, loopback(1001), now, refusals));
  }
  std::vector<OutDatagram> readdressed;
  for (const OutDatagram& d : refusals) {
    EXPECT_TRUE(primary.on_datagram({d.bytes.data(), d.length}, loopback(1002), now, readdressed));
  }
  return readdressed;
}

OutDatagram reply_datagram(std::uint8_t marker) {
  OutDatagram d;
  d.peer = loopback(9999);
  d.length = 1;
  d.bytes[0] = marker;
  return d;
}

class ReplicatorTest : public ::testing::Test {
 protected:
  ReplicatorTest() : ReplicatorTest(options()) {}
  explicit ReplicatorTest(const ReplicatorOptions& primary)
      : a_(primary, 0), b_(std::make_unique<Replicator>(options(), 0)) {}

  // Node "a" (port 1001) is the primary of kBucket and "b" (port 1002) its
  // backup, in both nodes' layouts.
  // A primary's layout: `backup` (on `port`) backs kBucket up.
  static ReplicaLayout primary_layout(std::uint64_t epoch, const std::string& backup,
                                      std::uint16_t port, const std::string& self = "a") {
    ReplicaLayout l;
    l.self_id = self;
    l.epoch = epoch;
    l.peers = {ReplicaPeer{backup, loopback(port)}};
    l.backups.resize(8);
    l.backups[kBucket] = {0};
    return l;
  }

  void both_layouts() {
    const auto snapshots = a_.set_layout(primary_layout(4, "b", 1002), now_);
    ASSERT_EQ(snapshots.size(), 1U);
    EXPECT_EQ(snapshots[0], std::make_pair(std::uint16_t{0}, kBucket));
    a_.begin_snapshot(0, kBucket);
    a_.end_snapshot(0, kBucket);

    EXPECT_TRUE(b_->set_layout(backup_layout(4), now_).empty());
  }

  // The backup's layout: "b" backs kBucket up for "a".
  static ReplicaLayout backup_layout(std::uint64_t epoch) {
    ReplicaLayout lb;
    lb.self_id = "b";
    lb.epoch = epoch;
    lb.peers = {ReplicaPeer{"a", loopback(1001)}};
    lb.backing.assign(8, ReplicaLayout::kNone);
    lb.backing[kBucket] = 0;
    return lb;
  }

  // The backup's layout once a map dropped "a": "b" backs nothing up.
  static ReplicaLayout layout_without_a(std::uint64_t epoch) {
    ReplicaLayout lb;
    lb.self_id = "b";
    lb.epoch = epoch;
    lb.backing.assign(8, ReplicaLayout::kNone);
    return lb;
  }

  // Moves every datagram between the two until none is left; what is for
  // neither (released client replies) is returned.
  std::vector<OutDatagram> exchange(std::vector<OutDatagram> wire) {
    std::vector<OutDatagram> clients;
    while (!wire.empty()) {
      std::vector<OutDatagram> next;
      for (const OutDatagram& d : wire) {
        const std::uint16_t port = ntohs(d.peer.addr.v4.sin_port);
        const std::span<const std::uint8_t> bytes(d.bytes.data(), d.length);
        if (port == 1002) {
          EXPECT_TRUE(b_->on_datagram(bytes, loopback(1001), now_, next));
        } else if (port == 1001) {
          EXPECT_TRUE(a_.on_datagram(bytes, loopback(1002), now_, next));
        } else {
          clients.push_back(d);
        }
      }
      wire = std::move(next);
    }
    return clients;
  }

  std::vector<OutDatagram> poll_a() {
    std::vector<OutDatagram> out;
    a_.poll(now_, out);
    return out;
  }
  // A stream's first datagrams are addressed to no process of "b" ("a"
  // has not heard from it): hands `wire` (from "a") to "b", which refuses
  // it, and its refusals to "a", which then addresses the stream to b's
  // process. Returns what "a" sends then: `wire` as addressed to "b".
  // "a" has a stream to start over: it does, with a snapshot holding "k"
  // (token 41), and hands it to "b".
  void restart_with_snapshot_of_k() {
    ASSERT_TRUE(a_.restart_pending());
    ASSERT_EQ(a_.restart_streams().size(), 1U);
    a_.begin_snapshot(0, kBucket);
    a_.append_snapshot(0, std::vector{grant("k", 41)});
    a_.end_snapshot(0, kBucket);
    (void)exchange(poll_a());
  }
  std::vector<OutDatagram> through_refusal(const std::vector<OutDatagram>& wire) {
    return through_refusal_of(a_, *b_, wire, now_);
  }
  std::vector<OutDatagram> poll_b() {
    std::vector<OutDatagram> out;
    b_->poll(now_, out);
    return out;
  }

  Replicator a_;
  std::unique_ptr<Replicator> b_;  // replaced when "b" restarts
  std::int64_t now_ = 1000 * kMs;
};

TEST_F(ReplicatorTest, AGrantsAnswerLeavesOnlyOnceTheBackupHasIt) {
  both_layouts();
  a_.route(std::vector{grant("k", 41)});
  OutDatagram reply = reply_datagram(0x77);
  ASSERT_TRUE(a_.hold(reply));
  EXPECT_EQ(a_.held(), 1U);
  const std::vector<OutDatagram> released = exchange(poll_a());
  ASSERT_EQ(released.size(), 1U);
  EXPECT_EQ(released[0].bytes[0], 0x77);
  EXPECT_EQ(a_.held(), 0U);
  // The primary holds a lease for the bucket now; none for others.
  EXPECT_GT(a_.lease_until(kBucket).count(), now_);
  // A bucket without a backup in the layout has no primary lease: in the
  // window between a map's layout and its gate, the old gate would grant
  // without a replica if it read "forever" here.
  EXPECT_EQ(a_.lease_until(kBucket + 1).count(), std::numeric_limits<std::int64_t>::min());
  EXPECT_EQ(a_.lease_until(1'000'000).count(), std::numeric_limits<std::int64_t>::min());
  // Nothing outstanding: a reply goes at once.
  OutDatagram plain = reply_datagram(1);
  EXPECT_FALSE(a_.hold(plain));
}

// A reply waits only for the backups of its own buckets: a backup that is
// silent (cut off, slow, stuck) holds back the answers for the buckets it
// backs up, not every answer of its primary. Before, hold() waited for
// every stream with anything unacknowledged, so one silent backup held
// every reply of the node.
TEST_F(ReplicatorTest, AReplyWaitsOnlyForTheBackupsOfItsOwnBuckets) {
  constexpr std::uint32_t kOther = 5;  // backed up by "c", which never answers
  ReplicaLayout l = primary_layout(4, "b", 1002);
  l.peers.push_back(ReplicaPeer{"c", loopback(1003)});
  l.backups[kOther] = {1};
  const auto snapshots = a_.set_layout(l, now_);
  ASSERT_EQ(snapshots.size(), 2U);
  for (const auto& [peer, bucket] : snapshots) {
    a_.begin_snapshot(peer, bucket);
    a_.end_snapshot(peer, bucket);
  }
  EXPECT_TRUE(b_->set_layout(backup_layout(4), now_).empty());
  Entry other = grant("o", 40);
  other.bucket = kOther;
  a_.route(std::vector{other, grant("k", 41)});

  OutDatagram mine = reply_datagram(0x77);     // for kBucket
  OutDatagram theirs = reply_datagram(0x78);   // for kOther
  OutDatagram unknown = reply_datagram(0x79);  // buckets unknown: every stream
  ASSERT_TRUE(a_.hold(mine, std::vector<std::uint32_t>{kBucket}));
  ASSERT_TRUE(a_.hold(theirs, std::vector<std::uint32_t>{kOther}));
  ASSERT_TRUE(a_.hold(unknown));
  // "b" answers; whatever goes to "c" (port 1003) is lost.
  std::vector<OutDatagram> released;
  for (const OutDatagram& d : exchange(poll_a())) {
    if (ntohs(d.peer.addr.v4.sin_port) != 1003) released.push_back(d);
  }
  ASSERT_EQ(released.size(), 1U);
  EXPECT_EQ(released[0].bytes[0], 0x77);
  EXPECT_EQ(a_.held(), 2U);
  // A bucket with no backup in the layout is no reason to answer at once.
  OutDatagram unbacked = reply_datagram(0x7a);
  EXPECT_TRUE(a_.hold(unbacked, std::vector<std::uint32_t>{kBucket + 1}));
  EXPECT_EQ(a_.held(), 3U);
}

// The bug the replication end-to-end tests of a backup killed mid-grant and of a
// partitioned primary found: a held answer whose backup left the layout was
// let out at once, with no live replica of its grant. It is dropped now:
// the client retransmits, and the shard answers from its dedup cache only
// if the bucket may still be granted here (ShardGateTest), held again
// behind the new backup's snapshot.
// The backup learns that its primary activated a bucket
// after the snapshot (Replicator::activated()), through the stream: a
// learner is promoted on that, never on a snapshot of a bucket its primary
// could not yet grant.
// A primary whose process is not yet up for its lock-delay: its streams do
// not say it is settled.
class UnsettledPrimaryTest : public ReplicatorTest {
 protected:
  UnsettledPrimaryTest() : ReplicatorTest(unsettled()) {}
  static ReplicatorOptions unsettled() {
    ReplicatorOptions o = options();
    o.settled_at_ns = std::numeric_limits<std::int64_t>::max();
    return o;
  }
};

TEST_F(UnsettledPrimaryTest, ABackupLearnsThatItsPrimaryActivatedABucketAfterTheSnapshot) {
  both_layouts();
  (void)exchange(poll_a());
  EXPECT_EQ(b_->progress(), (ReplicaProgress{.backed = 1, .caught_up = 1, .owner_active = 0}));
  // "a" started less than a lock-delay ago (not settled): its earlier run's
  // leases may be missing from its stream...
  EXPECT_FALSE(b_->primary_settled("a", kBucket));
  const std::vector<std::uint32_t> buckets = {kBucket, 5};  // 5: no backup here
  a_.activated(buckets);
  (void)exchange(poll_a());
  EXPECT_EQ(b_->progress(), (ReplicaProgress{.backed = 1, .caught_up = 1, .owner_active = 1}));
  // ...unless it has the bucket active: that it could only by taking it over
  // complete, so a takeover from it need not wait for its lock-delay.
  EXPECT_TRUE(b_->primary_settled("a", kBucket));
  // The map drops "a": once "b"'s promise has run out, its takeover is
  // complete.
  ASSERT_TRUE(b_->set_layout(layout_without_a(5), now_).empty());
  now_ += 251 * kMs;
  std::vector<std::pair<std::string, replication::ReplicaHolder>> holders;
  bool owner_active = false;
  ASSERT_TRUE(b_->takeover("a", kBucket, now_, holders, &owner_active));
  EXPECT_TRUE(owner_active);
}

TEST_F(ReplicatorTest, AnAnswerHeldForABackupThatLeftIsNeverSent) {
  both_layouts();
  a_.route(std::vector{grant("k", 41)});
  OutDatagram reply = reply_datagram(0x77);
  ASSERT_TRUE(a_.hold(reply));
  (void)poll_a();  // lost: "b" dies with it

  // The next map: "c" (port 1003) backs kBucket up instead of "b".
  ASSERT_EQ(a_.set_layout(primary_layout(5, "c", 1003), now_).size(), 1U);
  EXPECT_EQ(a_.held(), 0U);
  EXPECT_EQ(a_.dropped_replies(), 1U);
  a_.begin_snapshot(0, kBucket);
  a_.append_snapshot(0, std::vector{grant("k", 41)});
  a_.end_snapshot(0, kBucket);
  // The retransmission's answer waits for "c" to have the snapshot.
  OutDatagram again = reply_datagram(0x78);
  ASSERT_TRUE(a_.hold(again));
  const std::vector<OutDatagram> out = poll_a();
  ASSERT_FALSE(out.empty());
  for (const OutDatagram& d : out) ASSERT_EQ(ntohs(d.peer.addr.v4.sin_port), 1003) << "a reply";

  Replicator c(options(), 0);
  ReplicaLayout lc;
  lc.self_id = "c";
  lc.epoch = 5;
  lc.peers = {ReplicaPeer{"a", loopback(1001)}};
  lc.backing.assign(8, ReplicaLayout::kNone);
  lc.backing[kBucket] = 0;
  (void)c.set_layout(lc, now_);
  const std::vector<OutDatagram> released = shuttle({{&a_, 1001}, {&c, 1003}}, 1001, out, now_);
  ASSERT_EQ(released.size(), 1U);
  EXPECT_EQ(released[0].bytes[0], 0x78);
}

TEST_F(ReplicatorTest, ALostDatagramHoldsTheAnswerUntilTheResend) {
  both_layouts();
  a_.route(std::vector{grant("k", 41)});
  OutDatagram reply = reply_datagram(0x77);
  ASSERT_TRUE(a_.hold(reply));
  (void)poll_a();  // lost on the way
  now_ += 5 * kMs;
  EXPECT_TRUE(exchange(poll_a()).empty());  // nothing due yet
  now_ += 20 * kMs;
  EXPECT_EQ(exchange(poll_a()).size(), 1U);
}

TEST_F(ReplicatorTest, TheBackupTakesOverOnlyAfterItsPromiseRanOut) {
  both_layouts();
  a_.route(std::vector{grant("k", 41), grant("j", 42)});
  (void)exchange(poll_a());
  std::vector<std::pair<std::string, replication::ReplicaHolder>> holders;
  // Still promising: no takeover.
  EXPECT_FALSE(b_->takeover("a", kBucket, now_, holders));
  // The map drops "a" (it died): "b" stops promising...
  ASSERT_TRUE(b_->set_layout(layout_without_a(5), now_).empty());
  EXPECT_FALSE(b_->takeover("a", kBucket, now_ + 100 * kMs, holders));
  // ...and takes over once the last lease it gave has run out.
  const std::int64_t after = now_ + 251 * kMs;
  ASSERT_TRUE(b_->takeover("a", kBucket, after, holders));
  ASSERT_EQ(holders.size(), 2U);
  EXPECT_EQ(holders[0].first, "j");
  EXPECT_EQ(holders[1].first, "k");
  EXPECT_EQ(holders[1].second.token, 41U);
  // Not a bucket it backed up, nor a stranger's.
  EXPECT_FALSE(b_->takeover("a", kBucket + 1, after, holders));
  EXPECT_FALSE(b_->takeover("c", kBucket, after, holders));
}

// A backup that took over never acknowledges the old primary's late grant, through both nodes'
// Replicators: "a" grants under its
// primary lease, the REPLICATE is lost (a one-way cut from "a" to "b"), "b"
// evicts "a" and takes the bucket over without the grant. When the cut
// heals, "a"'s retransmission must not be acknowledged: before the fix "b"
// applied it to its stale replica and "a" answered GRANTED, while "b" could
// grant the key to another client.
TEST_F(ReplicatorTest, ABackupThatTookOverNeverAcknowledgesTheOldPrimarysLateGrant) {
  both_layouts();
  (void)exchange(poll_a());  // snapshots acknowledged: "a" holds a lease
  ASSERT_GT(a_.lease_until(kBucket).count(), now_);
  a_.route(std::vector{grant("late", 44)});
  OutDatagram reply = reply_datagram(0x55);
  ASSERT_TRUE(a_.hold(reply));
  (void)poll_a();  // lost
  ASSERT_TRUE(b_->set_layout(layout_without_a(5), now_).empty());
  now_ += 300 * kMs;
  std::vector<std::pair<std::string, replication::ReplicaHolder>> holders;
  ASSERT_TRUE(b_->takeover("a", kBucket, now_, holders));
  EXPECT_TRUE(holders.empty());
  // The cut heals.
  const std::vector<OutDatagram> released = exchange(poll_a());
  EXPECT_TRUE(released.empty()) << "the late grant was answered after the takeover";
  EXPECT_EQ(a_.held(), 1U);
  ASSERT_TRUE(b_->takeover("a", kBucket, now_, holders));
  EXPECT_TRUE(holders.empty());
}

// A node replaced at the same HOST:PORT under a new id
// ("a2" for the dead "a", as the runbook says a wiped data dir is). "b"
// keeps "a"'s stream for its takeover; "a2"'s datagrams must reach "a2"'s
// own stream, which lends it a lease, not the departed one.
TEST_F(ReplicatorTest, ANodeReplacedAtTheSameAddressReachesItsOwnStream) {
  both_layouts();
  a_.route(std::vector{grant("k", 41)});
  (void)exchange(poll_a());
  ReplicaLayout lb;
  lb.self_id = "b";
  lb.epoch = 5;
  lb.peers = {ReplicaPeer{"a2", loopback(1001)}};
  lb.backing.assign(8, ReplicaLayout::kNone);
  lb.backing[kBucket] = 0;
  (void)b_->set_layout(lb, now_);
  Replicator a2(options(), now_);
  ReplicaLayout la = primary_layout(5, "b", 1002, "a2");
  for (const auto& [peer, bucket] : a2.set_layout(la, now_)) {
    a2.begin_snapshot(peer, bucket);
    a2.end_snapshot(peer, bucket);
  }
  std::vector<OutDatagram> out;
  a2.poll(now_, out);
  ASSERT_FALSE(out.empty());
  (void)shuttle({{&a2, 1001}, {b_.get(), 1002}}, 1001, out, now_);
  EXPECT_GT(a2.lease_until(kBucket).count(), now_) << "a2's stream went to a's replica";
  // And "a"'s replica is still there for its takeover.
  std::vector<std::pair<std::string, replication::ReplicaHolder>> holders;
  ASSERT_TRUE(b_->takeover("a", kBucket, now_ + 300 * kMs, holders));
  ASSERT_EQ(holders.size(), 1U);
  EXPECT_EQ(holders[0].second.token, 41U);
}

TEST_F(ReplicatorTest, ABucketNoLongerBackedUpIsForgottenAndNeverTakenOver) {
  both_layouts();
  a_.route(std::vector{grant("k", 41)});
  (void)exchange(poll_a());
  // The next map keeps "a" as a primary of "b"'s, but for another bucket.
  ReplicaLayout lb;
  lb.self_id = "b";
  lb.epoch = 5;
  lb.peers = {ReplicaPeer{"a", loopback(1001)}};
  lb.backing.assign(8, ReplicaLayout::kNone);
  lb.backing[kBucket + 1] = 0;
  (void)b_->set_layout(lb, now_);
  lb.backing.assign(8, ReplicaLayout::kNone);
  lb.epoch = 6;
  (void)b_->set_layout(lb, now_);
  std::vector<std::pair<std::string, replication::ReplicaHolder>> holders;
  EXPECT_FALSE(b_->takeover("a", kBucket, now_ + 1000 * kMs, holders));
}

TEST_F(ReplicatorTest, ARestartedBackupIsStartedOverWithASnapshot) {
  both_layouts();
  a_.route(std::vector{grant("k", 41)});
  (void)exchange(poll_a());
  EXPECT_TRUE(a_.restart_streams().empty());
  // "b" restarts: a new Replicator, empty, with the same layout.
  b_ = std::make_unique<Replicator>(options(), now_);
  ReplicaLayout lb;
  lb.self_id = "b";
  lb.epoch = 4;  // the map it restarts into: the primary's
  lb.peers = {ReplicaPeer{"a", loopback(1001)}};
  lb.backing.assign(8, ReplicaLayout::kNone);
  lb.backing[kBucket] = 0;
  (void)b_->set_layout(lb, now_);
  now_ += 60 * kMs;
  (void)exchange(poll_a());  // a heartbeat: "b" answers with less than before
  EXPECT_EQ(a_.lease_until(kBucket).count(), std::numeric_limits<std::int64_t>::min());
  const auto again = a_.restart_streams();
  ASSERT_EQ(again.size(), 1U);
  EXPECT_EQ(again[0], std::make_pair(std::uint16_t{0}, kBucket));
  a_.begin_snapshot(0, kBucket);
  a_.append_snapshot(0, std::vector{grant("k", 41)});
  a_.end_snapshot(0, kBucket);
  (void)exchange(poll_a());
  EXPECT_GT(a_.lease_until(kBucket).count(), now_);
  // The restarted backup has the holder again, and takes over only once
  // the map drops "a" and its promise (from its restart on) has run out.
  lb.backing.assign(8, ReplicaLayout::kNone);
  (void)b_->set_layout(lb, now_);
  std::vector<std::pair<std::string, replication::ReplicaHolder>> holders;
  ASSERT_TRUE(b_->takeover("a", kBucket, now_ + 251 * kMs, holders));
  ASSERT_EQ(holders.size(), 1U);
  EXPECT_EQ(holders[0].first, "k");
}

TEST_F(ReplicatorTest, ABackupThatNowOwnsABucketOfALivePrimaryTakesItOverAndLendsItNoLease) {
  // A learner promoted: "a" stays the primary of kBucket + 1, but the next
  // map gives kBucket to "b", its backup, while "a" is still on the map
  // before. "b" takes kBucket over with the holder "a" answered, and "a"
  // gets no lease from "b" (a lease covers a stream, every bucket on it)
  // until it is on the new map, where kBucket is no longer its own.
  constexpr std::uint32_t kOther = kBucket + 1;
  const auto snapshot_all = [&](Replicator& r, const auto& pairs) {
    for (const auto& [peer, bucket] : pairs) {
      r.begin_snapshot(peer, bucket);
      r.end_snapshot(peer, bucket);
    }
  };
  ReplicaLayout la = primary_layout(4, "b", 1002);
  la.backups[kOther] = {0};
  snapshot_all(a_, a_.set_layout(la, now_));
  ReplicaLayout lb;
  lb.self_id = "b";
  lb.epoch = 4;
  lb.peers = {ReplicaPeer{"a", loopback(1001)}};
  lb.backing.assign(8, ReplicaLayout::kNone);
  lb.backing[kBucket] = 0;
  lb.backing[kOther] = 0;
  (void)b_->set_layout(lb, now_);
  Entry other = grant("o", 43);
  other.bucket = kOther;
  a_.route(std::vector{grant("k", 41), other});
  (void)exchange(poll_a());
  ASSERT_GT(a_.lease_until(kBucket).count(), now_);

  ReplicaLayout lb5;
  lb5.self_id = "b";
  lb5.epoch = 5;
  lb5.peers = {ReplicaPeer{"a", loopback(1001)}};
  lb5.backups.resize(8);
  lb5.backups[kBucket] = {0};
  lb5.backing.assign(8, ReplicaLayout::kNone);
  lb5.backing[kOther] = 0;
  (void)b_->set_layout(lb5, now_);
  std::vector<std::pair<std::string, replication::ReplicaHolder>> holders;
  EXPECT_FALSE(b_->takeover("a", kBucket, now_ + 100 * kMs, holders));  // promised till then
  EXPECT_EQ(caught_up_of(*b_), std::make_pair(std::size_t{0}, std::size_t{1}));

  // "a", still on epoch 4, streams on: "b" answers it with nothing applied
  // and no lease, so its lease runs out and it starts a new stream...
  for (int i = 0; i < 5; ++i) {
    now_ += 60 * kMs;
    (void)exchange(poll_a());
  }
  EXPECT_LT(a_.lease_until(kBucket).count(), now_);
  ASSERT_TRUE(a_.restart_pending());
  snapshot_all(a_, a_.restart_streams());
  (void)exchange(poll_a());
  // ...which "b" follows, but lends no lease while "a" is on epoch 4.
  EXPECT_LT(a_.lease_until(kBucket).count(), now_);
  EXPECT_LT(a_.lease_until(kOther).count(), now_);
  EXPECT_EQ(caught_up_of(*b_), std::make_pair(std::size_t{1}, std::size_t{1}));
  ASSERT_TRUE(b_->takeover("a", kBucket, now_, holders));
  ASSERT_EQ(holders.size(), 1U);
  EXPECT_EQ(holders[0].first, "k");
  EXPECT_FALSE(b_->takeover("a", kOther, now_, holders));  // still "a"'s

  // On epoch 5 "a" is the primary of kOther only, and earns leases again.
  ReplicaLayout la5 = primary_layout(5, "b", 1002);
  la5.backups[kBucket].clear();
  la5.backups[kOther] = {0};
  snapshot_all(a_, a_.set_layout(la5, now_));
  now_ += 60 * kMs;
  (void)exchange(poll_a());
  EXPECT_GT(a_.lease_until(kOther).count(), now_);
  EXPECT_EQ(a_.lease_until(kBucket).count(), std::numeric_limits<std::int64_t>::min());
}

// Simulation seed 9345: map 5 drains "a", so "b" owns kBucket alone and
// takes it over (granting it again, say); map 6 gives it back to "a" with
// "b" as its backup. "a", whose etcd link is slow, never saw map 5 and
// streams on from map 4, where kBucket was its own all along. "b" follows
// that stream on a fresh state, but must lend it no lease until "a" is on
// map 6: a lease lent to "a" on map 4 let it grant the key "b" had granted.
TEST_F(ReplicatorTest, APrimaryGivenBackABucketGetsNoLeaseUntilItIsOnTheMapThatGaveItBack) {
  both_layouts();
  a_.route(std::vector{grant("k", 41)});
  (void)exchange(poll_a());
  ASSERT_GT(a_.lease_until(kBucket).count(), now_);

  ReplicaLayout lb5;  // "a" drained: "b" is kBucket's primary, the last one
  lb5.self_id = "b";
  lb5.epoch = 5;
  lb5.peers = {ReplicaPeer{"a", loopback(1001)}};
  lb5.backups.resize(8);
  lb5.backing.assign(8, ReplicaLayout::kNone);
  lb5.owned.assign(8, false);
  lb5.owned[kBucket] = true;
  (void)b_->set_layout(lb5, now_);
  now_ += 1000 * kMs;  // "b"'s promise to "a" has run out
  std::vector<std::pair<std::string, replication::ReplicaHolder>> holders;
  ASSERT_TRUE(b_->takeover("a", kBucket, now_, holders));
  ASSERT_EQ(holders.size(), 1U);

  (void)b_->set_layout(backup_layout(6), now_);  // "a" undrained
  // "a", still on map 4, streams on (its lease has run out, so it starts
  // a new stream, with snapshots): "b" follows it and lends no lease.
  for (int i = 0; i < 5; ++i) {
    now_ += 60 * kMs;
    (void)exchange(poll_a());
    if (a_.restart_pending()) {
      for (const auto& [peer, bucket] : a_.restart_streams()) {
        a_.begin_snapshot(peer, bucket);
        a_.end_snapshot(peer, bucket);
      }
    }
  }
  (void)exchange(poll_a());
  EXPECT_EQ(caught_up_of(*b_), std::make_pair(std::size_t{1}, std::size_t{1}));
  EXPECT_LT(a_.lease_until(kBucket).count(), now_) << "a lease lent to a primary on map 4";

  // On map 6, kBucket is "a"'s again and "b" its backup: leases again.
  for (const auto& [peer, bucket] : a_.set_layout(primary_layout(6, "b", 1002), now_)) {
    a_.begin_snapshot(peer, bucket);
    a_.end_snapshot(peer, bucket);
  }
  now_ += 60 * kMs;
  (void)exchange(poll_a());
  EXPECT_GT(a_.lease_until(kBucket).count(), now_);
}

// Simulation seed 4486: a backup that skipped a map (cut off from etcd,
// it missed the one that dropped it) must not count what it applied before
// as a replica: the primary granted meanwhile with other backups.
TEST_F(ReplicatorTest, ABackupThatSkippedAMapStartsEveryStreamOver) {
  both_layouts();
  a_.route(std::vector{grant("k", 41)});
  constexpr std::int64_t kSilence = 300 * kMs;
  (void)exchange(poll_a());
  ASSERT_EQ(caught_up_of(*b_), std::make_pair(std::size_t{1}, std::size_t{1}));
  // A map in sequence keeps the stream: caught up stays caught up.
  EXPECT_TRUE(b_->set_layout(backup_layout(5), now_).empty());
  EXPECT_EQ(caught_up_of(*b_), std::make_pair(std::size_t{1}, std::size_t{1}));
  // Epoch 6 (never seen by "b") dropped it; epoch 7 makes it a backup again,
  // long after it last heard from "a".
  now_ += 2 * kSilence;
  EXPECT_TRUE(b_->set_layout(backup_layout(7), now_).empty());
  EXPECT_EQ(caught_up_of(*b_), std::make_pair(std::size_t{0}, std::size_t{1}));
  EXPECT_TRUE(b_->silent_peers(now_, kSilence).empty());
  // Dropped again at once: nothing to take over by.
  ASSERT_TRUE(b_->set_layout(layout_without_a(8), now_).empty());
  std::vector<std::pair<std::string, replication::ReplicaHolder>> holders;
  EXPECT_FALSE(b_->takeover("a", kBucket, now_ + 10 * kSilence, holders));
}

// The stream made afresh when a map is skipped follows no stream this run
// followed before. A replay of the old stream's opening (recorded, under the
// primary's own seal) does not catch it up, so a backup cut off from its
// primary never takes a bucket over by a stale snapshot; the primary's own
// next datagram of that stream is refused, and it starts a new one
// (replication_forgery_test.cc drives the same with real nodes).
TEST_F(ReplicatorTest, AFreshStreamRefusesTheStreamsThisRunFollowedBefore) {
  both_layouts();
  // The snapshot, no holder yet, as addressed to b's process.
  const std::vector<OutDatagram> opening = through_refusal(poll_a());
  (void)exchange(opening);
  using Progress = std::pair<std::size_t, std::size_t>;
  ASSERT_EQ(caught_up_of(*b_), Progress(1, 1));
  a_.route(std::vector{grant("k", 41)});
  (void)exchange(poll_a());
  // Epoch 5 never reached "b": its stream from "a" starts over.
  EXPECT_TRUE(b_->set_layout(backup_layout(6), now_).empty());
  ASSERT_EQ(caught_up_of(*b_), Progress(0, 1));
  std::vector<OutDatagram> answers;
  for (const OutDatagram& d : opening) {
    EXPECT_TRUE(b_->on_datagram(std::span<const std::uint8_t>(d.bytes.data(), d.length),
                                loopback(1001), now_, answers));
  }
  EXPECT_EQ(caught_up_of(*b_), Progress(0, 1));
  // The primary's heartbeat on that stream is refused: it starts over.
  now_ += 60 * kMs;
  (void)exchange(poll_a());
  restart_with_snapshot_of_k();
  EXPECT_EQ(caught_up_of(*b_), Progress(1, 1));
}

TEST_F(ReplicatorTest, APeerThatFallsSilentIsNamed) {
  both_layouts();
  constexpr std::int64_t kSilence = 300 * kMs;
  // Never heard from yet (it may adopt the map later): not named, however long.
  EXPECT_TRUE(a_.silent_peers(now_ + 10 * kSilence, kSilence).empty());
  (void)exchange(poll_a());
  now_ += 200 * kMs;
  (void)exchange(poll_a());  // heartbeat and its ack: both heard
  now_ += 200 * kMs;
  EXPECT_TRUE(a_.silent_peers(now_, kSilence).empty());
  EXPECT_TRUE(b_->silent_peers(now_, kSilence).empty());
  // Nothing gets through for 300 ms: each names the other.
  (void)poll_a();
  now_ += 300 * kMs;
  EXPECT_EQ(a_.silent_peers(now_, kSilence), std::vector<std::string>{"b"});
  EXPECT_EQ(b_->silent_peers(now_, kSilence), std::vector<std::string>{"a"});
}

TEST_F(ReplicatorTest, ANodeWhoseOwnLoopsStalledSuspectsNobodyForThatTime) {
  both_layouts();
  constexpr std::int64_t kSilence = 300 * kMs;
  (void)exchange(poll_a());
  a_.loop_ran(now_);
  // This node's loops stall for a second: what "b" sent meanwhile waits
  // unread in the socket, so "b" is not named however long the stall.
  now_ += 1000 * kMs;
  EXPECT_TRUE(a_.silent_peers(now_, kSilence).empty());
  // The loops ran again (and read nothing from "b"): now it is named.
  a_.loop_ran(now_);
  EXPECT_EQ(a_.silent_peers(now_, kSilence), std::vector<std::string>{"b"});
  // A late report of an older run changes nothing.
  a_.loop_ran(now_ - 900 * kMs);
  EXPECT_EQ(a_.silent_peers(now_, kSilence), std::vector<std::string>{"b"});
}

TEST_F(ReplicatorTest, ARestartedBackupIsReportedAsPendingARestart) {
  both_layouts();
  a_.route(std::vector{grant("k", 41)});
  (void)exchange(poll_a());
  EXPECT_FALSE(a_.restart_pending());
  b_ = std::make_unique<Replicator>(options(), now_);
  ReplicaLayout lb;
  lb.self_id = "b";
  lb.peers = {ReplicaPeer{"a", loopback(1001)}};
  lb.backing.assign(8, ReplicaLayout::kNone);
  lb.backing[kBucket] = 0;
  (void)b_->set_layout(lb, now_);
  now_ += 60 * kMs;
  (void)exchange(poll_a());
  EXPECT_TRUE(a_.restart_pending());
  EXPECT_EQ(a_.restart_streams().size(), 1U);
  EXPECT_FALSE(a_.restart_pending());
}

TEST_F(ReplicatorTest, AStrangersDatagramsEarnNothing) {
  both_layouts();
  a_.route(std::vector{grant("k", 41)});
  std::vector<OutDatagram> wire = poll_a();
  ASSERT_FALSE(wire.empty());
  std::vector<OutDatagram> out;
  // The same REPLICATE from an address that is no primary of "b"'s.
  const std::span<const std::uint8_t> bytes(wire[0].bytes.data(), wire[0].length);
  EXPECT_TRUE(b_->on_datagram(bytes, loopback(4444), now_, out));
  EXPECT_TRUE(out.empty());
  EXPECT_EQ(b_->rejected_datagrams(), 1U);
  // A client request is not a node-to-node datagram.
  const std::vector<std::uint8_t> client = {0x53, 0x48, 0x4C, 0x4B, 1, 0, 0, 0};
  EXPECT_FALSE(b_->on_datagram(client, loopback(1001), now_, out));
  // Garbage with a replication magic is rejected, not answered.
  const std::vector<std::uint8_t> garbage = {0x53, 0x4C, 0x52, 0x50, 9, 9};
  EXPECT_TRUE(b_->on_datagram(garbage, loopback(1001), now_, out));
  EXPECT_TRUE(out.empty());
}

// A datagram names its sender and receiver, and only the
// stream of the sender it names, at the address the layout gives that
// sender, takes it.
TEST_F(ReplicatorTest, ADatagramThatMisnamesEitherEndEarnsNothing) {
  both_layouts();
  a_.route(std::vector{grant("k", 41)});
  const std::vector<OutDatagram> wire = through_refusal(poll_a());
  ASSERT_EQ(wire.size(), 1U);
  using replication::ReplicateHeader;
  ReplicateHeader header;
  std::vector<Entry> entries;
  ASSERT_TRUE(
      replication::decode_replicate({wire[0].bytes.data(), wire[0].length}, header, entries));
  EXPECT_EQ(header.addressing.sender, replication::node_tag("a"));
  EXPECT_EQ(header.addressing.receiver, replication::node_tag("b"));
  const auto send = [&](const ReplicateHeader& h) {
    std::vector<std::uint8_t> bytes;
    EXPECT_EQ(replication::encode_replicate(h, entries, bytes), entries.size());
    std::vector<OutDatagram> out;
    EXPECT_TRUE(b_->on_datagram(bytes, loopback(1001), now_, out));
    return out;
  };
  ReplicateHeader other_receiver = header;
  other_receiver.addressing.receiver = replication::node_tag("c");
  EXPECT_TRUE(send(other_receiver).empty());
  ReplicateHeader other_sender = header;  // "b" backs up nothing for "c"
  other_sender.addressing.sender = replication::node_tag("c");
  EXPECT_TRUE(send(other_sender).empty());
  EXPECT_EQ(b_->rejected_datagrams(), 2U);
  // Nothing applied: the datagram's snapshot mark would have caught it up.
  EXPECT_EQ(caught_up_of(*b_), std::make_pair(std::size_t{0}, std::size_t{1}));
  // The datagram as sent is applied and answered.
  const std::vector<OutDatagram> acks = send(header);
  ASSERT_EQ(acks.size(), 1U);
  EXPECT_EQ(caught_up_of(*b_), std::make_pair(std::size_t{1}, std::size_t{1}));
  // An ack is checked the same way: one that names another backup lends
  // no lease.
  replication::Ack ack;
  ASSERT_TRUE(replication::decode_ack({acks[0].bytes.data(), acks[0].length}, ack));
  EXPECT_EQ(ack.addressing.sender, replication::node_tag("b"));
  EXPECT_EQ(ack.addressing.receiver, replication::node_tag("a"));
  replication::Ack misnamed = ack;
  misnamed.addressing.sender = replication::node_tag("c");
  std::vector<std::uint8_t> bytes;
  replication::encode_ack(misnamed, bytes);
  std::vector<OutDatagram> out;
  EXPECT_TRUE(a_.on_datagram(bytes, loopback(1002), now_, out));
  EXPECT_EQ(a_.rejected_datagrams(), 1U);
  EXPECT_LT(a_.lease_until(kBucket).count(), now_);
  EXPECT_TRUE(a_.on_datagram({acks[0].bytes.data(), acks[0].length}, loopback(1002), now_, out));
  EXPECT_GT(a_.lease_until(kBucket).count(), now_);
}

// A node replaced at its address, the rest: a departed primary's stream is kept while a
// bucket of it is still to be taken over here, and goes after that.
TEST_F(ReplicatorTest, ADepartedPrimarysStreamGoesOnceItsTakeoversAreDone) {
  both_layouts();
  a_.route(std::vector{grant("k", 41)});
  (void)exchange(poll_a());
  EXPECT_EQ(b_->primary_streams(), 1U);
  // "a" died; "b", the last one left, owns kBucket without a backup.
  ReplicaLayout lb;
  lb.self_id = "b";
  lb.epoch = 5;
  lb.backing.assign(8, ReplicaLayout::kNone);
  lb.owned.assign(8, false);
  lb.owned[kBucket] = true;
  (void)b_->set_layout(lb, now_);
  EXPECT_EQ(b_->primary_streams(), 1U) << "dropped before its takeover";
  lb.epoch = 6;
  (void)b_->set_layout(lb, now_);
  EXPECT_EQ(b_->primary_streams(), 1U) << "dropped before its takeover";
  std::vector<std::pair<std::string, replication::ReplicaHolder>> holders;
  ASSERT_TRUE(b_->takeover("a", kBucket, now_ + 251 * kMs, holders));
  ASSERT_EQ(holders.size(), 1U);
  lb.epoch = 7;
  (void)b_->set_layout(lb, now_);
  EXPECT_EQ(b_->primary_streams(), 0U);
}

TEST_F(ReplicatorTest, ADepartedPrimarysBucketsThatWentElsewhereAreForgottenAtOnce) {
  both_layouts();
  a_.route(std::vector{grant("k", 41)});
  (void)exchange(poll_a());
  ReplicaLayout lb;
  lb.self_id = "b";
  lb.epoch = 5;
  lb.backing.assign(8, ReplicaLayout::kNone);
  lb.owned.assign(8, false);  // kBucket went to another node
  (void)b_->set_layout(lb, now_);
  EXPECT_EQ(b_->primary_streams(), 0U);
  std::vector<std::pair<std::string, replication::ReplicaHolder>> holders;
  EXPECT_FALSE(b_->takeover("a", kBucket, now_ + 251 * kMs, holders));
}

// A backup's process changed (its incarnation on the wire): the primary
// starts the stream over whatever the new process acknowledges.
TEST_F(ReplicatorTest, ABackupsNewIncarnationStartsTheStreamOver) {
  ReplicatorOptions first = options();
  first.incarnation = 11;
  b_ = std::make_unique<Replicator>(first, now_);
  both_layouts();
  a_.route(std::vector{grant("k", 41)});
  (void)exchange(poll_a());
  ASSERT_GT(a_.lease_until(kBucket).count(), now_);
  EXPECT_FALSE(a_.restart_pending());
  ReplicatorOptions second = options();
  second.incarnation = 12;
  b_ = std::make_unique<Replicator>(second, now_);
  (void)b_->set_layout(backup_layout(4), now_);
  now_ += 60 * kMs;
  (void)exchange(poll_a());
  EXPECT_TRUE(a_.restart_pending());
  EXPECT_EQ(a_.lease_until(kBucket).count(), std::numeric_limits<std::int64_t>::min());
}

// A stream's first datagrams name no backup process (the primary has not
// heard from it), and the backup refuses them untouched; its refusal names
// its process, and the stream goes on addressed to it, under a larger id,
// from its first entry: no second snapshot, and the held answer comes once
// the backup has its grant.
TEST_F(ReplicatorTest, AStreamGoesOnAddressedToTheProcessThatRefusedItsFirstDatagrams) {
  both_layouts();
  a_.route(std::vector{grant("k", 41)});
  OutDatagram reply = reply_datagram(0x77);
  ASSERT_TRUE(a_.hold(reply));
  const std::vector<OutDatagram> first = poll_a();
  ASSERT_EQ(first.size(), 1U);
  replication::ReplicateHeader header;
  std::vector<Entry> entries;
  ASSERT_TRUE(
      replication::decode_replicate({first[0].bytes.data(), first[0].length}, header, entries));
  EXPECT_EQ(header.addressing.incarnation, a_.incarnation());
  EXPECT_EQ(header.addressing.receiver_incarnation, 0U);
  std::vector<OutDatagram> refusal;
  ASSERT_TRUE(
      b_->on_datagram({first[0].bytes.data(), first[0].length}, loopback(1001), now_, refusal));
  ASSERT_EQ(refusal.size(), 1U);
  EXPECT_EQ(b_->refused_for_another_process(), 1U);
  EXPECT_EQ(caught_up_of(*b_), std::make_pair(std::size_t{0}, std::size_t{1}));
  replication::Ack ack;
  ASSERT_TRUE(replication::decode_ack({refusal[0].bytes.data(), refusal[0].length}, ack));
  EXPECT_TRUE(ack.refused);
  EXPECT_EQ(ack.lease_ms, 0U);
  EXPECT_EQ(ack.addressing.incarnation, b_->incarnation());
  EXPECT_EQ(ack.addressing.receiver_incarnation, a_.incarnation());

  std::vector<OutDatagram> again;
  ASSERT_TRUE(
      a_.on_datagram({refusal[0].bytes.data(), refusal[0].length}, loopback(1002), now_, again));
  EXPECT_FALSE(a_.restart_pending());
  ASSERT_EQ(again.size(), 1U);
  replication::ReplicateHeader readdressed;
  ASSERT_TRUE(replication::decode_replicate({again[0].bytes.data(), again[0].length}, readdressed,
                                            entries));
  EXPECT_GT(readdressed.stream, header.stream);
  EXPECT_EQ(readdressed.first_seq, 1U);
  EXPECT_EQ(entries.size(), 3U);
  EXPECT_EQ(readdressed.addressing.receiver_incarnation, b_->incarnation());
  EXPECT_EQ(a_.held(), 1U);
  const std::vector<OutDatagram> released = exchange(again);
  ASSERT_EQ(released.size(), 1U);
  EXPECT_EQ(released[0].bytes[0], 0x77);
  EXPECT_GT(a_.lease_until(kBucket).count(), now_);
  EXPECT_EQ(caught_up_of(*b_), std::make_pair(std::size_t{1}, std::size_t{1}));
  // A late refusal of a datagram addressed as before names the old id and
  // changes nothing.
  ASSERT_TRUE(
      a_.on_datagram({refusal[0].bytes.data(), refusal[0].length}, loopback(1002), now_, again));
  EXPECT_FALSE(a_.restart_pending());
  EXPECT_GT(a_.lease_until(kBucket).count(), now_);
}

// The restarted-backup hole: a backup process that has just started
// follows no stream, so a recorded opening of its primary's stream (a
// snapshot and caught-up mark, under the primary's own seal) counted the
// bucket caught up on holders long gone. Every REPLICATE names the backup
// process it is for, and one for another is refused untouched.
TEST_F(ReplicatorTest, ARestartedBackupRefusesAStreamRecordedForItsEarlierProcess) {
  both_layouts();
  const std::vector<OutDatagram> opening = through_refusal(poll_a());  // no holder yet
  (void)exchange(opening);
  ASSERT_EQ(caught_up_of(*b_), std::make_pair(std::size_t{1}, std::size_t{1}));
  a_.route(std::vector{grant("k", 41)});
  (void)exchange(poll_a());

  // "b" restarts (a new process, the same layout); "a" cannot reach it.
  b_ = std::make_unique<Replicator>(options(), now_);
  (void)b_->set_layout(backup_layout(4), now_);
  std::vector<OutDatagram> answers;
  for (const OutDatagram& d : opening) {
    EXPECT_TRUE(b_->on_datagram({d.bytes.data(), d.length}, loopback(1001), now_, answers));
  }
  EXPECT_EQ(caught_up_of(*b_), std::make_pair(std::size_t{0}, std::size_t{1}));
  EXPECT_EQ(b_->refused_for_another_process(), opening.size());
  ASSERT_EQ(answers.size(), opening.size());
  for (const OutDatagram& d : answers) {
    replication::Ack ack;
    ASSERT_TRUE(replication::decode_ack({d.bytes.data(), d.length}, ack));
    EXPECT_TRUE(ack.refused);
    EXPECT_EQ(ack.lease_ms, 0U);
    EXPECT_EQ(ack.addressing.incarnation, b_->incarnation());
  }
  // Nor a datagram addressed to no process (one sent before the primary
  // heard from any): the same opening with its receiver's process cleared.
  replication::ReplicateHeader header;
  std::vector<Entry> entries;
  ASSERT_TRUE(
      replication::decode_replicate({opening[0].bytes.data(), opening[0].length}, header, entries));
  header.addressing.receiver_incarnation = 0;
  std::vector<std::uint8_t> unaddressed;
  ASSERT_EQ(replication::encode_replicate(header, entries, unaddressed), entries.size());
  EXPECT_TRUE(b_->on_datagram(unaddressed, loopback(1001), now_, answers));
  EXPECT_EQ(caught_up_of(*b_), std::make_pair(std::size_t{0}, std::size_t{1}));
  // Once its promise has run out it may take over only on what "a" itself
  // sends it: nothing yet.
  (void)b_->set_layout(layout_without_a(5), now_);
  std::vector<std::pair<std::string, replication::ReplicaHolder>> holders;
  EXPECT_FALSE(b_->takeover("a", kBucket, now_ + 300 * kMs, holders));
  // The primary's own next datagram is refused too, and names the new
  // process: "a" starts a stream over to it, with snapshots.
  b_ = std::make_unique<Replicator>(options(), now_);
  (void)b_->set_layout(backup_layout(4), now_);
  now_ += 60 * kMs;
  (void)exchange(poll_a());
  restart_with_snapshot_of_k();
  EXPECT_EQ(caught_up_of(*b_), std::make_pair(std::size_t{1}, std::size_t{1}));
  EXPECT_GT(a_.lease_until(kBucket).count(), now_);
}

// The mirror case: stream ids count from 1 in each map epoch, so a primary
// that restarts within one numbers its streams as its earlier run did. An
// ack the backup sent that earlier run, recorded and replayed while the new
// run's grant is held back on its way to the backup, acknowledged the grant
// the backup never saw: the answer went out, and a takeover by the backup
// would grant the key again. An ack names the primary process it is for.
TEST_F(ReplicatorTest, AnAckToAnEarlierRunOfThePrimaryIsDropped) {
  // A run of "a": its process, the map of epoch 4, its snapshot for "b".
  const auto run_of_a = [this](std::uint64_t incarnation) {
    ReplicatorOptions o = options();
    o.incarnation = incarnation;
    auto run = std::make_unique<Replicator>(o, now_);
    (void)run->set_layout(primary_layout(4, "b", 1002), now_);
    run->begin_snapshot(0, kBucket);
    run->end_snapshot(0, kBucket);
    return run;
  };
  const std::unique_ptr<Replicator> first_run = run_of_a(21);
  Replicator& a1 = *first_run;
  EXPECT_TRUE(b_->set_layout(backup_layout(4), now_).empty());
  const std::vector<std::pair<Replicator*, std::uint16_t>> nodes = {{&a1, 1001}, {b_.get(), 1002}};
  std::vector<OutDatagram> wire;
  a1.poll(now_, wire);
  (void)shuttle(nodes, 1001, wire, now_);
  a1.route(std::vector{grant("k", 41)});
  wire.clear();
  a1.poll(now_, wire);
  // b's acks of the grant, as an attacker records them.
  std::vector<OutDatagram> recorded;
  for (const OutDatagram& d : wire) {
    EXPECT_TRUE(b_->on_datagram({d.bytes.data(), d.length}, loopback(1001), now_, recorded));
  }
  ASSERT_EQ(recorded.size(), 1U);
  (void)shuttle(nodes, 1002, recorded, now_);
  ASSERT_GT(a1.lease_until(kBucket).count(), now_);

  // "a" restarts at once in the same epoch. It learns b's process (b
  // refuses its first datagrams, addressed to none) and goes on addressed
  // to it under the id its earlier run used there; from then on what it
  // sends "b" is held back.
  const std::unique_ptr<Replicator> second_run = run_of_a(22);
  Replicator& a2 = *second_run;
  wire.clear();
  a2.poll(now_, wire);
  std::vector<OutDatagram> held_back = through_refusal_of(a2, *b_, wire, now_);
  ASSERT_EQ(held_back.size(), 1U);
  a2.route(std::vector{grant("j", 42)});
  OutDatagram answer = reply_datagram(0x55);
  ASSERT_TRUE(a2.hold(answer));
  held_back.clear();
  a2.poll(now_, held_back);
  ASSERT_FALSE(held_back.empty());

  std::vector<OutDatagram> released;
  for (const OutDatagram& d : recorded) {
    EXPECT_TRUE(a2.on_datagram({d.bytes.data(), d.length}, loopback(1002), now_, released));
  }
  EXPECT_TRUE(released.empty()) << "the answer left with no backup having the grant";
  EXPECT_EQ(a2.held(), 1U);
  EXPECT_LT(a2.lease_until(kBucket).count(), now_);
  EXPECT_EQ(a2.rejected_datagrams(), recorded.size());
}

// A rolling upgrade: a node of the version before (2) sends datagrams 8
// bytes shorter per end, and this node drops them, counted, unanswered (an
// answer would lend a lease), whichever way they go (docs/cluster.md,
// "Upgrades").
TEST_F(ReplicatorTest, AVersionTwoPeersDatagramsAreDroppedUnanswered) {
  both_layouts();
  a_.route(std::vector{grant("k", 41)});
  const std::vector<OutDatagram> wire = through_refusal(poll_a());
  ASSERT_EQ(wire.size(), 1U);
  // As a version 2 node sends it: no receiver's process, version 2.
  const auto version_two = [](const OutDatagram& d, std::size_t header) {
    std::vector<std::uint8_t> bytes(d.bytes.begin(), d.bytes.begin() + d.length);
    bytes.erase(bytes.begin() + static_cast<std::ptrdiff_t>(header) - 8,
                bytes.begin() + static_cast<std::ptrdiff_t>(header));
    bytes[4] = 2;
    return bytes;
  };
  std::vector<OutDatagram> out;
  EXPECT_TRUE(b_->on_datagram(version_two(wire[0], replication::kReplicateHeaderSize),
                              loopback(1001), now_, out));
  EXPECT_TRUE(out.empty());
  EXPECT_EQ(b_->rejected_datagrams(), 1U);
  EXPECT_EQ(caught_up_of(*b_), std::make_pair(std::size_t{0}, std::size_t{1}));
  // b's ack of the datagram as sent, in version 2's shape, to "a".
  ASSERT_TRUE(b_->on_datagram({wire[0].bytes.data(), wire[0].length}, loopback(1001), now_, out));
  ASSERT_EQ(out.size(), 1U);
  std::vector<OutDatagram> none;
  EXPECT_TRUE(
      a_.on_datagram(version_two(out[0], replication::kAckHeaderSize), loopback(1002), now_, none));
  EXPECT_TRUE(none.empty());
  EXPECT_EQ(a_.rejected_datagrams(), 1U);
  EXPECT_LT(a_.lease_until(kBucket).count(), now_);
}

TEST(ReplicatorAuth, SealedStreamsWorkAndAWrongKeyEarnsNoLease) {
  AuthKey key{};
  key[0] = 1;
  AuthKey other{};
  other[0] = 2;
  Replicator a(options(key), 0);
  Replicator b(options(key), 0);
  Replicator forger(options(other), 0);
  ReplicaLayout la;
  la.self_id = "a";
  la.peers = {ReplicaPeer{"b", loopback(1002)}};
  la.backups.resize(8);
  la.backups[kBucket] = {0};
  (void)a.set_layout(la, 0);
  (void)forger.set_layout(la, 0);
  ReplicaLayout lb;
  lb.self_id = "b";
  lb.peers = {ReplicaPeer{"a", loopback(1001)}};
  lb.backing.assign(8, ReplicaLayout::kNone);
  lb.backing[kBucket] = 0;
  (void)b.set_layout(lb, 0);

  std::vector<OutDatagram> wire;
  forger.poll(0, wire);
  ASSERT_FALSE(wire.empty());
  std::vector<OutDatagram> out;
  EXPECT_TRUE(
      b.on_datagram(std::span(wire[0].bytes.data(), wire[0].length), loopback(1001), 0, out));
  EXPECT_TRUE(out.empty());
  EXPECT_EQ(b.rejected_datagrams(), 1U);

  wire.clear();
  a.poll(0, wire);
  EXPECT_TRUE(shuttle({{&a, 1001}, {&b, 1002}}, 1001, wire, 0).empty());
  EXPECT_GT(a.lease_until(kBucket).count(), 0);
}

TEST(ReplicaLayoutTest, EveryBucketHasOnePrimaryWhoseBackupsBackItUp) {
  Router router(RouterOptions{.bucket_bits = 8});
  const std::vector<Node> nodes = {Node{"a", 1}, Node{"b", 1}, Node{"c", 2}};
  ASSERT_EQ(router.assign(nodes), RouterStatus::kOk);
  const auto routing = router.snapshot();
  const std::vector<Peer> addresses = {loopback(1001), loopback(1002), loopback(1003)};
  std::vector<ReplicaLayout> layouts;
  for (std::uint16_t self = 0; self < 3; ++self) {
    layouts.push_back(replica_layout(6, *routing, {}, self, 2, addresses));
    EXPECT_EQ(layouts.back().epoch, 6U);
    ASSERT_EQ(layouts.back().peers.size(), 2U);
  }
  const auto node_of = [&](std::uint16_t self, std::uint16_t peer) {
    return layouts[self].peers[peer].id;
  };
  for (std::size_t b = 0; b < routing->bucket_count(); ++b) {
    const std::uint16_t owner = routing->table()[b];
    // The owner is the primary, with exactly one backup: the next node in
    // the bucket's ranking, which backs it up for the owner.
    ASSERT_EQ(layouts[owner].backups[b].size(), 1U) << b;
    EXPECT_EQ(layouts[owner].backing[b], ReplicaLayout::kNone);
    const std::string backup = node_of(owner, layouts[owner].backups[b][0]);
    const auto backup_index = static_cast<std::uint16_t>(backup[0] - 'a');
    EXPECT_EQ(backup_index, routing->ranking_of_bucket(b, 2)[1]);
    ASSERT_NE(layouts[backup_index].backing[b], ReplicaLayout::kNone);
    EXPECT_EQ(node_of(backup_index, layouts[backup_index].backing[b]), routing->nodes()[owner].id);
    EXPECT_TRUE(layouts[backup_index].backups[b].empty());
    // The third node has nothing to do with it.
    const auto third = static_cast<std::uint16_t>(3 - owner - backup_index);
    EXPECT_TRUE(layouts[third].backups[b].empty());
    EXPECT_EQ(layouts[third].backing[b], ReplicaLayout::kNone);
  }
  // One replica: no backups, nothing backed up.
  const ReplicaLayout single = replica_layout(6, *routing, {}, 0, 1, addresses);
  for (std::size_t b = 0; b < routing->bucket_count(); ++b) {
    EXPECT_TRUE(single.backups[b].empty());
    EXPECT_EQ(single.backing[b], ReplicaLayout::kNone);
  }
}

// Answers from the backup (ReplicatorOptions::relay_replies): the primary
// hands a held answer to the REPLICATE that carries its grant, and the
// backup sends it to the client once applied: one hop sooner.
class RelayTest : public ReplicatorTest {
 protected:
  RelayTest() : ReplicatorTest(relaying()) { b_ = std::make_unique<Replicator>(relaying(), 0); }
  static ReplicatorOptions relaying() {
    ReplicatorOptions o;
    o.relay_replies = true;
    return o;
  }
  // One step of delivery: `wire` from "a" to "b" (port 1002) or from "b"
  // to "a" (1001); the client answers each sent, by sender.
  struct Sent {
    std::vector<OutDatagram> by_a, by_b, to_a, to_b;
  };
  Sent step_to_b(const std::vector<OutDatagram>& wire) {
    Sent s;
    for (const OutDatagram& d : wire) {
      if (ntohs(d.peer.addr.v4.sin_port) != 1002) {
        s.by_a.push_back(d);
        continue;
      }
      std::vector<OutDatagram> out;
      EXPECT_TRUE(b_->on_datagram(std::span(d.bytes.data(), d.length), loopback(1001), now_, out));
      for (const OutDatagram& o : out) {
        (ntohs(o.peer.addr.v4.sin_port) == 1001 ? s.to_a : s.by_b).push_back(o);
      }
    }
    return s;
  }
  std::vector<OutDatagram> deliver_to_a(const std::vector<OutDatagram>& wire) {
    std::vector<OutDatagram> out;
    for (const OutDatagram& d : wire) {
      EXPECT_TRUE(a_.on_datagram(std::span(d.bytes.data(), d.length), loopback(1002), now_, out));
    }
    return out;
  }
};

TEST_F(RelayTest, TheBackupSendsAGrantsAnswerOnceItHasTheGrant) {
  both_layouts();
  (void)exchange(poll_a());  // the snapshot acknowledged: "b" has answered this stream
  a_.route(std::vector{grant("k", 41)});
  OutDatagram reply = reply_datagram(0x77);
  ASSERT_TRUE(a_.hold(reply, {}, true));
  const Sent sent = step_to_b(poll_a());
  EXPECT_EQ(a_.held(), 0U);  // handed to the REPLICATE
  EXPECT_EQ(a_.replies_relayed(), 1U);
  EXPECT_TRUE(sent.by_a.empty());
  ASSERT_EQ(sent.by_b.size(), 1U);
  EXPECT_EQ(ntohs(sent.by_b[0].peer.addr.v4.sin_port), 9999);
  EXPECT_EQ(sent.by_b[0].length, 1);
  EXPECT_EQ(sent.by_b[0].bytes[0], 0x77);
  EXPECT_EQ(b_->relays_sent(), 1U);
  // The ack still comes back (the primary's lease, its window), later
  // (kFlagAckLater: nothing at "a" waits on it), and releases nothing more:
  // the client gets one answer.
  EXPECT_TRUE(sent.to_a.empty());
  now_ += replication::StreamTiming{}.ack_later_ns;
  const std::vector<OutDatagram> acks = poll_b();
  ASSERT_EQ(acks.size(), 1U);
  EXPECT_TRUE(deliver_to_a(acks).empty());
  EXPECT_GT(a_.lease_until(kBucket).count(), now_);
}

// The last entry a REPLICATE in `wire` (one datagram) carries.
std::uint64_t last_seq_of(const std::vector<OutDatagram>& wire) {
  EXPECT_EQ(wire.size(), 1U);
  replication::ReplicateHeader header;
  std::vector<replication::Entry> entries;
  EXPECT_TRUE(replication::decode_replicate(std::span(wire[0].bytes.data(), wire[0].length), header,
                                            entries));
  return header.first_seq + entries.size() - 1;
}

TEST_F(RelayTest, OneLateAckAnswersEveryReplicateWhoseAnswersWereRelayed) {
  both_layouts();
  (void)exchange(poll_a());
  a_.route(std::vector{grant("k", 41)});
  OutDatagram first = reply_datagram(0x11);
  ASSERT_TRUE(a_.hold(first, {}, true));
  Sent sent = step_to_b(poll_a());
  EXPECT_EQ(sent.by_b.size(), 1U);
  EXPECT_TRUE(sent.to_a.empty());
  now_ += replication::StreamTiming{}.ack_later_ns / 2;
  a_.route(std::vector{grant("j", 42)});
  OutDatagram second = reply_datagram(0x22);
  ASSERT_TRUE(a_.hold(second, {}, true));
  const std::vector<OutDatagram> wire = poll_a();
  const std::uint64_t last = last_seq_of(wire);
  sent = step_to_b(wire);
  EXPECT_EQ(sent.by_b.size(), 1U);
  EXPECT_TRUE(sent.to_a.empty());
  // Not before ack_later_ns since the first was owed, then one ack for both.
  EXPECT_TRUE(poll_b().empty());
  now_ += replication::StreamTiming{}.ack_later_ns / 2;
  const std::vector<OutDatagram> acks = poll_b();
  ASSERT_EQ(acks.size(), 1U);
  EXPECT_EQ(b_->acks_spared(), 1U);
  replication::Ack ack;
  ASSERT_TRUE(replication::decode_ack(std::span(acks[0].bytes.data(), acks[0].length), ack));
  EXPECT_EQ(ack.applied, last);
  EXPECT_GT(ack.lease_ms, 0U);
  EXPECT_TRUE(deliver_to_a(acks).empty());
  EXPECT_GT(a_.lease_until(kBucket).count(), now_);
  // Nothing left to resend once the retransmission timeout has passed.
  now_ += 25 * kMs;
  EXPECT_TRUE(poll_b().empty());
  for (const OutDatagram& d : poll_a()) {
    replication::ReplicateHeader header;
    std::vector<replication::Entry> entries;
    ASSERT_TRUE(
        replication::decode_replicate(std::span(d.bytes.data(), d.length), header, entries));
    EXPECT_TRUE(entries.empty()) << "an entry the late ack covered was sent again";
  }
}

TEST_F(RelayTest, AnAckAnotherHeldAnswerWaitsOnComesAtOnce) {
  both_layouts();
  (void)exchange(poll_a());
  a_.route(std::vector{grant("k", 41)});
  OutDatagram relayed = reply_datagram(0x11);
  ASSERT_TRUE(a_.hold(relayed, {}, true));
  a_.route(std::vector{grant("j", 42)});
  OutDatagram retransmitted = reply_datagram(0x22);  // a retransmission's: not relayable
  ASSERT_TRUE(a_.hold(retransmitted, {}, false));
  const Sent sent = step_to_b(poll_a());
  ASSERT_EQ(sent.by_b.size(), 1U);
  EXPECT_EQ(sent.by_b[0].bytes[0], 0x11);
  ASSERT_EQ(sent.to_a.size(), 1U) << "the ack the primary's own answer waits on was put off";
  const std::vector<OutDatagram> released = deliver_to_a(sent.to_a);
  ASSERT_EQ(released.size(), 1U);
  EXPECT_EQ(released[0].bytes[0], 0x22);
  EXPECT_EQ(b_->acks_spared(), 0U);
}

TEST_F(RelayTest, AnAnswerNotRelayableOrBeforeTheBackupAnsweredComesFromThePrimary) {
  both_layouts();
  // The backup has not answered this stream yet (it may predate relays);
  // its refusal of the stream's first datagrams, addressed to no process of
  // it, is no answer.
  a_.route(std::vector{grant("k", 41)});
  OutDatagram first = reply_datagram(0x11);
  ASSERT_TRUE(a_.hold(first, {}, true));
  Sent sent = step_to_b(through_refusal(poll_a()));
  EXPECT_TRUE(sent.by_b.empty());
  std::vector<OutDatagram> released = deliver_to_a(sent.to_a);
  ASSERT_EQ(released.size(), 1U);
  EXPECT_EQ(released[0].bytes[0], 0x11);
  // A retransmission's answer (relayable false) waits for the ack.
  a_.route(std::vector{grant("j", 42)});
  OutDatagram again = reply_datagram(0x22);
  ASSERT_TRUE(a_.hold(again, {}, false));
  sent = step_to_b(poll_a());
  EXPECT_TRUE(sent.by_b.empty());
  EXPECT_EQ(a_.held(), 1U);
  released = deliver_to_a(sent.to_a);
  ASSERT_EQ(released.size(), 1U);
  EXPECT_EQ(released[0].bytes[0], 0x22);
  EXPECT_EQ(a_.replies_relayed(), 0U);
}

TEST_F(RelayTest, ARelayWaitingPastAGapIsNotSent) {
  both_layouts();
  (void)exchange(poll_a());
  a_.route(std::vector{grant("k", 41)});
  OutDatagram first = reply_datagram(0x11);
  ASSERT_TRUE(a_.hold(first, {}, true));
  (void)poll_a();  // lost, with its relay
  a_.route(std::vector{grant("j", 42)});
  OutDatagram second = reply_datagram(0x22);
  ASSERT_TRUE(a_.hold(second, {}, true));
  Sent sent = step_to_b(poll_a());
  EXPECT_TRUE(sent.by_b.empty()) << "an answer sent before its grant was applied";
  // The resend carries no relays: both clients retransmit, and their
  // retransmissions are answered by the primary.
  now_ += 25 * kMs;
  sent = step_to_b(poll_a());
  EXPECT_TRUE(sent.by_b.empty());
  EXPECT_TRUE(deliver_to_a(sent.to_a).empty());
  EXPECT_EQ(b_->relays_sent(), 0U);
}

// The same late grant, with relays: "a"'s REPLICATE, with the answer in it,
// is held up on the way while "b" evicts "a" and takes the bucket over
// without the grant. When it arrives late, "b" must not send the answer,
// as it must not acknowledge the grant.
TEST_F(RelayTest, ABackupThatTookOverNeverSendsTheOldPrimarysLateAnswer) {
  both_layouts();
  (void)exchange(poll_a());
  a_.route(std::vector{grant("late", 44)});
  OutDatagram reply = reply_datagram(0x55);
  ASSERT_TRUE(a_.hold(reply, {}, true));
  const std::vector<OutDatagram> delayed = poll_a();
  EXPECT_EQ(a_.replies_relayed(), 1U);
  ASSERT_TRUE(b_->set_layout(layout_without_a(5), now_).empty());
  now_ += 300 * kMs;
  std::vector<std::pair<std::string, replication::ReplicaHolder>> holders;
  ASSERT_TRUE(b_->takeover("a", kBucket, now_, holders));
  EXPECT_TRUE(holders.empty());
  const Sent sent = step_to_b(delayed);
  EXPECT_TRUE(sent.by_b.empty()) << "the late grant was answered after the takeover";
  EXPECT_EQ(b_->relays_sent(), 0U);
  EXPECT_TRUE(deliver_to_a(sent.to_a).empty());
}

// Acks ride in REPLICATEs (ReplicatorOptions::carry_acks): "a" is the
// primary of kBucket backed up by "b", and "b" the primary of kOtherBucket
// backed up by "a", as every node of a cluster backs the others up. An ack
// is owed until the next poll(), which puts it in the REPLICATE it sends
// the same peer, or sends it alone.
class CarriedAckTest : public ReplicatorTest {
 protected:
  static constexpr std::uint32_t kOtherBucket = 5;
  CarriedAckTest() : ReplicatorTest(carrying()) {
    b_ = std::make_unique<Replicator>(carrying(), 0);
  }
  static ReplicatorOptions carrying() {
    ReplicatorOptions o;
    o.carry_acks = true;
    return o;
  }
  static ReplicaLayout mutual(const std::string& self, const std::string& other,
                              std::uint16_t other_port, std::uint32_t primary_of,
                              std::uint32_t backup_of) {
    ReplicaLayout l;
    l.self_id = self;
    l.epoch = 4;
    l.peers = {ReplicaPeer{other, loopback(other_port)}};
    l.backups.resize(8);
    l.backups[primary_of] = {0};
    l.backing.assign(8, ReplicaLayout::kNone);
    l.backing[backup_of] = 0;
    return l;
  }
  static Entry grant_in(std::uint32_t bucket, std::string key, std::uint64_t token) {
    Entry e = grant(std::move(key), token);
    e.bucket = bucket;
    return e;
  }
  static std::uint32_t magic(const OutDatagram& d) {
    std::uint32_t m = 0;
    std::memcpy(&m, d.bytes.data(), sizeof m);
    return m;
  }
  static std::uint16_t port(const OutDatagram& d) { return ntohs(d.peer.addr.v4.sin_port); }
  // Delivers `wire` to the node each datagram is for; returns what that
  // sends (client answers included).
  std::vector<OutDatagram> deliver(const std::vector<OutDatagram>& wire) {
    std::vector<OutDatagram> out;
    for (const OutDatagram& d : wire) {
      const std::span<const std::uint8_t> bytes(d.bytes.data(), d.length);
      if (port(d) == 1002) {
        EXPECT_TRUE(b_->on_datagram(bytes, loopback(1001), now_, out));
      } else if (port(d) == 1001) {
        EXPECT_TRUE(a_.on_datagram(bytes, loopback(1002), now_, out));
      }
    }
    return out;
  }
  // Both layouts and snapshots, then datagrams and polls (as the I/O loops
  // poll after every batch) until neither node has anything to send.
  void settle() {
    ASSERT_EQ(a_.set_layout(mutual("a", "b", 1002, kBucket, kOtherBucket), now_).size(), 1U);
    ASSERT_EQ(b_->set_layout(mutual("b", "a", 1001, kOtherBucket, kBucket), now_).size(), 1U);
    a_.begin_snapshot(0, kBucket);
    a_.end_snapshot(0, kBucket);
    b_->begin_snapshot(0, kOtherBucket);
    b_->end_snapshot(0, kOtherBucket);
    std::vector<OutDatagram> wire;
    for (int round = 0; round < 20; ++round) {
      std::vector<OutDatagram> next = deliver(wire);
      for (OutDatagram& d : poll_a()) next.push_back(d);
      for (OutDatagram& d : poll_b()) next.push_back(d);
      if (next.empty()) return;
      wire = std::move(next);
    }
    FAIL() << "the two nodes never fell quiet";
  }
};

TEST_F(CarriedAckTest, AnAckRidesInTheReplicateGoingBackToItsPrimary) {
  settle();
  const std::uint64_t carried_before = b_->acks_carried();
  a_.route(std::vector{grant_in(kBucket, "k", 41)});
  OutDatagram from_a = reply_datagram(0x11);
  ASSERT_TRUE(a_.hold(from_a));
  const std::vector<OutDatagram> replicate = poll_a();
  ASSERT_EQ(replicate.size(), 1U);
  // Owed, not sent: the next poll decides how it goes.
  EXPECT_TRUE(deliver(replicate).empty());
  b_->route(std::vector{grant_in(kOtherBucket, "j", 42)});
  OutDatagram from_b = reply_datagram(0x22);
  ASSERT_TRUE(b_->hold(from_b));
  const std::vector<OutDatagram> back = poll_b();
  ASSERT_EQ(back.size(), 1U) << "the ack went alone beside the REPLICATE";
  EXPECT_EQ(port(back[0]), 1001);
  EXPECT_EQ(magic(back[0]), replication::kReplicateMagic);
  EXPECT_NE(back[0].bytes[kHeaderFlagsOffset] & replication::kFlagCarriesAck, 0);
  EXPECT_EQ(b_->acks_carried(), carried_before + 1);
  // "a" reads the ack: the answer it held goes; its own ack is owed.
  const std::vector<OutDatagram> released = deliver(back);
  ASSERT_EQ(released.size(), 1U);
  EXPECT_EQ(released[0].bytes[0], 0x11);
  EXPECT_GT(a_.lease_until(kBucket).count(), now_);
  // Nothing of its own goes to "b" now: the ack goes alone.
  const std::vector<OutDatagram> ack = poll_a();
  ASSERT_EQ(ack.size(), 1U);
  EXPECT_EQ(port(ack[0]), 1002);
  EXPECT_EQ(magic(ack[0]), replication::kAckMagic);
  const std::vector<OutDatagram> released_b = deliver(ack);
  ASSERT_EQ(released_b.size(), 1U);
  EXPECT_EQ(released_b[0].bytes[0], 0x22);
  EXPECT_GT(b_->lease_until(kOtherBucket).count(), now_);
  EXPECT_TRUE(poll_a().empty());
  EXPECT_TRUE(poll_b().empty());
}

TEST_F(CarriedAckTest, ACarriedAckIsReadWhenItsReplicateIsNotApplied) {
  settle();
  a_.route(std::vector{grant_in(kBucket, "k", 41)});
  OutDatagram from_a = reply_datagram(0x11);
  ASSERT_TRUE(a_.hold(from_a));
  EXPECT_TRUE(deliver(poll_a()).empty());
  // "b"'s REPLICATE carries the ack but names another receiver: "a"
  // refuses the REPLICATE and still reads the ack (it names "a").
  b_->route(std::vector{grant_in(kOtherBucket, "j", 42)});
  std::vector<OutDatagram> back = poll_b();
  ASSERT_EQ(back.size(), 1U);
  replication::ReplicateHeader header;
  std::vector<Entry> entries;
  std::optional<replication::Ack> carried;
  ASSERT_TRUE(replication::decode_replicate(std::span(back[0].bytes.data(), back[0].length), header,
                                            entries, nullptr, &carried));
  ASSERT_TRUE(carried.has_value());
  std::vector<std::uint8_t> forged;
  header.addressing.receiver = replication::node_tag("c");
  ASSERT_EQ(replication::encode_replicate(header, entries, forged), entries.size());
  ASSERT_TRUE(replication::append_ack(forged, *carried));
  OutDatagram d;
  d.peer = loopback(1001);
  std::memcpy(d.bytes.data(), forged.data(), forged.size());
  d.length = static_cast<std::uint16_t>(forged.size());
  const std::vector<OutDatagram> released = deliver({d});
  ASSERT_EQ(released.size(), 1U);
  EXPECT_EQ(released[0].bytes[0], 0x11);
  // The REPLICATE was not applied, so "a" owes "b" nothing.
  EXPECT_TRUE(poll_a().empty());
}

}  // namespace
}  // namespace shardlock::lease::internal
