// LeaseClient and Lease against a real LeaseServer on loopback: grants and
// hand-off, retransmission through a lossy / duplicating / reordering
// datagram layer, deadlines, the watchdog, the lease-lost callback, batching
// and routing over two nodes.
#include "shardlock/lease/client/client.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "poll_until.h"
#include "shardlock/lease/server/server.h"
#include "shardlock/workload/zipf.h"
#include "support/loopback_server.h"

namespace shardlock::lease {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Scheduling slack on top of a deadline, for loaded sanitizer runs.
constexpr auto kSlack = 750ms;

std::unique_ptr<LeaseServer> start_server(std::string bind = "127.0.0.1:0") {
  LeaseServerOptions options = shardlock::test_support::loopback_options(8);
  options.bind_address = std::move(bind);
  // Rebinding a fixed port right after a server on it stopped can briefly
  // fail (an io_uring ring releases its files asynchronously); retry, bounded.
  std::error_code ec;
  for (int attempt = 0; attempt < 100; ++attempt) {
    auto server = std::make_unique<LeaseServer>(options);
    ec = server->start();
    if (!ec) return server;
    if (ec != std::errc::address_in_use) {
      ADD_FAILURE() << ec.message() << ": " << server->error_detail();
      return nullptr;
    }
    std::this_thread::sleep_for(20ms);
  }
  ADD_FAILURE() << ec.message();
  return nullptr;
}

std::unique_ptr<LeaseClient> start_client(const std::vector<std::string>& nodes,
                                          LeaseClientOptions options = {}) {
  options.nodes = nodes;
  auto client = std::make_unique<LeaseClient>(options);
  const std::error_code ec = client->start();
  EXPECT_FALSE(ec) << ec.message() << ": " << client->error_detail();
  return client;
}

std::string address(const LeaseServer& server) {
  return "127.0.0.1:" + std::to_string(server.port());
}

// Datagrams sent other than retransmissions: what batching decides.
std::uint64_t first_sends(const LeaseClient& client) {
  return client.datagrams_sent() - client.retransmissions();
}

// ---------------------------------------------------------------------------
// The fault-injection seam: wraps the client's real UDP transport and loses,
// duplicates and reorders datagrams in both directions. Seeded, so a failure
// reproduces; thread-safe, since callers send from their own threads.
struct Faults {
  double drop = 0.0;
  double duplicate = 0.0;
  double reorder = 0.0;  // hold a datagram back behind the next one
};

class FaultyTransport final : public DatagramTransport {
 public:
  FaultyTransport(std::unique_ptr<DatagramTransport> inner, Faults faults, std::uint64_t seed,
                  std::atomic<bool>* blackhole = nullptr)
      : inner_(std::move(inner)), faults_(faults), random_(seed), blackhole_(blackhole) {}

  std::error_code send(const Endpoint& to, std::span<const std::uint8_t> bytes) override {
    std::lock_guard lock(mutex_);
    if (blackhole_ != nullptr && blackhole_->load()) return {};
    if (chance(faults_.drop)) return {};
    if (!held_send_ && chance(faults_.reorder)) {
      held_send_.emplace(to, std::vector<std::uint8_t>(bytes.begin(), bytes.end()));
      return {};
    }
    std::error_code ec = inner_->send(to, bytes);
    if (chance(faults_.duplicate)) (void)inner_->send(to, bytes);
    if (held_send_) {
      (void)inner_->send(held_send_->first, held_send_->second);
      held_send_.reset();
    }
    return ec;
  }

  std::size_t receive(const std::function<void(std::span<const std::uint8_t>)>& deliver) override {
    std::vector<std::vector<std::uint8_t>> out;
    std::size_t n = 0;
    {
      std::lock_guard lock(mutex_);
      // A datagram held back since the last call goes out now, behind any
      // that arrived in between.
      std::optional<std::vector<std::uint8_t>> late = std::move(held_receive_);
      held_receive_.reset();
      n = inner_->receive([&](std::span<const std::uint8_t> bytes) {
        if (blackhole_ != nullptr && blackhole_->load()) return;
        if (chance(faults_.drop)) return;
        std::vector<std::uint8_t> copy(bytes.begin(), bytes.end());
        if (!held_receive_ && chance(faults_.reorder)) {
          held_receive_ = std::move(copy);
          return;
        }
        if (chance(faults_.duplicate)) out.push_back(copy);
        out.push_back(std::move(copy));
      });
      if (late) out.push_back(std::move(*late));
    }
    for (const auto& bytes : out) deliver(bytes);
    return n;
  }

  int fd() const noexcept override { return inner_->fd(); }
  milliseconds poll_interval() const noexcept override { return 5ms; }

 private:
  bool chance(double p) {
    return p > 0.0 && static_cast<double>(random_.next() >> 11) * 0x1.0p-53 < p;
  }

