// Membership, the map's epoch and the epoch file, against a real
// single-member etcd (tests/support/etcd_fixture.h). The etcd tests skip when
// /usr/bin/etcd is missing; the epoch file and option tests always run. The
// values and routing over a map are tested in tests/cluster/cluster_map_test.cc.
#include "membership.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "epoch_file.h"
#include "poll_until.h"
#include "support/etcd_fixture.h"
#include "tcp_proxy.h"

namespace shardlock::cluster {
namespace {

using std::chrono::milliseconds;
using std::chrono::nanoseconds;
using std::chrono::seconds;
using test_support::EtcdProcess;
using test_support::EtcdSuiteTest;
using test_support::poll_until;

// etcd's minimum TTL, so leaving members expire quickly.
constexpr seconds kTtl{2};
constexpr milliseconds kMargin{500};
// Small tables keep the Router's builds cheap under the sanitizers; the
// mapping is the same function at any size.
constexpr int kTestBucketBits = 12;

std::string make_temp_dir() {
  std::string pattern =
      (std::filesystem::temp_directory_path() / "shardlock-members-XXXXXX").string();
  return ::mkdtemp(pattern.data()) != nullptr ? pattern : std::string();
}

// Collects log lines from every member's threads.
class LogLines {
 public:
  std::function<void(std::string_view)> sink() {
    return [this](std::string_view line) {
      std::lock_guard lock(mutex_);
      lines_.emplace_back(line);
    };
  }
  bool contains(std::string_view text) const {
    std::lock_guard lock(mutex_);
    for (const std::string& line : lines_) {
      if (line.find(text) != std::string::npos) return true;
    }
    return false;
  }

 private:
  mutable std::mutex mutex_;
  std::vector<std::string> lines_;
};

// Collects the views a member's on_view reports. Must outlive the member:
// use MembershipTest::new_views().
class Views {
 public:
  std::function<void(const ClusterView&)> sink() {
    return [this](const ClusterView& view) {
      std::lock_guard lock(mutex_);
      views_.push_back(view);
    };
  }
  std::optional<ClusterView> last() const {
    std::lock_guard lock(mutex_);
    if (views_.empty()) return std::nullopt;
    return views_.back();
  }
  std::vector<ClusterView> all() const {
    std::lock_guard lock(mutex_);
    return views_;
  }

 private:
  mutable std::mutex mutex_;
  std::vector<ClusterView> views_;
};

std::vector<std::string> ids_of(const ClusterMap& map) {
  std::vector<std::string> ids;
  for (const ClusterMember& member : map.members) ids.push_back(member.id);
  return ids;
}

// ---------------------------------------------------------------------------
// Pure parts
// ---------------------------------------------------------------------------

TEST(EpochFileTest, RecordsDurablyNeverGoesBackAndRefusesACorruptFile) {
  const std::string dir = make_temp_dir();
  ASSERT_FALSE(dir.empty());
  std::string detail;
  {
    std::unique_ptr<EpochFile> file;
    ASSERT_FALSE(EpochFile::open(dir, file, detail)) << detail;
    EXPECT_EQ(file->highest(), 0u);
    ASSERT_FALSE(file->record(41, detail)) << detail;
    ASSERT_FALSE(file->record(7, detail)) << detail;  // lower: a no-op
    EXPECT_EQ(file->highest(), 41u);
  }
  {
    std::unique_ptr<EpochFile> file;
    ASSERT_FALSE(EpochFile::open(dir, file, detail)) << detail;
    EXPECT_EQ(file->highest(), 41u);
  }
  std::uint64_t epoch = 0;
  EXPECT_TRUE(EpochFile::decode(EpochFile::encode(5), epoch));
  EXPECT_EQ(epoch, 5u);
  {
    std::ofstream out(dir + "/" + EpochFile::kFileName, std::ios::trunc);
    out << "shardlock-cluster-epoch v1 42 0000000000000000\n";  // a bad checksum
  }
  std::unique_ptr<EpochFile> file;
  const std::error_code ec = EpochFile::open(dir, file, detail);
  EXPECT_EQ(ec, std::errc::illegal_byte_sequence);
  EXPECT_NE(detail.find(EpochFile::kFileName), std::string::npos) << detail;
  EXPECT_EQ(file, nullptr);
  std::filesystem::remove_all(dir);
}

TEST(MembershipOptionsTest, BadOptionsAreRefusedBeforeAnyIo) {
  MembershipOptions good;
  good.endpoints = "127.0.0.1:1";  // never contacted
  good.prefix = "/shardlock/x/";
  good.node_id = "a";
  good.advertise = "127.0.0.1:7000";
  good.data_dir = "/nonexistent-never-created";
  const auto refused = [](MembershipOptions options) {
    std::unique_ptr<Membership> member;
    std::string detail;
    const std::error_code ec = Membership::start(std::move(options), member, detail);
    EXPECT_FALSE(detail.empty());
    return ec == MembershipErrc::kInvalidOptions && member == nullptr;
  };
  MembershipOptions o = good;
  o.node_id = "a/b";
  EXPECT_TRUE(refused(o));
  o = good;
  o.advertise = "127.0.0.1";
  EXPECT_TRUE(refused(o));
  o = good;
  o.prefix = "/shardlock/x";
  EXPECT_TRUE(refused(o));
  o = good;
  o.weight = 0;
  EXPECT_TRUE(refused(o));
  o = good;
  o.data_dir.clear();
  EXPECT_TRUE(refused(o));
  o = good;
  o.lease_ttl = seconds(2);
  o.drift_margin = seconds(1);
  EXPECT_TRUE(refused(o));
}

// ---------------------------------------------------------------------------
// Against etcd
// ---------------------------------------------------------------------------

class MembershipTest : public EtcdSuiteTest {
 protected:
  void SetUp() override {
    EtcdSuiteTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    prefix_ = "/shardlock/" + test_name() + "/";
    base_dir_ = make_temp_dir();
    ASSERT_FALSE(base_dir_.empty());
    router_options_.bucket_bits = kTestBucketBits;
  }
  void TearDown() override {
    members_.clear();  // stops them (revoking their leases)
    if (!base_dir_.empty()) std::filesystem::remove_all(base_dir_);
  }

