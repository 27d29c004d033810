// See config.h.
#include "bench/config.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <charconv>
#include <system_error>
#include <thread>

namespace shardlock::bench {
namespace {

using lease::kMaxBatch;
using lease::kMaxKeysPerRequest;

// The flags that are read into text first, then parsed and checked.
struct FlagTexts {
  std::string duration = "10s";
  std::string ttl = "30s";
  std::string auth_key_file;
  bool auth = false;
  std::uint32_t tenant = 0;  // read only when --tenant is given
  std::string cipher;        // --cipher, as given
  tools::OutputFlags output;
};

// --read-fraction's check: a number from 0 to 1.
CLI::Validator fraction_validator() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        double value = 0;
        const char* end = text.data() + text.size();
        const auto parsed = std::from_chars(text.data(), end, value);
        if (parsed.ec != std::errc{} || parsed.ptr != end || !(value >= 0.0 && value <= 1.0))
          return "want a fraction from 0 to 1 (e.g. 0.9), got '" + text + "'";
        return {};
      },
      "0..1");
}

// Declares every flag, in the order --help lists them.
void add_flags(CLI::App& app, Config& config, FlagTexts& texts) {
  app.add_option("--server", config.server,
                 "Target an external shardlockd: HOST:PORT[,HOST:PORT...]");
  app.add_flag("--discover", config.discover,
               "Lease mode, with --server: the servers are seeds of a cluster (docs/cluster.md); "
               "the clients ask them for the cluster's map and send each key to its owner node");
  // json: one object instead of the table, no progress line
  tools::add_output_flags(app, texts.output);
  app.add_option("--duration", texts.duration, "How long to run, e.g. 10s, 500ms, 1m")
      ->capture_default_str();
  app.add_option(
         "--clients", config.clients,
         "Concurrent clients: LeaseClients (lease mode) or threads (table mode; default: CPUs)")
      ->check(CLI::Range(1u, 4096u))
      ->capture_default_str();
  app.add_option("--keys", config.keys, "Key space size")
      ->check(CLI::Range(1ULL, 1ULL << 32))
      ->capture_default_str();
  app.add_option("--theta", config.theta, "Zipf skew (0 = uniform)")
      ->check(CLI::Range(0.0, 10.0))
      ->capture_default_str();
  app.add_option("--ttl", texts.ttl, "Lease TTL (lease mode)")->capture_default_str();
  app.add_option("--batch", config.batch, "Keys per datagram per client (lease mode)")
      ->check(CLI::Range(1u, static_cast<unsigned>(kMaxBatch)))
      ->capture_default_str();
  app.add_option("--read-fraction", config.read_fraction,
                 "Lease mode: the fraction of acquires that are shared (ACQUIRE_SHARED) instead "
                 "of exclusive, 0..1")
      ->check(fraction_validator())
      ->capture_default_str();
  app.add_option("--keys-per-op", config.keys_per_op,
                 "Lease mode: each acquire is one ACQUIRE_MANY over this many distinct keys "
                 "(all or nothing, one node), released key by key; 1..16 (1: plain ACQUIRE)")
      ->check(CLI::Range(1u, static_cast<unsigned>(kMaxKeysPerRequest)))
      ->capture_default_str();
  app.add_option("--pack", config.pack,
                 "Most requests per datagram, across owners (1: one request per datagram)")
      ->check(CLI::Range(1u, static_cast<unsigned>(kMaxBatch)))
      ->capture_default_str();
  app.add_option("--mode", config.mode,
                 "lease: over UDP to a LeaseServer; table: in-process LockTable")
      ->check(CLI::IsMember({"lease", "table"}))
      ->capture_default_str();
  app.add_option("--server-threads", config.server_threads, "I/O threads of the embedded server")
      ->check(CLI::Range(1u, 64u))
      ->capture_default_str();
  app.add_option(
         "--server-io", config.server_io,
         "I/O back end of the embedded server: auto (io_uring if available), uring or socket")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "uring", "socket"}));
  app.add_option("--client-threads", config.client_threads,
                 "LeaseClients (sockets and I/O threads) the lease-mode clients are spread over "
                 "(default: CPUs / 2, 1..4)")
      ->check(CLI::Range(1u, 256u));
  app.add_option("--busy-poll-us", config.busy_poll_us,
                 "Lease mode: microseconds the embedded server's and the clients' I/O threads "
                 "keep polling before they sleep (lower latency for CPU); 0 = off")
      ->capture_default_str()
      ->check(CLI::Range(0u, 10'000u));
  app.add_option("--seed", config.seed, "Workload seed")->capture_default_str();
  app.add_option("--auth-key", texts.auth_key_file,
                 "Key file shared with --server (shardlockctl keygen): seal every datagram");
  app.add_flag("--auth", texts.auth,
               "Seal every datagram with a fresh random key (embedded server): measures the "
               "cost of authentication");
  app.add_option("--tenant", texts.tenant,
                 "Lease mode: seal every datagram as the tenant with this key id "
                 "(docs/security.md). The embedded server serves that one tenant, with a fresh "
                 "random key and every right on every key; with --server, --auth-key FILE holds "
                 "the tenant's key")
      ->type_name("ID");
  app.add_flag("--encrypt", config.encrypt,
               "With --tenant: encrypt every datagram (the tenant's encrypt=yes), for the "
               "embedded server's tenant too");
  app.add_option("--cipher", texts.cipher,
                 "With --tenant: the cipher suite, auto (the default: AES-256-GCM where this CPU "
                 "has AES-NI, else portable), portable (BLAKE2b and XChaCha20-Poly1305) or aes")
      ->check(CLI::IsMember({"auto", "portable", "aes"}));
}

// Fills in what the parsed flags leave to be read or defaulted, and checks
// the flags against each other. Returns the usage error's exit status, or
// nullopt.
std::optional<int> finish_config(const CLI::App& app, const FlagTexts& texts, Config& config) {
  config.json = texts.output.json();
  // --duration never goes on the wire: no bound but the clock's.
  const auto duration = tools::parse_duration_flag(
      "--duration", texts.duration, tools::ZeroDuration::kRejected, milliseconds::max());
  if (!duration.error.empty()) return tools::usage_error(kTool, duration.error);
  const auto ttl = tools::parse_duration_flag("--ttl", texts.ttl, tools::ZeroDuration::kRejected);
  if (!ttl.error.empty()) return tools::usage_error(kTool, ttl.error);
  config.duration = duration.value;
  config.ttl = ttl.value;
  config.clients_given = app.count("--clients") > 0;
  if (app.count("--client-threads") == 0) {
    // One client I/O thread per two CPUs, 1..4: on a 2-CPU machine the
    // embedded server's thread and one client thread each get a CPU.
    config.client_threads = std::clamp(std::thread::hardware_concurrency() / 2, 1u, 4u);
  }
  if (config.mode == "table" && !config.clients_given) {
    config.clients = std::max(1u, std::thread::hardware_concurrency());
  }
  const auto auth_key = tools::load_auth_key_flag(texts.auth_key_file);
  if (!auth_key.error.empty()) return tools::usage_error(kTool, auth_key.error);
  config.auth_key = auth_key.key;
  if (app.count("--tenant") > 0) config.tenant = texts.tenant;
  if (config.encrypt && !config.tenant) {
    return tools::usage_error(kTool, "--encrypt needs --tenant");
  }
  if (!texts.cipher.empty()) {
    if (!config.tenant) return tools::usage_error(kTool, "--cipher needs --tenant");
    // IsMember() checked the word.
    config.cipher =
        lease::parse_envelope_cipher(texts.cipher).value_or(lease::EnvelopeCipher::kAuto);
    if (config.cipher == lease::EnvelopeCipher::kAes && !lease::aes_gcm_available()) {
      return tools::usage_error(
          kTool, "--cipher aes: this CPU has no AES-GCM (AES-NI and PCLMULQDQ); use portable");
    }
  }
  if (config.tenant && texts.auth) {
    return tools::usage_error(
        kTool, "--auth and --tenant exclude each other: --tenant makes its own key too");
  }
  if (config.tenant && !config.auth_key) {
    if (!config.server.empty()) {
      return tools::usage_error(kTool,
                                "--tenant with --server needs the tenant's key: --auth-key FILE");
    }
    config.auth_key = lease::generate_auth_key();
  }
  if (texts.auth && !config.auth_key) {
    if (!config.server.empty()) {
      return tools::usage_error(kTool, "--auth needs the embedded server; use --auth-key");
    }
    config.auth_key = lease::generate_auth_key();
  }
  if (config.mode == "table" && !config.server.empty()) {
    return tools::usage_error(kTool, "--server applies to --mode lease only");
  }
  if (config.discover && config.server.empty()) {
    return tools::usage_error(kTool, "--discover needs --server: the seeds of the cluster");
  }
  if (config.mode == "table" && config.tenant) {
    return tools::usage_error(kTool, "--tenant, --encrypt and --cipher apply to --mode lease only");
  }
  if (config.mode == "table" && (config.read_fraction > 0.0 || config.keys_per_op > 1)) {
    return tools::usage_error(kTool,
                              "--read-fraction and --keys-per-op apply to --mode lease only");
  }
  if (config.keys_per_op > 1 && config.batch > 1) {
    return tools::usage_error(
        kTool,
        "--keys-per-op and --batch exclude each other: an ACQUIRE_MANY already carries "
        "several keys");
  }
  if (config.keys_per_op > config.keys) {
    return tools::usage_error(kTool, "--keys-per-op " + std::to_string(config.keys_per_op) +
                                         " needs at least as many --keys");
  }
  return std::nullopt;
}

}  // namespace