  std::unique_ptr<DatagramTransport> inner_;
  Faults faults_;
  std::mutex mutex_;
  workload::SplitMix64 random_;
  std::atomic<bool>* blackhole_;
  std::optional<std::pair<Endpoint, std::vector<std::uint8_t>>> held_send_;
  std::optional<std::vector<std::uint8_t>> held_receive_;
};

LeaseClientOptions faulty(Faults faults, std::uint64_t seed,
                          std::atomic<bool>* blackhole = nullptr) {
  LeaseClientOptions options;
  options.initial_retransmit = 10ms;
  options.max_retransmit = 80ms;
  options.wrap_transport =
      [=](std::unique_ptr<DatagramTransport> inner) -> std::unique_ptr<DatagramTransport> {
    return std::make_unique<FaultyTransport>(std::move(inner), faults, seed, blackhole);
  };
  return options;
}

// ---------------------------------------------------------------------------

TEST(LeaseClientTest, GrantsBusyReleaseAndIncreasingTokens) {
  auto server = start_server();
  ASSERT_TRUE(server);
  auto a = start_client({address(*server)});
  auto b = start_client({address(*server)});
  EXPECT_NE(a->client_id(), b->client_id());

  AcquireResult first = a->try_acquire("orders/1", 10s);
  ASSERT_TRUE(first) << first.error.message();
  EXPECT_EQ(first.lease.key(), "orders/1");
  EXPECT_GT(first.lease.token(), 0u);
  EXPECT_TRUE(first.lease.valid());
  EXPECT_EQ(owner_client(first.lease.owner()), owner_client(a->client_id()))
      << "the lease's own owner, of a's client";
  EXPECT_LE(first.lease.expiry(), LeaseClock::now() + 10s);

  AcquireResult busy = b->try_acquire("orders/1", 10s);
  EXPECT_EQ(busy.error, LeaseErrc::kBusy);
  EXPECT_TRUE(busy.lease.empty());
  EXPECT_GT(busy.holder_ttl_left_ms, 0u);

  CallResult q = b->query("orders/1");
  ASSERT_FALSE(q.error) << q.error.message();
  EXPECT_TRUE(q.held);
  EXPECT_EQ(q.token, first.lease.token());

  EXPECT_FALSE(first.lease.renew(5s));
  EXPECT_EQ(first.lease.ttl(), 5s);

  // The raw API checks ownership on the server.
  EXPECT_EQ(b->release("orders/1", first.lease.token()).error, LeaseErrc::kNotOwner);

  const std::uint64_t token = first.lease.token();
  EXPECT_FALSE(first.lease.release());
  EXPECT_FALSE(first.lease.valid());
  EXPECT_EQ(first.lease.release(), LeaseErrc::kLeaseInactive);

  AcquireResult second = b->try_acquire("orders/1", 10s);
  ASSERT_TRUE(second) << second.error.message();
  EXPECT_GT(second.lease.token(), token);

  EXPECT_EQ(a->try_acquire("", 1s).error, LeaseErrc::kBadArgument);
  EXPECT_EQ(a->try_acquire(std::string(kMaxKeyLength + 1, 'k'), 1s).error, LeaseErrc::kBadArgument);
  EXPECT_EQ(a->try_acquire("k", 0ms).error, LeaseErrc::kBadArgument);
  EXPECT_EQ(a->try_acquire("k", 10min).error, LeaseErrc::kServerError);  // above max_ttl
}

TEST(LeaseClientTest, WaitingAcquireIsHandedOverOnRelease) {
  auto server = start_server();
  ASSERT_TRUE(server);
  auto a = start_client({address(*server)});
  auto b = start_client({address(*server)});
  AcquireResult held = a->try_acquire("jobs/nightly", 10s);
  ASSERT_TRUE(held);
  std::thread releaser([&] {
    // Release only once b's ACQUIRE is queued on the server, so the grant
    // below is a hand-off, not a fresh acquire of a free key.
    EXPECT_TRUE(test_support::poll_until([&] { return a->query("jobs/nightly").waiters == 1; },
                                         test_support::kPollTimeout, 2ms))
        << "b's ACQUIRE never queued";
    EXPECT_FALSE(held.lease.release());
  });
  AcquireResult waited = b->acquire("jobs/nightly", 10s, 5s);
  releaser.join();
  ASSERT_TRUE(waited) << waited.error.message();
  EXPECT_GT(waited.lease.token(), held.lease.token());
  EXPECT_GE(server->stats().counter(StatCounter::kQueued), 1u);

  AcquireResult timed_out = a->acquire("jobs/nightly", 10s, 100ms);
  EXPECT_EQ(timed_out.error, LeaseErrc::kTimeout);
}

TEST(LeaseClientTest, DestroyingAHeldLeaseReleasesIt) {
  auto server = start_server();
  ASSERT_TRUE(server);
  auto a = start_client({address(*server)});
  auto b = start_client({address(*server)});
  {
    AcquireResult held = a->try_acquire("scoped", 30s);
    ASSERT_TRUE(held);
  }
  AcquireResult next = b->acquire("scoped", 30s, 2s);
  EXPECT_TRUE(next) << next.error.message();
}

// The heart of the retransmission contract: with a quarter of datagrams
// lost and others duplicated and reordered in both directions, every call
// ends by its deadline, no key is ever held by two clients at once, no
// (key, token) is handed out twice, and the server granted no more leases
// than the clients can account for.
TEST(LeaseClientTest, LossyDuplicatingReorderingPathNeverGrantsTwice) {
  auto server = start_server();
  ASSERT_TRUE(server);
  constexpr int kClients = 4;
  constexpr int kIterations = 30;
  constexpr int kKeys = 3;
  const Faults faults{.drop = 0.25, .duplicate = 0.2, .reorder = 0.2};

  std::vector<std::unique_ptr<LeaseClient>> clients;
  for (int i = 0; i < kClients; ++i)
    clients.push_back(start_client({address(*server)}, faulty(faults, 100 + i)));

  std::array<std::atomic<int>, kKeys> holders{};
  std::atomic<int> overlaps{0};
  std::atomic<int> late_calls{0};
  std::atomic<std::uint64_t> granted{0};
  std::atomic<std::uint64_t> unanswered_acquires{0};
  std::mutex tokens_mutex;
  std::set<std::pair<int, std::uint64_t>> tokens;
  std::atomic<int> duplicate_tokens{0};

  const auto request_timeout = LeaseClientOptions{}.request_timeout;
  std::vector<std::thread> threads;
  for (int c = 0; c < kClients; ++c) {
    threads.emplace_back([&, c] {
      workload::SplitMix64 random(c + 1);
      for (int i = 0; i < kIterations; ++i) {
        const int key = static_cast<int>(random.uniform(kKeys));
        const milliseconds wait = random.uniform(2) == 0 ? 0ms : 300ms;
        const auto begin = Clock::now();
        AcquireResult r = clients[c]->acquire("lossy/" + std::to_string(key), 20s, wait);
        if (Clock::now() - begin > request_timeout + wait + kSlack) late_calls.fetch_add(1);
        if (r.error == LeaseErrc::kUnreachable) unanswered_acquires.fetch_add(1);
        if (!r) continue;
        granted.fetch_add(1);
        {
          std::lock_guard lock(tokens_mutex);
          if (!tokens.emplace(key, r.lease.token()).second) duplicate_tokens.fetch_add(1);
        }
        if (holders[key].fetch_add(1) != 0) overlaps.fetch_add(1);
        std::this_thread::sleep_for(milliseconds(random.uniform(3)));
        holders[key].fetch_sub(1);
        const auto release_begin = Clock::now();
        const std::error_code released = r.lease.release();
        if (Clock::now() - release_begin > request_timeout + kSlack) late_calls.fetch_add(1);
        // A release whose every answer was lost leaves the lease to expire;
        // later acquires of that key then wait or see BUSY, which is fine.
        (void)released;
      }
    });
  }
  for (auto& t : threads) t.join();

  EXPECT_EQ(overlaps.load(), 0);
  EXPECT_EQ(duplicate_tokens.load(), 0);
  EXPECT_EQ(late_calls.load(), 0);
  EXPECT_GT(granted.load(), 0u);
  std::uint64_t retransmissions = 0;
  for (const auto& c : clients) retransmissions += c->retransmissions();
  EXPECT_GT(retransmissions, 0u) << "the fault layer should have forced retransmissions";
  // Retransmitted ACQUIREs are answered from the dedup cache, not granted
  // again: every grant the server made is one a client saw, or one whose
  // every answer was lost.
  const ServerStats stats = server->stats();
  EXPECT_GE(stats.counter(StatCounter::kGrants), granted.load());
  EXPECT_LE(stats.counter(StatCounter::kGrants), granted.load() + unanswered_acquires.load());
}

TEST(LeaseClientTest, EveryCallEndsByItsDeadlineWhenNobodyAnswers) {
  // A bound socket that never answers: datagrams vanish, no ICMP comes back.
  const int sink = ::socket(AF_INET, SOCK_DGRAM, 0);
  ASSERT_GE(sink, 0);
  sockaddr_in bound{};
  bound.sin_family = AF_INET;
  bound.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(sink, reinterpret_cast<sockaddr*>(&bound), sizeof bound), 0);
  socklen_t length = sizeof bound;
  ASSERT_EQ(::getsockname(sink, reinterpret_cast<sockaddr*>(&bound), &length), 0);