  MembershipOptions options_for(const std::string& id, const std::string& endpoints = {}) {
    MembershipOptions options;
    options.endpoints = endpoints.empty() ? etcd_->endpoint() : endpoints;
    options.prefix = prefix_;
    options.node_id = id;
    options.advertise = "127.0.0.1:" + std::to_string(7000 + id.size() + id.back());
    options.data_dir = base_dir_ + "/" + id;
    options.lease_ttl = kTtl;
    options.drift_margin = kMargin;
    options.retry_interval = milliseconds(100);
    options.log = log_.sink();
    return options;
  }

  // Starts a member and keeps it in members_ (stopped at TearDown).
  Membership* start(MembershipOptions options) {
    std::unique_ptr<Membership> member;
    std::string detail;
    const std::error_code ec = Membership::start(std::move(options), member, detail);
    EXPECT_FALSE(ec) << ec.message() << ": " << detail;
    if (ec) return nullptr;
    members_.push_back(std::move(member));
    return members_.back().get();
  }
  Membership* start(const std::string& id) { return start(options_for(id)); }

  // Every member in `members` has the same map, with exactly `ids`, at an
  // epoch above `above`.
  static bool converged(const std::vector<Membership*>& members,
                        const std::vector<std::string>& ids, std::uint64_t above) {
    const auto first = members.front()->current_map();
    if (first->epoch <= above || ids_of(*first) != ids) return false;
    for (Membership* member : members) {
      if (*member->current_map() != *first) return false;
    }
    return true;
  }

  // CAS wins summed over `members`.
  static std::uint64_t publishes(const std::vector<Membership*>& members) {
    std::uint64_t total = 0;
    for (Membership* member : members) total += member->stats().maps_published;
    return total;
  }

  std::unique_ptr<ClusterRouting> routing_of(const ClusterMap& map) const {
    std::unique_ptr<ClusterRouting> routing;
    EXPECT_EQ(ClusterRouting::build(map, router_options_, routing), RouterStatus::kOk);
    return routing;
  }

  // A collector that outlives every member (they stop in TearDown).
  Views& new_views() { return views_.emplace_back(); }

  std::string prefix_;
  std::string base_dir_;
  RouterOptions router_options_;
  LogLines log_;
  std::list<Views> views_;
  std::vector<std::unique_ptr<Membership>> members_;
};

TEST_F(MembershipTest, ThreeNodesConvergeOnOneMapWhoseEpochIsTheMapKeysRevision) {
  Membership* a = start("a");
  Membership* b = start("b");
  Membership* c = start("c");
  ASSERT_TRUE(a && b && c);
  ASSERT_TRUE(poll_until(
      [&] {
        return converged({a, b, c}, {"a", "b", "c"}, 0);
      },
      test_support::kPollTimeout, milliseconds(20)));
  const auto map = a->current_map();
  EXPECT_EQ(map->members[1].address, b->options().advertise);
  EXPECT_EQ(map->members[1].weight, 1u);

  // The epoch is the one the map key's value carries.
  const auto read = a->etcd().get(prefix_ + "map");
  ASSERT_TRUE(read.ok()) << read.detail;
  ASSERT_EQ(read.value.kvs.size(), 1u);
  const auto stored = decode_map(read.value.kvs[0].value,
                                 static_cast<std::uint64_t>(read.value.kvs[0].mod_revision));
  ASSERT_TRUE(stored.has_value());
  EXPECT_EQ(*stored, *map);

  // Each member key is under its node's own lease.
  for (Membership* member : {a, b, c}) {
    const auto key = a->etcd().get(prefix_ + "members/" + member->options().node_id);
    ASSERT_TRUE(key.ok());
    ASSERT_EQ(key.value.kvs.size(), 1u);
    EXPECT_EQ(key.value.kvs[0].lease, member->lease_id());
    EXPECT_TRUE(member->lease_alive());
    // The epoch each adopted is persisted.
    EXPECT_EQ(member->stats().highest_epoch, map->epoch);
  }
  // Every published map was adopted by its publisher, and publishes are CAS
  // wins: no more of them than the maps that ever existed for this prefix.
  std::uint64_t published = 0;
  for (Membership* member : {a, b, c}) published += member->stats().maps_published;
  EXPECT_GE(published, 1u);
  EXPECT_LE(published, 3u);  // at most one per membership change: +a, +b, +c
}

TEST_F(MembershipTest, ANodeWhoseLeaseExpiresLeavesTheMapAtAHigherEpoch) {
  Membership* a = start("a");
  Membership* b = start("b");
  Membership* c = start("c");
  ASSERT_TRUE(a && b && c);
  ASSERT_TRUE(poll_until(
      [&] {
        return converged({a, b, c}, {"a", "b", "c"}, 0);
      },
      test_support::kPollTimeout, milliseconds(20)));
  const std::uint64_t before = a->current_map()->epoch;
  const std::uint64_t published_before = publishes({a, b});

  // A crash: no revoke, the keep-alives stop, etcd expires the lease.
  c->stop(StopMode::kAbandonLease);
  EXPECT_FALSE(c->lease_alive());
  ASSERT_TRUE(poll_until(
      [&] {
        return converged({a, b}, {"a", "b"}, before);
      },
      test_support::kPollTimeout, milliseconds(20)))
      << "a: epoch " << a->current_map()->epoch << ", " << a->current_map()->members.size()
      << " members";
  EXPECT_GT(b->current_map()->epoch, before);
  // Both saw the same change and raced to publish it; one CAS won.
  EXPECT_EQ(publishes({a, b}) - published_before, 1u);
}

TEST_F(MembershipTest, AJoinerRaisesTheEpochAndTakesOnlyBucketsThatMoveToIt) {
  Membership* a = start("a");
  Membership* b = start("b");
  Membership* c = start("c");
  ASSERT_TRUE(a && b && c);
  ASSERT_TRUE(poll_until(
      [&] {
        return converged({a, b, c}, {"a", "b", "c"}, 0);
      },
      test_support::kPollTimeout, milliseconds(20)));
  const auto before_map = a->current_map();
  const auto before = routing_of(*before_map);
  const std::uint64_t published_before = publishes({a, b, c});

  Membership* d = start("d");
  ASSERT_NE(d, nullptr);
  ASSERT_TRUE(poll_until(
      [&] {
        return converged({a, b, c, d}, {"a", "b", "c", "d"}, before_map->epoch);
      },
      test_support::kPollTimeout, milliseconds(20)));
  // Four nodes may react to the join; exactly one CAS publishes it.
  EXPECT_EQ(publishes({a, b, c, d}) - published_before, 1u);
  const auto after = routing_of(*d->current_map());
  ASSERT_EQ(before->bucket_count(), after->bucket_count());
  std::size_t moved = 0;
  for (std::size_t bucket = 0; bucket < after->bucket_count(); ++bucket) {
    const ClusterMember* old_owner = before->owner_of_bucket(bucket);
    const ClusterMember* new_owner = after->owner_of_bucket(bucket);
    ASSERT_TRUE(old_owner && new_owner);
    if (old_owner->id != new_owner->id) {
      ++moved;
      ASSERT_EQ(new_owner->id, "d") << "bucket " << bucket << " moved from " << old_owner->id;
    }
  }
  EXPECT_GT(moved, 0u);
  EXPECT_LT(moved, after->bucket_count() / 2);  // about a quarter
}

TEST_F(MembershipTest, APersistedHigherEpochMakesARestartedNodeRefuseTheMapAndPublishAboveIt) {
  MembershipOptions options = options_for("a");
  Membership* a = start(options);
  ASSERT_NE(a, nullptr);
  ASSERT_TRUE(poll_until([&] { return converged({a}, {"a"}, 0); }, test_support::kPollTimeout,
                         milliseconds(20)));
  const std::uint64_t epoch = a->current_map()->epoch;
  members_.clear();  // stops it, revoking its lease

  // As if this node had seen a much newer map before etcd lost it.
  {
    std::unique_ptr<EpochFile> file;
    std::string detail;
    ASSERT_FALSE(EpochFile::open(options.data_dir, file, detail)) << detail;
    ASSERT_EQ(file->highest(), epoch);
    ASSERT_FALSE(file->record(epoch + 1000, detail)) << detail;
  }
  std::vector<ClusterMap> seen;
  std::mutex seen_mutex;
  options.on_map_change = [&](const ClusterMap& map) {
    std::lock_guard lock(seen_mutex);
    seen.push_back(map);
  };
  Membership* restarted = start(options);
  ASSERT_NE(restarted, nullptr);
  // It never adopts the older map; it puts the same membership again above
  // every epoch it has seen (what an etcd restored from a snapshot needs).
  ASSERT_TRUE(poll_until([&] { return restarted->current_map()->epoch == epoch + 1001; },
                         test_support::kPollTimeout, milliseconds(20)));
  const MembershipStats stats = restarted->stats();
  EXPECT_EQ(stats.highest_epoch, epoch + 1001);
  EXPECT_GE(stats.maps_refused, 1u);
  EXPECT_EQ(stats.last_refused_epoch, epoch);
  EXPECT_EQ(stats.maps_adopted, 1u);
  EXPECT_TRUE(log_.contains("refusing cluster map epoch " + std::to_string(epoch)));
  std::lock_guard lock(seen_mutex);
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].epoch, epoch + 1001);
}

