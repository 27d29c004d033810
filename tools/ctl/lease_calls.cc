// shardlockctl renew KEY --token T --owner HEX --ttl DUR, release KEY --token T
// --owner HEX, and query KEY: the calls on one lease the caller names.
#include <memory>

#include "ctl/commands.h"
#include "ctl/diagnosis.h"

namespace shardlock::ctl {

using namespace lease;

namespace {

// The flags of renew, release and query.
struct LeaseCallFlags {
  std::string key;
  std::uint64_t token = 0;
  std::string owner_hex;
  DurationArg ttl;  // renew
};

// query's JSON: QUERY's summary fields as before (mode null when nobody
// holds the key), "listed" (false: the server predates QUERY_HOLDERS), and
// "holder_list", each holder oldest grant first (null when not listed).
Json holders_json(const std::string& key, const HoldersReply& r) {
  Json j;
  put_key(j, "key", key);
  j["held"] = r.held;
  j["mode"] = r.held ? Json(std::string(to_string(r.mode))) : Json(nullptr);
  j["holders"] = r.holder_count;
  j["permits"] = r.permits;
  j["token"] = r.token;
  j["ttl_left_ms"] = r.ttl_left.count();
  j["waiters"] = r.waiters;
  j["listed"] = r.listed;
  if (!r.listed) {
    j["holder_list"] = nullptr;
    return j;
  }
  j["holder_list"] = Json::array();
  for (const HolderInfo& h : r.holders) {
    Json item;
    item["owner"] = to_hex(h.owner);
    item["token"] = h.token;
    item["mode"] = std::string(to_string(r.mode));
    item["ttl_left_ms"] = h.ttl_left.count();
    item["pending"] = h.pending;
    put_key(item, "value", h.value);
    j["holder_list"].push_back(std::move(item));
  }
  return j;
}

// query for people: the summary line ("not held" when nobody holds the
// key), then one indented line per holder, oldest grant first.
std::string holders_text(const std::string& key, const HoldersReply& r) {
  std::string text = shown(key);
  if (!r.held) return text + " not held waiters=" + std::to_string(r.waiters) + "\n";
  const std::string mode(to_string(r.mode));
  text += " held mode=" + mode + " holders=" + std::to_string(r.holder_count) +
          (r.mode == LeaseMode::kPermit ? " permits=" + std::to_string(r.permits) : "") +
          " ttl_left=" + seconds_text(static_cast<std::uint64_t>(r.ttl_left.count())) +
          " token=" + std::to_string(r.token) + " waiters=" + std::to_string(r.waiters) + "\n";
  for (const HolderInfo& h : r.holders) {
    text += "  owner=" + to_hex(h.owner) + " token=" + std::to_string(h.token) + " mode=" + mode +
            " ttl_left=" + seconds_text(static_cast<std::uint64_t>(h.ttl_left.count())) +
            (h.pending ? " pending" : "") + (h.value.empty() ? "" : " value=" + shown(h.value)) +
            "\n";
  }
  return text;
}

// renew (with `renew`) or release of the lease `flags` name.
int renew_or_release(Session& session, LeaseCallFlags& flags, bool renew) {
  if (const auto status = check_servers_and_timeout(session)) return *status;
  if (!parse_arg(flags.ttl, "--ttl", ZeroDuration::kRejected)) {
    return kExitUsage;
  }
  const std::vector<std::string> one_key = {flags.key};
  StartedClient started = start_client_for_key(session, flags.key, flags.owner_hex);
  if (!started.client) return started.status;
  LeaseClient& client = *started.client;
  const std::string& key = flags.key;
  const milliseconds ttl = flags.ttl.value;
  const CallResult r =
      renew ? client.renew(key, flags.token, ttl) : client.release(key, flags.token);
  if (r.error) {
    return report(session.out, one_key,
                  diagnosed(client, session, one_key, r.error, r.wire_error, ttl), ttl);
  }
  Json j;
  put_key(j, "key", key);
  j["token"] = flags.token;
  std::string text = shown(key) + " token=" + std::to_string(flags.token);
  if (renew) {
    j["ttl_ms"] = r.ttl_ms;
    j["renewed"] = true;
    text += " renewed ttl=" + seconds_text(r.ttl_ms);
  } else {
    j["released"] = true;
    text += " released";
  }
  print_result(session.out, j, text + "\n");
  return kExitOk;
}

int query(Session& session, const LeaseCallFlags& flags) {
  if (const auto status = check_servers_and_timeout(session)) return *status;
  const std::vector<std::string> one_key = {flags.key};
  StartedClient started = start_client_for_key(session, flags.key);
  if (!started.client) return started.status;
  LeaseClient& client = *started.client;
  const std::string& key = flags.key;
  const HoldersReply r = client.holders(key);
  if (r.error) {
    return report(session.out, one_key,
                  diagnosed(client, session, one_key, r.error, r.wire_error, {}), {});
  }
  if (!r.listed) {
    std::fprintf(stderr,
                 "shardlockctl: %s: the server does not list holders (it predates "
                 "QUERY_HOLDERS): its summary only\n",
                 shown(key).c_str());
  }
  if (session.out.json) {
    print_json(holders_json(key, r));
  } else {
    std::printf("%s", holders_text(key, r).c_str());
  }
  return kExitOk;
}

// The flags renew and release share.
void add_lease_flags(CLI::App& sub, LeaseCallFlags& flags) {
  sub.add_option("key", flags.key, "The key")->required();
  sub.add_option("--token", flags.token, "The lease's token")->required();
  sub.add_option("--owner", flags.owner_hex, "The owner printed by acquire")->required();
}

}  // namespace

void add_renew_command(CLI::App& app, Session& session) {
  auto flags = std::make_shared<LeaseCallFlags>();
  CLI::App* sub = app.add_subcommand("renew", "Extend a lease you hold");
  add_lease_flags(*sub, *flags);
  sub->add_option("--ttl", flags->ttl.text, "New duration, e.g. 30s")->required();
  on_parsed(*sub, session, /*short_w=*/true,
            [&session, flags] { return renew_or_release(session, *flags, /*renew=*/true); });
}

void add_release_command(CLI::App& app, Session& session) {
  auto flags = std::make_shared<LeaseCallFlags>();
  CLI::App* sub = app.add_subcommand("release", "Give a lease back");
  add_lease_flags(*sub, *flags);
  on_parsed(*sub, session, /*short_w=*/true,
            [&session, flags] { return renew_or_release(session, *flags, /*renew=*/false); });
}

void add_query_command(CLI::App& app, Session& session) {
  auto flags = std::make_shared<LeaseCallFlags>();
  CLI::App* sub = app.add_subcommand(
      "query",
      "Who holds the key: each holder (owner id, token, mode, time left), oldest grant first, "
      "and how many wait; with the summary (held, mode: exclusive, shared or permit, holders, "
      "the permit limit, the newest token, the longest ttl left)");
  sub->add_option("key", flags->key, "The key")->required();
  on_parsed(*sub, session, /*short_w=*/true, [&session, flags] { return query(session, *flags); });
}

}  // namespace shardlock::ctl