  LeaseClientOptions options;
  options.request_timeout = 300ms;
  auto client = start_client({"127.0.0.1:" + std::to_string(ntohs(bound.sin_port))}, options);
  std::vector<std::thread> threads;
  std::atomic<int> late{0};
  std::atomic<int> wrong{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      const milliseconds wait = t % 2 == 0 ? 0ms : 200ms;
      const auto begin = Clock::now();
      const AcquireResult r = client->acquire("nobody/" + std::to_string(t), 1s, wait);
      const auto elapsed = Clock::now() - begin;
      if (r.error != LeaseErrc::kUnreachable) wrong.fetch_add(1);
      if (elapsed > options.request_timeout + wait + kSlack ||
          elapsed < options.request_timeout + wait) {
        late.fetch_add(1);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(late.load(), 0);
  EXPECT_GT(client->retransmissions(), 0u);
  ::close(sink);
}

TEST(LeaseClientTest, WatchdogKeepsALeaseAcrossManyTtls) {
  auto server = start_server();
  ASSERT_TRUE(server);
  auto a = start_client({address(*server)});
  auto b = start_client({address(*server)});
  std::atomic<int> lost{0};
  LeaseOptions watch;
  watch.watchdog = true;
  watch.on_lost = [&](const LeaseLost&) { lost.fetch_add(1); };
  // Renewed every 200 ms; a stall of 400 ms (a loaded sanitizer run) is
  // survived.
  AcquireResult held = a->try_acquire("watched", 600ms, watch);
  ASSERT_TRUE(held);
  const auto end = Clock::now() + 3600ms;  // six TTLs
  int invalid_samples = 0;
  while (Clock::now() < end) {
    if (!held.lease.valid()) ++invalid_samples;
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_EQ(invalid_samples, 0);
  EXPECT_EQ(lost.load(), 0);
  EXPECT_EQ(b->try_acquire("watched", 1s).error, LeaseErrc::kBusy);
  EXPECT_GE(server->stats().counter(StatCounter::kRenewed), 6u);
  EXPECT_FALSE(held.lease.release());
  std::this_thread::sleep_for(700ms);
  EXPECT_EQ(lost.load(), 0) << "a released lease is never reported lost";
}

TEST(LeaseClientTest, LostCallbackFiresOnceWhenTheServerStops) {
  auto server = start_server();
  ASSERT_TRUE(server);
  auto a = start_client({address(*server)});
  std::atomic<int> lost{0};
  std::mutex event_mutex;
  LeaseLost event;
  LeaseOptions watch;
  watch.watchdog = true;
  watch.on_lost = [&](const LeaseLost& e) {
    std::lock_guard lock(event_mutex);
    event = e;
    lost.fetch_add(1);
  };
  AcquireResult held = a->try_acquire("doomed", 600ms, watch);
  ASSERT_TRUE(held);
  // The watchdog has renewed it at least twice (past one TTL), seen on the
  // server, not assumed from elapsed time.
  ASSERT_TRUE(
      test_support::poll_until([&] { return server->stats().counter(StatCounter::kRenewed) >= 2; },
                               test_support::kPollTimeout, 5ms));
  EXPECT_TRUE(held.lease.valid());
  server->stop();
  const auto stopped = Clock::now();
  while (lost.load() == 0 && Clock::now() - stopped < 600ms + kSlack * 3)
    std::this_thread::sleep_for(10ms);
  EXPECT_EQ(lost.load(), 1);
  EXPECT_FALSE(held.lease.valid());
  std::this_thread::sleep_for(500ms);
  EXPECT_EQ(lost.load(), 1) << "fires exactly once";
  std::lock_guard lock(event_mutex);
  EXPECT_EQ(event.key, "doomed");
  EXPECT_EQ(event.token, held.lease.token());
  EXPECT_EQ(event.reason, LeaseErrc::kExpired);
  EXPECT_FALSE(event.refused_by_server);
}

TEST(LeaseClientTest, LostCallbackFiresOnceWhenTheLeaseIsTakenOver) {
  auto server = start_server();
  ASSERT_TRUE(server);
  const std::string bind = address(*server);
  auto a = start_client({bind});
  std::atomic<int> lost{0};
  std::atomic<bool> refused{false};
  LeaseOptions watch;
  watch.watchdog = true;
  watch.renew_fraction = 0.2;
  watch.on_lost = [&](const LeaseLost& e) {
    refused.store(e.refused_by_server);
    lost.fetch_add(1);
  };
  AcquireResult held = a->try_acquire("contested", 2s, watch);
  ASSERT_TRUE(held);
  // The server restarts (no data dir: it forgets every lease) and another
  // owner takes the key; the next renewal is refused.
  server.reset();
  server = start_server(bind);
  ASSERT_TRUE(server);
  auto b = start_client({bind});
  AcquireResult taken = b->try_acquire("contested", 10s);
  ASSERT_TRUE(taken) << taken.error.message();
  const auto begin = Clock::now();
  while (lost.load() == 0 && Clock::now() - begin < 2s + kSlack) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(lost.load(), 1);
  EXPECT_TRUE(refused.load());
  EXPECT_FALSE(held.lease.valid());
  EXPECT_EQ(held.lease.renew(), LeaseErrc::kLeaseInactive);
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(lost.load(), 1);
}

TEST(LeaseClientTest, LostCallbackFiresAtClientExpiryWithoutWatchdog) {
  auto server = start_server();
  ASSERT_TRUE(server);
  auto a = start_client({address(*server)});
  std::atomic<int> lost{0};
  LeaseOptions options;
  options.on_lost = [&](const LeaseLost&) { lost.fetch_add(1); };
  AcquireResult held = a->try_acquire("unwatched", 200ms, options);
  ASSERT_TRUE(held);
  const auto expiry = held.lease.expiry();
  while (lost.load() == 0 && LeaseClock::now() < expiry + kSlack) std::this_thread::sleep_for(5ms);
  EXPECT_EQ(lost.load(), 1);
  EXPECT_GE(LeaseClock::now(), expiry);
}

TEST(LeaseClientTest, CallsFromCompletionsAreBatched) {
  auto server = start_server();
  ASSERT_TRUE(server);
  auto client = start_client({address(*server)});
  constexpr int kCalls = 20;
  std::atomic<int> granted{0};
  std::atomic<int> released{0};
  std::atomic<int> done{0};
  const std::uint64_t sent_before = first_sends(*client);
  client->post([&] {
    for (int i = 0; i < kCalls; ++i) {
      const std::string key = "batch/" + std::to_string(i);
      client->acquire_async(key, 5s, 0ms, [&, key](const CallResult& r) {
        if (r.error) {
          done.fetch_add(1);
          return;
        }
        granted.fetch_add(1);
        client->release_async(
            key, r.token,
            [&](const CallResult& rr) {
              if (!rr.error) released.fetch_add(1);
              done.fetch_add(1);
            },
            r.owner);  // the acquire's own fresh owner
      });
    }
  });
  const auto begin = Clock::now();
  while (done.load() < kCalls && Clock::now() - begin < 5s) std::this_thread::sleep_for(5ms);
  EXPECT_EQ(granted.load(), kCalls);
  EXPECT_EQ(released.load(), kCalls);
  // 20 acquires in one datagram, then the releases in as few as the replies
  // came in: far fewer first sends than calls. Retransmissions go one call
  // per datagram, and how many a loaded machine makes is timing, so they
  // are not counted.
  EXPECT_LT(first_sends(*client) - sent_before, static_cast<std::uint64_t>(kCalls));
}

// Owners multiplexed over one client (as shardlock-bench does): each is
// its own identity to the server, although their requests share datagrams
// (items carry their owner), and one round's datagrams all go out.
TEST(LeaseClientTest, OwnersSharingOneClientExcludeEachOther) {
  auto server = start_server();
  ASSERT_TRUE(server);
  auto client = start_client({address(*server)});
  const std::uint64_t sent_before = first_sends(*client);
  constexpr int kOwners = 150;
  std::vector<ClientId> owners;
  for (int i = 0; i < kOwners; ++i) owners.push_back(random_client_id());
  std::atomic<int> granted{0};
  std::atomic<int> busy{0};
  std::atomic<int> done{0};
  client->post([&] {
    for (const ClientId& owner : owners) {
      client->acquire_async(
          "shared/key", 5s, 0ms,
          [&](const CallResult& r) {
            if (!r.error) granted.fetch_add(1);
            if (r.error == LeaseErrc::kBusy) busy.fetch_add(1);
            done.fetch_add(1);
          },
          owner);
    }
  });
  const auto begin = Clock::now();
  while (done.load() < kOwners && Clock::now() - begin < 10s) std::this_thread::sleep_for(5ms);
  EXPECT_EQ(granted.load(), 1);
  EXPECT_EQ(busy.load(), kOwners - 1);
  // About 28 owners' ACQUIREs fit in one datagram: far fewer first sends
  // than owners (CI's loaded run retransmitted every one of them once more).
  EXPECT_LT(first_sends(*client) - sent_before, static_cast<std::uint64_t>(kOwners));
  EXPECT_EQ(client->try_acquire("shared/key", 1s).error,
            LeaseErrc::kBusy);  // the client's own id, too
}

TEST(LeaseClientTest, RoutesEachKeyToItsOwnerNode) {
  auto one = start_server();
  auto two = start_server();
  ASSERT_TRUE(one && two);
  const std::vector<std::string> nodes = {address(*one), address(*two)};
  auto client = start_client(nodes);
  auto again = start_client({nodes[1], nodes[0]});  // order does not matter
  std::array<std::uint64_t, 2> expected{};
  std::vector<Lease> leases;
  for (int i = 0; i < 40; ++i) {
    const std::string key = "routed/" + std::to_string(i);
    const std::size_t node = client->node_for(key);
    ASSERT_LT(node, 2u);
    EXPECT_EQ(nodes[node], (std::vector<std::string>{nodes[1], nodes[0]})[again->node_for(key)]);
    ++expected[node];
    AcquireResult r = client->try_acquire(key, 10s);
    ASSERT_TRUE(r) << r.error.message();
    leases.push_back(std::move(r.lease));
  }
  EXPECT_GT(expected[0], 0u);
  EXPECT_GT(expected[1], 0u);
  EXPECT_EQ(one->stats().counter(StatCounter::kGrants), expected[0]);
  EXPECT_EQ(two->stats().counter(StatCounter::kGrants), expected[1]);
  const ServerStatsReply stats = client->stats(1);
  ASSERT_FALSE(stats.error) << stats.error.message();
  EXPECT_EQ(stats.shard_count, 8u);
  EXPECT_EQ(stats.shard_tokens.size(), 8u);
  EXPECT_EQ(stats.counters[static_cast<std::size_t>(StatCounter::kGrants)], expected[1]);
}

// ---------------------------------------------------------------------------
// The client-side two-holder paths, numbered as the lease server's first safety review
// listed them. Each test failed before its fix.

// Hole 1: a renewal to a shorter TTL must pull the client-side expiry in, or
// the old holder outlives the server's deadline.
TEST(LeaseSafetyTest, RenewalToAShorterTtlShortensTheClientExpiry) {
  auto server = start_server();
  ASSERT_TRUE(server);
  auto a = start_client({address(*server)});
  AcquireResult held = a->try_acquire("shrinking", 10s);
  ASSERT_TRUE(held);
  const auto before_renew = LeaseClock::now();
  ASSERT_FALSE(held.lease.renew(500ms));
  EXPECT_LE(held.lease.expiry(), before_renew + 500ms + kSlack)
      << "the server's deadline is now about 500 ms away";
  EXPECT_EQ(held.lease.ttl(), 500ms);
}

// Hole 2, and the owner contract: a second acquire of a held key through the same
// client is a contender of its own, never a grant that shares or replaces
// the first: busy at once, granted (with a newer token) only after the first
// lets go, and dropping the first never frees the second.
TEST(LeaseSafetyTest, ASecondAcquireThroughTheSameClientWaitsForTheFirst) {
  auto server = start_server();
  ASSERT_TRUE(server);
  auto a = start_client({address(*server)});
  auto observer = start_client({address(*server)});
  AcquireResult first = a->try_acquire("replaced", 10s);
  ASSERT_TRUE(first);
  AcquireResult busy = a->try_acquire("replaced", 10s);
  EXPECT_EQ(busy.error, LeaseErrc::kBusy);
  EXPECT_TRUE(first.lease.valid());
  EXPECT_FALSE(first.lease.renew(10s)) << "the first grant stands";
  std::thread release_soon([&] {
    std::this_thread::sleep_for(50ms);
    EXPECT_FALSE(first.lease.release());
  });
  AcquireResult second = a->acquire("replaced", 10s, 10s);
  release_soon.join();
  ASSERT_TRUE(second) << second.error.message();
  EXPECT_GT(second.lease.token(), first.lease.token()) << "a fresh grant, not the old one";
  const CallResult q = observer->query("replaced");
  ASSERT_FALSE(q.error);
  EXPECT_TRUE(q.held);
  EXPECT_EQ(q.token, second.lease.token());
  EXPECT_TRUE(second.lease.valid());
}

// Hole 2, the lost case: a Lease the client declared lost while the server
// still held it. A new acquire through the same client is another owner, so
// it waits until the server's lease ends; dropping the lost one then must
// not free the new grant.
TEST(LeaseSafetyTest, DroppingALostLeaseKeepsTheReacquiredOne) {
  auto server = start_server();
  ASSERT_TRUE(server);
  LeaseClientOptions options;
  options.clock_drift_factor = 0.5;  // the client gives up at half the TTL
  auto a = start_client({address(*server)}, options);
  auto observer = start_client({address(*server)});
  std::atomic<int> lost{0};
  LeaseOptions watch;
  watch.on_lost = [&](const LeaseLost&) { lost.fetch_add(1); };
  AcquireResult old = a->try_acquire("relost", 2s, watch);
  ASSERT_TRUE(old);
  const auto begin = Clock::now();
  while (lost.load() == 0 && Clock::now() - begin < 10s) std::this_thread::sleep_for(2ms);
  ASSERT_EQ(lost.load(), 1);
  EXPECT_EQ(a->try_acquire("relost", 2s).error, LeaseErrc::kBusy)
      << "the server still holds the lost lease";
  AcquireResult again = a->acquire("relost", 4s, 5s);
  ASSERT_TRUE(again) << again.error.message();
  EXPECT_GT(again.lease.token(), old.lease.token());
  old = AcquireResult{};
  // A RELEASE, if one was sent, left a's socket in that assignment, before
  // this QUERY; the server serves one client socket in order, so once a's
  // QUERY is answered that RELEASE has been applied. No sleep needed.
  ASSERT_FALSE(a->query("relost").error);
  const CallResult q = observer->query("relost");
  ASSERT_FALSE(q.error);
  EXPECT_TRUE(q.held);
  EXPECT_EQ(q.token, again.lease.token());
}

// Hole 3: the client-side expiry runs on CLOCK_BOOTTIME and keeps a drift
// margin below the server's deadline.
TEST(LeaseSafetyTest, ClientExpiryKeepsADriftMarginOnTheBootClock) {
  timespec boot{};
  ASSERT_EQ(::clock_gettime(CLOCK_BOOTTIME, &boot), 0);
  const auto boot_before =
      std::chrono::seconds(boot.tv_sec) + std::chrono::nanoseconds(boot.tv_nsec);
  const auto clock_reading = LeaseClock::now().time_since_epoch();
  ASSERT_EQ(::clock_gettime(CLOCK_BOOTTIME, &boot), 0);
  const auto boot_after =
      std::chrono::seconds(boot.tv_sec) + std::chrono::nanoseconds(boot.tv_nsec);
  EXPECT_GE(clock_reading, boot_before);
  EXPECT_LE(clock_reading, boot_after);

  auto server = start_server();
  ASSERT_TRUE(server);
  auto a = start_client({address(*server)});
  const auto before = LeaseClock::now();
  AcquireResult held = a->try_acquire("drift", 1000ms);
  const auto after = LeaseClock::now();
  ASSERT_TRUE(held);
  // Default margin: 1% of the TTL plus 2 ms (Redlock's drift factor), below
  // a send time that is no later than `after`.
  EXPECT_LE(held.lease.expiry(), after + 1000ms - 12ms);
  EXPECT_GE(held.lease.expiry(), before + 1000ms - 12ms);
}

// Hole 4: two spellings of one node would route keys of one server as if
// they were two; refuse the list.
TEST(LeaseSafetyTest, DuplicateNodesAreRefused) {
  for (const std::vector<std::string>& nodes :
       {std::vector<std::string>{"127.0.0.1:7420", "127.0.0.1:7420"},
        std::vector<std::string>{"localhost:7420", "127.0.0.1:7420"},
        std::vector<std::string>{"127.0.0.1:7420", "127.0.0.2:7420", "127.0.0.1:7420"}}) {
    LeaseClientOptions options;
    options.nodes = nodes;
    LeaseClient client(options);
    EXPECT_EQ(client.start(), LeaseErrc::kBadAddress) << nodes[0] << " " << nodes[1];
    EXPECT_NE(client.error_detail().find("same"), std::string::npos) << client.error_detail();
  }
}

TEST(LeaseClientStart, AddressesFollowTheServersRuleAndBusyPollIsBounded) {
  // One HOST:PORT rule for server and client (udp.h): no port 0 or beyond
  // 65535 for a server to reach, brackets for IPv6 with a port.
  for (const char* bad : {"127.0.0.1:0", "127.0.0.1:65536", "127.0.0.1:", ":7420", "[::1]7420",
                          "no-port", "127.0.0.1:7a"}) {
    Endpoint e;
    EXPECT_EQ(parse_endpoint(bad, e), LeaseErrc::kBadAddress) << bad;
  }
  for (const char* good : {"127.0.0.1:7420", "[::1]:7420", "localhost:65535"}) {
    Endpoint e;
    EXPECT_FALSE(parse_endpoint(good, e)) << good;
  }
  LeaseClientOptions options;
  options.nodes = {"127.0.0.1:7420"};
  options.busy_poll = std::chrono::microseconds{10'001};
  LeaseClient client(options);
  EXPECT_EQ(client.start(), LeaseErrc::kBadArgument);
  EXPECT_NE(client.error_detail().find("busy_poll"), std::string::npos) << client.error_detail();
}

// Hole 5: once release() or the destructor has returned, the lost callback
// neither runs nor is still running.
TEST(LeaseSafetyTest, LostCallbackNeverOutlivesReleaseOrDestruction) {
  auto server = start_server();
  ASSERT_TRUE(server);
  auto a = start_client({address(*server)});
  for (const bool destroy : {false, true}) {
    std::atomic<bool> started{false};
    std::atomic<bool> finished{false};
    LeaseOptions watch;
    watch.on_lost = [&](const LeaseLost&) {
      started.store(true);
      std::this_thread::sleep_for(300ms);
      finished.store(true);
    };
    auto held = std::make_unique<AcquireResult>(a->try_acquire("slow/callback", 100ms, watch));
    ASSERT_TRUE(*held);
    const auto begin = Clock::now();
    while (!started.load() && Clock::now() - begin < 5s) std::this_thread::sleep_for(1ms);
    ASSERT_TRUE(started.load());
    if (destroy) {
      held.reset();
    } else {
      (void)held->lease.release();
    }
    EXPECT_TRUE(finished.load()) << (destroy ? "destructor" : "release()")
                                 << " returned while on_lost was running";
  }
}

// Hole 6: a grant that arrives after its own client-side expiry is never a
// Lease that is invalid from the start. Its expiry counts from the ACQUIRE's
// first send, so a wait longer than the TTL ends past it: the client renews
// it before returning it, and the renewal's send time bounds the expiry.
TEST(LeaseSafetyTest, AGrantThatArrivesPastItsExpiryIsRenewedBeforeItIsReturned) {
  auto server = start_server();
  ASSERT_TRUE(server);
  auto holder = start_client({address(*server)});
  auto waiter = start_client({address(*server)});
  AcquireResult held = holder->try_acquire("late", 10s);
  ASSERT_TRUE(held);
  std::thread release_later([&] {
    // The waiter's ACQUIRE must be queued before the hand-off.
    const auto begin = Clock::now();
    while (server->stats().counter(StatCounter::kQueued) == 0 && Clock::now() - begin < 5s)
      std::this_thread::sleep_for(1ms);
    std::this_thread::sleep_for(250ms);  // longer than the waiter's TTL
    (void)held.lease.release();
  });
  const std::uint64_t renewed_before = server->stats().counter(StatCounter::kRenewed);
  AcquireResult late = waiter->acquire("late", 200ms, 5s);
  release_later.join();
  ASSERT_TRUE(late) << late.error.message();
  EXPECT_TRUE(late.lease.valid());
  EXPECT_GT(late.lease.token(), held.lease.token());
  EXPECT_EQ(server->stats().counter(StatCounter::kRenewed), renewed_before + 1);
  EXPECT_FALSE(late.lease.release());
}

// ... and one whose lease ended at the server before the client heard of it
// (its GRANTED lost until the TTL ran out) is an error, and nothing is held.
TEST(LeaseSafetyTest, AGrantWhoseLeaseEndedBeforeItArrivedIsAnError) {
  auto server = start_server();
  ASSERT_TRUE(server);
  auto holder = start_client({address(*server)});
  std::atomic<bool> cut{false};
  auto waiter = start_client({address(*server)}, faulty(Faults{}, 1, &cut));
  AcquireResult held = holder->try_acquire("ended", 10s);
  ASSERT_TRUE(held);
  std::thread release_later([&] {
    const auto begin = Clock::now();
    while (server->stats().counter(StatCounter::kQueued) == 0 && Clock::now() - begin < 5s)
      std::this_thread::sleep_for(1ms);
    cut = true;  // the GRANTED and the retransmissions are lost...
    (void)held.lease.release();
    std::this_thread::sleep_for(400ms);  // ...until the 100 ms lease has ended
    cut = false;
  });
  AcquireResult late = waiter->acquire("ended", 100ms, 5s);
  release_later.join();
  EXPECT_EQ(late.error, LeaseErrc::kGrantExpired);
  EXPECT_TRUE(late.lease.empty());
  EXPECT_EQ(holder->query("ended").held, false);
}

// Hole 9 (client side): a second process acting for the same owner (as
// shardlockctl renew --owner does) uses request ids above the first's, so the
// server applies its RENEW instead of treating it as a stale replay.
TEST(LeaseSafetyTest, ALaterClientForTheSameOwnerRenewsForReal) {
  auto server = start_server();
  ASSERT_TRUE(server);
  auto first = start_client({address(*server)});
  AcquireResult held = first->try_acquire("handed/over", 2s);
  ASSERT_TRUE(held);
  const std::uint64_t token = held.lease.token();
  const ClientId held_owner = held.lease.owner();
  held.lease.detach();
  for (int round = 0; round < 8; ++round) {
    std::this_thread::sleep_for(2ms);  // a later process starts later
    LeaseClientOptions same_owner;
    same_owner.client_id = held_owner;
    auto later = start_client({address(*server)}, same_owner);
    const CallResult r = later->renew("handed/over", token, 5s);
    ASSERT_FALSE(r.error) << r.error.message();
    EXPECT_EQ(r.ttl_ms, 5000u) << "round " << round << ": the renewal was treated as stale";
  }
  EXPECT_EQ(server->stats().counter(StatCounter::kStaleRequests), 0u);
}

TEST(LeaseClientTest, ClientIdHexRoundTrips) {
  const ClientId id{0x0123456789abcdefULL, 0xfedcba9876543210ULL};
  EXPECT_EQ(to_hex(id), "fedcba98765432100123456789abcdef");
  EXPECT_EQ(parse_client_id(to_hex(id)), id);
  EXPECT_FALSE(parse_client_id("xyz"));
  EXPECT_FALSE(parse_client_id(std::string(32, 'g')));
}

TEST(LeaseClientTest, NodeListsAndAddresses) {
  EXPECT_EQ(split_node_list("a:1,b:2,,c:3,"), (std::vector<std::string>{"a:1", "b:2", "c:3"}));
  EXPECT_TRUE(split_node_list("").empty());
  Endpoint e;
  EXPECT_FALSE(parse_endpoint("127.0.0.1:7420", e));
  EXPECT_FALSE(parse_endpoint("[::1]:7420", e));
  EXPECT_EQ(parse_endpoint("127.0.0.1", e), LeaseErrc::kBadAddress);
  EXPECT_EQ(parse_endpoint("127.0.0.1:0", e), LeaseErrc::kBadAddress);
  EXPECT_EQ(parse_endpoint("127.0.0.1:70000", e), LeaseErrc::kBadAddress);
  EXPECT_EQ(parse_endpoint("[::1:7420", e), LeaseErrc::kBadAddress);
  LeaseClientOptions mixed;
  mixed.nodes = {"127.0.0.1:1", "[::1]:2"};
  LeaseClient client(mixed);
  EXPECT_EQ(client.start(), LeaseErrc::kBadAddress);
  EXPECT_EQ(client.try_acquire("k", 1s).error, LeaseErrc::kNotStarted);
}

// ---------------------------------------------------------------------------
// Lease kinds: shared and permit leases, and acquire_many (all or nothing).

TEST(LeaseKindsTest, SharedLeasesCoexistAndKeepAnExclusiveOneOut) {
  auto server = start_server();
  ASSERT_TRUE(server);
  auto a = start_client({address(*server)});
  auto b = start_client({address(*server)});
  auto writer = start_client({address(*server)});

  AcquireResult first = a->acquire_shared("doc/1", 10s, 0ms);
  ASSERT_TRUE(first) << first.error.message();
  AcquireResult second = b->acquire_shared("doc/1", 10s, 0ms);
  ASSERT_TRUE(second) << second.error.message();
  EXPECT_EQ(first.lease.mode(), LeaseMode::kShared);
  EXPECT_EQ(second.lease.mode(), LeaseMode::kShared);
  EXPECT_EQ(first.lease.permits(), 0u);
  EXPECT_NE(first.lease.token(), second.lease.token()) << "every holder has its own token";
  EXPECT_TRUE(first.lease.valid());
  EXPECT_TRUE(second.lease.valid());

  AcquireResult excluded = writer->try_acquire("doc/1", 10s);
  EXPECT_EQ(excluded.error, LeaseErrc::kBusy);
  EXPECT_TRUE(excluded.lease.empty());
  EXPECT_GT(excluded.holder_ttl_left_ms, 0u);

  const CallResult q = writer->query("doc/1");
  ASSERT_FALSE(q.error) << q.error.message();
  EXPECT_TRUE(q.held);
  EXPECT_EQ(q.mode, LeaseMode::kShared);
  EXPECT_EQ(q.holders, 2u);
  EXPECT_EQ(q.permits, 0u);

  // One shared holder letting go leaves the key shared by the other.
  EXPECT_FALSE(first.lease.release());
  EXPECT_EQ(writer->try_acquire("doc/1", 10s).error, LeaseErrc::kBusy);
  EXPECT_EQ(writer->query("doc/1").holders, 1u);
  EXPECT_FALSE(second.lease.release());

  // And the reverse: an exclusive holder keeps readers out.
  AcquireResult exclusive = writer->try_acquire("doc/1", 10s);
  ASSERT_TRUE(exclusive) << exclusive.error.message();
  EXPECT_EQ(exclusive.lease.mode(), LeaseMode::kExclusive);
  EXPECT_EQ(a->acquire_shared("doc/1", 10s, 0ms).error, LeaseErrc::kBusy);
  EXPECT_EQ(a->query("doc/1").mode, LeaseMode::kExclusive);

  EXPECT_EQ(a->acquire_shared("", 1s, 0ms).error, LeaseErrc::kBadArgument);
  EXPECT_EQ(a->acquire_shared("doc/2", 0ms, 0ms).error, LeaseErrc::kBadArgument);
}

TEST(LeaseKindsTest, PermitKeyGrantsUpToItsLimit) {
  auto server = start_server();
  ASSERT_TRUE(server);
  constexpr std::uint32_t kPermits = 3;
  std::vector<std::unique_ptr<LeaseClient>> clients;
  for (std::uint32_t i = 0; i <= kPermits + 1; ++i)
    clients.push_back(start_client({address(*server)}));

  std::vector<Lease> held;
  std::set<std::uint64_t> tokens;
  for (std::uint32_t i = 0; i < kPermits; ++i) {
    AcquireResult r = clients[i]->acquire_permit("pool/db", kPermits, 10s, 0ms);
    ASSERT_TRUE(r) << "permit " << i << ": " << r.error.message();
    EXPECT_EQ(r.lease.mode(), LeaseMode::kPermit);
    EXPECT_EQ(r.lease.permits(), kPermits);
    tokens.insert(r.lease.token());
    held.push_back(std::move(r.lease));
  }
  EXPECT_EQ(tokens.size(), kPermits) << "each permit has its own token";

  AcquireResult full = clients[kPermits]->acquire_permit("pool/db", kPermits, 10s, 0ms);
  EXPECT_EQ(full.error, LeaseErrc::kBusy);
  EXPECT_TRUE(full.lease.empty());

  const CallResult q = clients[kPermits]->query("pool/db");
  ASSERT_FALSE(q.error) << q.error.message();
  EXPECT_TRUE(q.held);
  EXPECT_EQ(q.mode, LeaseMode::kPermit);
  EXPECT_EQ(q.holders, kPermits);
  EXPECT_EQ(q.permits, kPermits);

  // While the key is in use its limit is the first acquirer's, and it is no
  // lock.
  AcquireResult other_limit = clients[kPermits + 1]->acquire_permit("pool/db", 5, 10s, 0ms);
  EXPECT_EQ(other_limit.error, LeaseErrc::kServerError);
  EXPECT_EQ(other_limit.wire_error, WireError::kLeaseKindMismatch);
  AcquireResult as_lock = clients[kPermits + 1]->try_acquire("pool/db", 10s);
  EXPECT_EQ(as_lock.error, LeaseErrc::kServerError);
  EXPECT_EQ(as_lock.wire_error, WireError::kLeaseKindMismatch);

  // A permit given back makes room for one more.
  EXPECT_FALSE(held.back().release());
  held.pop_back();
  AcquireResult next = clients[kPermits]->acquire_permit("pool/db", kPermits, 10s, 0ms);
  EXPECT_TRUE(next) << next.error.message();

  EXPECT_EQ(clients[0]->acquire_permit("pool/x", 0, 1s, 0ms).error, LeaseErrc::kBadArgument);
  EXPECT_EQ(clients[0]->acquire_permit("pool/x", kMaxPermits + 1, 1s, 0ms).error,
            LeaseErrc::kBadArgument);
}

TEST(LeaseKindsTest, AcquireManyGrantsEveryKeyWithItsOwnToken) {
  auto server = start_server();
  ASSERT_TRUE(server);
  auto a = start_client({address(*server)});
  auto b = start_client({address(*server)});
  const std::vector<std::string_view> keys = {"acct/3", "acct/1", "acct/2"};

  // Tokens count per shard, so two keys may carry equal tokens; what holds
  // is that each lease carries its own key's token, as the server has it,
  // and a later grant of the key carries a larger one.
  std::vector<std::uint64_t> earlier;
  {
    MultiAcquireResult first = a->acquire_many(keys, 10s, 0ms);
    ASSERT_TRUE(first) << first.error.message();
    ASSERT_EQ(first.leases.size(), keys.size());
    for (Lease& lease : first.leases) {
      earlier.push_back(lease.token());
      EXPECT_FALSE(lease.release());
    }
  }
  MultiAcquireResult r = a->acquire_many(keys, 10s, 0ms);
  ASSERT_TRUE(r) << r.error.message();
  ASSERT_EQ(r.leases.size(), keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) {
    EXPECT_EQ(r.leases[i].key(), keys[i]) << "leases come in the caller's order";
    EXPECT_EQ(r.leases[i].mode(), LeaseMode::kExclusive);
    EXPECT_TRUE(r.leases[i].valid());
    EXPECT_GT(r.leases[i].token(), earlier[i]) << keys[i];
    const CallResult q = b->query(keys[i]);
    ASSERT_FALSE(q.error) << q.error.message();
    EXPECT_TRUE(q.held);
    EXPECT_EQ(q.token, r.leases[i].token()) << keys[i];
    EXPECT_EQ(b->try_acquire(keys[i], 1s).error, LeaseErrc::kBusy) << keys[i];
  }

  // Each lease is released on its own.
  EXPECT_FALSE(r.leases[1].release());
  EXPECT_TRUE(b->try_acquire("acct/1", 1s)) << "released with its own token";
  EXPECT_EQ(b->try_acquire("acct/2", 1s).error, LeaseErrc::kBusy);

  // Shared: two owners hold the same keys together.
  const std::vector<std::string_view> read = {"acct/7", "acct/8"};
  MultiAcquireResult reader_a = a->acquire_many(read, 10s, 0ms, LeaseMode::kShared);
  MultiAcquireResult reader_b = b->acquire_many(read, 10s, 0ms, LeaseMode::kShared);
  ASSERT_TRUE(reader_a) << reader_a.error.message();
  ASSERT_TRUE(reader_b) << reader_b.error.message();
  for (const Lease& lease : reader_a.leases) EXPECT_EQ(lease.mode(), LeaseMode::kShared);
  EXPECT_EQ(b->query("acct/8").holders, 2u);
}

TEST(LeaseKindsTest, AcquireManyHoldsNothingWhenOneKeyIsBusy) {
  auto server = start_server();
  ASSERT_TRUE(server);
  auto a = start_client({address(*server)});
  auto b = start_client({address(*server)});
  auto observer = start_client({address(*server)});
  AcquireResult taken = b->try_acquire("set/b", 10s);
  ASSERT_TRUE(taken);

  const std::vector<std::string_view> keys = {"set/a", "set/b", "set/c"};
  MultiAcquireResult r = a->acquire_many(keys, 10s, 0ms);
  EXPECT_EQ(r.error, LeaseErrc::kBusy);
  EXPECT_EQ(r.busy_key, "set/b");
  EXPECT_GT(r.holder_ttl_left_ms, 0u);
  EXPECT_TRUE(r.leases.empty());
  for (const std::string_view key : {"set/a", "set/c"}) {
    EXPECT_FALSE(observer->query(key).held) << key << " stayed held by the refused request";
    AcquireResult free = observer->try_acquire(key, 1s);
    EXPECT_TRUE(free) << key << ": " << free.error.message();
  }

  // A wait that runs out is a timeout, and still holds nothing.
  MultiAcquireResult waited =
      a->acquire_many(std::vector<std::string_view>{"set/d", "set/b"}, 10s, 100ms);
  EXPECT_EQ(waited.error, LeaseErrc::kTimeout);
  EXPECT_TRUE(waited.leases.empty());
  EXPECT_FALSE(observer->query("set/d").held);
}

TEST(LeaseKindsTest, AcquireManyRefusesABadKeyListBeforeSending) {
  auto server = start_server();
  ASSERT_TRUE(server);
  auto a = start_client({address(*server)});
  const std::uint64_t sent_before = a->datagrams_sent();

  EXPECT_EQ(a->acquire_many({}, 1s, 0ms).error, LeaseErrc::kBadArgument);
  EXPECT_EQ(a->acquire_many(std::vector<std::string_view>{"x", "y", "x"}, 1s, 0ms).error,
            LeaseErrc::kBadArgument);
  std::vector<std::string> names;
  for (std::size_t i = 0; i <= kMaxKeysPerRequest; ++i)
    names.push_back("many/" + std::to_string(i));
  std::vector<std::string_view> seventeen(names.begin(), names.end());
  ASSERT_EQ(seventeen.size(), 17u);
  EXPECT_EQ(a->acquire_many(seventeen, 1s, 0ms).error, LeaseErrc::kBadArgument);
  EXPECT_EQ(a->acquire_many(std::vector<std::string_view>{"x", ""}, 1s, 0ms).error,
            LeaseErrc::kBadArgument);
  const std::string too_long(kMaxKeyLength + 1, 'k');
  EXPECT_EQ(a->acquire_many(std::vector<std::string_view>{"x", too_long}, 1s, 0ms).error,
            LeaseErrc::kBadArgument);
  EXPECT_EQ(a->acquire_many(std::vector<std::string_view>{"x"}, 1s, 0ms, LeaseMode::kPermit).error,
            LeaseErrc::kBadArgument);
  EXPECT_EQ(a->acquire_many(std::vector<std::string_view>{"x"}, 0ms, 0ms).error,
            LeaseErrc::kBadArgument);
  // Sixteen keys of the longest length do not fit in one datagram.
  std::vector<std::string> long_names;
  for (std::size_t i = 0; i < kMaxKeysPerRequest; ++i) {
    long_names.push_back(std::string(kMaxKeyLength - 2, 'k') + std::to_string(10 + i));
  }
  const std::vector<std::string_view> oversized(long_names.begin(), long_names.end());
  EXPECT_EQ(a->acquire_many(oversized, 1s, 0ms).error, LeaseErrc::kBadArgument);
  EXPECT_EQ(a->datagrams_sent(), sent_before) << "refused before sending";

  // The async call refuses the same lists, at once.
  std::atomic<int> refused{0};
  a->acquire_many_async(seventeen, LeaseMode::kExclusive, 1s, 0ms, [&](const CallResult& r) {
    if (r.error == LeaseErrc::kBadArgument) refused.fetch_add(1);
  });
  EXPECT_EQ(refused.load(), 1);

  // Sixteen short keys are fine.
  seventeen.pop_back();
  MultiAcquireResult sixteen = a->acquire_many(seventeen, 1s, 0ms);
  ASSERT_TRUE(sixteen) << sixteen.error.message();
  EXPECT_EQ(sixteen.leases.size(), kMaxKeysPerRequest);
}

TEST(LeaseKindsTest, AcquireManyRefusesKeysOfDifferentNodes) {
  auto one = start_server();
  auto two = start_server();
  ASSERT_TRUE(one && two);
  auto client = start_client({address(*one), address(*two)});
  std::array<std::string, 2> on_node;
  for (int i = 0; on_node[0].empty() || on_node[1].empty(); ++i) {
    ASSERT_LT(i, 1000) << "no key routed to one of the nodes";
    const std::string key = "split/" + std::to_string(i);
    std::string& slot = on_node[client->node_for(key)];
    if (slot.empty()) slot = key;
  }
  const std::uint64_t sent_before = client->datagrams_sent();
  MultiAcquireResult r =
      client->acquire_many(std::vector<std::string_view>{on_node[0], on_node[1]}, 1s, 0ms);
  EXPECT_EQ(r.error, LeaseErrc::kCrossNode);
  EXPECT_TRUE(r.leases.empty());
  EXPECT_EQ(client->datagrams_sent(), sent_before) << "refused before sending";
  EXPECT_EQ(one->stats().counter(StatCounter::kRequests), 0u);
  EXPECT_EQ(two->stats().counter(StatCounter::kRequests), 0u);

  // Keys of one node go to that node, whichever it is.
  std::string second_on_two;
  for (int i = 0; second_on_two.empty(); ++i) {
    ASSERT_LT(i, 1000);
    const std::string key = "together/" + std::to_string(i);
    if (client->node_for(key) == 1) second_on_two = key;
  }
  MultiAcquireResult same =
      client->acquire_many(std::vector<std::string_view>{on_node[1], second_on_two}, 5s, 0ms);
  ASSERT_TRUE(same) << same.error.message();
  EXPECT_EQ(two->stats().counter(StatCounter::kGrants), 2u);
  EXPECT_EQ(one->stats().counter(StatCounter::kGrants), 0u);
}

TEST(LeaseKindsTest, WatchdogRenewsSharedAndMultiKeyLeasesPastTheirTtl) {
  auto server = start_server();
  ASSERT_TRUE(server);
  auto a = start_client({address(*server)});
  auto b = start_client({address(*server)});
  std::atomic<int> lost{0};
  LeaseOptions watch;
  watch.watchdog = true;
  watch.on_lost = [&](const LeaseLost&) { lost.fetch_add(1); };
  constexpr auto kTtl = 900ms;

  AcquireResult shared = a->acquire_shared("watched/shared", kTtl, 0ms, watch);
  ASSERT_TRUE(shared) << shared.error.message();
  MultiAcquireResult many = a->acquire_many(std::vector<std::string_view>{"watched/1", "watched/2"},
                                            kTtl, 0ms, LeaseMode::kExclusive, watch);
  ASSERT_TRUE(many) << many.error.message();
  std::vector<const Lease*> leases = {&shared.lease, &many.leases[0], &many.leases[1]};
  std::vector<LeaseClock::time_point> granted_expiry;
  for (const Lease* lease : leases) granted_expiry.push_back(lease->expiry());
  const LeaseClock::time_point latest =
      *std::max_element(granted_expiry.begin(), granted_expiry.end());

  // Past every lease's first expiry, each still held: its expiry moved on.
  ASSERT_TRUE(test_support::poll_until([&] { return LeaseClock::now() > latest + 100ms; },
                                       test_support::kPollTimeout, 10ms));
  for (std::size_t i = 0; i < leases.size(); ++i) {
    EXPECT_TRUE(leases[i]->valid()) << leases[i]->key();
    EXPECT_GT(leases[i]->expiry(), granted_expiry[i]) << leases[i]->key();
  }
  EXPECT_EQ(lost.load(), 0);
  EXPECT_GE(server->stats().counter(StatCounter::kRenewed), 3u);
  EXPECT_EQ(b->try_acquire("watched/shared", 1s).error, LeaseErrc::kBusy);
  EXPECT_EQ(b->try_acquire("watched/1", 1s).error, LeaseErrc::kBusy);
  EXPECT_EQ(b->try_acquire("watched/2", 1s).error, LeaseErrc::kBusy);
  EXPECT_TRUE(b->acquire_shared("watched/shared", 1s, 0ms)) << "still shared, not exclusive";

  EXPECT_FALSE(shared.lease.release());
  for (Lease& lease : many.leases) EXPECT_FALSE(lease.release());
  EXPECT_EQ(lost.load(), 0) << "a released lease is never reported lost";
}

TEST(LeaseKindsTest, AsyncAcquiresOfEveryKind) {
  auto server = start_server();
  ASSERT_TRUE(server);
  auto client = start_client({address(*server)});
  const ClientId reader_a = random_client_id();
  const ClientId reader_b = random_client_id();
  const ClientId writer = random_client_id();
  std::mutex mutex;
  std::map<std::string, CallResult> results;
  std::atomic<int> done{0};
  const auto record = [&](std::string name) {
    return [&, name](const CallResult& r) {
      {
        std::lock_guard lock(mutex);
        results[name] = r;
      }
      done.fetch_add(1);
    };
  };
  const std::vector<std::string_view> keys = {"async/1", "async/2"};
  client->acquire_async("async/shared", LeaseMode::kShared, 0, 5s, 0ms, record("shared a"),
                        reader_a);
  client->acquire_async("async/shared", LeaseMode::kShared, 0, 5s, 0ms, record("shared b"),
                        reader_b);
  client->acquire_async("async/permit", LeaseMode::kPermit, 1, 5s, 0ms, record("permit"), reader_a);
  client->acquire_many_async(keys, LeaseMode::kExclusive, 5s, 0ms, record("many"), writer);
  ASSERT_TRUE(test_support::poll_until([&] { return done.load() == 4; }));
  // After the others, so it is busy on both counts.
  client->acquire_async("async/permit", LeaseMode::kPermit, 1, 5s, 0ms, record("permit 2"),
                        reader_b);
  client->acquire_many_async(keys, LeaseMode::kShared, 5s, 0ms, record("many 2"), reader_a);
  ASSERT_TRUE(test_support::poll_until([&] { return done.load() == 6; }));

  std::lock_guard lock(mutex);
  EXPECT_FALSE(results["shared a"].error) << results["shared a"].error.message();
  EXPECT_FALSE(results["shared b"].error) << results["shared b"].error.message();
  EXPECT_NE(results["shared a"].token, results["shared b"].token);
  EXPECT_FALSE(results["permit"].error) << results["permit"].error.message();
  EXPECT_EQ(results["permit 2"].error, LeaseErrc::kBusy);
  const CallResult& many = results["many"];
  ASSERT_FALSE(many.error) << many.error.message();
  EXPECT_EQ(many.reply, MessageType::kGrantedMany);
  ASSERT_EQ(many.tokens.size(), 2u);
  EXPECT_GT(many.tokens[0], 0u);
  EXPECT_GT(many.tokens[1], 0u);
  EXPECT_GT(many.ttl_ms, 0u);
  EXPECT_EQ(results["many 2"].error, LeaseErrc::kBusy);
  EXPECT_EQ(results["many 2"].reply, MessageType::kBusyMany);
  EXPECT_LT(results["many 2"].busy_index, 2u);
}

// ---------------------------------------------------------------------------
// A scripted node: answers the client with replies no correct server sends,
// to check what the client believes.

std::vector<std::uint8_t> encode_reply(const ClientId& to, const Message& reply) {
  Datagram d;
  d.client_id = to;
  d.request_id = reply.request_id;
  (void)d.push(reply);
  std::vector<std::uint8_t> bytes(kMaxDatagramSize);
  std::size_t written = 0;
  EXPECT_EQ(encode(d, bytes, written), ProtocolError::kOk);
  bytes.resize(written);
  return bytes;
}

std::vector<std::uint8_t> tokens_le(const std::vector<std::uint64_t>& tokens) {
  std::vector<std::uint8_t> bytes;
  for (const std::uint64_t t : tokens) {
    for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<std::uint8_t>(t >> (8 * i)));
  }
  return bytes;
}

// What the scripted node saw of an ACQUIRE_MANY.
struct SeenAcquireMany {
  LeaseMode mode = LeaseMode::kExclusive;
  std::uint32_t wait_ms = 0;
  std::vector<std::string> keys;
};

class ScriptedNode {
 public:
  // Answers every request datagram with answer(request, from client id):
  // encoded replies, sent in order.
  using Answer =
      std::function<std::vector<std::vector<std::uint8_t>>(const Message&, const ClientId&)>;

  explicit ScriptedNode(Answer answer) : answer_(std::move(answer)) {
    fd_ = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    EXPECT_GE(fd_, 0);
    sockaddr_in bound{};
    bound.sin_family = AF_INET;
    bound.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&bound), sizeof bound), 0);
    socklen_t length = sizeof bound;
    EXPECT_EQ(::getsockname(fd_, reinterpret_cast<sockaddr*>(&bound), &length), 0);
    port_ = ntohs(bound.sin_port);
    thread_ = std::thread([this] { run(); });
  }
  ~ScriptedNode() {
    stop_.store(true);
    thread_.join();
    ::close(fd_);
  }
  ScriptedNode(const ScriptedNode&) = delete;
  ScriptedNode& operator=(const ScriptedNode&) = delete;

