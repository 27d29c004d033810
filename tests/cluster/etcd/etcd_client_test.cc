// EtcdClient against a real single-member etcd (tests/support/etcd_fixture.h).
// Skips when /usr/bin/etcd is missing.
#include "etcd_client.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "poll_until.h"
#include "support/etcd_fixture.h"
#include "watch_log.h"

namespace shardlock::cluster {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using test_support::EtcdProcess;
using test_support::EtcdSuiteTest;
using test_support::poll_until;

std::unique_ptr<EtcdClient> connect_or_die(const std::string& endpoints,
                                           milliseconds call_timeout = seconds(5)) {
  EtcdClientOptions options;
  options.endpoints = endpoints;
  options.call_timeout = call_timeout;
  auto connected = EtcdClient::connect(options);
  EXPECT_TRUE(connected.ok()) << connected.detail;
  return std::move(connected.value);
}

bool key_present(EtcdClient& client, const std::string& key) {
  const auto got = client.get(key);
  return got.ok() && got.value.kvs.size() == 1;
}

bool key_absent(EtcdClient& client, const std::string& key) {
  const auto got = client.get(key);
  return got.ok() && got.value.kvs.empty();
}

// One etcd for the suite; each test works under its own key prefix.
class EtcdClientTest : public EtcdSuiteTest {
 protected:
  void SetUp() override {
    EtcdSuiteTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    client_ = connect_or_die(etcd_->endpoint());
    ASSERT_NE(client_, nullptr);
    prefix_ = test_name() + "/";
  }

  std::unique_ptr<EtcdClient> client_;
  std::string prefix_;
};

TEST(EtcdPrefix, RangeEndCoversExactlyThePrefix) {
  EXPECT_EQ(prefix_range_end("a/"), "a0");
  EXPECT_EQ(prefix_range_end("members/"), "members0");
  EXPECT_EQ(prefix_range_end(std::string("a\xff", 2)), "b");
  EXPECT_EQ(prefix_range_end(std::string("\xff\xff", 2)), std::string(1, '\0'));
  EXPECT_EQ(prefix_range_end(""), std::string(1, '\0'));
}

TEST(EtcdErrors, GrpcStatusesMapOntoTheCategory) {
  EXPECT_EQ(errc_from_grpc_status(14), EtcdErrc::kUnavailable);  // UNAVAILABLE
  EXPECT_EQ(errc_from_grpc_status(4), EtcdErrc::kDeadlineExceeded);
  EXPECT_EQ(errc_from_grpc_status(5), EtcdErrc::kNotFound);
  EXPECT_EQ(errc_from_grpc_status(11), EtcdErrc::kCompacted);  // OUT_OF_RANGE
  EXPECT_EQ(errc_from_grpc_status(13), EtcdErrc::kServerError);
  const std::error_code code = EtcdErrc::kUnavailable;
  EXPECT_EQ(code.category().name(), std::string("shardlock.etcd"));
  EXPECT_EQ(code.message(), "etcd unavailable");
}

TEST(EtcdConnect, MalformedEndpointsAreRefusedWithoutIo) {
  for (const char* endpoints : {"", "localhost", "127.0.0.1:", "127.0.0.1:0", "127.0.0.1:70000",
                                "127.0.0.1:2379,", "::1:2379", "host:12ab"}) {
    EtcdClientOptions options;
    options.endpoints = endpoints;
    const auto connected = EtcdClient::connect(options);
    EXPECT_EQ(connected.error, EtcdErrc::kBadEndpoint) << "'" << endpoints << "'";
    EXPECT_FALSE(connected.detail.empty());
    EXPECT_EQ(connected.value, nullptr);
  }
  EtcdClientOptions options;
  options.endpoints = "http://127.0.0.1:2379, [::1]:2380";
  const auto connected = EtcdClient::connect(options);
  ASSERT_TRUE(connected.ok()) << connected.detail;
  EXPECT_EQ(connected.value->current_endpoint(), "127.0.0.1:2379");
}

TEST_F(EtcdClientTest, PutGetPrefixAndDeleteWithRisingRevisions) {
  const auto first = client_->put(prefix_ + "a", "1");
  ASSERT_TRUE(first.ok()) << first.detail;
  const auto second = client_->put(prefix_ + "b", "2");
  ASSERT_TRUE(second.ok()) << second.detail;
  EXPECT_GT(second.value, first.value);
  const auto again = client_->put(prefix_ + "a", "3");
  ASSERT_TRUE(again.ok()) << again.detail;
  EXPECT_GT(again.value, second.value);
  ASSERT_TRUE(client_->put(prefix_ + "zz-outside", "x").ok());  // not under prefix_ + "a"

  const auto a = client_->get(prefix_ + "a");
  ASSERT_TRUE(a.ok()) << a.detail;
  ASSERT_EQ(a.value.kvs.size(), 1u);
  EXPECT_EQ(a.value.kvs[0].value, "3");
  EXPECT_EQ(a.value.kvs[0].create_revision, first.value);
  EXPECT_EQ(a.value.kvs[0].mod_revision, again.value);
  EXPECT_EQ(a.value.kvs[0].version, 2);
  EXPECT_EQ(a.value.kvs[0].lease, 0);
  EXPECT_GE(a.value.revision, again.value);

  const auto missing = client_->get(prefix_ + "missing");
  ASSERT_TRUE(missing.ok()) << missing.detail;
  EXPECT_TRUE(missing.value.kvs.empty());

  const auto all = client_->get_prefix(prefix_);
  ASSERT_TRUE(all.ok()) << all.detail;
  ASSERT_EQ(all.value.kvs.size(), 3u);
  EXPECT_EQ(all.value.kvs[0].key, prefix_ + "a");  // key order
  EXPECT_EQ(all.value.kvs[1].key, prefix_ + "b");
  EXPECT_EQ(all.value.kvs[2].key, prefix_ + "zz-outside");
  const auto only_a = client_->get_prefix(prefix_ + "a");
  ASSERT_TRUE(only_a.ok());
  EXPECT_EQ(only_a.value.kvs.size(), 1u);

  const auto deleted = client_->delete_key(prefix_ + "a");
  ASSERT_TRUE(deleted.ok()) << deleted.detail;
  EXPECT_EQ(deleted.value, 1);
  const auto deleted_again = client_->delete_key(prefix_ + "a");
  ASSERT_TRUE(deleted_again.ok());
  EXPECT_EQ(deleted_again.value, 0);
  EXPECT_TRUE(key_absent(*client_, prefix_ + "a"));
  const auto after = client_->get_prefix(prefix_);
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after.value.kvs.size(), 2u);
  EXPECT_GT(after.value.revision, again.value);  // the delete was a revision too
}

