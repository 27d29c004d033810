// shardlockctl leader NAME and observe NAME [--count N]: who leads an
// election (elect, in run.cc, campaigns in one), once or as it changes.
#include "shardlock/lease/client/election.h"

#include <memory>
#include <optional>

#include "ctl/commands.h"
#include "ctl/diagnosis.h"

namespace shardlock::ctl {

using namespace lease;

namespace {

struct ElectionFlags {
  std::string name;
  std::uint64_t count = 0;  // observe --count
};

// A name's leader (or none) as a line for people and as JSON.
std::string leader_text(const std::string& name, const std::optional<LeaderInfo>& leader) {
  if (!leader) return shown(name) + " no leader\n";
  return shown(name) + " leader term=" + std::to_string(leader->term) +
         " owner=" + to_hex(leader->owner) + " ttl=" + seconds_text(leader->ttl_left.count()) +
         " value=" + shown(leader->value) + "\n";
}

Json leader_json(const std::string& name, const std::optional<LeaderInfo>& leader) {
  Json j;
  put_key(j, "name", name);
  if (!leader) {
    j["leader"] = nullptr;
    return j;
  }
  Json l;
  l["term"] = leader->term;
  l["owner"] = to_hex(leader->owner);
  l["ttl_ms"] = leader->ttl_left.count();
  put_key(l, "value", leader->value);
  j["leader"] = std::move(l);
  return j;
}

void print_leader(const Output& out, const std::string& name,
                  const std::optional<LeaderInfo>& leader) {
  if (out.json) {
    print_json(leader_json(name, leader));
  } else {
    std::printf("%s", leader_text(name, leader).c_str());
  }
  std::fflush(stdout);
}

// observe: one line per change of leader, the first for the leader now,
// until --count changes were shown (0: until interrupted).
int run_observe(LeaseClient& client, const Session& session, const std::string& name,
                std::uint64_t count) {
  const Output& out = session.out;
  LeaderObserver observer(client, name);
  std::uint64_t shown_changes = 0;
  std::error_code last_error;
  while (count == 0 || shown_changes < count) {
    std::error_code error;
    std::optional<LeaderChange> change = observer.next(std::chrono::seconds(1), &error);
    if (error) {
      // Said once per outage, on stderr; the watch keeps trying.
      if (error != last_error) {
        const std::vector<std::string> keys = {name};
        (void)report(Output{.json = false, .errors_to_stderr = true}, keys,
                     diagnosed(client, session, keys, error, WireError::kInternal, {}), {});
      }
      last_error = error;
      continue;
    }
    last_error.clear();
    if (!change) continue;
    print_leader(out, name, change->leader);
    ++shown_changes;
  }
  return kExitOk;
}

int leader(Session& session, const ElectionFlags& flags) {
  if (const auto status = check_servers_and_timeout(session)) return *status;
  const std::vector<std::string> one_key = {flags.name};
  StartedClient started = start_client_for_key(session, flags.name);
  if (!started.client) return started.status;
  LeaseClient& client = *started.client;
  const HoldersReply r = client.holders(flags.name);
  if (r.error) {
    return report(session.out, one_key,
                  diagnosed(client, session, one_key, r.error, r.wire_error, {}), {});
  }
  print_leader(session.out, flags.name, leader_of(r.mode, r.holders));
  return kExitOk;
}

int observe(Session& session, const ElectionFlags& flags) {
  if (const auto status = check_servers_and_timeout(session)) return *status;
  StartedClient started = start_client_for_key(session, flags.name);
  if (!started.client) return started.status;
  return run_observe(*started.client, session, flags.name, flags.count);
}

}  // namespace

void add_leader_command(CLI::App& app, Session& session) {
  auto flags = std::make_shared<ElectionFlags>();
  CLI::App* sub = app.add_subcommand(
      "leader",
      "The leader of election NAME: its term, owner, time left and value; or 'no leader' "
      "(JSON: {name, leader: {term, owner, ttl_ms, value} or null})");
  sub->add_option("name", flags->name, "The election's name")->required();
  on_parsed(*sub, session, /*short_w=*/true, [&session, flags] { return leader(session, *flags); });
}

void add_observe_command(CLI::App& app, Session& session) {
  auto flags = std::make_shared<ElectionFlags>();
  CLI::App* sub = app.add_subcommand(
      "observe",
      "Follow election NAME: one line per change of leader (as leader prints it), the first for "
      "the leader now, in term order, without polling (a watch). Ctrl-C ends it");
  sub->add_option("name", flags->name, "The election's name")->required();
  sub->add_option("--count", flags->count, "Stop after this many lines (0: never)")
      ->capture_default_str();
  on_parsed(*sub, session, /*short_w=*/true,
            [&session, flags] { return observe(session, *flags); });
}

}  // namespace shardlock::ctl
