// A real cluster end to end: a real etcd (support/etcd_fixture.h) and shardlockd
// nodes as processes with --cluster, driven by cluster clients
// (discover_cluster). Keys are served by their owners only; a joining node
// takes only the buckets it owns in the new map; a drained node hands off
// while it is still alive; a node killed with -9 has its keys granted by the
// new owners only after the lock-delay, with tokens above every token it
// issued.
//
// Timings are short (TTLs of 2 s) so faults resolve in seconds. The only
// timing check is a lower bound (no grant before the lock-delay), which a
// slow machine cannot break.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "membership.h"
#include "node_processes.h"
#include "shardlock/cluster/cluster_map.h"
#include "shardlock/lease/client/client.h"
#include "shardlock/lease/wire/epoch_token.h"
#include "support/daemon.h"
#include "support/etcd_fixture.h"
#include "support/process.h"

namespace shardlock::cluster {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using lease::LeaseClient;
using lease::LeaseClientOptions;
using lease::LeaseErrc;
using test_support::acquire_until_granted;
using test_support::EtcdSuiteTest;

const std::string kDaemon = SHARDLOCK_TOOL_SHARDLOCKD;
// --max-ttl 2s + --etcd-lease-ttl 2s + the 500 ms drift margin.
constexpr auto kLockDelay = 4500ms;

// One shardlockd node of the test's cluster.
struct NodeProcess {
  std::string id;
  std::string data_dir;
  std::string address;  // as bound and advertised
  test_support::ChildProcess process;
};

class ClusterTest : public EtcdSuiteTest {
 protected:
  void SetUp() override {
    EtcdSuiteTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    ASSERT_TRUE(fs::exists(kDaemon)) << kDaemon << " is missing: build the shardlockd target";
    char pattern[] = "/tmp/shardlock-cluster-XXXXXX";
    ASSERT_NE(::mkdtemp(pattern), nullptr);
    root_ = pattern;
  }
  void TearDown() override {
    nodes_.clear();  // kills what is left
    if (!root_.empty()) fs::remove_all(root_);
  }

  // Starts node `id` (again, with its data dir, when it ran before) and
  // waits for its ready line. Port 0: a restart may get another port.
  NodeProcess& start_node(const std::string& id) {
    auto& node = nodes_[id];
    if (!node) node = std::make_unique<NodeProcess>();
    node->id = id;
    node->data_dir = root_ + "/" + id;
    const std::vector<std::string> argv = {kDaemon,
                                           "--listen",
                                           "127.0.0.1:0",
                                           "--data-dir",
                                           node->data_dir,
                                           "--cluster",
                                           "etcd://" + etcd_->endpoint(),
                                           "--cluster-name",
                                           test_name(),
                                           "--node-id",
                                           id,
                                           "--max-ttl",
                                           "2s",
                                           "--etcd-lease-ttl",
                                           "2s",
                                           "--io",
                                           "socket"};
    test_support::ChildOptions wiring;
    wiring.stderr_path = root_ + "/" + id + ".log";
    std::string why;
    node->address = test_support::start_daemon(node->process, argv, wiring, 30s, why);
    EXPECT_FALSE(node->address.empty()) << why;
    return *node;
  }

  std::unique_ptr<LeaseClient> client() {
    LeaseClientOptions options;
    for (const auto& [id, node] : nodes_) {
      if (node->process.running()) options.nodes.push_back(node->address);
    }
    options.discover_cluster = true;
    options.request_timeout = 1500ms;
    auto c = std::make_unique<LeaseClient>(options);
    const std::error_code ec = c->start();
    EXPECT_FALSE(ec) << ec.message() << ": " << c->error_detail();
    return c;
  }

  // A client whose map has exactly `ids`, waiting up to 30 s for the cluster
  // to publish it.
  std::unique_ptr<LeaseClient> client_with_members(const std::set<std::string>& ids) {
    const auto deadline = std::chrono::steady_clock::now() + 30s;
    for (;;) {
      auto c = client();
      std::set<std::string> seen;
      for (const auto& member : c->map_members()) seen.insert(member.id);
      if (seen == ids || std::chrono::steady_clock::now() > deadline) {
        EXPECT_EQ(seen, ids);
        return c;
      }
      std::this_thread::sleep_for(100ms);
    }
  }

  // The map's owner id of `key` in `c`'s map.
  static std::string owner_id(const LeaseClient& c, const std::string& key) {
    const auto members = c.map_members();
    const std::size_t index = c.node_for(key);
    return index < members.size() ? members[index].id : std::string();
  }