TEST_F(EtcdClientTest, PutIfAbsentSucceedsOnceThenReportsTheHolder) {
  const auto first = client_->put_if_absent(prefix_ + "k", "first");
  ASSERT_TRUE(first.ok()) << first.detail;
  EXPECT_TRUE(first.value.applied);
  EXPECT_GT(first.value.revision, 0);

  const auto second = client_->put_if_absent(prefix_ + "k", "second");
  ASSERT_TRUE(second.ok()) << second.detail;
  EXPECT_FALSE(second.value.applied);
  ASSERT_TRUE(second.value.current.has_value());
  EXPECT_EQ(second.value.current->value, "first");
  EXPECT_EQ(second.value.current->mod_revision, first.value.revision);

  const auto stored = client_->get(prefix_ + "k");
  ASSERT_TRUE(stored.ok());
  ASSERT_EQ(stored.value.kvs.size(), 1u);
  EXPECT_EQ(stored.value.kvs[0].value, "first");
}

TEST_F(EtcdClientTest, PutIfModRevisionIsACompareAndSwap) {
  const auto created = client_->put_if_mod_revision(prefix_ + "k", "v1", 0);  // only if absent
  ASSERT_TRUE(created.ok()) << created.detail;
  ASSERT_TRUE(created.value.applied);

  const auto stale =
      client_->put_if_mod_revision(prefix_ + "k", "lost", created.value.revision - 1);
  ASSERT_TRUE(stale.ok()) << stale.detail;
  EXPECT_FALSE(stale.value.applied);
  ASSERT_TRUE(stale.value.current.has_value());
  EXPECT_EQ(stale.value.current->value, "v1");

  const auto swapped = client_->put_if_mod_revision(prefix_ + "k", "v2", created.value.revision);
  ASSERT_TRUE(swapped.ok()) << swapped.detail;
  EXPECT_TRUE(swapped.value.applied);
  EXPECT_GT(swapped.value.revision, created.value.revision);
  const auto replay = client_->put_if_mod_revision(prefix_ + "k", "v3", created.value.revision);
  ASSERT_TRUE(replay.ok());
  EXPECT_FALSE(replay.value.applied);
  EXPECT_EQ(replay.value.current->value, "v2");
}