  [[nodiscard]] std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  void run() {
    std::vector<std::uint8_t> buffer(kMaxDatagramSize);
    Datagram request;
    while (!stop_.load()) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 10) <= 0) continue;
      sockaddr_storage from{};
      socklen_t from_length = sizeof from;
      const ssize_t n = ::recvfrom(fd_, buffer.data(), buffer.size(), 0,
                                   reinterpret_cast<sockaddr*>(&from), &from_length);
      if (n <= 0) continue;
      if (decode(std::span(buffer.data(), static_cast<std::size_t>(n)), request) !=
          ProtocolError::kOk) {
        continue;
      }
      for (const Message& m : request.items()) {
        for (const auto& reply : answer_(m, m.owner.value_or(request.client_id))) {
          (void)::sendto(fd_, reply.data(), reply.size(), 0, reinterpret_cast<sockaddr*>(&from),
                         from_length);
        }
      }
    }
  }

  Answer answer_;
  int fd_ = -1;
  std::uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

TEST(LeaseKindsTest, GrantedManyWithoutATokenPerKeyIsIgnored) {
  std::mutex mutex;
  SeenAcquireMany seen;
  ScriptedNode node([&](const Message& m, const ClientId& from) {
    std::vector<std::vector<std::uint8_t>> replies;
    if (m.type != MessageType::kAcquireMany) return replies;
    {
      std::lock_guard lock(mutex);
      seen.mode = m.mode;
      seen.wait_ms = m.wait_ms;
      seen.keys.clear();
      for (const std::string_view key : KeyList(m)) seen.keys.emplace_back(key);
    }
    const auto short_list = tokens_le({11, 12});
    const auto long_list = tokens_le({11, 12, 13, 14});
    const auto good = tokens_le({11, 12, 13});
    Message base;
    base.request_id = m.request_id;
    base.ttl_ms = 10'000;
    Message r = base;
    r.type = MessageType::kGrantedMany;
    r.tokens_le = short_list;
    replies.push_back(encode_reply(from, r));
    r.tokens_le = long_list;
    replies.push_back(encode_reply(from, r));
    Message busy = base;
    busy.type = MessageType::kBusyMany;
    busy.index = 3;  // names no key of the request
    replies.push_back(encode_reply(from, busy));
    r.tokens_le = good;
    replies.push_back(encode_reply(from, r));
    return replies;
  });
  auto client = start_client({node.address()});
  const std::vector<std::string_view> keys = {"s/2", "s/1", "s/3"};
  MultiAcquireResult r = client->acquire_many(keys, 10s, 250ms, LeaseMode::kShared);
  ASSERT_TRUE(r) << r.error.message();
  ASSERT_EQ(r.leases.size(), 3u);
  for (std::size_t i = 0; i < keys.size(); ++i) {
    EXPECT_EQ(r.leases[i].key(), keys[i]);
    EXPECT_EQ(r.leases[i].token(), 11 + i);
    EXPECT_EQ(r.leases[i].mode(), LeaseMode::kShared);
  }
  EXPECT_GE(client->malformed_replies(), 3u);
  std::lock_guard lock(mutex);
  EXPECT_EQ(seen.mode, LeaseMode::kShared);
  EXPECT_EQ(seen.wait_ms, 250u);
  EXPECT_EQ(seen.keys, (std::vector<std::string>{"s/2", "s/1", "s/3"}));
  for (Lease& lease : r.leases) lease.detach();  // the node does not answer RELEASE
}

