// shardlockctl acquire KEY... --ttl DUR [-w DUR] [-s | --permits P] [--value V]
//                      [--owner HEX] [-q]: take a lease and leave it held.
#include <cinttypes>
#include <memory>
#include <thread>

#include "ctl/acquiring.h"
#include "ctl/commands.h"

namespace shardlock::ctl {

using namespace lease;

namespace {

struct AcquireFlags {
  KeyFlags key;
  std::string owner_hex;
};

// The leases of `a` as acquire prints them: one line per key, or one JSON
// object for them all.
void print_acquired(const Output& out, const std::vector<std::string>& keys, const Acquired& a) {
  const Lease& first = a.leases.front();
  if (!out.json) {
    std::string common = " ttl=" + seconds_text(first.ttl().count()) +
                         " owner=" + to_hex(first.owner()) +
                         " mode=" + std::string(to_string(first.mode()));
    if (first.mode() == LeaseMode::kPermit) common += " permits=" + std::to_string(first.permits());
    for (const Lease& lease : a.leases) {
      std::printf("%s token=%" PRIu64 "%s\n", shown(lease.key()).c_str(), lease.token(),
                  common.c_str());
    }
    return;
  }
  Json j;
  if (keys.size() == 1) {
    put_key(j, "key", keys[0]);
    j["token"] = first.token();
  } else {
    j["leases"] = Json::array();
    for (const Lease& lease : a.leases) {
      Json item;
      put_key(item, "key", lease.key());
      item["token"] = lease.token();
      j["leases"].push_back(std::move(item));
    }
  }
  j["ttl_ms"] = first.ttl().count();
  j["owner"] = to_hex(first.owner());
  j["mode"] = std::string(to_string(first.mode()));
  if (first.mode() == LeaseMode::kPermit) j["permits"] = first.permits();
  print_json(j);
}

int acquire(Session& session, AcquireFlags& flags) {
  KeyFlags& key = flags.key;
  if (const auto status = resolve_short_w(key, session)) return *status;
  session.out.quiet = key.quiet;
  if (const auto status = check_servers_and_timeout(session)) return *status;
  if (!parse_arg(key.ttl, "--ttl", ZeroDuration::kRejected) ||
      !parse_arg(key.wait, "--wait", ZeroDuration::kAllowed)) {
    return kExitUsage;
  }
  ClientRequest request;
  request.keys = key.keys;
  request.owner_hex = flags.owner_hex;
  request.check = [&] { return check_kind(key); };
  StartedClient started = start_client(session, request);
  if (!started.client) return started.status;
  LeaseClient& client = *started.client;
  const milliseconds ttl = key.ttl.value;
  const milliseconds wait = key.wait.value;
  Acquired a = !key.quiet && wait > kNoticeAfter
                   ? acquire_telling(client, key.keys, key.kind, ttl, wait,
                                     std::move(started.owner), key.quiet, /*election=*/false,
                                     [] { std::this_thread::sleep_for(milliseconds(20)); })
                   : acquire_keys(client, key.keys, key.kind, ttl, wait, std::move(started.owner));
  if (a.error) {
    return report(session.out, key.keys, acquire_failure(client, session, key.keys, a, ttl), ttl,
                  wait);
  }
  print_acquired(session.out, key.keys, a);
  // The leases outlive this process: let go of the handles, not the leases.
  for (Lease& lease : a.leases) lease.detach();
  return kExitOk;
}

}  // namespace

void add_acquire_command(CLI::App& app, Session& session) {
  auto flags = std::make_shared<AcquireFlags>();
  KeyFlags& key = flags->key;
  CLI::App* sub = app.add_subcommand(
      "acquire",
      "Take a lease and leave it held; prints KEY token=T ttl=.. owner=.. mode=.. per key (JSON: "
      "{key, token, ttl_ms, owner, mode}, or for several keys {leases: [{key, token}...], "
      "ttl_ms, owner, mode}). Several keys (up to 16, of one node) are taken all or nothing");
  sub->add_option("key", key.keys, "The key(s)")->required();
  sub->add_option("--ttl", key.ttl.text, "Lease duration, e.g. 30s")->required();
  sub->add_option("--wait", key.wait.text,
                  "Wait up to this long for the holder(s) to let go (default 0: answer busy "
                  "at once)");
  add_kind_flags(*sub, key);
  sub->add_option("--owner", flags->owner_hex,
                  "Act as this owner (32 hex digits): the lease is held by exactly this "
                  "owner, as renew and release --owner name it; default: a fresh owner of its own");
  sub->add_flag("-q,--quiet", key.quiet,
                "No line on stderr while waiting (after 1s a --wait prints what holds the key "
                "and how long it waits at most), nor when busy, recovering or the wait ran "
                "out: the exit status says it (JSON still prints its result)");
  on_parsed(*sub, session, /*short_w=*/false,
            [&session, flags] { return acquire(session, *flags); });
}

}  // namespace shardlock::ctl