TEST_F(MembershipTest, LeaseAliveIsADeadlineOnTheInjectedClock) {
  auto fake_now = std::make_shared<std::atomic<std::int64_t>>(
      std::chrono::duration_cast<nanoseconds>(seconds(1000)).count());
  MembershipOptions options = options_for("a");
  options.clock = [fake_now] { return nanoseconds(fake_now->load(std::memory_order_relaxed)); };
  Membership* a = start(options);
  ASSERT_NE(a, nullptr);
  // The clock stands still: every acknowledged keep-alive was sent at 1000 s,
  // so the deadline is 1000 s + the TTL etcd granted (2 s) - the margin.
  const nanoseconds expected = seconds(1000) + kTtl - kMargin;
  ASSERT_TRUE(poll_until([&] { return a->stats().keep_alives_acked >= 2; },
                         test_support::kPollTimeout, milliseconds(20)));
  EXPECT_EQ(a->lease_deadline(), expected);
  EXPECT_TRUE(a->lease_alive());
  EXPECT_TRUE(a->lease_alive(expected - nanoseconds(1)));
  EXPECT_FALSE(a->lease_alive(expected));
  EXPECT_FALSE(a->lease_alive(expected + seconds(60)));

  // The clock jumps 10 s (a pause): past the deadline, until a keep-alive
  // sent at the new time is acknowledged and moves it.
  fake_now->store(std::chrono::duration_cast<nanoseconds>(seconds(1010)).count(),
                  std::memory_order_relaxed);
  ASSERT_TRUE(poll_until([&] { return a->lease_deadline() == expected + seconds(10); },
                         test_support::kPollTimeout, milliseconds(20)));
  EXPECT_TRUE(a->lease_alive());
}

TEST_F(MembershipTest, ADrainedNodeLeavesTheNextMapWhileItsKeyStaysAlive) {
  Membership* a = start("a");
  Membership* b = start("b");
  Membership* c = start("c");
  ASSERT_TRUE(a && b && c);
  ASSERT_TRUE(poll_until(
      [&] {
        return converged({a, b, c}, {"a", "b", "c"}, 0);
      },
      test_support::kPollTimeout, milliseconds(20)));
  const std::uint64_t before = a->current_map()->epoch;
  const EtcdStatus drained = c->drain();
  ASSERT_TRUE(drained.ok()) << drained.detail;
  // c itself follows the map that leaves it out.
  ASSERT_TRUE(poll_until(
      [&] {
        return converged({a, b, c}, {"a", "b"}, before);
      },
      test_support::kPollTimeout, milliseconds(20)));
  const auto key = a->etcd().get(prefix_ + "members/c");
  ASSERT_TRUE(key.ok()) << key.detail;
  ASSERT_EQ(key.value.kvs.size(), 1u);
  EXPECT_EQ(key.value.kvs[0].lease, c->lease_id());
  const auto record = decode_member(key.value.kvs[0].value);
  ASSERT_TRUE(record.has_value());
  EXPECT_EQ(record->state, MemberState::kDraining);
  EXPECT_TRUE(c->lease_alive());
}

