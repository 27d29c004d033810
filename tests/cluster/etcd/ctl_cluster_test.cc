// shardlockctl members and drain against a real etcd
// (tests/support/etcd_fixture.h), with two Membership instances in this
// process as the cluster's nodes: what members lists, and that drain moves a
// node out of the map and --cancel brings it back.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <numeric>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "membership.h"
#include "poll_until.h"
#include "shardlock/cluster/cluster_map.h"
#include "support/etcd_fixture.h"
#include "tools/client_tool_support.h"

namespace shardlock::cluster {
namespace {

using lease::testing::Json;
using lease::testing::json_line;
using lease::testing::run_tool;
using lease::testing::ToolResult;
using std::chrono::milliseconds;
using std::chrono::seconds;
using test_support::EtcdSuiteTest;
using test_support::poll_until;

const std::string kCtl = SHARDLOCK_TOOL_SHARDLOCKCTL;

// One line of `members`: the id, then its key=value fields.
struct Line {
  std::string id;
  std::map<std::string, std::string> fields;
};

// `members` output: the header's fields and every member's line.
struct Listing {
  std::map<std::string, std::string> header;
  std::map<std::string, Line> members;
};

std::map<std::string, std::string> fields_of(std::istringstream& words) {
  std::map<std::string, std::string> fields;
  for (std::string word; words >> word;) {
    const std::size_t equals = word.find('=');
    if (equals != std::string::npos) fields[word.substr(0, equals)] = word.substr(equals + 1);
  }
  return fields;
}

Listing parse_listing(const std::string& out) {
  Listing listing;
  std::istringstream lines(out);
  std::string line;
  if (std::getline(lines, line)) {
    std::istringstream words(line);
    listing.header = fields_of(words);
  }
  while (std::getline(lines, line)) {
    std::istringstream words(line);
    Line member;
    words >> member.id;
    member.fields = fields_of(words);
    listing.members[member.id] = member;
  }
  return listing;
}

class CtlClusterTest : public EtcdSuiteTest {
 protected:
  void SetUp() override {
    EtcdSuiteTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    name_ = test_name();
    prefix_ = cluster_prefix(name_);
    ASSERT_FALSE(prefix_.empty()) << name_;
    std::string pattern =
        (std::filesystem::temp_directory_path() / "shardlock-ctl-cluster-XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    base_dir_ = pattern;
    for (const char* id : {"a", "b"}) {
      MembershipOptions options;
      options.endpoints = etcd_->endpoint();
      options.prefix = prefix_;
      options.node_id = id;
      options.advertise = std::string("127.0.0.1:") + (id[0] == 'a' ? "7101" : "7102");
      options.data_dir = base_dir_ + "/" + id;
      options.lease_ttl = seconds(2);
      options.drift_margin = milliseconds(500);
      options.retry_interval = milliseconds(100);
      options.log = [](std::string_view) {};
      std::unique_ptr<Membership> member;
      std::string detail;
      ASSERT_FALSE(Membership::start(std::move(options), member, detail)) << detail;
      members_.push_back(std::move(member));
    }
    ASSERT_TRUE(poll_until(
        [&] {
          return map_ids() == std::vector<std::string>{"a", "b"};
        },
        test_support::kPollTimeout, milliseconds(20)));
  }
  void TearDown() override {
    members_.clear();
    if (!base_dir_.empty()) std::filesystem::remove_all(base_dir_);
  }

  Membership& a() { return *members_[0]; }
  Membership& b() { return *members_[1]; }

  // The ids in a's map, once b's map is the same.
  std::vector<std::string> map_ids() {
    const auto map = a().current_map();
    if (*map != *b().current_map()) return {};
    std::vector<std::string> ids;
    for (const ClusterMember& member : map->members) ids.push_back(member.id);
    return ids;
  }

  ToolResult ctl(std::vector<std::string> args) {
    args.insert(args.end(), {"--cluster", "etcd://" + etcd_->endpoint(), "--cluster-name", name_});
    return run_tool(kCtl, args, milliseconds(60'000));
  }

  std::optional<MemberState> state_in_etcd(const std::string& id) {
    const auto read = a().etcd().get(prefix_ + "members/" + id);
    if (!read.ok() || read.value.kvs.size() != 1) return std::nullopt;
    const auto record = decode_member(read.value.kvs[0].value);
    return record ? std::optional(record->state) : std::nullopt;
  }

  std::string name_;
  std::string prefix_;
  std::string base_dir_;
  std::vector<std::unique_ptr<Membership>> members_;
};

TEST_F(CtlClusterTest, MembersListsEveryMemberWithItsBucketsInTheCurrentMap) {
  const std::uint64_t epoch = a().current_map()->epoch;
  ASSERT_TRUE(a().put_handoff(epoch).ok());

  const ToolResult listed = ctl({"members"});
  ASSERT_EQ(listed.exit_code, 0) << listed.err;
  const Listing listing = parse_listing(listed.out);
  EXPECT_EQ(listing.header.at("cluster"), name_);
  EXPECT_EQ(listing.header.at("epoch"), std::to_string(epoch));
  EXPECT_EQ(listing.header.at("members"), "2");
  EXPECT_EQ(listing.header.at("buckets"), "65536");
  ASSERT_EQ(listing.members.size(), 2u) << listed.out;
  std::size_t buckets = 0;
  for (const char* id : {"a", "b"}) {
    const Line& line = listing.members.at(id);
    EXPECT_EQ(line.fields.at("state"), "active");
    EXPECT_EQ(line.fields.at("weight"), "1");
    EXPECT_EQ(line.fields.at("drain"), "no");
    EXPECT_GT(std::stoul(line.fields.at("buckets")), 0u);
    buckets += std::stoul(line.fields.at("buckets"));
  }
  EXPECT_EQ(buckets, 65536u);
  EXPECT_EQ(listing.members.at("a").fields.at("address"), "127.0.0.1:7101");
  EXPECT_EQ(listing.members.at("a").fields.at("handoff"), std::to_string(epoch));
  EXPECT_EQ(listing.members.at("b").fields.at("handoff"), "-");

  const ToolResult as_json = ctl({"members", "--json"});
  ASSERT_EQ(as_json.exit_code, 0) << as_json.err;
  const auto json = json_line(as_json);
  ASSERT_TRUE(json.has_value()) << as_json.out;
  EXPECT_EQ((*json)["epoch"].number, static_cast<double>(epoch));
  EXPECT_EQ((*json)["members"].number, 2);
  const std::vector<Json>& nodes = (*json)["nodes"].items;
  ASSERT_EQ(nodes.size(), 2u);
  EXPECT_EQ(nodes[0]["id"].text, "a");
  EXPECT_EQ(nodes[0]["handoff"].number, static_cast<double>(epoch));
  EXPECT_EQ(nodes[1]["handoff"].kind, Json::Kind::kNull);
  EXPECT_EQ(nodes[0]["buckets"].number + nodes[1]["buckets"].number, 65536);
  EXPECT_FALSE(nodes[1]["drain"].boolean);
}

TEST_F(CtlClusterTest, DrainTakesANodeOutOfTheMapAndCancelBringsItBack) {
  // Membership alone never hands off (ClusterNode does): b's hand-off is
  // acknowledged here once the map leaves it out, as its node would.
  std::thread handoff([&] {
    ASSERT_TRUE(poll_until([&] { return map_ids() == std::vector<std::string>{"a"}; },
                           test_support::kPollTimeout, milliseconds(20)));
    ASSERT_TRUE(b().put_handoff(b().current_map()->epoch).ok());
  });
  const ToolResult drained = ctl({"drain", "b", "--wait", "20s"});
  handoff.join();
  ASSERT_EQ(drained.exit_code, 0) << drained.out << drained.err;
  ASSERT_EQ(map_ids(), std::vector<std::string>{"a"});
  EXPECT_EQ(state_in_etcd("b"), MemberState::kDraining);
  EXPECT_TRUE(b().lease_alive());
  const Listing listing = parse_listing(ctl({"members"}).out);
  ASSERT_EQ(listing.members.count("b"), 1u);
  EXPECT_EQ(listing.members.at("b").fields.at("state"), "draining");
  EXPECT_EQ(listing.members.at("b").fields.at("buckets"), "0");
  EXPECT_EQ(listing.members.at("b").fields.at("drain"), "yes");
  EXPECT_EQ(listing.members.at("a").fields.at("buckets"), "65536");

  const ToolResult cancelled = ctl({"drain", "b", "--cancel", "--wait", "20s"});
  ASSERT_EQ(cancelled.exit_code, 0) << cancelled.out << cancelled.err;
  ASSERT_TRUE(poll_until(
      [&] {
        return map_ids() == std::vector<std::string>{"a", "b"};
      },
      test_support::kPollTimeout, milliseconds(20)));
  EXPECT_EQ(state_in_etcd("b"), MemberState::kActive);
}

// `drain --wait` returned as soon as the map gave the
// node no buckets, before the node had handed them off, so stopping it then
// cost its keys a whole lock-delay. It returns once handoff/ID acknowledges
// the map's epoch.
TEST_F(CtlClusterTest, DrainWaitsForTheHandOffOfTheCurrentMap) {
  std::atomic<bool> returned{false};
  ToolResult drained;
  std::thread drain([&] {
    drained = ctl({"drain", "b", "--wait", "30s"});
    returned.store(true);
  });
  ASSERT_TRUE(poll_until([&] { return map_ids() == std::vector<std::string>{"a"}; },
                         test_support::kPollTimeout, milliseconds(20)));
  const std::uint64_t epoch = b().current_map()->epoch;
  // A hand-off of an older map is not this one.
  ASSERT_TRUE(b().put_handoff(epoch - 1).ok());
  // The map gives b nothing, yet b has not handed off: ctl polls every
  // 200 ms and must still be waiting after several polls.
  std::this_thread::sleep_for(milliseconds(1500));
  EXPECT_FALSE(returned.load()) << drained.out << drained.err;
  ASSERT_TRUE(b().put_handoff(epoch).ok());
  drain.join();
  EXPECT_EQ(drained.exit_code, 0) << drained.out << drained.err;
  EXPECT_NE(drained.out.find("handed them off"), std::string::npos) << drained.out;
}

// A node that dies while draining hands nothing off: its member key vanishes
// (here: Membership stopped, which revokes its lease) and drain --wait ends,
// saying the new owners wait the lock-delay.
TEST_F(CtlClusterTest, DrainOfANodeThatIsGoneEndsWithANote) {
  ToolResult drained;
  std::thread drain([&] { drained = ctl({"drain", "b", "--wait", "30s"}); });
  ASSERT_TRUE(poll_until([&] { return map_ids() == std::vector<std::string>{"a"}; },
                         test_support::kPollTimeout, milliseconds(20)));
  members_[1].reset();  // b stops without handing off
  drain.join();
  EXPECT_EQ(drained.exit_code, 0) << drained.out << drained.err;
  EXPECT_NE(drained.out.find("it is gone"), std::string::npos) << drained.out;
  EXPECT_NE(drained.out.find("lock-delay"), std::string::npos) << drained.out;
}

TEST_F(CtlClusterTest, AnUnknownIdIsRefusedUnlessForced) {
  const ToolResult refused = ctl({"drain", "zz"});
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_NE(refused.err.find("'zz' is not a member"), std::string::npos) << refused.err;
  EXPECT_NE(refused.err.find("a, b"), std::string::npos) << refused.err;
  auto read = a().etcd().get(prefix_ + "drain/zz");
  ASSERT_TRUE(read.ok());
  EXPECT_TRUE(read.value.kvs.empty());

  const ToolResult forced = ctl({"drain", "zz", "--force"});
  EXPECT_EQ(forced.exit_code, 0) << forced.err;
  read = a().etcd().get(prefix_ + "drain/zz");
  ASSERT_TRUE(read.ok());
  EXPECT_EQ(read.value.kvs.size(), 1u);
  // The drain key of a non-member shows in members, as a gone id.
  const Listing listing = parse_listing(ctl({"members"}).out);
  ASSERT_EQ(listing.members.count("zz"), 1u);
  EXPECT_EQ(listing.members.at("zz").fields.at("state"), "gone");
  EXPECT_EQ(listing.members.at("zz").fields.at("drain"), "yes");
  EXPECT_EQ(ctl({"drain", "zz", "--cancel"}).exit_code, 0);
}

TEST_F(CtlClusterTest, ABadUrlIsAUsageErrorAndAnUnreachableEtcdExits3) {
  const ToolResult bad_url =
      run_tool(kCtl, {"members", "--cluster", "grpc://" + etcd_->endpoint()}, seconds(30));
  EXPECT_EQ(bad_url.exit_code, 2);
  EXPECT_NE(bad_url.err.find("etcd://HOST:PORT"), std::string::npos) << bad_url.err;
  const ToolResult bad_name = run_tool(
      kCtl, {"members", "--cluster", "etcd://" + etcd_->endpoint(), "--cluster-name", "a/b"},
      seconds(30));
  EXPECT_EQ(bad_name.exit_code, 2);
  EXPECT_NE(bad_name.err.find("--cluster-name"), std::string::npos) << bad_name.err;

  const std::uint16_t closed = test_support::free_loopback_port();
  ASSERT_NE(closed, 0);
  const ToolResult unreachable = run_tool(
      kCtl,
      {"--timeout", "500ms", "members", "--cluster", "etcd://127.0.0.1:" + std::to_string(closed)},
      seconds(30));
  EXPECT_EQ(unreachable.exit_code, 3) << unreachable.err;
  EXPECT_NE(unreachable.err.find("cannot read"), std::string::npos) << unreachable.err;
}

}  // namespace
}  // namespace shardlock::cluster
