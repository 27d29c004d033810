// A real server with tenants (LeaseServerOptions::tenants, tenants.h): over
// loopback UDP, tenants' clients are held to their prefixes and rights,
// cannot act on one another's leases with a guessed or observed owner id,
// are dropped when sealed in the wrong form or under another tenant's key,
// keep their leases across a reload and a key rotation, and are held to
// their tenant's bounds on leases, waiters and watches over all of their
// clients. Where the CPU has AES-NI the tenants seal in either suite (an
// AES-GCM client and a portable one of one tenant share its leases), and a
// server that lacks it drops AES datagrams as auth failures.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <future>
#include <optional>
#include <string>
#include <vector>

#include "poll_until.h"
#include "shardlock/lease/client/client.h"
#include "shardlock/lease/server/server.h"
#include "shardlock/lease/tenants.h"
#include "shardlock/lease/wire/envelope.h"
#include "support/loopback_server.h"
#include "wire/aes_testing.h"

namespace shardlock::lease {
namespace {

using namespace std::chrono_literals;

struct Keys {
  AuthKey billing = generate_auth_key();
  AuthKey ops = generate_auth_key();
  AuthKey secret = generate_auth_key();
  AuthKey newcomer = generate_auth_key();
};

// billing: acquire and query on billing/ and shared/; ops: everything;
// secret: encrypted, acquire on secret/ only.
std::string tenant_file(const Keys& k, bool with_newcomer = false) {
  std::string text = "tenant billing id=1 key=" + format_auth_key(k.billing) + "\n" +
                     "tenant ops id=2 key=" + format_auth_key(k.ops) + "\n" +
                     "tenant secret id=3 key=" + format_auth_key(k.secret) + " encrypt=yes\n" +
                     "allow billing \"billing/\" acquire,query\n"
                     "allow billing \"shared/\" acquire,query\n"
                     "allow ops \"\" all\n"
                     "allow secret \"secret/\" acquire\n";
  if (with_newcomer) {
    text += "tenant newcomer id=4 key=" + format_auth_key(k.newcomer) + "\n" +
            "allow newcomer \"new/\" acquire\n";
  }
  return text;
}

TenantTable table_of(const std::string& text) {
  auto parsed = parse_tenant_file(text, "/");
  EXPECT_TRUE(parsed.ok()) << parsed.message();
  return parsed.ok() ? std::move(*parsed.table) : TenantTable{};
}

class TenantsServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    LeaseServerOptions o = test_support::loopback_options();
    o.tenants = table_of(tenant_file(keys_));
    server_ = test_support::start_loopback_server(o);
    ASSERT_NE(server_, nullptr);
  }

  std::unique_ptr<LeaseClient> client_of(std::uint32_t tenant, const AuthKey& key,
                                         bool encrypt = false,
                                         EnvelopeCipher cipher = EnvelopeCipher::kAuto) {
    LeaseClientOptions o;
    o.auth_key = key;
    o.tenant = tenant;
    o.encrypt = encrypt;
    o.cipher = cipher;
    o.request_timeout = 1500ms;
    return test_support::start_loopback_client(*server_, o);
  }

  [[nodiscard]] std::uint64_t auth_failures() const {
    return server_->stats().counters[static_cast<std::size_t>(StatCounter::kAuthFailures)];
  }

  Keys keys_;
  std::unique_ptr<LeaseServer> server_;
};

TEST_F(TenantsServerTest, ATenantActsOnlyOnItsPrefixesWithItsRights) {
  auto billing = client_of(1, keys_.billing);
  auto granted = billing->acquire("billing/invoice-7", 5s, 0ms);
  ASSERT_TRUE(granted) << granted.error.message();

  auto outside = billing->acquire("ops/deploy", 5s, 0ms);
  EXPECT_EQ(outside.error, LeaseErrc::kServerError);
  EXPECT_EQ(outside.wire_error, WireError::kPermissionDenied);
  // A key equal to no prefix but starting like one is outside too.
  EXPECT_EQ(billing->acquire("billing", 5s, 0ms).wire_error, WireError::kPermissionDenied);
  // STATS needs admin on "": billing has none.
  const auto stats = billing->stats();
  EXPECT_TRUE(stats.error) << "billing read the server's stats";

  // ops has every right on every key, STATS included.
  auto ops = client_of(2, keys_.ops);
  EXPECT_FALSE(ops->stats().error);
  const HoldersReply held = ops->holders("billing/invoice-7");
  ASSERT_FALSE(held.error) << held.error.message();
  EXPECT_TRUE(held.held);
  EXPECT_FALSE(granted.lease.release());

  // Counted per tenant: billing's three refusals, none of ops'.
  const auto stats_of = [&](std::string_view name) {
    for (const TenantStats& t : server_->tenant_stats()) {
      if (t.name == name) return t;
    }
    ADD_FAILURE() << "no tenant " << name;
    return TenantStats{};
  };
  const TenantStats b = stats_of("billing");
  EXPECT_EQ(b.key_id, 1u);
  EXPECT_EQ(b.permission_denied, 3u);
  EXPECT_GE(b.requests, 5u);
  EXPECT_EQ(stats_of("ops").permission_denied, 0u);
  EXPECT_EQ(stats_of("secret").requests, 0u);
}