TEST_F(MembershipTest, ALostLeaseIsReplacedAndTheMapShowsTheNodeAgain) {
  Membership* a = start("a");
  Membership* b = start("b");
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(poll_until(
      [&] {
        return converged({a, b}, {"a", "b"}, 0);
      },
      test_support::kPollTimeout, milliseconds(20)));
  const std::uint64_t before = a->current_map()->epoch;
  const std::int64_t old_lease = b->lease_id();
  ASSERT_TRUE(a->etcd().revoke_lease(old_lease).ok());  // etcd drops b's key now

  ASSERT_TRUE(poll_until(
      [&] {
        const std::int64_t lease = b->lease_id();
        return lease != 0 && lease != old_lease;
      },
      test_support::kPollTimeout, milliseconds(20)));
  const MembershipStats stats = b->stats();
  EXPECT_GE(stats.leases_lost, 1u);
  EXPECT_GE(stats.registrations, 2u);
  // The map moved on (b left, then came back) and shows b under its new key.
  ASSERT_TRUE(poll_until(
      [&] {
        return converged({a, b}, {"a", "b"}, before) && b->lease_alive();
      },
      test_support::kPollTimeout, milliseconds(20)));
  const auto key = a->etcd().get(prefix_ + "members/b");
  ASSERT_TRUE(key.ok());
  ASSERT_EQ(key.value.kvs.size(), 1u);
  EXPECT_EQ(key.value.kvs[0].lease, b->lease_id());
}

TEST_F(MembershipTest, AJoiningNodeLearnsUntilItHasCaughtUpAndLearnsAgainAfterRegisteringAgain) {
  auto learner_options = [&](const std::string& id) {
    MembershipOptions options = options_for(id);
    options.join_as_learner = true;
    return options;
  };
  const auto learner_ids = [](const ClusterMap& map) {
    std::vector<std::string> ids;
    for (const ClusterMember& m : map.learners) ids.push_back(m.id);
    return ids;
  };
  const auto record_state = [&](const std::string& id) {
    const auto key = members_.front()->etcd().get(prefix_ + "members/" + id);
    EXPECT_TRUE(key.ok()) << key.detail;
    if (!key.ok() || key.value.kvs.size() != 1) return MemberState::kDraining;
    return decode_member(key.value.kvs[0].value).value_or(MemberRecord{}).state;
  };
  // With no member to learn from, the first joiner is a member at once.
  Membership* a = start(learner_options("a"));
  ASSERT_TRUE(a);
  ASSERT_TRUE(poll_until([&] { return converged({a}, {"a"}, 0); }, test_support::kPollTimeout,
                         milliseconds(20)));
  EXPECT_EQ(a->current_map()->members[0].lease, a->lease_id());
  EXPECT_TRUE(a->learning());
  EXPECT_EQ(record_state("a"), MemberState::kJoining);
  // The second learns: in the map, apart from the members.
  Membership* b = start(learner_options("b"));
  ASSERT_TRUE(b);
  ASSERT_TRUE(poll_until(
      [&] {
        return converged({a, b}, {"a"}, 0) &&
               learner_ids(*a->current_map()) == std::vector<std::string>{"b"};
      },
      test_support::kPollTimeout, milliseconds(20)));
  // a's own caught_up() changes its record, not the map.
  const std::uint64_t with_learner = a->current_map()->epoch;
  ASSERT_TRUE(a->caught_up().ok());
  EXPECT_FALSE(a->learning());
  EXPECT_EQ(record_state("a"), MemberState::kActive);
  // b's makes it a member.
  ASSERT_TRUE(b->caught_up().ok());
  EXPECT_EQ(record_state("b"), MemberState::kActive);
  ASSERT_TRUE(poll_until(
      [&] {
        return converged({a, b}, {"a", "b"}, with_learner) && a->current_map()->learners.empty();
      },
      test_support::kPollTimeout, milliseconds(20)));
  EXPECT_EQ(a->current_map()->epoch, with_learner + 1);  // a's record alone moved nothing
  // A registration again is a new incarnation: a learner until it catches up.
  const std::uint64_t promoted = a->current_map()->epoch;
  const std::int64_t old_lease = b->lease_id();
  ASSERT_TRUE(a->etcd().revoke_lease(old_lease).ok());
  ASSERT_TRUE(poll_until(
      [&] {
        return converged({a, b}, {"a"}, promoted) &&
               learner_ids(*a->current_map()) == std::vector<std::string>{"b"} &&
               a->current_map()->learners[0].lease == b->lease_id();
      },
      test_support::kPollTimeout, milliseconds(20)));
  EXPECT_TRUE(b->learning());
  EXPECT_EQ(record_state("b"), MemberState::kJoining);
}

TEST_F(MembershipTest, MalformedValuesInEtcdAreCountedAndIgnored) {
  Membership* a = start("a");
  ASSERT_NE(a, nullptr);
  ASSERT_TRUE(poll_until([&] { return converged({a}, {"a"}, 0); }, test_support::kPollTimeout,
                         milliseconds(20)));
  const std::uint64_t before = a->current_map()->epoch;
  ASSERT_TRUE(a->etcd().put(prefix_ + "members/x", "not a member").ok());
  ASSERT_TRUE(a->etcd().put(prefix_ + "members/bad/id", "address=h:1 weight=1 state=active").ok());
  ASSERT_TRUE(poll_until([&] { return a->stats().bad_values >= 2; }, test_support::kPollTimeout,
                         milliseconds(20)));
  // A map value that does not decode is replaced by the live membership.
  ASSERT_TRUE(a->etcd().put(prefix_ + "map", "garbage").ok());
  ASSERT_TRUE(poll_until([&] { return converged({a}, {"a"}, before); }, test_support::kPollTimeout,
                         milliseconds(20)));
}