TEST_F(EtcdClientTest, RevokingALeaseDeletesItsKeys) {
  const auto lease = client_->grant_lease(10);
  ASSERT_TRUE(lease.ok()) << lease.detail;
  EXPECT_NE(lease.value.id, 0);
  EXPECT_EQ(lease.value.ttl_seconds, 10);
  const auto put = client_->put(prefix_ + "member", "node-1", lease.value.id);
  ASSERT_TRUE(put.ok()) << put.detail;
  const auto got = client_->get(prefix_ + "member");
  ASSERT_TRUE(got.ok());
  ASSERT_EQ(got.value.kvs.size(), 1u);
  EXPECT_EQ(got.value.kvs[0].lease, lease.value.id);

  const auto revoked = client_->revoke_lease(lease.value.id);
  ASSERT_TRUE(revoked.ok()) << revoked.detail;
  EXPECT_TRUE(key_absent(*client_, prefix_ + "member"));  // revocation is synchronous

  const auto again = client_->revoke_lease(lease.value.id);
  EXPECT_EQ(again.error, EtcdErrc::kNotFound) << again.detail;
  const auto kept = client_->keep_alive_once(lease.value.id);
  EXPECT_EQ(kept.error, EtcdErrc::kLeaseExpired) << kept.detail;
  const auto orphan = client_->put(prefix_ + "orphan", "x", lease.value.id);
  EXPECT_EQ(orphan.error, EtcdErrc::kNotFound) << orphan.detail;
}

TEST_F(EtcdClientTest, AKeyUnderALeaseGoesWhenItsTtlRunsOut) {
  const auto lease = client_->grant_lease(2);  // etcd's minimum TTL
  ASSERT_TRUE(lease.ok()) << lease.detail;
  ASSERT_TRUE(client_->put(prefix_ + "member", "node-1", lease.value.id).ok());
  EXPECT_TRUE(key_present(*client_, prefix_ + "member"));
  // No keep-alive: etcd expires the lease after ~2 s and deletes the key.
  EXPECT_TRUE(poll_until([&] { return key_absent(*client_, prefix_ + "member"); },
                         test_support::kPollTimeout, milliseconds(100)));
  const auto kept = client_->keep_alive_once(lease.value.id);
  EXPECT_EQ(kept.error, EtcdErrc::kLeaseExpired) << kept.detail;
}

TEST_F(EtcdClientTest, KeepAlivesKeepAKeyPastItsTtl) {
  const auto lease = client_->grant_lease(2);
  ASSERT_TRUE(lease.ok()) << lease.detail;
  ASSERT_TRUE(client_->put(prefix_ + "member", "node-1", lease.value.id).ok());
  // Three TTLs, renewing at a quarter of it: the key never goes.
  const auto until = std::chrono::steady_clock::now() + seconds(6);
  int renewals = 0;
  while (std::chrono::steady_clock::now() < until) {
    const auto kept = client_->keep_alive_once(lease.value.id);
    ASSERT_TRUE(kept.ok()) << kept.detail;
    EXPECT_GE(kept.value, 1);
    EXPECT_LE(kept.value, 2);
    ++renewals;
    ASSERT_TRUE(key_present(*client_, prefix_ + "member")) << "after " << renewals << " renewals";
    std::this_thread::sleep_for(milliseconds(500));  // pacing, not an assertion
  }
  EXPECT_GE(renewals, 4);
  ASSERT_TRUE(client_->revoke_lease(lease.value.id).ok());
}

TEST_F(EtcdClientTest, AWatchSeesAPutAndADeleteInOrder) {
  const auto start = client_->get(prefix_);
  ASSERT_TRUE(start.ok()) << start.detail;
  WatchLog log;
  auto watch = client_->watch_prefix(prefix_, start.value.revision + 1, log.callback());
  ASSERT_TRUE(client_->put("Other" + prefix_ + "x", "not watched").ok());
  const auto put = client_->put(prefix_ + "x", "1");
  ASSERT_TRUE(put.ok()) << put.detail;
  ASSERT_TRUE(client_->delete_key(prefix_ + "x").ok());

  ASSERT_TRUE(poll_until([&] { return log.events().size() >= 2; }, test_support::kPollTimeout,
                         milliseconds(10)));
  const std::vector<WatchEvent> events = log.events();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].type, WatchEventType::kPut);
  EXPECT_EQ(events[0].kv.key, prefix_ + "x");
  EXPECT_EQ(events[0].kv.value, "1");
  EXPECT_EQ(events[0].kv.mod_revision, put.value);
  EXPECT_EQ(events[1].type, WatchEventType::kDelete);
  EXPECT_EQ(events[1].kv.key, prefix_ + "x");
  EXPECT_GT(events[1].kv.mod_revision, events[0].kv.mod_revision);
  watch->cancel();
  watch->cancel();  // idempotent
  EXPECT_TRUE(log.errors().empty());
}

