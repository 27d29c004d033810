// etcd over TLS with client certificates and user/password authentication,
// against a real etcd (support/etcd_fixture.h's start_tls_suite_etcd():
// certificates made with openssl, etcd with --client-cert-auth and auth
// enabled through etcdctl):
//
// - the EtcdClient: its calls, watches and keep-alives carry the token; a
//   token etcd let expire is replaced without failing a call; a wrong CA, an
//   expired or missing client certificate and a wrong password each fail
//   with an error that names the cause; read_etcd_tls_files() refuses what
//   gRPC could not use, naming the file;
// - shardlockd: two nodes form a cluster over TLS as an etcd user limited to
//   /shardlock/, fail over after kill -9 of one and drain (shardlockctl
//   drain over TLS); a wrong CA, an expired certificate and a wrong password
//   each fail the start (exit 1) naming the cause, and a missing file or a
//   password on the command line is a usage error (exit 2).
//
// Skips without etcd, etcdctl or openssl. Timings are short (TTLs of 2 s);
// nothing asserts a duration.
#include <sys/wait.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "etcd_client.h"
#include "node_processes.h"
#include "poll_until.h"
#include "shardlock/lease/client/client.h"
#include "support/certificates.h"
#include "support/etcd_fixture.h"
#include "support/process.h"
#include "watch_log.h"

namespace shardlock::cluster {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using test_support::acquire_until_granted;
using test_support::EtcdSuiteTest;
using test_support::poll_until;

const std::string kCtl = SHARDLOCK_TOOL_SHARDLOCKCTL;
const std::string kDaemon = SHARDLOCK_TOOL_SHARDLOCKD;

// The suite's TLS files: `cert` names a client certificate the fixture made
// ("node", "expired"; empty: none), `ca` the CA file ("ca", "other-ca").
EtcdTls tls_files(const test_support::TestCertificates& pki, const std::string& cert,
                  const std::string& ca = "ca") {
  auto read = read_etcd_tls_files(pki.cert(ca), cert.empty() ? "" : pki.cert(cert),
                                  cert.empty() ? "" : pki.key(cert));
  EXPECT_TRUE(read.ok()) << read.detail;
  return read.value;
}

class EtcdTlsTest : public EtcdSuiteTest {
 protected:
  static void SetUpTestSuite() { start_tls_suite_etcd(); }
  void SetUp() override {
    EtcdSuiteTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    prefix_ = "/shardlock/" + test_name() + "/";
  }

  // A client of the suite's etcd over TLS; `cert` and `ca` as tls_files()
  // takes them, `credentials` unset for none.
  static EtcdResult<std::unique_ptr<EtcdClient>> connect(
      const std::string& cert, std::optional<EtcdCredentials> credentials,
      const std::string& ca = "ca", std::chrono::milliseconds call_timeout = 5s) {
    EtcdClientOptions options;
    options.endpoints = etcd_->endpoint();
    options.tls = tls_files(*certificates_, cert, ca);
    options.credentials = std::move(credentials);
    options.call_timeout = call_timeout;
    return EtcdClient::connect(options);
  }
  static EtcdCredentials node_user() { return {kNodeUser, kNodePassword}; }

