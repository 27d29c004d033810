#include "ctl/session.h"

#include <charconv>

#include <utility>

namespace shardlock::ctl {

using namespace lease;
using tools::usage_error;

namespace {

constexpr const char* kGlobalGroup = "Global flags (before or after the subcommand)";

// The usage error of the first key that is not 1..kMaxKeyLength bytes.
std::optional<int> check_key_lengths(const std::vector<std::string>& keys) {
  for (const std::string& k : keys) {
    if (k.size() < kMinKeyLength || k.size() > kMaxKeyLength) {
      return usage_error(kTool, "keys are 1.." + std::to_string(kMaxKeyLength) + " bytes");
    }
  }
  return std::nullopt;
}

// Blocks the signals run takes itself; before any client thread exists, so
// every thread inherits the mask.
void block_handled_signals() {
  const sigset_t handled = handled_signals();
  pthread_sigmask(SIG_BLOCK, &handled, nullptr);
  // SIGCHLD ignored (inherited across exec from a parent that ignores it)
  // would have the kernel reap the command, so its exit status could
  // never be read, and run reported 0 whatever the command did.
  struct sigaction default_action {};
  default_action.sa_handler = SIG_DFL;
  sigemptyset(&default_action.sa_mask);
  sigaction(SIGCHLD, &default_action, nullptr);
}

// The exit status of a client that did not start with `ec`.
int start_failure(const LeaseClientOptions& options, std::error_code ec) {
  if (ec == LeaseErrc::kBadAddress) {
    // A host name that does not resolve is no usage error: DNS may be down.
    for (const std::string& node : options.nodes) {
      Endpoint endpoint;
      if (parse_endpoint(node, endpoint) == LeaseErrc::kUnreachable) return kExitUnreachable;
    }
    return kExitUsage;
  }
  // --discover: no seed answered with the cluster's map.
  return ec == LeaseErrc::kUnreachable ? kExitUnreachable : kExitError;
}

}  // namespace

bool parse_arg(DurationArg& d, const char* flag, ZeroDuration zero) {
  if (d.text.empty()) return true;
  const auto parsed = tools::parse_duration_flag(flag, d.text, zero);
  if (!parsed.error.empty()) {
    usage_error(kTool, parsed.error);
    return false;
  }
  d.value = parsed.value;
  return true;
}

void add_global_flags(CLI::App& app, Globals& g, bool short_w) {
  app.add_option("--server", g.servers,
                 "HOST:PORT of the server(s), comma separated (env SHARDLOCK_SERVER; required "
                 "except for keygen, members and drain)")
      ->group(kGlobalGroup);
  app.add_option("--timeout", g.timeout,
                 "How long a request retransmits before 'unreachable' (members, drain: each etcd "
                 "call's deadline)")
      ->capture_default_str()
      ->group(kGlobalGroup);
  app.add_flag("--discover", g.discover,
               "The servers are seeds of a cluster (docs/cluster.md): ask them for the cluster's "
               "map and send each key to the node that owns it, following redirects. stats "
               "still asks the --server nodes")
      ->group(kGlobalGroup);
  app.add_option("--auth-key", g.auth_key_file,
                 "File with the key shared with the servers (see keygen; env "
                 "SHARDLOCK_AUTH_KEY_FILE); seals every request and accepts only sealed replies")
      ->group(kGlobalGroup);
  app.add_option("--tenant", g.tenant,
                 "The key id of the tenant whose key --auth-key holds (docs/security.md; env "
                 "SHARDLOCK_TENANT), for a server started with --tenants")
      ->group(kGlobalGroup);
  app.add_flag("--encrypt", g.encrypt,
               "Encrypt every datagram (the tenant's encrypt=yes; env SHARDLOCK_ENCRYPT=1); "
               "needs --tenant")
      ->group(kGlobalGroup);
  app.add_option("--cipher", g.cipher,
                 "With --tenant, the cipher suite (env SHARDLOCK_CIPHER): auto (the default: "
                 "AES-256-GCM where this CPU has AES-NI, else portable), portable (BLAKE2b and "
                 "XChaCha20-Poly1305: for a server without AES-NI) or aes")
      ->check(CLI::IsMember({"auto", "portable", "aes"}))
      ->group(kGlobalGroup);
  tools::add_output_flags(app, g.output, short_w, kGlobalGroup);
}

void on_parsed(CLI::App& sub, Session& session, bool short_w, std::function<int()> action) {
  add_global_flags(sub, session.globals, short_w);
  sub.callback([&session, action = std::move(action)] { session.action = action; });
}

std::optional<int> check_servers_and_timeout(Session& session) {
  if (session.globals.servers.empty()) {
    return usage_error(kTool, "--server (or SHARDLOCK_SERVER) is required");
  }
  if (!parse_arg(session.timeout, "--timeout", ZeroDuration::kRejected)) return kExitUsage;
  return std::nullopt;
}

StartedClient start_client_for_key(const Session& session, const std::string& key,
                                   const std::string& owner_hex) {
  ClientRequest request;
  request.keys = {key};
  request.owner_hex = owner_hex;
  return start_client(session, request);
}

sigset_t handled_signals() {
  sigset_t handled;
  sigemptyset(&handled);
  for (int s : {SIGCHLD, SIGTERM, SIGINT, SIGHUP}) sigaddset(&handled, s);
  return handled;
}

StartedClient start_client(const Session& session, const ClientRequest& request) {
  StartedClient started;
  const Globals& g = session.globals;
  LeaseClientOptions options;
  options.nodes = split_node_list(g.servers);
  options.discover_cluster = g.discover;
  options.request_timeout = session.timeout.value;
  // acquire --owner: the lease's owner (each acquire is otherwise a fresh
  // owner of its own); renew, release --owner: the raw calls' owner.
  if (!request.owner_hex.empty()) {
    const auto id = parse_client_id(request.owner_hex);
    if (!id) {
      started.status =
          usage_error(kTool, "--owner wants 32 hex digits, got '" + request.owner_hex + "'");
      return started;
    }
    options.client_id = *id;
    started.owner.owner = *id;
  }
  const auto auth = tools::load_auth_key_flag(g.auth_key_file);
  if (!auth.error.empty()) {
    started.status = usage_error(kTool, auth.error);
    return started;
  }
  options.auth_key = auth.key;
  if (!g.tenant.empty()) {
    std::uint32_t id = 0;
    const char* end = g.tenant.data() + g.tenant.size();
    const auto parsed = std::from_chars(g.tenant.data(), end, id);
    if (parsed.ec != std::errc{} || parsed.ptr != end) {
      started.status = usage_error(kTool, "--tenant wants a key id (0 to 4294967295), got '" +
                                              g.tenant + "'");
      return started;
    }
    if (!auth.key) {
      started.status = usage_error(kTool, "--tenant needs the tenant's key (--auth-key FILE)");
      return started;
    }
    options.tenant = id;
  }
  if (g.encrypt && !options.tenant) {
    started.status = usage_error(kTool, "--encrypt needs --tenant");
    return started;
  }
  options.encrypt = g.encrypt;
  if (!g.cipher.empty()) {
    const std::optional<lease::EnvelopeCipher> cipher = lease::parse_envelope_cipher(g.cipher);
    if (!cipher) {
      const std::string why = "--cipher (or SHARDLOCK_CIPHER) wants auto, portable or aes, not '";
      started.status = usage_error(kTool, why + g.cipher + "'");
      return started;
    }
    if (*cipher == lease::EnvelopeCipher::kAes && !options.tenant) {
      started.status = usage_error(kTool, "--cipher aes needs --tenant");
      return started;
    }
    if (*cipher == lease::EnvelopeCipher::kAes && !lease::aes_gcm_available()) {
      started.status = usage_error(kTool,
                                   "--cipher aes: this CPU has no AES-GCM (AES-NI and "
                                   "PCLMULQDQ); use --cipher portable");
      return started;
    }
    options.cipher = *cipher;
  }
  std::optional<int> refused = request.check ? request.check() : std::nullopt;
  if (!refused && !request.takes_command && !session.command.empty()) {
    refused = usage_error(kTool, "only run and elect take -- COMMAND");
  }
  if (!refused) refused = check_key_lengths(request.keys);
  if (refused) {
    started.status = *refused;
    return started;
  }
  if (request.takes_signals) block_handled_signals();
  started.nodes = options.nodes;
  started.have_key = options.auth_key.has_value();
  started.client = std::make_unique<LeaseClient>(options);
  if (const std::error_code ec = started.client->start()) {
    std::fprintf(stderr, "shardlockctl: %s\n", started.client->error_detail().c_str());
    started.status = start_failure(options, ec);
    started.client.reset();
  }
  return started;
}

}  // namespace shardlock::ctl