TEST_F(MembershipTest, ASecondNodeWithALiveIdIsRefused) {
  ASSERT_NE(start("a"), nullptr);
  MembershipOptions options = options_for("a");
  options.data_dir = base_dir_ + "/other";
  std::unique_ptr<Membership> twin;
  std::string detail;
  EXPECT_EQ(Membership::start(options, twin, detail), MembershipErrc::kMemberExists);
  EXPECT_NE(detail.find("members/a"), std::string::npos) << detail;
  EXPECT_EQ(twin, nullptr);
}

// Two nodes cut off from each other suspect each other at once: the first
// eviction wins, and the second is refused by etcd (its evictor is no
// longer a member), so one of them stays. Before, each revoked the other's
// lease and both left the map.
TEST_F(MembershipTest, OfTwoNodesEvictingEachOtherOnlyTheFirstSucceeds) {
  Membership* a = start("a");
  Membership* b = start("b");
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  const std::int64_t a_lease = a->lease_id();
  const std::int64_t b_lease = b->lease_id();
  ASSERT_TRUE(a->evict("b", b_lease).ok());
  const EtcdStatus second = b->evict("a", a_lease);
  EXPECT_FALSE(second.ok());
  EXPECT_EQ(second.error, EtcdErrc::kNotFound) << second.detail;
  EXPECT_NE(second.detail.find("evicted first"), std::string::npos) << second.detail;
  const auto view = Membership::read_view(a->etcd(), prefix_);
  ASSERT_TRUE(view.ok()) << view.detail;
  ASSERT_EQ(view.value.members.size(), 1U);
  EXPECT_EQ(view.value.members[0].id, "a");
  // A stale suspicion (a lease the peer no longer has) evicts nothing, nor
  // does a node evict itself.
  EXPECT_FALSE(a->evict("b", b_lease).ok());
  EXPECT_FALSE(a->evict("a", a_lease).ok());
}

TEST_F(MembershipTest, ANodeWithAnotherReplicaCountIsRefused) {
  MembershipOptions first = options_for("a");
  first.replicas = 2;
  ASSERT_NE(start(first), nullptr);
  MembershipOptions other = options_for("b");
  other.replicas = 3;
  std::unique_ptr<Membership> refused;
  std::string detail;
  EXPECT_EQ(Membership::start(other, refused, detail), MembershipErrc::kReplicasMismatch);
  EXPECT_NE(detail.find("node a runs with --replicas 2"), std::string::npos) << detail;
  EXPECT_EQ(refused, nullptr);
  // Refused before registering: b never appears.
  const auto view = Membership::read_view(members_[0]->etcd(), prefix_);
  ASSERT_TRUE(view.ok()) << view.detail;
  EXPECT_EQ(view.value.members.size(), 1u);
  // A record without the field (an earlier version) counts as one replica.
  ASSERT_TRUE(members_[0]
                  ->etcd()
                  .put(prefix_ + "members/old", "address=127.0.0.1:9 weight=1 state=active")
                  .ok());
  MembershipOptions same = options_for("c");
  same.replicas = 2;
  EXPECT_EQ(Membership::start(same, refused, detail), MembershipErrc::kReplicasMismatch);
  EXPECT_NE(detail.find("node old runs with --replicas 1"), std::string::npos) << detail;
  ASSERT_TRUE(members_[0]->etcd().delete_key(prefix_ + "members/old").ok());
  // The same count joins.
  EXPECT_NE(start(same), nullptr);
}

const ClusterView::Member* find_member(const ClusterView& view, std::string_view id) {
  for (const ClusterView::Member& member : view.members) {
    if (member.id == id) return &member;
  }
  return nullptr;
}

TEST_F(MembershipTest, EveryPassReportsAViewOfMembersHandoffsAndDrainsWithTheAdoptedMap) {
  Views& views = new_views();
  MembershipOptions options = options_for("a");
  options.on_view = views.sink();
  Membership* a = start(options);
  ASSERT_NE(a, nullptr);
  // The first pass runs inside start(), so its view is there already.
  ASSERT_TRUE(views.last().has_value());
  Membership* b = start("b");
  ASSERT_NE(b, nullptr);
  ASSERT_TRUE(poll_until(
      [&] {
        return converged({a, b}, {"a", "b"}, 0);
      },
      test_support::kPollTimeout, milliseconds(20)));

  ASSERT_TRUE(a->put_handoff(a->current_map()->epoch).ok());
  ASSERT_TRUE(a->etcd().put(prefix_ + "handoff/x", "not a number").ok());
  ASSERT_TRUE(a->etcd().put(prefix_ + "drain/b", "1").ok());
  ASSERT_TRUE(a->etcd().put(prefix_ + "handoff/y", "42").ok());  // the last write: seen last
  ASSERT_TRUE(poll_until(
      [&] {
        const auto view = views.last();
        return view && !view->handoffs.empty() && view->handoffs.back().id == "y";
      },
      test_support::kPollTimeout, milliseconds(20)));
  const ClusterView view = *views.last();
  // The map is the adopted one; b drains (the key), so the map may have
  // moved on to {a} by now, and the view shows whatever a adopted.
  EXPECT_EQ(*view.map, *a->current_map());
  ASSERT_EQ(view.members.size(), 2u);
  EXPECT_EQ(view.members[0].id, "a");
  EXPECT_EQ(view.members[1].id, "b");
  const auto key = a->etcd().get(prefix_ + "members/a");
  ASSERT_TRUE(key.ok());
  ASSERT_EQ(key.value.kvs.size(), 1u);
  EXPECT_EQ(view.members[0].create_revision, key.value.kvs[0].create_revision);
  EXPECT_EQ(view.members[0].lease, a->lease_id());
  EXPECT_EQ(view.members[0].record.address, a->options().advertise);
  EXPECT_EQ(view.members[1].lease, b->lease_id());
  // handoff/x does not decode: skipped and counted.
  ASSERT_EQ(view.handoffs.size(), 2u);
  EXPECT_EQ(view.handoffs[0].id, "a");
  EXPECT_EQ(view.handoffs[1].id, "y");
  EXPECT_EQ(view.handoffs[1].epoch, 42u);
  EXPECT_GE(a->stats().bad_values, 1u);
  EXPECT_EQ(view.drains, std::vector<std::string>{"b"});
  // Views come in revision order.
  const std::vector<ClusterView> all = views.all();
  for (std::size_t i = 1; i < all.size(); ++i) {
    EXPECT_LE(all[i - 1].revision, all[i].revision);
  }
}