// An owner id seen in a HOLDERS_REPLY (or guessed) names the lease only
// within the tenant that took it: the server forces the tenant's key id into
// every owner a datagram names.
TEST_F(TenantsServerTest, AnotherTenantCannotRenewOrReleaseALeaseByItsOwnerId) {
  auto billing = client_of(1, keys_.billing);
  auto granted = billing->acquire("shared/report", 10s, 0ms);
  ASSERT_TRUE(granted) << granted.error.message();
  const ClientId owner = granted.lease.owner();
  const std::uint64_t token = granted.lease.token();
  EXPECT_EQ(owner.hi >> 32, 1u) << "a tenant's owners carry its key id";

  auto ops = client_of(2, keys_.ops);  // every right on shared/ too
  EXPECT_EQ(ops->renew("shared/report", token, 10s, owner).error, LeaseErrc::kNotOwner);
  EXPECT_EQ(ops->release("shared/report", token, owner).error, LeaseErrc::kNotOwner);
  EXPECT_EQ(ops->acquire("shared/report", 5s, 0ms).error, LeaseErrc::kBusy);

  // The same calls from billing itself, as that owner, do work: the refusal
  // above is the tenant's, not the call's.
  EXPECT_FALSE(billing->renew("shared/report", token, 10s, owner).error);
  EXPECT_FALSE(billing->release("shared/report", token, owner).error);
  granted.lease.detach();
}

TEST_F(TenantsServerTest, DatagramsUnderAnotherTenantsKeyOrInTheWrongFormAreDropped) {
  // Tenant 1's id with tenant 2's key: no tenant's datagram.
  auto forged = client_of(1, keys_.ops);
  EXPECT_EQ(forged->acquire("billing/x", 5s, 0ms).error, LeaseErrc::kUnreachable);
  // An unknown key id.
  auto stranger = client_of(9, generate_auth_key());
  EXPECT_EQ(stranger->acquire("billing/x", 5s, 0ms).error, LeaseErrc::kUnreachable);
  // secret must encrypt: its authenticated-only datagrams are dropped...
  auto plain = client_of(3, keys_.secret, /*encrypt=*/false);
  EXPECT_EQ(plain->acquire("secret/a", 5s, 0ms).error, LeaseErrc::kUnreachable);
  // ...and its encrypted ones served, within its rights.
  auto sealed = client_of(3, keys_.secret, /*encrypt=*/true);
  auto granted = sealed->acquire("secret/a", 5s, 0ms);
  ASSERT_TRUE(granted) << granted.error.message();
  EXPECT_EQ(sealed->acquire("shared/a", 5s, 0ms).wire_error, WireError::kPermissionDenied);
  // A client without any key is refused by a server with tenants.
  LeaseClientOptions none;
  none.request_timeout = 1500ms;
  auto keyless = test_support::start_loopback_client(*server_, none);
  EXPECT_EQ(keyless->acquire("billing/y", 5s, 0ms).error, LeaseErrc::kUnreachable);
  EXPECT_GE(server_->stats().counters[static_cast<std::size_t>(StatCounter::kAuthFailures)], 4u);
  EXPECT_FALSE(granted.lease.release());
}