TEST(LeaseKindsTest, BusyManyNamesTheKeyAndTimeoutCarriesNoKey) {
  ScriptedNode node([&](const Message& m, const ClientId& from) {
    std::vector<std::vector<std::uint8_t>> replies;
    if (m.type != MessageType::kAcquireMany) return replies;
    if (m.wait_ms == 0) {
      Message busy;
      busy.type = MessageType::kBusyMany;
      busy.request_id = m.request_id;
      busy.ttl_ms = 1234;
      busy.index = 1;
      replies.push_back(encode_reply(from, busy));
      return replies;
    }
    // A TIMEOUT with a key answers a keyed request, never an ACQUIRE_MANY.
    Message timeout;
    timeout.type = MessageType::kTimeout;
    timeout.request_id = m.request_id;
    timeout.key = "b";
    replies.push_back(encode_reply(from, timeout));
    timeout.key = {};
    replies.push_back(encode_reply(from, timeout));
    return replies;
  });
  auto client = start_client({node.address()});
  const std::vector<std::string_view> keys = {"a", "b", "c"};
  MultiAcquireResult busy = client->acquire_many(keys, 10s, 0ms);
  EXPECT_EQ(busy.error, LeaseErrc::kBusy);
  EXPECT_EQ(busy.busy_key, "b");
  EXPECT_EQ(busy.holder_ttl_left_ms, 1234u);
  EXPECT_TRUE(busy.leases.empty());
  MultiAcquireResult timed_out = client->acquire_many(keys, 10s, 50ms);
  EXPECT_EQ(timed_out.error, LeaseErrc::kTimeout);
  EXPECT_TRUE(timed_out.busy_key.empty());
}