TEST_F(MembershipTest, AReRegisteredMemberShowsANewCreateRevisionInTheView) {
  Views& views = new_views();
  MembershipOptions options = options_for("a");
  options.on_view = views.sink();
  Membership* a = start(options);
  Membership* b = start("b");
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(poll_until(
      [&] {
        const auto view = views.last();
        return view && find_member(*view, "b") != nullptr;
      },
      test_support::kPollTimeout, milliseconds(20)));
  const std::int64_t first_created = find_member(*views.last(), "b")->create_revision;
  const std::int64_t old_lease = b->lease_id();
  ASSERT_TRUE(a->etcd().revoke_lease(old_lease).ok());  // etcd drops b's key now
  ASSERT_TRUE(poll_until(
      [&] {
        const auto view = views.last();
        const ClusterView::Member* member = view ? find_member(*view, "b") : nullptr;
        return member != nullptr && member->create_revision != first_created;
      },
      test_support::kPollTimeout, milliseconds(20)));
  const ClusterView view = *views.last();
  const ClusterView::Member* member = find_member(view, "b");
  ASSERT_NE(member, nullptr);
  EXPECT_GT(member->create_revision, first_created);
  EXPECT_NE(member->lease, old_lease);
}

TEST_F(MembershipTest, AHandoffIsPutUnderTheNodesLeaseAndRefusedWhenNotRegistered) {
  Membership* a = start("a");
  ASSERT_NE(a, nullptr);
  ASSERT_TRUE(a->put_handoff(12345).ok());
  const auto key = a->etcd().get(prefix_ + "handoff/a");
  ASSERT_TRUE(key.ok()) << key.detail;
  ASSERT_EQ(key.value.kvs.size(), 1u);
  EXPECT_EQ(key.value.kvs[0].value, "12345");
  EXPECT_EQ(key.value.kvs[0].lease, a->lease_id());

  // A crash-like stop leaves the key until the lease expires; the node has
  // no lease any more, so a hand-off is refused without I/O.
  a->stop(StopMode::kAbandonLease);
  const EtcdStatus refused = a->put_handoff(12346);
  EXPECT_EQ(refused.error, EtcdErrc::kNotFound);
  EXPECT_NE(refused.detail.find("not registered"), std::string::npos) << refused.detail;
  // The key goes with the lease.
  ASSERT_TRUE(poll_until(
      [&] {
        const auto read = a->etcd().get(prefix_ + "handoff/a");
        return read.ok() && read.value.kvs.empty();
      },
      test_support::kPollTimeout, milliseconds(50)));
}

TEST_F(MembershipTest, ADrainKeyDrainsTheNodeAndDeletingItBringsItBack) {
  Membership* a = start("a");
  Membership* b = start("b");
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(poll_until(
      [&] {
        return converged({a, b}, {"a", "b"}, 0);
      },
      test_support::kPollTimeout, milliseconds(20)));
  const std::uint64_t before = a->current_map()->epoch;
  const auto state_of_b = [&]() -> std::optional<MemberState> {
    const auto read = a->etcd().get(prefix_ + "members/b");
    if (!read.ok() || read.value.kvs.size() != 1) return std::nullopt;
    const auto record = decode_member(read.value.kvs[0].value);
    return record ? std::optional(record->state) : std::nullopt;
  };

  ASSERT_TRUE(Membership::request_drain(a->etcd(), prefix_, "b").ok());
  ASSERT_TRUE(poll_until(
      [&] {
        return converged({a, b}, {"a"}, before);
      },
      test_support::kPollTimeout, milliseconds(20)));
  EXPECT_EQ(state_of_b(), MemberState::kDraining);
  EXPECT_TRUE(b->lease_alive());
  EXPECT_EQ(b->stats().drains_by_key, 1u);
  const std::uint64_t drained = a->current_map()->epoch;

  ASSERT_TRUE(Membership::cancel_drain(a->etcd(), prefix_, "b").ok());
  ASSERT_TRUE(poll_until(
      [&] {
        return converged({a, b}, {"a", "b"}, drained);
      },
      test_support::kPollTimeout, milliseconds(20)));
  EXPECT_EQ(state_of_b(), MemberState::kActive);
  EXPECT_EQ(b->stats().drains_cancelled, 1u);
  // Cancelling again is not an error; a bad id is refused.
  EXPECT_TRUE(Membership::cancel_drain(a->etcd(), prefix_, "b").ok());
  EXPECT_EQ(Membership::request_drain(a->etcd(), prefix_, "b/c").error, EtcdErrc::kInvalidArgument);
}

TEST_F(MembershipTest, ADrainByCodeOutlivesADrainKeyThatComesAndGoes) {
  Views& views_of_b = new_views();
  MembershipOptions options = options_for("b");
  options.on_view = views_of_b.sink();
  Membership* a = start("a");
  Membership* b = start(options);
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(poll_until(
      [&] {
        return converged({a, b}, {"a", "b"}, 0);
      },
      test_support::kPollTimeout, milliseconds(20)));
  ASSERT_TRUE(b->drain().ok());
  ASSERT_TRUE(Membership::request_drain(a->etcd(), prefix_, "b").ok());
  ASSERT_TRUE(poll_until(
      [&] {
        const auto view = views_of_b.last();
        return view && view->drains == std::vector<std::string>{"b"};
      },
      test_support::kPollTimeout, milliseconds(20)));
  ASSERT_TRUE(Membership::cancel_drain(a->etcd(), prefix_, "b").ok());
  // b has passed over the prefix without the key.
  ASSERT_TRUE(poll_until(
      [&] {
        const auto view = views_of_b.last();
        return view && view->drains.empty();
      },
      test_support::kPollTimeout, milliseconds(20)));
  EXPECT_EQ(b->stats().drains_by_key, 0u);  // it was draining already
  EXPECT_EQ(b->stats().drains_cancelled, 0u);
  ASSERT_TRUE(poll_until(
      [&] {
        return converged({a, b}, {"a"}, 0);
      },
      test_support::kPollTimeout, milliseconds(20)));
  const auto read = a->etcd().get(prefix_ + "members/b");
  ASSERT_TRUE(read.ok());
  ASSERT_EQ(read.value.kvs.size(), 1u);
  EXPECT_EQ(decode_member(read.value.kvs[0].value)->state, MemberState::kDraining);
}