// Each suite, each form: an AES-GCM client of a tenant acquires and
// releases, an encrypt=yes tenant is served over AES-GCM and refused in
// either suite when it only authenticates, and one tenant's AES and
// portable clients share its leases (the server answers each in its own
// suite).
TEST_F(TenantsServerTest, TenantsAreServedInTheAesSuiteAndThePortableOneAtOnce) {
  if (!aes_gcm_available()) GTEST_SKIP() << "this CPU has no AES-NI";
  auto fast = client_of(1, keys_.billing, false, EnvelopeCipher::kAes);
  auto portable = client_of(1, keys_.billing, false, EnvelopeCipher::kPortable);
  auto granted = fast->acquire("billing/a", 5s, 0ms);
  ASSERT_TRUE(granted) << granted.error.message();
  const auto seen = portable->query("billing/a");
  ASSERT_FALSE(seen.error) << seen.error.message();
  EXPECT_TRUE(seen.held);
  EXPECT_EQ(seen.token, granted.lease.token());
  EXPECT_EQ(portable->acquire("billing/a", 5s, 0ms).error, LeaseErrc::kBusy);
  EXPECT_EQ(fast->acquire("ops/a", 5s, 0ms).wire_error, WireError::kPermissionDenied);
  EXPECT_FALSE(granted.lease.release());
  EXPECT_FALSE(fast->query("billing/a").held);

  // secret must encrypt: served over AES-GCM (and portably)...
  for (const EnvelopeCipher cipher : {EnvelopeCipher::kAes, EnvelopeCipher::kPortable}) {
    SCOPED_TRACE(std::string(to_string(cipher)));
    auto sealed = client_of(3, keys_.secret, /*encrypt=*/true, cipher);
    auto secret = sealed->acquire("secret/a", 5s, 0ms);
    ASSERT_TRUE(secret) << secret.error.message();
    EXPECT_FALSE(secret.lease.release());
    // ...and refused when it only authenticates, in either suite.
    auto plain = client_of(3, keys_.secret, /*encrypt=*/false, cipher);
    EXPECT_EQ(plain->acquire("secret/b", 5s, 0ms).error, LeaseErrc::kUnreachable);
  }
  // kAuto is AES-GCM here.
  auto automatic = client_of(3, keys_.secret, /*encrypt=*/true);
  auto secret = automatic->acquire("secret/c", 5s, 0ms);
  ASSERT_TRUE(secret) << secret.error.message();
  EXPECT_FALSE(secret.lease.release());
}

// A client that forces AES-GCM on a host without it does not start; one
// without a tenant cannot ask for it.
TEST_F(TenantsServerTest, AClientForcingAesNeedsATenantAndTheCpu) {
  LeaseClientOptions o;
  o.nodes = {server_->listen_address()};
  o.auth_key = keys_.billing;
  o.cipher = EnvelopeCipher::kAes;
  {
    LeaseClient no_tenant(o);
    EXPECT_EQ(no_tenant.start(), LeaseErrc::kBadArgument);
    EXPECT_NE(no_tenant.error_detail().find("tenant"), std::string::npos);
  }
  o.tenant = 1;
  internal::hide_aes_gcm_for_testing(true);
  {
    LeaseClient no_aes(o);
    EXPECT_EQ(no_aes.start(), LeaseErrc::kBadArgument);
    EXPECT_NE(no_aes.error_detail().find("AES"), std::string::npos);
  }
  internal::hide_aes_gcm_for_testing(false);
}

// One request datagram from a socket of its own, and the answer if one
// comes within `wait`.
std::optional<std::vector<std::uint8_t>> exchange(std::uint16_t port,
                                                  std::span<const std::uint8_t> datagram,
                                                  std::chrono::milliseconds wait) {
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  EXPECT_GE(fd, 0);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(port);
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::sendto(fd, datagram.data(), datagram.size(), 0, reinterpret_cast<sockaddr*>(&to),
                     sizeof to),
            static_cast<ssize_t>(datagram.size()));
  pollfd p{.fd = fd, .events = POLLIN, .revents = 0};
  std::optional<std::vector<std::uint8_t>> reply;
  if (::poll(&p, 1, static_cast<int>(wait.count())) == 1) {
    std::vector<std::uint8_t> bytes(kMaxDatagramSize + 64);
    const ssize_t n = ::recv(fd, bytes.data(), bytes.size(), 0);
    if (n > 0) {
      bytes.resize(static_cast<std::size_t>(n));
      reply = std::move(bytes);
    }
  }
  ::close(fd);
  return reply;
}