std::string_view security_name(const Config& config) noexcept {
  if (config.tenant) return config.encrypt ? "encrypt" : "tenant";
  return config.auth_key ? "auth" : "keyless";
}

std::string_view cipher_name(const Config& config) noexcept {
  if (!config.tenant) return "";
  const std::optional<lease::EnvelopeMode> mode =
      lease::tenant_envelope_mode(config.encrypt, config.cipher);
  return mode && lease::envelope_uses_aes(*mode) ? "aes" : "portable";
}

std::optional<int> read_command_line(int argc, char** argv, Config& config) {
  CLI::App app{
      "shardlock-bench: hot-key lock workload. With no flags it starts an embedded LeaseServer on "
      "127.0.0.1:0 and runs Zipf 0.99 acquire+release pairs over 100k keys for 10 s."};
  tools::add_version_flag(app, kTool);
  app.footer(
      "Exit codes: 0 ok; 1 the run failed (embedded server, client set-up, drain); 2 usage; "
      "3 the --server does not answer; 4 errors dominated: no acquire was granted, or more than "
      "half of the answered requests were errors (not BUSY) - stderr names the first error, the "
      "JSON has ok:false and errors_by_kind.");
  FlagTexts texts;
  add_flags(app, config, texts);
  if (const auto status = tools::parse_command_line(app, argc, argv, kTool)) return *status;
  return finish_config(app, texts, config);
}

}  // namespace shardlock::bench