// ---------------------------------------------------------------------------
// Who holds what (QUERY_HOLDERS)

TEST(LeaseHoldersTest, ListsEachHolderOldestFirstAcrossPages) {
  auto server = start_server();
  ASSERT_TRUE(server);
  auto client = start_client({address(*server)});
  // More permit holders than one reply datagram lists, each its own owner.
  constexpr std::uint32_t kHolders = 120;
  std::vector<std::uint64_t> tokens(kHolders);
  for (std::uint32_t i = 0; i < kHolders; ++i) {
    std::atomic<bool> done{false};
    CallResult result;
    client->acquire_async(
        "pool/many", LeaseMode::kPermit, kHolders, 30s, 0ms,
        [&](const CallResult& r) {
          result = r;
          done.store(true);
        },
        ClientId{1000 + i, 7});
    ASSERT_TRUE(test_support::poll_until([&] { return done.load(); }, 5s));
    ASSERT_FALSE(result.error) << result.error.message();
    tokens[i] = result.token;
  }
  const HoldersReply r = client->holders("pool/many");
  ASSERT_FALSE(r.error) << r.error.message();
  EXPECT_TRUE(r.listed);
  EXPECT_TRUE(r.held);
  EXPECT_EQ(r.mode, LeaseMode::kPermit);
  EXPECT_EQ(r.permits, kHolders);
  EXPECT_EQ(r.holder_count, kHolders);
  EXPECT_EQ(r.waiters, 0u);
  ASSERT_EQ(r.holders.size(), kHolders);
  for (std::uint32_t i = 0; i < kHolders; ++i) {
    EXPECT_EQ(r.holders[i].owner, (ClientId{1000 + i, 7})) << i;
    EXPECT_EQ(r.holders[i].token, tokens[i]) << i;
    EXPECT_GT(r.holders[i].ttl_left, 0ms);
    EXPECT_LE(r.holders[i].ttl_left, 30s);
    EXPECT_FALSE(r.holders[i].pending);
    EXPECT_TRUE(r.holders[i].value.empty());
  }
  EXPECT_EQ(r.token, tokens.back());
}