// billing's ACQUIRE of `key`, sealed in `mode` as its client would.
// `request_id`: each call of one client its own, or the server answers a
// second key under the same id ERROR request_id_reused when both keys land
// on one shard (which the secret seed decides at each start).
std::vector<std::uint8_t> sealed_acquire(const AuthKey& key, std::string_view lease_key,
                                         EnvelopeMode mode, std::uint64_t request_id) {
  Message m;
  m.type = MessageType::kAcquire;
  m.request_id = request_id;
  m.key = lease_key;
  m.ttl_ms = 5000;
  Datagram d;
  d.client_id = ClientId{.lo = 5, .hi = std::uint64_t{1} << 32};
  d.request_id = m.request_id;
  EXPECT_TRUE(d.push(m));
  std::vector<std::uint8_t> bytes(kMaxDatagramSize);
  std::size_t n = 0;
  EXPECT_EQ(encode_request(d, std::span(bytes).first(kMaxDatagramSize - kMaxEnvelopeOverhead), n),
            ProtocolError::kOk);
  n = seal_for(bytes, n, 1, envelope_key(key), mode);
  EXPECT_NE(n, 0U);
  bytes.resize(n);
  return bytes;
}

// A server on a host without AES-NI (hidden here) drops AES datagrams,
// counted with the auth failures, and still serves the portable suite; the
// same datagram is answered, in its own form, once AES is back.
TEST_F(TenantsServerTest, AServerWithoutAesDropsAesDatagramsAsAuthFailures) {
  if (!aes_gcm_available()) GTEST_SKIP() << "this CPU has no AES-NI";
  const auto aes = sealed_acquire(keys_.billing, "billing/n", EnvelopeMode::kEncryptedAes, 77);
  const auto portable =
      sealed_acquire(keys_.billing, "billing/p", EnvelopeMode::kAuthenticated, 78);
  internal::hide_aes_gcm_for_testing(true);
  const std::uint64_t before = auth_failures();
  EXPECT_EQ(exchange(server_->port(), aes, 300ms), std::nullopt);
  EXPECT_EQ(auth_failures(), before + 1);
  const auto served = exchange(server_->port(), portable, 2000ms);
  ASSERT_TRUE(served.has_value());
  EXPECT_EQ(peek_key_id(*served), (EnvelopeKeyId{1, EnvelopeMode::kAuthenticated}));
  internal::hide_aes_gcm_for_testing(false);
  const auto answered = exchange(server_->port(), aes, 2000ms);
  ASSERT_TRUE(answered.has_value());
  EXPECT_EQ(peek_key_id(*answered), (EnvelopeKeyId{1, EnvelopeMode::kEncryptedAes}));
  std::vector<std::uint8_t> out(kMaxDatagramSize);
  const auto opened = open_with(*answered, envelope_key(keys_.billing), out);
  Datagram reply;
  ASSERT_EQ(decode(opened, reply), ProtocolError::kOk);
  EXPECT_EQ(reply.items()[0].type, MessageType::kGranted);
  EXPECT_EQ(auth_failures(), before + 1);
}

// A reload adds a tenant and keeps every lease; one that removes a tenant
// stops serving it.
TEST_F(TenantsServerTest, AReloadAddsAndRemovesTenantsAndKeepsTheLeases) {
  auto billing = client_of(1, keys_.billing);
  auto held = billing->acquire("billing/kept", 10s, 0ms);
  ASSERT_TRUE(held) << held.error.message();

  const auto requests_of = [&](std::string_view name) -> std::uint64_t {
    for (const TenantStats& t : server_->tenant_stats()) {
      if (t.name == name) return t.requests;
    }
    return 0;
  };
  const std::uint64_t before = requests_of("billing");
  ASSERT_TRUE(server_->reload_tenants(table_of(tenant_file(keys_, /*with_newcomer=*/true))));
  EXPECT_EQ(requests_of("billing"), before) << "a reload keeps a tenant's counts";
  auto newcomer = client_of(4, keys_.newcomer);
  auto fresh = newcomer->acquire("new/a", 5s, 0ms);
  ASSERT_TRUE(fresh) << fresh.error.message();
  EXPECT_FALSE(held.lease.renew(10s)) << "billing's lease survives the reload";

  ASSERT_TRUE(server_->reload_tenants(table_of(tenant_file(keys_, /*with_newcomer=*/false))));
  EXPECT_EQ(newcomer->acquire("new/b", 5s, 0ms).error, LeaseErrc::kUnreachable);
  EXPECT_FALSE(held.lease.renew(10s));
  EXPECT_FALSE(held.lease.release());
  fresh.lease.detach();
}