TEST_F(EtcdClientTest, AWatchFromAPastRevisionReplaysHistory) {
  const auto first = client_->put(prefix_ + "a", "1");
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(client_->put(prefix_ + "b", "2").ok());
  WatchLog log;
  auto watch = client_->watch_prefix(prefix_, first.value, log.callback());
  ASSERT_TRUE(poll_until([&] { return log.events().size() >= 2; }, test_support::kPollTimeout,
                         milliseconds(10)));
  const auto events = log.events();
  EXPECT_EQ(events[0].kv.key, prefix_ + "a");
  EXPECT_EQ(events[1].kv.key, prefix_ + "b");
}

TEST(EtcdUnreachable, ARefusedEndpointFailsAsUnavailableWithinItsDeadline) {
  const std::uint16_t port = test_support::free_loopback_port();
  ASSERT_NE(port, 0);
  const std::string endpoint = "127.0.0.1:" + std::to_string(port);
  auto client = connect_or_die(endpoint, milliseconds(1000));
  ASSERT_NE(client, nullptr);
  const auto started = std::chrono::steady_clock::now();
  const auto got = client->get("k");
  const auto took = std::chrono::steady_clock::now() - started;
  EXPECT_EQ(got.error, EtcdErrc::kUnavailable) << got.detail;
  EXPECT_NE(got.detail.find(endpoint), std::string::npos) << got.detail;
  // Why, in gRPC's words: the channel's last connection error.
  EXPECT_NE(got.detail.find("Connection refused"), std::string::npos) << got.detail;
  // The deadline bounds it; generous slack for sanitizer builds on shared cores.
  EXPECT_LT(took, seconds(6));
  const auto kept = client->keep_alive_once(1);
  EXPECT_EQ(kept.error, EtcdErrc::kUnavailable) << kept.detail;
  const auto lease = client->grant_lease(5);
  EXPECT_EQ(lease.error, EtcdErrc::kUnavailable) << lease.detail;
}

TEST(EtcdUnreachable, AnEndpointThatNeverAnswersFailsAtTheDeadline) {
  // A listening socket nobody accepts from: the kernel completes the TCP
  // handshake, and then nothing ever answers.
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof address;
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  ASSERT_EQ(::listen(fd, 16), 0);
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length), 0);
  const std::string endpoint = "127.0.0.1:" + std::to_string(ntohs(address.sin_port));
  auto client = connect_or_die(endpoint, milliseconds(500));
  ASSERT_NE(client, nullptr);

  const auto started = std::chrono::steady_clock::now();
  const auto put = client->put("k", "v");
  const auto took = std::chrono::steady_clock::now() - started;
  EXPECT_TRUE(put.error == EtcdErrc::kDeadlineExceeded || put.error == EtcdErrc::kUnavailable)
      << put.detail;
  EXPECT_GE(took, milliseconds(400)) << put.detail;  // it did wait for the deadline ...
  EXPECT_LT(took, seconds(6));                       // ... and not much past it
  const auto kept = client->keep_alive_once(1);
  EXPECT_TRUE(kept.error == EtcdErrc::kDeadlineExceeded || kept.error == EtcdErrc::kUnavailable)
      << kept.detail;
  ::close(fd);
}

TEST(EtcdFailover, CallsMoveOnFromADeadEndpointToALiveOne) {
  if (!EtcdProcess::available()) GTEST_SKIP() << EtcdProcess::kMissingMessage;
  EtcdProcess etcd;
  ASSERT_TRUE(etcd.start()) << etcd.error();
  const std::uint16_t dead = test_support::free_loopback_port();
  auto client = connect_or_die("127.0.0.1:" + std::to_string(dead) + "," + etcd.endpoint(),
                               milliseconds(1000));
  ASSERT_NE(client, nullptr);
  const auto first = client->put("k", "v");
  EXPECT_EQ(first.error, EtcdErrc::kUnavailable) << first.detail;  // the dead one, first
  EXPECT_EQ(client->current_endpoint(), etcd.endpoint());
  const auto second = client->put("k", "v");
  EXPECT_TRUE(second.ok()) << second.detail;
}

