#include "ctl/diagnosis.h"

#include <arpa/inet.h>
#include <netinet/in.h>

namespace shardlock::ctl {

using namespace lease;

namespace {

// How long an unanswered node is probed for a refusal (error messages).
constexpr milliseconds kProbeWait{300};

bool is_loopback(const Endpoint& e) {
  if (e.address.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&e.address);
    return (ntohl(a->sin_addr.s_addr) >> 24) == 127;
  }
  if (e.address.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&e.address);
    return IN6_IS_ADDR_LOOPBACK(&a->sin6_addr);
  }
  return false;
}

// The server's maximum TTL, learned by bisection with RENEWs of `key` under
// token 0 (which no lease has): a TTL above the limit is refused before the
// token is looked at, one within it is answered not-owner or expired. After
// an ACQUIRE was refused kTtlOutOfRange for `refused`; nullopt when the
// server stops answering like that.
std::optional<std::uint32_t> learn_max_ttl(LeaseClient& client, std::string_view key,
                                           milliseconds refused) {
  std::uint64_t low = 0;  // the highest TTL known to be accepted (0: none yet)
  auto high = static_cast<std::uint64_t>(refused.count());  // refused
  while (high - low > 1) {
    const std::uint64_t mid = low + (high - low) / 2;
    const CallResult r = client.renew(key, 0, milliseconds(mid));
    if (r.error == LeaseErrc::kServerError && r.wire_error == WireError::kTtlOutOfRange) {
      high = mid;
    } else if (r.error == LeaseErrc::kNotOwner || r.error == LeaseErrc::kExpired) {
      low = mid;
    } else {
      return std::nullopt;
    }
  }
  if (low == 0) return std::nullopt;
  return static_cast<std::uint32_t>(low);
}

}  // namespace

void diagnose_silence(LeaseClient& client, const std::string& node, milliseconds timeout,
                      bool have_key, Failure& f) {
  const TransportCounters seen = client.transport_counters();
  if (seen.auth_mismatches > 0) {
    f.auth_failed = true;
    f.detail = std::to_string(seen.auth_mismatches) + " repl" +
               (seen.auth_mismatches == 1 ? "y" : "ies") + " from " + node +
               " failed authentication: " +
               (have_key ? "the server sends them unsealed (it has no --auth-key)"
                         : "the server seals them (it has an --auth-key; give this client the "
                           "same with --auth-key FILE)");
    return;
  }
  Endpoint endpoint;
  const PortProbe probe =
      parse_endpoint(node, endpoint) ? PortProbe::kUnknown : probe_port(endpoint, kProbeWait);
  const std::string waited = "no answer from " + node + " within " + seconds_text(timeout.count());
  switch (probe) {
    case PortProbe::kRefused:
      f.detail = waited +
                 ": nothing listens there (the host refused the port); is shardlockd "
                 "running, on that address?";
      return;
    case PortProbe::kSilent:
      // On this host nothing is in between: something holds the port.
      f.detail = waited +
                 (is_loopback(endpoint) ? ", yet something holds the port: "
                                        : ", and no refusal either: the host is down or a "
                                          "firewall drops UDP, or ") +
                 "a shardlockd there drops every request not sealed with its key, without "
                 "an answer: " +
                 (have_key ? "check that --auth-key names the server's key"
                           : "this client sends none (--auth-key FILE, or "
                             "SHARDLOCK_AUTH_KEY_FILE)") +
                 "; or a cluster node with --replicas holds its answer until its backups "
                 "have the change, and one of them does not acknowledge";
      return;
    case PortProbe::kAnswered:
    case PortProbe::kUnknown:
      break;
  }
  f.detail = waited;
}

Failure diagnosed(LeaseClient& client, const Session& session, const std::vector<std::string>& keys,
                  std::error_code error, WireError wire, milliseconds ttl) {
  const Globals& g = session.globals;
  Failure f;
  f.error = error;
  f.wire_error = wire;
  if (error == LeaseErrc::kUnreachable) {
    const std::string node = keys.empty() ? std::string() : client.address_for(keys.front());
    diagnose_silence(client, node.empty() ? g.servers : node, session.timeout.value,
                     !g.auth_key_file.empty(), f);
  }
  if (error == LeaseErrc::kServerError && wire == WireError::kTtlOutOfRange && !keys.empty() &&
      ttl.count() > 0) {
    f.max_ttl_ms = learn_max_ttl(client, keys.front(), ttl);
  }
  return f;
}

}  // namespace shardlock::ctl