// Rotation (docs/security.md, "Rotating a tenant's key"): the next key is
// accepted beside the current one, a client that moved to it renews and
// releases what was taken under the old key (owners are scoped by the key
// id, which rotation keeps), and once the old key is retired it is refused
// while the lease lives on.
TEST(TenantsRotationTest, ARotatedKeyKeepsEveryLease) {
  const AuthKey old_key = generate_auth_key();
  const AuthKey new_key = generate_auth_key();
  const auto file = [](const AuthKey& key, const AuthKey* next) {
    return "tenant billing id=1 key=" + format_auth_key(key) +
           (next != nullptr ? " next=" + format_auth_key(*next) : std::string()) + "\n" +
           "allow billing \"billing/\" acquire,query\n";
  };
  LeaseServerOptions o = test_support::loopback_options();
  o.tenants = table_of(file(old_key, nullptr));
  auto server = test_support::start_loopback_server(o);
  ASSERT_NE(server, nullptr);
  const auto client_of = [&](const AuthKey& key) {
    LeaseClientOptions co;
    co.auth_key = key;
    co.tenant = 1;
    co.request_timeout = 1000ms;
    return test_support::start_loopback_client(*server, co);
  };
  // A blocking call on behalf of `owner`, as a restarted client that kept
  // its owner id makes it.
  const auto call = [](auto&& start) {
    std::promise<CallResult> done;
    auto answer = done.get_future();
    start([&done](const CallResult& r) { done.set_value(r); });
    return answer.get();
  };

  auto before = client_of(old_key);
  auto held = before->acquire("billing/ledger", 30s, 0ms);
  ASSERT_TRUE(held) << held.error.message();
  const ClientId owner = held.lease.owner();
  const std::uint64_t token = held.lease.token();

  // Step 1: the next key beside the current one; both are accepted.
  ASSERT_TRUE(server->reload_tenants(table_of(file(old_key, &new_key))));
  auto after = client_of(new_key);
  const CallResult renewed = call(
      [&](auto done) { after->renew_async("billing/ledger", token, 30s, std::move(done), owner); });
  EXPECT_EQ(renewed.reply, MessageType::kRenewed) << renewed.error.message();
  EXPECT_FALSE(held.lease.renew(30s)) << "the old key still works during the switch";

  // Step 3: the next key made current; the old one is refused.
  ASSERT_TRUE(server->reload_tenants(table_of(file(new_key, nullptr))));
  EXPECT_EQ(before->acquire("billing/other", 5s, 0ms).error, LeaseErrc::kUnreachable);
  const HoldersReply still = after->holders("billing/ledger");
  ASSERT_FALSE(still.error) << still.error.message();
  ASSERT_EQ(still.holders.size(), 1u) << "the lease outlived the rotation";
  EXPECT_EQ(still.holders[0].token, token);
  const CallResult released = call(
      [&](auto done) { after->release_async("billing/ledger", token, std::move(done), owner); });
  EXPECT_EQ(released.reply, MessageType::kReleased) << released.error.message();
  EXPECT_TRUE(after->acquire("billing/ledger", 5s, 0ms)) << "released under the new key";
  held.lease.detach();
}