TEST(LeaseHoldersTest, ShowsTheExclusiveHolderAndItsWaiters) {
  auto server = start_server();
  ASSERT_TRUE(server);
  auto holder = start_client({address(*server)});
  auto waiter = start_client({address(*server)});
  AcquireResult held = holder->acquire("jobs/one", 20s, 0ms);
  ASSERT_TRUE(held) << held.error.message();
  std::atomic<bool> done{false};
  waiter->acquire_async("jobs/one", 20s, 10s, [&](const CallResult&) { done.store(true); });
  ASSERT_TRUE(test_support::poll_until([&] { return holder->query("jobs/one").waiters == 1; }, 5s));

  const HoldersReply r = waiter->holders("jobs/one");
  ASSERT_FALSE(r.error) << r.error.message();
  EXPECT_TRUE(r.held);
  EXPECT_EQ(r.mode, LeaseMode::kExclusive);
  EXPECT_EQ(r.waiters, 1u);
  ASSERT_EQ(r.holders.size(), 1u);
  EXPECT_EQ(r.holders[0].owner, held.lease.owner());
  EXPECT_EQ(r.holders[0].token, held.lease.token());
  EXPECT_EQ(r.token, held.lease.token());

  EXPECT_FALSE(held.lease.release());
  ASSERT_TRUE(test_support::poll_until([&] { return done.load(); }, 5s));
  const HoldersReply after = holder->holders("jobs/one");
  ASSERT_EQ(after.holders.size(), 1u);
  EXPECT_EQ(owner_client(after.holders[0].owner), owner_client(waiter->client_id()));

  const HoldersReply free = holder->holders("jobs/nobody");
  ASSERT_FALSE(free.error);
  EXPECT_TRUE(free.listed);
  EXPECT_FALSE(free.held);
  EXPECT_EQ(free.holder_count, 0u);
  EXPECT_TRUE(free.holders.empty());
  EXPECT_EQ(holder->holders("").error, LeaseErrc::kBadArgument);
}