TEST_F(MembershipTest, EveryStartAndEveryRequestBeginsANewEpochWithTheSameMembers) {
  MembershipOptions options = options_for("a");
  Membership* a = start(options);
  ASSERT_NE(a, nullptr);
  ASSERT_TRUE(poll_until([&] { return converged({a}, {"a"}, 0); }, test_support::kPollTimeout,
                         milliseconds(20)));
  const std::uint64_t first = a->current_map()->epoch;
  members_.clear();  // stops it, revoking its lease; the map key stays

  // The same id and data dir against the same etcd: the membership is the
  // same as the published map, and still the epoch rises.
  Membership* restarted = start(options);
  ASSERT_NE(restarted, nullptr);
  ASSERT_TRUE(poll_until([&] { return converged({restarted}, {"a"}, first); },
                         test_support::kPollTimeout, milliseconds(20)));
  // Epochs are the cluster's own counter: the next one, however many other
  // writes etcd took in between (a shared etcd's revision races ahead).
  const std::uint64_t second = restarted->current_map()->epoch;
  EXPECT_EQ(second, first + 1);
  // Not a republish: the map records each member's etcd lease, and the
  // restarted node has a new one.
  EXPECT_EQ(restarted->stats().maps_republished, 0u);
  EXPECT_EQ(restarted->current_map()->members[0].lease, restarted->lease_id());
  const auto read = restarted->etcd().get(prefix_ + "map");
  ASSERT_TRUE(read.ok());
  ASSERT_EQ(read.value.kvs.size(), 1u);
  EXPECT_GT(static_cast<std::uint64_t>(read.value.kvs[0].mod_revision), second);

  for (int i = 0; i < 50; ++i) {
    ASSERT_TRUE(restarted->etcd().put(prefix_ + "unrelated", std::to_string(i)).ok());
  }
  restarted->request_new_epoch();
  ASSERT_TRUE(poll_until([&] { return converged({restarted}, {"a"}, second); },
                         test_support::kPollTimeout, milliseconds(20)));
  EXPECT_EQ(restarted->current_map()->epoch, second + 1);

  // A floor (a data dir whose tokens are above this epoch's) jumps to it.
  restarted->request_new_epoch(second + 100);
  ASSERT_TRUE(poll_until([&] { return converged({restarted}, {"a"}, second + 1); },
                         test_support::kPollTimeout, milliseconds(20)));
  EXPECT_EQ(restarted->current_map()->epoch, second + 100);
  const MembershipStats stats = restarted->stats();
  EXPECT_EQ(stats.epochs_requested, 2u);
  EXPECT_EQ(stats.maps_republished, 2u);
  EXPECT_EQ(stats.highest_epoch, restarted->current_map()->epoch);
}

// Maps published between two reads reach the view in order, from the watch:
// a node that only adopted the newest would not know who owned a bucket in
// between, and could grant beside a live lease.
TEST_F(MembershipTest, MapsPublishedBetweenTwoReadsAreAdoptedInOrder) {
  std::mutex mutex;
  std::condition_variable changed;
  bool hold = false;
  bool held = false;
  std::vector<ClusterView> views;
  MembershipOptions options = options_for("a");
  options.on_view = [&](const ClusterView& view) {
    std::unique_lock lock(mutex);
    views.push_back(view);
    held = hold;
    changed.notify_all();
    changed.wait(lock, [&] { return !hold; });
  };
  Membership* a = start(options);
  ASSERT_NE(a, nullptr);
  ASSERT_TRUE(poll_until([&] { return converged({a}, {"a"}, 0); }, test_support::kPollTimeout,
                         milliseconds(20)));
  const ClusterMap before = *a->current_map();
  {
    // Stall the map thread inside a pass.
    std::unique_lock lock(mutex);
    hold = true;
    held = false;
  }
  ASSERT_TRUE(a->etcd().put(prefix_ + "poke", "1").ok());
  {
    std::unique_lock lock(mutex);
    ASSERT_TRUE(changed.wait_for(lock, seconds(20), [&] { return held; }));
  }
  // Two maps while it stalls (the same membership, so nobody re-publishes).
  for (std::uint64_t i = 1; i <= 2; ++i) {
    ASSERT_TRUE(
        a->etcd().put(prefix_ + "map", encode_map({before.epoch + i, before.members})).ok());
  }
  std::this_thread::sleep_for(milliseconds(300));  // the watch delivers both meanwhile
  {
    std::unique_lock lock(mutex);
    hold = false;
    views.clear();
    changed.notify_all();
  }
  ASSERT_TRUE(poll_until([&] { return a->current_map()->epoch == before.epoch + 2; },
                         test_support::kPollTimeout, milliseconds(20)));
  std::unique_lock lock(mutex);
  std::vector<std::uint64_t> adopted;
  for (const ClusterView& view : views) {
    for (const auto& map : view.adopted) adopted.push_back(map->epoch);
  }
  EXPECT_EQ(adopted, (std::vector<std::uint64_t>{before.epoch + 1, before.epoch + 2}));
}