  // `n` keys, `per_node` of which each listed node owns in `c`'s map.
  static std::map<std::string, std::vector<std::string>> keys_by_owner(const LeaseClient& c,
                                                                       std::size_t per_node) {
    std::map<std::string, std::vector<std::string>> out;
    const std::size_t members = c.map_members().size();
    for (int i = 0;
         out.size() < members ||
         std::any_of(out.begin(), out.end(), [&](auto& e) { return e.second.size() < per_node; });
         ++i) {
      const std::string key = "key-" + std::to_string(i);
      auto& keys = out[owner_id(c, key)];
      if (keys.size() < per_node) keys.push_back(key);
    }
    return out;
  }

  // A client of one node only (no discovery): its QUERY answers say what
  // that node itself holds, or REDIRECT when the key is not its.
  static std::unique_ptr<LeaseClient> direct_client(const std::string& address) {
    LeaseClientOptions options;
    options.nodes = {address};
    options.request_timeout = 1000ms;
    auto c = std::make_unique<LeaseClient>(options);
    EXPECT_FALSE(c->start());
    return c;
  }

  std::string root_;
  std::map<std::string, std::unique_ptr<NodeProcess>> nodes_;
};

TEST_F(ClusterTest, KeysAreGrantedOnlyByTheirOwnersWithTheEpochInTheirTokens) {
  for (const char* id : {"n1", "n2", "n3"}) start_node(id);
  auto c = client_with_members({"n1", "n2", "n3"});
  const auto keys = keys_by_owner(*c, 4);
  for (const auto& [owner, owned] : keys) {
    auto direct_owner = direct_client(nodes_.at(owner)->address);
    for (const std::string& key : owned) {
      auto held = c->try_acquire(key, 2000ms);
      // The start-up gate: the first map activates after the lock-delay.
      if (!held) {
        ASSERT_TRUE(acquire_until_granted(*c, key));
        held = c->try_acquire(key, 2000ms);
      }
      ASSERT_TRUE(held) << key << ": " << held.error.message();
      EXPECT_EQ(token_epoch(held.lease.token()), c->map_epoch()) << key;
      // The owner holds it...
      const auto q = direct_owner->query(key);
      ASSERT_FALSE(q.error) << q.error.message();
      EXPECT_TRUE(q.held);
      EXPECT_EQ(q.token, held.lease.token());
      // ...and every other node refuses it.
      for (const auto& [id, node] : nodes_) {
        if (id == owner) continue;
        auto other = direct_client(node->address);
        EXPECT_EQ(other->try_acquire(key, 1000ms).error, make_error_code(LeaseErrc::kRedirected))
            << key << " at " << id;
      }
      EXPECT_FALSE(held.lease.release());
    }
  }
}

TEST_F(ClusterTest, AJoiningNodeTakesOnlyItsBucketsAndTheirTokensRise) {
  for (const char* id : {"n1", "n2", "n3"}) start_node(id);
  auto before = client_with_members({"n1", "n2", "n3"});
  std::vector<std::string> keys;
  for (int i = 0; i < 3000; ++i) keys.push_back("join-" + std::to_string(i));
  std::map<std::string, std::string> owner_before;
  for (const auto& key : keys) owner_before[key] = owner_id(*before, key);
  // A token for some keys of every node, before the join.
  std::map<std::string, std::uint64_t> token_before;
  for (std::size_t i = 0; i < keys.size(); i += 97) {
    const auto token = acquire_until_granted(*before, keys[i]);
    ASSERT_TRUE(token);
    token_before[keys[i]] = *token;
  }

  start_node("n4");
  auto after = client_with_members({"n1", "n2", "n3", "n4"});
  EXPECT_GT(after->map_epoch(), before->map_epoch());
  std::size_t moved = 0;
  for (const auto& key : keys) {
    const std::string now_owner = owner_id(*after, key);
    if (now_owner != owner_before[key]) {
      EXPECT_EQ(now_owner, "n4") << key << " moved from " << owner_before[key];
      ++moved;
    }
  }
  // About a quarter moves (3000 keys: 750 +- a few dozen); none stays put
  // only by luck.
  EXPECT_GT(moved, keys.size() / 8);
  EXPECT_LT(moved, keys.size() / 2);
  for (const auto& [key, old_token] : token_before) {
    const auto token = acquire_until_granted(*after, key);
    ASSERT_TRUE(token);
    EXPECT_GT(*token, old_token) << key;
    EXPECT_EQ(token_epoch(*token), after->map_epoch()) << key;
  }
}

TEST_F(ClusterTest, ADrainedNodeHandsItsKeysOffWhileStillAlive) {
  for (const char* id : {"n1", "n2", "n3"}) start_node(id);
  auto before = client_with_members({"n1", "n2", "n3"});
  const auto keys = keys_by_owner(*before, 8);
  std::map<std::string, std::uint64_t> token_before;
  for (const std::string& key : keys.at("n2")) {
    const auto token = acquire_until_granted(*before, key);
    ASSERT_TRUE(token);
    token_before[key] = *token;
  }
  auto connected = EtcdClient::connect({.endpoints = etcd_->endpoint()});
  ASSERT_TRUE(connected.ok()) << connected.detail;
  EtcdClient& etcd = *connected.value;
  ASSERT_TRUE(Membership::request_drain(etcd, cluster_prefix(test_name()), "n2").ok());

  auto after = client_with_members({"n1", "n3"});
  for (const auto& [key, old_token] : token_before) {
    const auto token = acquire_until_granted(*after, key);
    ASSERT_TRUE(token);
    EXPECT_GT(*token, old_token) << key;
  }
  // n2 never left: its member key is alive (draining), so its buckets could
  // only have activated elsewhere through its hand-off acknowledgement, not
  // through a lock-delay after it vanished.
  const auto view = Membership::read_view(etcd, cluster_prefix(test_name()));
  ASSERT_TRUE(view.ok()) << view.detail;
  bool alive_and_draining = false;
  for (const auto& member : view.value.members) {
    if (member.id == "n2") alive_and_draining = member.record.state == MemberState::kDraining;
  }
  EXPECT_TRUE(alive_and_draining);
  bool acked = false;
  for (const auto& handoff : view.value.handoffs) {
    if (handoff.id == "n2") acked = handoff.epoch >= after->map_epoch();
  }
  EXPECT_TRUE(acked) << "n2 wrote no hand-off for epoch " << after->map_epoch();
  EXPECT_TRUE(nodes_.at("n2")->process.running());
}

TEST_F(ClusterTest, AKilledNodesKeysMoveOnlyAfterTheLockDelayWithHigherTokens) {
  for (const char* id : {"n1", "n2", "n3"}) start_node(id);
  auto before = client_with_members({"n1", "n2", "n3"});
  const auto keys = keys_by_owner(*before, 8);
  std::uint64_t highest_from_n2 = 0;
  for (const std::string& key : keys.at("n2")) {
    const auto token = acquire_until_granted(*before, key);
    ASSERT_TRUE(token);
    highest_from_n2 = std::max(highest_from_n2, *token);
  }
  // One of n2's keys stays held when n2 dies: its holder must not see a
  // second holder before the lease could have expired everywhere.
  auto held = before->try_acquire(keys.at("n2").front(), 2000ms);
  ASSERT_TRUE(held) << held.error.message();
  highest_from_n2 = std::max(highest_from_n2, held.lease.token());
  held.lease.detach();

  const auto killed_at = std::chrono::steady_clock::now();
  nodes_.at("n2")->process.kill();
  auto after = client_with_members({"n1", "n3"});
  std::optional<std::chrono::steady_clock::time_point> first_grant;
  for (const std::string& key : keys.at("n2")) {
    const auto token = acquire_until_granted(*after, key);
    ASSERT_TRUE(token);
    if (!first_grant) first_grant = std::chrono::steady_clock::now();
    EXPECT_GT(*token, highest_from_n2) << key;
  }
  // A lower bound only: the new owners count the delay from when they saw
  // n2's member key vanish, which is after the kill.
  ASSERT_TRUE(first_grant);
  EXPECT_GE(*first_grant - killed_at, kLockDelay);
}

// A node paused past its etcd lease wakes up with a map that still gives it
// buckets the cluster has given away meanwhile. It must grant none of them:
// its lease is gone, and once it registers again it starts over as at a
// start, never granting by what it knew under the old lease.
TEST_F(ClusterTest, ANodePausedPastItsEtcdLeaseGrantsNothingItGaveAwayWhenItWakes) {
  for (const char* id : {"n1", "n2", "n3"}) start_node(id);
  auto before = client_with_members({"n1", "n2", "n3"});
  const auto keys = keys_by_owner(*before, 6);
  for (const std::string& key : keys.at("n2")) ASSERT_TRUE(acquire_until_granted(*before, key));
  NodeProcess& paused = *nodes_.at("n2");
  paused.process.signal(SIGSTOP);
  auto after = client_with_members({"n1", "n3"});
  // The new owners hold every one of n2's keys when it wakes.
  std::vector<lease::Lease> held;
  for (const std::string& key : keys.at("n2")) {
    ASSERT_TRUE(acquire_until_granted(*after, key));
    lease::LeaseOptions renewed;
    renewed.watchdog = true;
    auto lease = after->try_acquire(key, 2000ms, renewed);
    ASSERT_TRUE(lease) << key << ": " << lease.error.message();
    held.push_back(std::move(lease.lease));
  }
  paused.process.signal(SIGCONT);
  // The woken node registers again and the next map gives it its buckets
  // back, so the new owners' leases end (their renewals are redirected) and
  // are handed back. Until the first of them ends, the woken node must
  // grant none of its old keys.
  auto direct = direct_client(paused.address);
  const auto all_valid = [&] {
    return std::all_of(held.begin(), held.end(), [](const lease::Lease& l) { return l.valid(); });
  };
  const auto until = std::chrono::steady_clock::now() + 8s;
  int refused = 0;
  while (std::chrono::steady_clock::now() < until && all_valid()) {
    for (const std::string& key : keys.at("n2")) {
      auto result = direct->try_acquire(key, 1000ms);
      if (result && all_valid()) {
        ADD_FAILURE() << key << " granted by the woken node while another holds it";
      }
      if (!result) ++refused;
    }
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_GT(refused, 0);
}

// A node that leaves sends no REDIRECT: a client that keeps its map must
// still find its keys' new owners (it asks the others for the map when a
// node stops answering).
TEST_F(ClusterTest, AClientFindsTheNewOwnersOfANodeThatLeft) {
  for (const char* id : {"n1", "n2", "n3"}) start_node(id);
  auto c = client_with_members({"n1", "n2", "n3"});
  const std::uint64_t epoch_before = c->map_epoch();
  const auto keys = keys_by_owner(*c, 4);
  for (const std::string& key : keys.at("n2")) ASSERT_TRUE(acquire_until_granted(*c, key));
  nodes_.at("n2")->process.signal(SIGTERM);  // a clean leave: its etcd lease is revoked
  ASSERT_TRUE(nodes_.at("n2")->process.wait_for(20s));
  for (const std::string& key : keys.at("n2")) {
    const auto token = acquire_until_granted(*c, key);
    ASSERT_TRUE(token) << key;
    EXPECT_GT(token_epoch(*token), epoch_before) << key;
  }
  EXPECT_GT(c->map_epoch(), epoch_before);
  for (const auto& member : c->map_members()) EXPECT_NE(member.id, "n2");
}

TEST_F(ClusterTest, BadClusterFlagsAreUsageErrorsAndAnUnreachableEtcdFailsTheStart) {
  const auto run = [&](std::vector<std::string> args) {
    args.insert(args.begin(), kDaemon);
    test_support::ChildProcess p;
    EXPECT_TRUE(p.start(args, /*capture_stdout=*/true, root_ + "/flags.log"));
    EXPECT_TRUE(p.wait_for(30s));
    std::ifstream log(root_ + "/flags.log");
    const std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
    return std::make_pair(WIFEXITED(p.exit_status()) ? WEXITSTATUS(p.exit_status()) : -1, text);
  };
  const std::string etcd = "etcd://" + etcd_->endpoint();
  const std::string dir = root_ + "/d";
  auto [code, log] = run({"--listen", "127.0.0.1:0", "--cluster", etcd, "--data-dir", dir});
  EXPECT_EQ(code, 2);
  EXPECT_NE(log.find("--node-id"), std::string::npos) << log;
  std::tie(code, log) = run({"--listen", "127.0.0.1:0", "--cluster", etcd, "--node-id", "x"});
  EXPECT_EQ(code, 2);
  EXPECT_NE(log.find("--data-dir"), std::string::npos) << log;
  std::tie(code, log) = run({"--listen", "127.0.0.1:0", "--cluster", "grpc://" + etcd_->endpoint(),
                             "--node-id", "x", "--data-dir", dir});
  EXPECT_EQ(code, 2);
  EXPECT_NE(log.find("is not etcd://"), std::string::npos) << log;
  std::tie(code, log) = run({"--listen", "127.0.0.1:0", "--node-id", "x"});
  EXPECT_EQ(code, 2) << "--node-id without --cluster";
  std::tie(code, log) =
      run({"--listen", "127.0.0.1:0", "--cluster", etcd, "--node-id", "bad/id", "--data-dir", dir});
  EXPECT_EQ(code, 2);
  EXPECT_NE(log.find("--node-id 'bad/id'"), std::string::npos) << log;
  // Nothing listens on this port: the start fails, it does not hang.
  const std::string nowhere =
      "etcd://127.0.0.1:" + std::to_string(test_support::free_loopback_port());
  std::tie(code, log) = run({"--listen", "127.0.0.1:0", "--cluster", nowhere, "--node-id", "x",
                             "--data-dir", dir, "--etcd-lease-ttl", "2s"});
  EXPECT_EQ(code, 1);
  EXPECT_NE(log.find("cannot join the cluster"), std::string::npos) << log;
}

}  // namespace
}  // namespace shardlock::cluster