// A value attached to an acquire is listed with its holder and
// outlives the watchdog's renewals; a waiting acquire's comes with the key.
TEST(LeaseHoldersTest, AnAcquiresValueStaysWithItsHolder) {
  auto server = start_server();
  ASSERT_TRUE(server);
  auto leader = start_client({address(*server)});
  auto next = start_client({address(*server)});
  LeaseOptions options;
  options.watchdog = true;
  options.value = "10.0.0.7:5432 pid 4242";
  AcquireResult held = leader->acquire("election/db", 600ms, 0ms, options);
  ASSERT_TRUE(held) << held.error.message();
  LeaseOptions next_options;
  next_options.value = std::string(kMaxHolderValueLength, 'n');
  std::atomic<bool> granted{false};
  AcquireResult next_held;  // outlives the thread: its Lease releases when destroyed
  std::thread waiter([&] {
    next_held = next->acquire("election/db", 10s, 10s, next_options);
    EXPECT_TRUE(next_held) << next_held.error.message();
    granted.store(true);
  });
  // Several TTLs of renewals later, the value is still there.
  ASSERT_TRUE(test_support::poll_until(
      [&] { return server->stats().counter(StatCounter::kRenewed) >= 3; }, 10s));
  HoldersReply r = next->holders("election/db");
  ASSERT_FALSE(r.error) << r.error.message();
  ASSERT_EQ(r.holders.size(), 1u);
  EXPECT_EQ(r.holders[0].value, "10.0.0.7:5432 pid 4242");
  EXPECT_EQ(r.holders[0].token, held.lease.token());
  EXPECT_EQ(r.waiters, 1u);

  EXPECT_FALSE(held.lease.release());
  ASSERT_TRUE(test_support::poll_until([&] { return granted.load(); }, 10s));
  waiter.join();
  r = leader->holders("election/db");
  ASSERT_EQ(r.holders.size(), 1u);
  EXPECT_EQ(owner_client(r.holders[0].owner), owner_client(next->client_id()));
  EXPECT_EQ(r.holders[0].value, next_options.value);

  // Too long, or on acquire_many: refused before sending.
  LeaseOptions too_long;
  too_long.value = std::string(kMaxHolderValueLength + 1, 'x');
  EXPECT_EQ(leader->acquire("election/x", 1s, 0ms, too_long).error, LeaseErrc::kBadArgument);
  const std::vector<std::string_view> keys = {"m/1", "m/2"};
  LeaseOptions valued;
  valued.value = "v";
  EXPECT_EQ(leader->acquire_many(keys, 1s, 0ms, LeaseMode::kExclusive, valued).error,
            LeaseErrc::kBadArgument);
}

// A server from before QUERY_HOLDERS answers QUERY, and either drops
// QUERY_HOLDERS (its codec does not know the type) or answers it
// ERROR(kNotARequest).
TEST(LeaseHoldersTest, AnOlderServerGetsTheQuerySummary) {
  for (const bool refuses : {false, true}) {
    SCOPED_TRACE(refuses ? "ERROR(kNotARequest)" : "no answer");
    ScriptedNode old([&](const Message& m, const ClientId& from) {
      std::vector<std::vector<std::uint8_t>> replies;
      Message reply;
      reply.request_id = m.request_id;
      if (m.type == MessageType::kQuery) {
        reply.type = MessageType::kQueryReply;
        reply.key = m.key;
        reply.held = true;
        reply.token = 42;
        reply.ttl_ms = 900;
        reply.waiters = 2;
        reply.mode = LeaseMode::kShared;
        reply.holders = 3;
        replies.push_back(encode_reply(from, reply));
      } else if (m.type == MessageType::kQueryHolders && refuses) {
        reply.type = MessageType::kError;
        reply.error = WireError::kNotARequest;
        replies.push_back(encode_reply(from, reply));
      }
      return replies;
    });
    LeaseClientOptions options;
    options.request_timeout = 300ms;
    auto client = start_client({old.address()}, options);
    const HoldersReply r = client->holders("old/key");
    ASSERT_FALSE(r.error) << r.error.message();
    EXPECT_FALSE(r.listed);
    EXPECT_TRUE(r.holders.empty());
    EXPECT_TRUE(r.held);
    EXPECT_EQ(r.mode, LeaseMode::kShared);
    EXPECT_EQ(r.token, 42u);
    EXPECT_EQ(r.ttl_left, 900ms);
    EXPECT_EQ(r.waiters, 2u);
    EXPECT_EQ(r.holder_count, 3u);
  }
}

}  // namespace
}  // namespace shardlock::lease