// A node whose watch lost the maps published while it was
// cut off from etcd (its watch resumes at a compacted revision, so etcd
// cancels it) reads them back from the map key's history and adopts every
// epoch in order. Before, it adopted only the newest: an epoch jump, which
// starts the node's history over (every bucket that moved to it waits out
// the lock-delay, and a backup skips its takeovers).
TEST_F(MembershipTest, MapsMissedWhileCutOffAreReadBackFromEtcdsHistoryAndAdoptedInOrder) {
  torture::TcpProxy proxy;
  ASSERT_TRUE(proxy.start(etcd_->client_port())) << proxy.error();
  Views& views = new_views();
  MembershipOptions options = options_for("a", "127.0.0.1:" + std::to_string(proxy.port()));
  options.on_view = views.sink();
  Membership* a = start(options);
  ASSERT_NE(a, nullptr);
  ASSERT_TRUE(poll_until([&] { return converged({a}, {"a"}, 0); }, test_support::kPollTimeout,
                         milliseconds(20)));
  const ClusterMap before = *a->current_map();
  auto direct = EtcdClient::connect({.endpoints = etcd_->endpoint()});
  ASSERT_TRUE(direct.ok()) << direct.detail;
  EtcdClient& etcd = *direct.value;

  proxy.set_cut(true);
  std::this_thread::sleep_for(milliseconds(100));
  // Past the watch's resume point, then two maps (the same membership, so
  // nobody re-publishes), and the history compacted below the first.
  ASSERT_TRUE(etcd.put(prefix_ + "poke", "1").ok());
  const auto first = etcd.put(prefix_ + "map", encode_map({before.epoch + 1, before.members}));
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(etcd.put(prefix_ + "map", encode_map({before.epoch + 2, before.members})).ok());
  ASSERT_TRUE(etcd.compact(first.value).ok());
  std::this_thread::sleep_for(milliseconds(200));
  proxy.set_cut(false);  // well inside the 2 s etcd lease

  ASSERT_TRUE(poll_until([&] { return a->current_map()->epoch == before.epoch + 2; },
                         test_support::kPollTimeout, milliseconds(20)));
  std::vector<std::uint64_t> adopted;
  for (const ClusterView& view : views.all()) {
    for (const auto& map : view.adopted) {
      if (map->epoch > before.epoch) adopted.push_back(map->epoch);
    }
  }
  EXPECT_EQ(adopted, (std::vector<std::uint64_t>{before.epoch + 1, before.epoch + 2}));
  EXPECT_EQ(a->stats().maps_read_back, 1u);
  EXPECT_TRUE(log_.contains("read 1 cluster map(s) the watch had not delivered back"));
}

TEST_F(MembershipTest, AnUnreadableMemberRecordIsPresentButOutOfTheMap) {
  Membership* a = start("a");
  ASSERT_NE(a, nullptr);
  ASSERT_TRUE(poll_until([&] { return converged({a}, {"a"}, 0); }, test_support::kPollTimeout,
                         milliseconds(20)));
  // A newer version's record: a state this version cannot parse.
  const auto lease = a->etcd().grant_lease(30);
  ASSERT_TRUE(lease.ok());
  ASSERT_TRUE(a->etcd()
                  .put(prefix_ + "members/z", "address=127.0.0.1:9 weight=1 state=upgrading",
                       lease.value.id)
                  .ok());
  const auto view = Membership::read_view(a->etcd(), prefix_);
  ASSERT_TRUE(view.ok());
  ASSERT_EQ(view.value.members.size(), 2u);
  EXPECT_EQ(view.value.members[1].id, "z");
  EXPECT_FALSE(view.value.members[1].readable);
  EXPECT_TRUE(view.value.members[0].readable);
  // Alive, so not gone; and not in the map either.
  ASSERT_TRUE(a->etcd().put(prefix_ + "poke", "1").ok());
  std::this_thread::sleep_for(milliseconds(200));
  EXPECT_EQ(ids_of(*a->current_map()), std::vector<std::string>{"a"});
  (void)a->etcd().revoke_lease(lease.value.id);
}

TEST_F(MembershipTest, AJoinerStartsANewEpochWithOnePublish) {
  Membership* a = start("a");
  ASSERT_NE(a, nullptr);
  ASSERT_TRUE(poll_until([&] { return converged({a}, {"a"}, 0); }, test_support::kPollTimeout,
                         milliseconds(20)));
  const std::uint64_t before = a->current_map()->epoch;
  const std::uint64_t published_before = publishes({a});
  Membership* b = start("b");
  ASSERT_NE(b, nullptr);
  ASSERT_TRUE(poll_until(
      [&] {
        return converged({a, b}, {"a", "b"}, before);
      },
      test_support::kPollTimeout, milliseconds(20)));
  // The joiner's fresh epoch is the map that adds it, whoever published it.
  EXPECT_EQ(publishes({a, b}) - published_before, 1u);
  EXPECT_EQ(a->stats().maps_republished + b->stats().maps_republished, 0u);
}

TEST(MembershipEtcdKilled, LeaseAliveTurnsFalseWithinTtlPlusMargin) {
  if (!EtcdProcess::available()) GTEST_SKIP() << EtcdProcess::kMissingMessage;
  EtcdProcess etcd;
  ASSERT_TRUE(etcd.start()) << etcd.error();
  const std::string dir = make_temp_dir();
  ASSERT_FALSE(dir.empty());
  MembershipOptions options;
  options.endpoints = etcd.endpoint();
  options.prefix = "/shardlock/killed/";
  options.node_id = "a";
  options.advertise = "127.0.0.1:7001";
  options.data_dir = dir;
  options.lease_ttl = kTtl;
  options.drift_margin = kMargin;
  options.log = [](std::string_view) {};
  std::unique_ptr<Membership> a;
  std::string detail;
  ASSERT_FALSE(Membership::start(options, a, detail)) << detail;
  ASSERT_TRUE(poll_until([&] { return a->stats().keep_alives_acked >= 1; },
                         test_support::kPollTimeout, milliseconds(20)));
  ASSERT_TRUE(a->lease_alive());

  const nanoseconds killed_at = std::chrono::steady_clock::now().time_since_epoch();
  etcd.kill();
  // Every acknowledged keep-alive was sent before the kill, so the deadline
  // is at most killed_at + TTL - margin; polling longer than that is slack.
  EXPECT_TRUE(poll_until([&] { return !a->lease_alive(); }, kTtl + kMargin, milliseconds(10)));
  EXPECT_LE(a->lease_deadline(), killed_at + kTtl - kMargin);
  EXPECT_FALSE(a->lease_alive());
  a->stop(StopMode::kAbandonLease);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace shardlock::cluster
