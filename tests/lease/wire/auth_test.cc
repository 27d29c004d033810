// Datagram authentication: key files, sealing and opening, and a server and
// clients on loopback with matching, missing and wrong keys, plus a fake
// server whose forged GRANTED a keyed client must not believe.
#include "shardlock/lease/wire/auth.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "shardlock/lease/client/client.h"
#include "shardlock/lease/server/server.h"
#include "support/loopback_server.h"

namespace shardlock::lease {
namespace {

using namespace std::chrono_literals;
using shardlock::test_support::loopback_address;
using shardlock::test_support::loopback_options;
using shardlock::test_support::start_loopback_server;

constexpr std::string_view kKeyHex =
    "00112233445566778899aabbccddeeff00112233445566778899AABBCCDDEEFF";

AuthKey test_key() { return *parse_auth_key(kKeyHex); }

TEST(AuthKeyTest, ParsesAndFormatsHex) {
  const auto key = parse_auth_key(kKeyHex);
  ASSERT_TRUE(key.has_value());
  EXPECT_EQ((*key)[0], 0x00);
  EXPECT_EQ((*key)[1], 0x11);
  EXPECT_EQ((*key)[31], 0xFF);
  EXPECT_EQ(format_auth_key(*key),
            "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff");
  EXPECT_EQ(parse_auth_key("  \n" + std::string(kKeyHex) + "\r\n"), key);

  EXPECT_FALSE(parse_auth_key(""));
  EXPECT_FALSE(parse_auth_key(kKeyHex.substr(1)));                     // 63 digits
  EXPECT_FALSE(parse_auth_key(std::string(kKeyHex) + "0"));            // 65 digits
  EXPECT_FALSE(parse_auth_key("g" + std::string(kKeyHex.substr(1))));  // not hex
  EXPECT_FALSE(parse_auth_key(std::string(kKeyHex.substr(0, 32)) + " " +
                              std::string(kKeyHex.substr(33))));  // inner space

  const AuthKey a = generate_auth_key();
  const AuthKey b = generate_auth_key();
  EXPECT_NE(a, b);
  EXPECT_EQ(parse_auth_key(format_auth_key(a)), a);
}

TEST(AuthKeyTest, LoadsKeyFilesWithClearErrors) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("shardlock_auth_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string good = (dir / "good.key").string();
  const std::string bad = (dir / "bad.key").string();
  std::ofstream(good) << kKeyHex << "\n";
  std::ofstream(bad) << "not a key\n";

  const AuthKeyFile loaded = load_auth_key(good);
  ASSERT_TRUE(loaded.key.has_value()) << loaded.error;
  EXPECT_EQ(*loaded.key, test_key());

  const AuthKeyFile refused = load_auth_key(bad);
  EXPECT_FALSE(refused.key.has_value());
  EXPECT_NE(refused.error.find(bad), std::string::npos) << refused.error;
  EXPECT_NE(refused.error.find("keygen"), std::string::npos) << refused.error;

  const std::string missing = (dir / "missing.key").string();
  const AuthKeyFile absent = load_auth_key(missing);
  EXPECT_FALSE(absent.key.has_value());
  EXPECT_NE(absent.error.find(missing), std::string::npos) << absent.error;
  std::filesystem::remove_all(dir);
}

std::vector<std::uint8_t> encoded_acquire() {
  Datagram d;
  d.client_id = {7, 9};
  d.request_id = 42;
  Message m;
  m.type = MessageType::kAcquire;
  m.request_id = 42;
  m.key = "inventory:42";
  m.ttl_ms = 1000;
  (void)d.push(m);
  std::vector<std::uint8_t> bytes(kMaxDatagramSize);
  std::size_t n = 0;
  EXPECT_EQ(encode_request(d, bytes, n), ProtocolError::kOk);
  bytes.resize(n);
  return bytes;
}

TEST(AuthSealTest, SealedDatagramsOpenOnlyUnderTheirKeyAndUntouched) {
  const std::vector<std::uint8_t> plain = encoded_acquire();
  std::vector<std::uint8_t> sealed(plain.size() + kAuthTagSize);
  std::copy(plain.begin(), plain.end(), sealed.begin());
  ASSERT_EQ(seal_datagram(sealed, plain.size(), test_key()), plain.size() + kAuthTagSize);
  EXPECT_EQ(sealed[5] & kFlagAuthenticated, kFlagAuthenticated);

  const auto opened = open_datagram(sealed, test_key());
  ASSERT_EQ(opened.size(), plain.size());
  Datagram d;
  ASSERT_EQ(decode(opened, d), ProtocolError::kOk);  // the codec accepts the flag
  EXPECT_EQ(d.flags, kFlagAuthenticated);
  EXPECT_EQ(d.items()[0].key, "inventory:42");

  // Every single-bit change anywhere, tag included, is refused.
  for (std::size_t i = 0; i < sealed.size(); ++i) {
    std::vector<std::uint8_t> tampered = sealed;
    tampered[i] ^= 0x10;
    EXPECT_TRUE(open_datagram(tampered, test_key()).empty()) << "byte " << i;
  }
  AuthKey other = test_key();
  other[3] ^= 1;
  EXPECT_TRUE(open_datagram(sealed, other).empty());
  EXPECT_TRUE(open_datagram(plain, test_key()).empty());  // never sealed
  EXPECT_TRUE(open_datagram(std::span(sealed).first(kHeaderSize), test_key()).empty());

  // Refusals to seal: no room for the tag, or shorter than a header.
  std::vector<std::uint8_t> tight = plain;
  EXPECT_EQ(seal_datagram(tight, tight.size(), test_key()), 0u);
  EXPECT_EQ(seal_datagram(sealed, kHeaderSize - 1, test_key()), 0u);

  // The codec still rejects the other flag bits: kFlagKeyId here, which
  // opening an envelope clears (envelope.h), and the reserved ones.
  std::vector<std::uint8_t> reserved = plain;
  reserved[5] = kFlagKeyId;
  EXPECT_EQ(decode(reserved, d), ProtocolError::kBadFlags);
}

// ---------------------------------------------------------------------------
// Over loopback.

// The loopback server (support/loopback_server.h) under `key`; null, with
// the test failed, when it cannot start.
std::unique_ptr<LeaseServer> start_server(std::optional<AuthKey> key,
                                          std::size_t dedup_entries_per_shard = 4096) {
  LeaseServerOptions options = loopback_options(/*shards=*/4);
  options.dedup_entries_per_shard = dedup_entries_per_shard;
  options.auth_key = key;
  return start_loopback_server(options);
}

// `timeout`: short for clients that must not be answered (the call ends when
// it runs out), long for those that must be, so a loaded machine cannot fail
// them.
std::unique_ptr<LeaseClient> start_client(std::uint16_t port, std::optional<AuthKey> key,
                                          std::chrono::milliseconds timeout) {
  LeaseClientOptions options;
  options.nodes = {"127.0.0.1:" + std::to_string(port)};
  options.auth_key = key;
  options.request_timeout = timeout;
  auto client = std::make_unique<LeaseClient>(options);
  const std::error_code ec = client->start();
  EXPECT_FALSE(ec) << ec.message() << ": " << client->error_detail();
  return client;
}

std::uint64_t auth_failures(const LeaseServer& server) {
  return server.stats().counter(StatCounter::kAuthFailures);
}

TEST(AuthServerTest, MatchingKeysWorkAndOthersAreDroppedAndCounted) {
  auto server = start_server(test_key());
  ASSERT_NE(server, nullptr);
  auto keyed = start_client(server->port(), test_key(), 10s);
  AcquireResult a = keyed->acquire("k", 5s, 0ms);
  ASSERT_TRUE(a) << a.error.message();
  const std::uint64_t token = a.lease.token();
  EXPECT_EQ(auth_failures(*server), 0u);
  // STATS travels sealed too, and reports the counter.
  EXPECT_EQ(keyed->stats().counters[static_cast<std::size_t>(StatCounter::kAuthFailures)], 0u);

  // No key: every request is dropped, so the client hears nothing.
  auto unkeyed = start_client(server->port(), std::nullopt, 300ms);
  const AcquireResult plain = unkeyed->acquire("other", 5s, 0ms);
  EXPECT_EQ(plain.error, LeaseErrc::kUnreachable);
  const CallResult release_attempt = unkeyed->release("k", token);
  EXPECT_EQ(release_attempt.error, LeaseErrc::kUnreachable);

  // Another key: the same.
  AuthKey wrong = test_key();
  wrong[0] ^= 0xFF;
  auto wrong_keyed = start_client(server->port(), wrong, 300ms);
  EXPECT_EQ(wrong_keyed->acquire("other", 5s, 0ms).error, LeaseErrc::kUnreachable);

  EXPECT_GE(auth_failures(*server), 3u);  // at least one datagram per refused call
  EXPECT_EQ(server->stats().counter(StatCounter::kGrants), 1u);
  // The lease the keyed client holds was not touched by the refused release.
  const CallResult q = keyed->query("k");
  ASSERT_FALSE(q.error) << q.error.message();
  EXPECT_TRUE(q.held);
  EXPECT_EQ(q.token, token);
  EXPECT_FALSE(a.lease.release());
}

TEST(AuthServerTest, ServerWithoutKeyDropsSealedDatagrams) {
  auto server = start_server(std::nullopt);
  ASSERT_NE(server, nullptr);
  auto keyed = start_client(server->port(), test_key(), 300ms);
  EXPECT_EQ(keyed->acquire("k", 5s, 0ms).error, LeaseErrc::kUnreachable);
  EXPECT_GE(auth_failures(*server), 1u);
  EXPECT_EQ(server->stats().counter(StatCounter::kGrants), 0u);
}

// A fake server answers every request with an unsealed GRANTED (and then a
// GRANTED sealed under another key). A keyed client must believe neither.
TEST(AuthServerTest, KeyedClientIgnoresForgedReplies) {
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  socklen_t len = sizeof addr;
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);