  std::string prefix_;
};

TEST_F(EtcdTlsTest, AnAuthenticatedClientPutsReadsWatchesAndKeepsALeaseAlive) {
  auto connected = connect("node", node_user());
  ASSERT_TRUE(connected.ok()) << connected.detail;
  EtcdClient& client = *connected.value;
  // From the revision after this read, whenever the watch's stream opens.
  const auto start = client.get(prefix_);
  ASSERT_TRUE(start.ok()) << start.detail;
  WatchLog watched;
  const auto watch = client.watch_prefix(prefix_, start.value.revision + 1, watched.callback());

  const auto lease = client.grant_lease(5);
  ASSERT_TRUE(lease.ok()) << lease.detail;
  const auto put = client.put(prefix_ + "a", "1", lease.value.id);
  ASSERT_TRUE(put.ok()) << put.detail;
  const auto got = client.get(prefix_ + "a");
  ASSERT_TRUE(got.ok()) << got.detail;
  ASSERT_EQ(got.value.kvs.size(), 1u);
  EXPECT_EQ(got.value.kvs[0].value, "1");
  const auto kept = client.keep_alive_once(lease.value.id);
  ASSERT_TRUE(kept.ok()) << kept.detail;
  EXPECT_GT(kept.value, 0);
  const auto swapped =
      client.put_if_mod_revision(prefix_ + "a", "2", got.value.kvs[0].mod_revision);
  ASSERT_TRUE(swapped.ok()) << swapped.detail;
  EXPECT_TRUE(swapped.value.applied);
  EXPECT_TRUE(poll_until([&] { return watched.events().size() >= 2; }, 10s));
  EXPECT_TRUE(watched.errors().empty()) << watched.errors().front();
  EXPECT_TRUE(client.revoke_lease(lease.value.id).ok());

  // The user's role covers /shardlock/ only: etcd's RBAC holds.
  const auto outside = client.put("elsewhere/" + test_name(), "x");
  EXPECT_EQ(outside.error, EtcdErrc::kPermissionDenied) << outside.detail;
}

TEST_F(EtcdTlsTest, AWrongPasswordFailsAsAuthenticationFailedInEtcdsWords) {
  auto connected = connect("node", EtcdCredentials{kNodeUser, "not-the-password"});
  ASSERT_TRUE(connected.ok()) << connected.detail;
  const auto got = connected.value->get(prefix_ + "a");
  EXPECT_EQ(got.error, EtcdErrc::kAuthenticationFailed);
  EXPECT_NE(got.detail.find("authentication failed, invalid user ID or password"),
            std::string::npos)
      << got.detail;
  EXPECT_NE(got.detail.find("user '" + std::string(kNodeUser) + "'"), std::string::npos)
      << got.detail;
  EXPECT_EQ(got.detail.find("not-the-password"), std::string::npos) << got.detail;
}

TEST_F(EtcdTlsTest, AWrongCaFailsNamingTheCertificateCheck) {
  auto connected = connect("node", node_user(), "other-ca", 1500ms);
  ASSERT_TRUE(connected.ok()) << connected.detail;
  const auto got = connected.value->get(prefix_ + "a");
  EXPECT_EQ(got.error, EtcdErrc::kUnavailable);
  EXPECT_NE(got.detail.find("certificate verify failed"), std::string::npos) << got.detail;
  EXPECT_NE(got.detail.find("does not verify against the CA"), std::string::npos) << got.detail;
}

TEST_F(EtcdTlsTest, AnExpiredClientCertificateIsRefusedBeforeAnyConnection) {
  const auto connected = connect("expired", node_user());
  EXPECT_EQ(connected.error, EtcdErrc::kCertificateExpired);
  EXPECT_NE(connected.detail.find("expired at 2020-01-02T00:00:00Z"), std::string::npos)
      << connected.detail;
  EXPECT_NE(connected.detail.find(certificates_->cert("expired")), std::string::npos)
      << connected.detail;
}

TEST_F(EtcdTlsTest, WithoutAClientCertificateTheErrorSaysEtcdRefusedIt) {
  auto connected = connect("", node_user(), "ca", 1500ms);
  ASSERT_TRUE(connected.ok()) << connected.detail;
  const auto got = connected.value->get(prefix_ + "a");
  EXPECT_EQ(got.error, EtcdErrc::kUnavailable);
  EXPECT_NE(got.detail.find("refuses the client certificate"), std::string::npos) << got.detail;
}

TEST_F(EtcdTlsTest, PlaintextToATlsPortFailsSayingToUseEtcds) {
  EtcdClientOptions options;
  options.endpoints = etcd_->endpoint();
  options.call_timeout = 1500ms;
  auto connected = EtcdClient::connect(options);
  ASSERT_TRUE(connected.ok()) << connected.detail;
  const auto got = connected.value->get(prefix_ + "a");
  EXPECT_EQ(got.error, EtcdErrc::kUnavailable) << got.detail;
  EXPECT_NE(got.detail.find("use etcds://"), std::string::npos) << got.detail;
}

// The fixture's PKI without an etcd: what read_etcd_tls_files() refuses.
TEST_F(EtcdTlsTest, TlsFilesGrpcCouldNotUseAreRefusedNamingTheFile) {
  const test_support::TestCertificates& pki = *certificates_;
  const auto refused = [](const std::string& ca, const std::string& cert, const std::string& key,
                          const std::string& says) {
    const auto read = read_etcd_tls_files(ca, cert, key);
    EXPECT_EQ(read.error, EtcdErrc::kTlsConfig) << ca << " " << cert << " " << key;
    EXPECT_NE(read.detail.find(says), std::string::npos) << read.detail;
  };
  const std::string missing = pki.dir() + "/missing.crt";
  refused(missing, "", "", "cannot read the CA file " + missing + ": No such file or directory");
  refused(pki.cert("ca"), pki.cert("node"), missing, "cannot read the client key " + missing);
  refused(pki.cert("ca"), pki.cert("node"), "", "without its key");
  refused(pki.cert("ca"), "", pki.key("node"), "without its certificate");
  // A password file is no certificate; another certificate's key is not this one's.
  refused(pki.dir() + "/node.password", "", "", "holds no PEM certificate");
  refused(pki.cert("ca"), pki.cert("node"), pki.cert("node"),
          "holds no unencrypted PEM private key");
  refused(pki.cert("ca"), pki.cert("node"), pki.key("admin"), "does not belong to the certificate");
  EXPECT_TRUE(read_etcd_tls_files(pki.cert("ca"), pki.cert("node"), pki.key("node")).ok());
  EXPECT_TRUE(read_etcd_tls_files("", "", "").ok());  // the default roots, no client certificate
}

// etcd forgets a simple token its --auth-token-ttl after its last use (and
// all of them when it restarts).
class EtcdTokenExpiryTest : public EtcdTlsTest {
 protected:
  static void SetUpTestSuite() { start_tls_suite_etcd({"--auth-token-ttl=1"}); }
};

TEST_F(EtcdTokenExpiryTest, CallsAfterTheTokenExpiredAuthenticateAgainAndSucceed) {
  auto connected = connect("node", node_user());
  ASSERT_TRUE(connected.ok()) << connected.detail;
  EtcdClient& client = *connected.value;
  const auto lease = client.grant_lease(10);
  ASSERT_TRUE(lease.ok()) << lease.detail;
  ASSERT_TRUE(client.put(prefix_ + "a", "1").ok());
  ASSERT_TRUE(client.keep_alive_once(lease.value.id).ok());
  // etcd drops tokens idle for a TTL, checked once a second.
  std::this_thread::sleep_for(2500ms);
  const auto put = client.put(prefix_ + "a", "2", lease.value.id);
  EXPECT_TRUE(put.ok()) << put.detail;
  std::this_thread::sleep_for(2500ms);
  const auto kept = client.keep_alive_once(lease.value.id);
  EXPECT_TRUE(kept.ok()) << kept.detail;
  std::this_thread::sleep_for(2500ms);
  // A watch created with an expired token is refused once, then made anew
  // (the pause lets its thread meet the expired token before this thread's
  // put replaces it; from the revision after the last put, so no event is
  // missed either way).
  WatchLog watched;
  const auto watch = client.watch_prefix(prefix_, put.value + 1, watched.callback());
  std::this_thread::sleep_for(500ms);
  ASSERT_TRUE(client.put(prefix_ + "b", "1").ok());
  EXPECT_TRUE(poll_until([&] { return !watched.events().empty(); }, 10s));
  EXPECT_TRUE(watched.errors().empty()) << watched.errors().front();
}

// ---------------------------------------------------------------------------
// shardlockd over TLS
// ---------------------------------------------------------------------------

class ShardlockdTlsTest : public test_support::NodeProcessTest {
 protected:
  static void SetUpTestSuite() { start_tls_suite_etcd(); }