// Without a tenant file the single --auth-key is one tenant: it scopes no
// owner, so a client's owners stay the random ids it chose.
TEST(TenantsLegacyTest, TheSingleAuthKeyScopesNoOwner) {
  LeaseServerOptions o = test_support::loopback_options();
  o.auth_key = generate_auth_key();
  auto server = test_support::start_loopback_server(o);
  ASSERT_NE(server, nullptr);
  LeaseClientOptions c;
  c.auth_key = o.auth_key;
  c.client_id = ClientId{.lo = 0x1111, .hi = 0xABCD'0000'0000'2222ULL};
  auto client = test_support::start_loopback_client(*server, c);
  auto granted = client->acquire("k", 5s, 0ms);
  ASSERT_TRUE(granted) << granted.error.message();
  const HoldersReply held = client->holders("k");
  ASSERT_FALSE(held.error);
  ASSERT_EQ(held.holders.size(), 1u);
  EXPECT_EQ(held.holders[0].owner.hi, 0xABCD'0000'0000'2222ULL);
  EXPECT_FALSE(server->reload_tenants(TenantTable::single(*o.auth_key)))
      << "nothing to reload without options.tenants";
  EXPECT_FALSE(granted.lease.release());
}

// A tenant's max-leases, max-waiters and max-watches hold over all of its
// clients and the server's shards, each refusal naming its bound, while
// another tenant is untouched; a reload that raises a bound lets it grow.
TEST(TenantLimitsServerTest, ATenantsBoundsHoldOverAllItsClientsAndNameTheBound) {
  const AuthKey billing_key = generate_auth_key();
  const AuthKey ops_key = generate_auth_key();
  const auto file = [&](int max_leases) {
    return "tenant billing id=1 key=" + format_auth_key(billing_key) +
           " max-leases=" + std::to_string(max_leases) + " max-waiters=1 max-watches=1\n" +
           "tenant ops id=2 key=" + format_auth_key(ops_key) + "\n" +
           "allow billing \"\" acquire,query\n"
           "allow ops \"\" all\n";
  };
  LeaseServerOptions o = test_support::loopback_options(/*shards=*/8);
  o.tenants = table_of(file(2));
  auto server = test_support::start_loopback_server(o);
  ASSERT_NE(server, nullptr);
  const auto client_of = [&](std::uint32_t tenant, const AuthKey& key) {
    LeaseClientOptions co;
    co.auth_key = key;
    co.tenant = tenant;
    co.request_timeout = 1500ms;
    return test_support::start_loopback_client(*server, co);
  };
  const auto billing_stats = [&] {
    for (const TenantStats& t : server->tenant_stats()) {
      if (t.name == "billing") return t;
    }
    return TenantStats{};
  };
  auto a = client_of(1, billing_key);
  auto b = client_of(1, billing_key);  // another client, same tenant
  auto ops = client_of(2, ops_key);

  auto k1 = a->acquire("k1", 20s, 0ms);
  auto k2 = b->acquire("k2", 20s, 0ms);
  ASSERT_TRUE(k1) << k1.error.message();
  ASSERT_TRUE(k2) << k2.error.message();
  for (LeaseClient* c : {a.get(), b.get()}) {
    const auto third = c->acquire("k3", 20s, 0ms);
    EXPECT_EQ(third.error, LeaseErrc::kServerError);
    EXPECT_EQ(third.wire_error, WireError::kTenantLeaseLimit) << to_string(third.wire_error);
  }
  auto k3 = ops->acquire("k3", 20s, 0ms);  // ops has no bound
  ASSERT_TRUE(k3) << k3.error.message();
  EXPECT_EQ(billing_stats().leases, 2u);

  // One ACQUIRE of billing may wait (on ops' key); a second is refused.
  std::atomic<bool> waited{false};
  a->acquire_async("k3", 20s, 3s, [&](const CallResult&) { waited = true; });
  ASSERT_TRUE(test_support::poll_until([&] { return billing_stats().waiters == 1; }));
  const auto second_waiter = b->acquire("k3", 20s, 2s);
  EXPECT_EQ(second_waiter.wire_error, WireError::kTenantWaiterLimit)
      << to_string(second_waiter.wire_error);

  // One WATCH of billing may park; a second is refused.
  std::atomic<bool> woke{false};
  a->watch_async("k3", KeyVersion{k3.lease.token(), 1}, 3s,
                 [&](const CallResult&) { woke = true; });
  ASSERT_TRUE(test_support::poll_until([&] { return billing_stats().watches == 1; }));
  const WatchEvent second_watch = b->watch_once("k1", KeyVersion{k1.lease.token(), 1}, 2s);
  EXPECT_EQ(second_watch.wire_error, WireError::kTenantWatchLimit)
      << to_string(second_watch.wire_error);

  // A reload raises max-leases: billing may hold a third lease.
  ASSERT_TRUE(server->reload_tenants(table_of(file(3))));
  auto k4 = b->acquire("k4", 20s, 0ms);
  EXPECT_TRUE(k4) << k4.error.message();
  EXPECT_EQ(billing_stats().leases, 3u);
  ASSERT_TRUE(test_support::poll_until([&] { return waited.load() && woke.load(); }));
}

}  // namespace
}  // namespace shardlock::lease