TEST(EtcdRestart, TheClientSurvivesKill9AndARestartOnTheSameDataDir) {
  if (!EtcdProcess::available()) GTEST_SKIP() << EtcdProcess::kMissingMessage;
  EtcdProcess etcd;
  ASSERT_TRUE(etcd.start()) << etcd.error();
  auto client = connect_or_die(etcd.endpoint(), milliseconds(1000));
  ASSERT_NE(client, nullptr);

  const auto before = client->put("restart/k", "before");
  ASSERT_TRUE(before.ok()) << before.detail;
  const auto lease = client->grant_lease(30);
  ASSERT_TRUE(lease.ok()) << lease.detail;
  ASSERT_TRUE(client->put("restart/member", "node-1", lease.value.id).ok());
  ASSERT_TRUE(client->keep_alive_once(lease.value.id).ok());  // the stream is open now
  WatchLog log;
  auto watch = client->watch_prefix("restart/", before.value + 1, log.callback());

  etcd.kill();
  // Calls fail meanwhile, each within its deadline.
  EXPECT_TRUE(poll_until([&] { return !client->get("restart/k").ok(); }, seconds(10)));
  const auto down = client->put("restart/k", "while down");
  EXPECT_TRUE(down.error == EtcdErrc::kUnavailable || down.error == EtcdErrc::kDeadlineExceeded)
      << down.detail;
  const auto kept_down = client->keep_alive_once(lease.value.id);
  EXPECT_FALSE(kept_down.ok());

  ASSERT_TRUE(etcd.start()) << etcd.error();
  // The same channel reconnects; the data is still there.
  std::string last_error;
  ASSERT_TRUE(poll_until(
      [&] {
        const auto attempt = client->get("restart/k");
        last_error = attempt.detail;
        return attempt.ok();
      },
      test_support::kPollTimeout, milliseconds(50)))
      << last_error;
  const auto got = client->get("restart/k");
  ASSERT_TRUE(got.ok()) << got.detail;
  ASSERT_EQ(got.value.kvs.size(), 1u);
  EXPECT_EQ(got.value.kvs[0].value, "before");
  EXPECT_GE(got.value.revision, before.value);
  // The lease survived (etcd renews leases on restart); a fresh keep-alive
  // stream replaces the broken one.
  const auto kept = client->keep_alive_once(lease.value.id);
  ASSERT_TRUE(kept.ok()) << kept.detail;
  EXPECT_GT(kept.value, 0);
  EXPECT_TRUE(key_present(*client, "restart/member"));

  // The watch reconnected by itself and resumes after what it delivered.
  const auto after = client->put("restart/k", "after");
  ASSERT_TRUE(after.ok()) << after.detail;
  ASSERT_TRUE(poll_until(
      [&] {
        const auto events = log.events();
        return !events.empty() && events.back().kv.mod_revision == after.value;
      },
      test_support::kPollTimeout, milliseconds(20)));
  const auto events = log.events();
  for (std::size_t i = 1; i < events.size(); ++i) {
    EXPECT_GT(events[i].kv.mod_revision, events[i - 1].kv.mod_revision) << "repeated or reordered";
  }
  EXPECT_TRUE(log.errors().empty());
}

// Last in the suite: the compaction takes every earlier revision with it.
TEST_F(EtcdClientTest, AKeyIsReadAtAPastRevisionUntilThatHistoryIsCompacted) {
  const std::string key = prefix_ + "k";
  const auto first = client_->put(key, "v1");
  const auto second = client_->put(key, "v2");
  ASSERT_TRUE(first.ok() && second.ok());
  const auto then = client_->get_at(key, first.value);
  ASSERT_TRUE(then.ok()) << then.detail;
  ASSERT_EQ(then.value.kvs.size(), 1u);
  EXPECT_EQ(then.value.kvs[0].value, "v1");
  EXPECT_EQ(then.value.kvs[0].mod_revision, first.value);
  EXPECT_GE(then.value.revision, second.value);  // the store's revision, not the one read at
  const auto before = client_->get_at(key, first.value - 1);
  ASSERT_TRUE(before.ok()) << before.detail;
  EXPECT_TRUE(before.value.kvs.empty());

  ASSERT_TRUE(client_->compact(second.value).ok());
  const auto compacted = client_->get_at(key, first.value);
  EXPECT_EQ(compacted.error, make_error_code(EtcdErrc::kCompacted)) << compacted.detail;
  const auto kept = client_->get_at(key, second.value);
  ASSERT_TRUE(kept.ok()) << kept.detail;
  ASSERT_EQ(kept.value.kvs.size(), 1u);
  EXPECT_EQ(kept.value.kvs[0].value, "v2");
}

}  // namespace
}  // namespace shardlock::cluster