  // Runs shardlockd as a node of a cluster on the suite's etcd with the
  // TLS and auth flags `etcd` until it exits; its exit code and log.
  // `url`: the --cluster flag's value (default: the suite's etcd).
  std::pair<int, std::string> failed_start(const std::vector<std::string>& etcd,
                                           const std::vector<std::string>& env = {},
                                           std::string url = {}) {
    if (url.empty()) url = etcd_->url();
    std::vector<std::string> argv = {
        kDaemon,      "--listen",         "127.0.0.1:0", "--io",      "socket",
        "--data-dir", root_ + "/fails",   "--node-id",   "x",         "--cluster-name",
        test_name(),  "--etcd-lease-ttl", "2s",          "--cluster", url};
    argv.insert(argv.end(), etcd.begin(), etcd.end());
    const std::string log_path = root_ + "/fails.log";
    fs::remove(log_path);
    test_support::ChildOptions wiring;
    wiring.capture_stdout = true;
    wiring.stderr_path = log_path;
    wiring.extra_env = env;
    test_support::ChildProcess p;
    EXPECT_TRUE(p.start(argv, wiring)) << p.error();
    EXPECT_TRUE(p.wait_for(30s)) << "shardlockd did not exit";
    std::ifstream log(log_path);
    std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
    return {WIFEXITED(p.exit_status()) ? WEXITSTATUS(p.exit_status()) : -1, std::move(text)};
  }
  // The node flags with `flag`'s value replaced by `value`.
  static std::vector<std::string> node_flags_with(const std::string& flag,
                                                  const std::string& value) {
    std::vector<std::string> flags = node_flags_;
    for (std::size_t i = 0; i + 1 < flags.size(); i += 2) {
      if (flags[i] == flag) flags[i + 1] = value;
    }
    return flags;
  }
};

TEST_F(ShardlockdTlsTest, TwoNodesFormFailOverAfterKill9AndDrainOverTlsWithAuth) {
  start_node("n1");
  start_node("n2");
  ASSERT_FALSE(HasFailure());
  auto both = client_with_members({"n1", "n2"});
  std::map<std::string, std::uint64_t> token_of;
  for (const char* id : {"n1", "n2"}) {
    for (const std::string& key : keys_of(*both, id, 3)) {
      const auto token = acquire_until_granted(*both, key);
      ASSERT_TRUE(token) << key;
      token_of[key] = *token;
    }
  }

  // kill -9 of n2: n1 takes its keys over, above every token n2 issued.
  nodes_.at("n2")->kill();
  auto alone = client_with_members({"n1"});
  for (auto& [key, token] : token_of) {
    const auto after = acquire_until_granted(*alone, key);
    ASSERT_TRUE(after) << key;
    EXPECT_GT(*after, token) << key;
    token = *after;
  }

  // n2 comes back (its old member key expires first), then n1 drains:
  // shardlockctl over TLS as the same etcd user, and n2 serves every key.
  start_node("n2");
  ASSERT_FALSE(HasFailure());
  auto again = client_with_members({"n1", "n2"});
  std::vector<std::string> drain = {"drain", "n1", "--cluster-name", test_name(), "--wait", "30s"};
  const std::vector<std::string> etcd = cluster_flags();
  drain.insert(drain.end(), etcd.begin(), etcd.end());
  const auto drained = test_support::run_tool(kCtl, drain, 60s);
  ASSERT_EQ(drained.exit_code, 0) << drained.out << drained.err;
  auto drained_map = client_with_members({"n2"});
  for (const auto& [key, token] : token_of) {
    const auto after = acquire_until_granted(*drained_map, key);
    ASSERT_TRUE(after) << key;
    EXPECT_GT(*after, token) << key;
  }
  EXPECT_TRUE(nodes_.at("n1")->running());
  std::vector<std::string> members = {"members", "--cluster-name", test_name()};
  members.insert(members.end(), etcd.begin(), etcd.end());
  const auto listed = test_support::run_tool(kCtl, members, 30s);
  EXPECT_EQ(listed.exit_code, 0) << listed.err;
  EXPECT_NE(listed.out.find("draining"), std::string::npos) << listed.out;
}

TEST_F(ShardlockdTlsTest, AWrongCaFailsTheStartNamingTheTlsHandshake) {
  const auto [code, log] =
      failed_start(node_flags_with("--etcd-cacert", certificates_->cert("other-ca")));
  EXPECT_EQ(code, 1) << log;
  EXPECT_NE(log.find("cannot join the cluster"), std::string::npos) << log;
  EXPECT_NE(log.find("Ssl handshake failed"), std::string::npos) << log;
  EXPECT_NE(log.find("certificate verify failed"), std::string::npos) << log;
}

TEST_F(ShardlockdTlsTest, AnExpiredClientCertificateFailsTheStartNamingIt) {
  std::vector<std::string> flags = node_flags_with("--etcd-cert", certificates_->cert("expired"));
  for (std::size_t i = 0; i + 1 < flags.size(); i += 2) {
    if (flags[i] == "--etcd-key") flags[i + 1] = certificates_->key("expired");
  }
  const auto [code, log] = failed_start(flags);
  EXPECT_EQ(code, 1) << log;
  EXPECT_NE(log.find("cannot join the cluster"), std::string::npos) << log;
  EXPECT_NE(log.find("the client certificate in " + certificates_->cert("expired") +
                     " (CN=node) expired at 2020-01-02T00:00:00Z"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("renew --etcd-cert"), std::string::npos) << log;
}

TEST_F(ShardlockdTlsTest, AWrongPasswordFailsTheStartInEtcdsWords) {
  const auto [code, log] = failed_start(
      node_flags_with("--etcd-password-file", certificates_->dir() + "/wrong.password"));
  EXPECT_EQ(code, 1) << log;
  EXPECT_NE(log.find("cannot join the cluster"), std::string::npos) << log;
  EXPECT_NE(log.find("authentication failed, invalid user ID or password"), std::string::npos)
      << log;
  EXPECT_NE(log.find("check --etcd-user"), std::string::npos) << log;
  EXPECT_EQ(log.find("not-the-password"), std::string::npos) << log;
}

TEST_F(ShardlockdTlsTest, NoUserOnAnEtcdWithAuthFailsTheStartSayingWhatIsMissing) {
  std::vector<std::string> flags;
  for (std::size_t i = 0; i + 1 < node_flags_.size(); i += 2) {
    if (node_flags_[i] == "--etcd-user" || node_flags_[i] == "--etcd-password-file") continue;
    flags.push_back(node_flags_[i]);
    flags.push_back(node_flags_[i + 1]);
  }
  const auto [code, log] = failed_start(flags);
  EXPECT_EQ(code, 1) << log;
  EXPECT_NE(log.find("cannot join the cluster"), std::string::npos) << log;
  EXPECT_NE(log.find("permission denied"), std::string::npos) << log;
  EXPECT_NE(log.find("without --etcd-user, etcd takes the user from the CN"), std::string::npos)
      << log;
}

TEST_F(ShardlockdTlsTest, AMissingFileOrAPasswordOnTheCommandLineIsAUsageError) {
  const std::string missing = root_ + "/missing.pem";
  for (const char* flag : {"--etcd-cacert", "--etcd-cert", "--etcd-key", "--etcd-password-file"}) {
    const auto [code, log] = failed_start(node_flags_with(flag, missing));
    EXPECT_EQ(code, 2) << flag << ": " << log;
    EXPECT_NE(log.find(missing + ": No such file or directory"), std::string::npos)
        << flag << ": " << log;
  }
  // etcdctl's --user NAME:PASSWORD would show the password in ps.
  auto [code, log] = failed_start(node_flags_with("--etcd-user", "shardlock:node-secret"));
  EXPECT_EQ(code, 2) << log;
  EXPECT_NE(log.find("visible to every user in ps"), std::string::npos) << log;
  EXPECT_EQ(log.find("node-secret"), std::string::npos) << log;
  // TLS files with a plaintext URL; a user without a password.
  std::tie(code, log) = failed_start(node_flags_, {}, "etcd://" + etcd_->endpoint());
  EXPECT_EQ(code, 2) << log;
  EXPECT_NE(log.find("--etcd-cacert needs TLS"), std::string::npos) << log;
  std::tie(code, log) =
      failed_start({"--etcd-cacert", certificates_->cert("ca"), "--etcd-user", kNodeUser});
  EXPECT_EQ(code, 2) << log;
  EXPECT_NE(log.find("needs its password"), std::string::npos) << log;
}

TEST_F(ShardlockdTlsTest, ThePasswordMayComeFromTheEnvironment) {
  std::vector<std::string> flags;
  for (std::size_t i = 0; i + 1 < node_flags_.size(); i += 2) {
    if (node_flags_[i] == "--etcd-password-file") continue;
    flags.push_back(node_flags_[i]);
    flags.push_back(node_flags_[i + 1]);
  }
  // The wrong one: the start fails in etcd's words, so it was sent.
  const auto [code, log] = failed_start(flags, {"SHARDLOCK_ETCD_PASSWORD=not-the-password"});
  EXPECT_EQ(code, 1) << log;
  EXPECT_NE(log.find("authentication failed"), std::string::npos) << log;
}

}  // namespace
}  // namespace shardlock::cluster