  std::atomic<int> forged{0};
  std::atomic<bool> done{false};
  std::thread fake([&] {
    AuthKey other = test_key();
    other[31] ^= 0x55;
    while (!done.load()) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 20) <= 0) continue;
      std::vector<std::uint8_t> in(2048);
      sockaddr_in from{};
      socklen_t from_len = sizeof from;
      const ssize_t n =
          ::recvfrom(fd, in.data(), in.size(), 0, reinterpret_cast<sockaddr*>(&from), &from_len);
      if (n <= 0) continue;
      in.resize(static_cast<std::size_t>(n));
      // The request is sealed: read its ids from the header (the codec would
      // see the tag as non-zero padding).
      Datagram request;
      if (decode(std::span(in).first(in.size() - kAuthTagSize), request) != ProtocolError::kOk) {
        continue;
      }
      Datagram reply;
      reply.client_id = request.client_id;
      reply.request_id = request.request_id;
      Message m;
      m.type = MessageType::kGranted;
      m.request_id = request.items()[0].request_id;
      m.key = request.items()[0].key;
      m.token = 1;
      m.ttl_ms = 5000;
      (void)reply.push(m);
      std::vector<std::uint8_t> out(kMaxDatagramSize);
      std::size_t written = 0;
      if (encode(reply, std::span(out).first(kMaxDatagramSize - kAuthTagSize), written) !=
          ProtocolError::kOk) {
        continue;
      }
      const int round = forged.fetch_add(1);
      if (round % 2 == 1) written = seal_datagram(out, written, other);
      ::sendto(fd, out.data(), written, 0, reinterpret_cast<sockaddr*>(&from), from_len);
    }
  });

  auto client = start_client(ntohs(addr.sin_port), test_key(), 1s);
  const AcquireResult r = client->acquire("k", 5s, 0ms);
  EXPECT_EQ(r.error, LeaseErrc::kUnreachable);
  EXPECT_GE(forged.load(), 2);  // both kinds of forgery were tried
  // Every forgery was counted as a malformed reply, none as an answer.
  EXPECT_GE(client->malformed_replies(), 2u);
  done = true;
  fake.join();
  ::close(fd);
}

// Wraps a client's transport and keeps a copy of every datagram it sends:
// what an attacker on the path would capture.
class CapturingTransport final : public DatagramTransport {
 public:
  CapturingTransport(std::unique_ptr<DatagramTransport> inner,
                     std::shared_ptr<std::vector<std::vector<std::uint8_t>>> sent,
                     std::shared_ptr<std::mutex> mutex)
      : inner_(std::move(inner)), sent_(std::move(sent)), mutex_(std::move(mutex)) {}
  std::error_code send(const Endpoint& to, std::span<const std::uint8_t> bytes) override {
    {
      std::lock_guard lock(*mutex_);
      sent_->emplace_back(bytes.begin(), bytes.end());
    }
    return inner_->send(to, bytes);
  }
  std::size_t receive(const std::function<void(std::span<const std::uint8_t>)>& deliver) override {
    return inner_->receive(deliver);
  }
  int fd() const noexcept override { return inner_->fd(); }

 private:
  std::unique_ptr<DatagramTransport> inner_;
  std::shared_ptr<std::vector<std::vector<std::uint8_t>>> sent_;
  std::shared_ptr<std::mutex> mutex_;
};

// With authentication on, a captured RENEW replayed after
// its dedup entry is gone (here: no dedup cache at all) must not extend the
// lease of a holder that has gone away.
TEST(AuthServerTest, ReplayedRenewNeverExtendsALease) {
  auto server = start_server(test_key(), /*dedup_entries_per_shard=*/0);
  ASSERT_NE(server, nullptr);
  auto sent = std::make_shared<std::vector<std::vector<std::uint8_t>>>();
  auto sent_mutex = std::make_shared<std::mutex>();
  LeaseClientOptions options;
  options.nodes = {loopback_address(*server)};
  options.auth_key = test_key();
  options.request_timeout = 10s;
  options.wrap_transport = [&](std::unique_ptr<DatagramTransport> inner) {
    return std::unique_ptr<DatagramTransport>(
        std::make_unique<CapturingTransport>(std::move(inner), sent, sent_mutex));
  };
  auto victim = std::make_unique<LeaseClient>(options);
  ASSERT_FALSE(victim->start()) << victim->error_detail();
  AcquireResult held = victim->acquire("replayed", 3s, 0ms);
  ASSERT_TRUE(held) << held.error.message();
  ASSERT_FALSE(held.lease.renew(3s));
  std::vector<std::uint8_t> captured_renew;
  {
    std::lock_guard lock(*sent_mutex);
    captured_renew = sent->back();
  }
  held.lease.detach();  // the holder goes away without releasing
  victim.reset();

  // The attacker replays the sealed RENEW from another socket.
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(server->port());
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  auto observer = start_client(server->port(), test_key(), 10s);
  std::this_thread::sleep_for(1500ms);  // let the lease age, so an extension shows
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(::sendto(fd, captured_renew.data(), captured_renew.size(), 0,
                       reinterpret_cast<const sockaddr*>(&addr), sizeof addr),
              static_cast<ssize_t>(captured_renew.size()));
  }
  // The server reads its socket in arrival order: the QUERY comes after the
  // replays.
  const CallResult q = observer->query("replayed");
  ASSERT_FALSE(q.error) << q.error.message();
  EXPECT_TRUE(q.held);
  EXPECT_LE(q.ttl_ms, 3000u - 1000u) << "a replayed RENEW moved the deadline";
  EXPECT_EQ(server->stats().counter(StatCounter::kStaleRequests), 3u);
  ::close(fd);
}

}  // namespace
}  // namespace shardlock::lease
