// shardlockctl: the command-line client of the lease service.
//
//   shardlockctl [GLOBAL FLAGS] SUBCOMMAND [FLAGS] [GLOBAL FLAGS]
//     global: --server HOST:PORT[,HOST:PORT...] --timeout DUR --auth-key FILE
//             --discover, and the output switch -w json | --json
//     run     KEY... [-w DUR | -n] [-s | --permits P] [--value V] [-E N] [-q] [--ttl DUR]
//             [--on-lost term|kill|ignore] [--kill-after DUR] -- COMMAND ARGS...
//     elect   NAME [-w DUR | -n] [--value V] [-E N] [-q] [--ttl DUR] [--on-lost ...]
//             [--kill-after DUR] -- COMMAND ARGS...
//     acquire KEY... --ttl DUR [-w DUR] [-s | --permits P] [--value V] [--owner HEX] [-q]
//     renew   KEY --token T --owner HEX --ttl DUR
//     release KEY --token T --owner HEX
//     query   KEY          (each holder, and the waiters)
//     stats        (gauges: version, uptime, leases, keys, waiters; counters)
//     ping         (round trip, version, uptime, recovering or not)
//     top | hot    [--interval DUR] [--count N | --once] [--limit N]
//                  (a live view of the busiest keys, as redis-cli --hotkeys)
//     keygen
//     members --cluster etcd://HOST:PORT[,...] [--cluster-name NAME]
//     drain   ID --cluster ... [--cancel] [--force] [--wait DUR]
//
// The global flags go before or after the subcommand, and every
// subcommand's --help lists them. Durations: 500ms, 1.5s, 30 (seconds), 2m.
//
// run works like flock(1): it waits for the lease (as flock, etcdctl lock
// and consul lock do) unless -n, or up to -w DUR; a wait longer than the
// server's --max-wait is queued again until it is spent. A key it cannot
// take prints nothing on stdout (the command's stream): the reason goes to
// stderr and the exit status is -E's (69 by default, EX_UNAVAILABLE, so it
// is not the command's own 1), for a server in its lock-delay too, so that
// `run -n -E 0 -q` skips a turn quietly. A wait that lasts over a second
// says once on stderr what it waits for and how long at most (flock -v
// style) unless -q. A lease lost while the command runs (the message says
// why) gets it SIGTERM, then SIGKILL after --kill-after (5s), as timeout -k
// and consul lock do, so it cannot go on past another holder's grant.
//
// Several keys (up to 16, all owned by one node) are taken all or nothing
// with one ACQUIRE_MANY, exclusive or shared; --permits takes one key.
// --discover talks to a cluster (docs/cluster.md): the --server addresses
// are seeds that give the cluster's map, and each key goes to its owner.
//
// Output is for people by default, one line per result; -w json (--json,
// --write-out json) prints one JSON object per result instead, made with
// nlohmann-json, for scripts. A key that is not UTF-8 is shown with each
// byte outside valid UTF-8 (and each backslash) as \xNN; JSON adds its exact
// bytes as "key_hex". Errors go to stderr as "shardlockctl: KEY: reason";
// with JSON they are one object on stdout ({"key":..,"error":..}), except
// run's, which go to stderr. Exit codes, as with flock -n:
//   0  granted / renewed / released / answered
//   1  busy or timed out (acquire); not owner or expired (renew, release);
//      drain: an id that is not a member (without --force), or --wait ran out
//   2  usage error (also: several keys owned by different nodes; a bad
//      --cluster URL or --cluster-name)
//   3  server unreachable: no answer in --timeout, or a host name that does
//      not resolve (the message says which, and whether anything listens
//      there); members, drain: etcd unreachable
//   4  server recovering (lock-delay after a restart)
//   5  the server answered ERROR (a TTL above its limit names the limit),
//      incomplete stats, or a local failure (stdout could not be written)
//   6  replies failed authentication (the server's --auth-key is not ours)
//   run: the command's own exit status (128+N if killed by signal N;
//        126 not executable, 127 not found), except 5 when it cannot be
//        learned, -E's status (69) when the lease was not acquired (busy,
//        recovering, or -w ran out), and
//   75 the lease was lost while the command ran (EX_TEMPFAIL)
//
// This file is only main(): each command lives in tools/ctl/ (commands.h
// lists them), as etcdctl's do, and registers its subcommand, flags and
// callback; ctl/output.h prints for people and (nlohmann-json) for scripts,
// ctl/session.h starts the client.
#include <CLI/CLI.hpp>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/command_line.h"
#include "ctl/commands.h"
#include "ctl/session.h"

namespace {

using namespace shardlock::ctl;

// The value of a flag given on the command line, else of `env`.
void default_from_env(std::string& value, const char* env) {
  if (!value.empty()) return;
  if (const char* text = std::getenv(env); text != nullptr) value = text;
}

// Parses the command line. Like parse_command_line(), and: an unknown
// subcommand is named, and no arguments at all print the usage.
std::optional<int> parse(CLI::App& app, std::vector<char*>& args) {
  if (args.size() == 1) {
    std::cout << app.help();
    return kExitUsage;
  }
  try {
    app.parse(static_cast<int>(args.size()), args.data());
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    const std::vector<std::string> extra = app.remaining();
    if (app.get_subcommands().empty() && !extra.empty() && !extra.front().empty() &&
        extra.front().front() != '-') {
      std::string names;
      for (const CLI::App* sub : app.get_subcommands({})) {
        names += (names.empty() ? "" : ", ") + sub->get_name();
      }
      return shardlock::tools::usage_error(
          kTool, "unknown command '" + extra.front() + "' (commands: " + names + ")");
    }
    return shardlock::tools::usage_error(kTool, e.what());
  }
  return std::nullopt;
}

// run's keys and its command are both positional, so CLI11 would hand
// the command's words to the keys: everything after run's (or elect's)
// first "--" is the command, taken out of `args` here.
std::vector<std::string> take_command(std::vector<char*>& args) {
  std::vector<std::string> command;
  bool run_named = false;
  for (std::size_t i = 1; i < args.size(); ++i) {
    const std::string_view arg = args[i];
    if (arg == "run" || arg == "elect") run_named = true;
    if (run_named && arg == "--") {
      for (std::size_t j = i + 1; j < args.size(); ++j) command.emplace_back(args[j]);
      args.resize(i);
      break;
    }
  }
  return command;
}

int run(int argc, char** argv) {
  CLI::App app{
      "shardlockctl: take, renew, release and inspect shardlock leases; run a command under a "
      "lease, like flock(1).\nDurations: 500ms, 1.5s, 30 (seconds), 2m, 1m30s.",
      kTool};
  app.require_subcommand(1);
  shardlock::tools::add_version_flag(app, kTool);
  Session session;
  add_global_flags(app, session.globals, /*short_w=*/true);
  app.footer(
      "Output: for people by default; -w json (or --json) prints JSON for scripts, on every "
      "subcommand.\nExit codes: 0 ok; 1 busy/timeout/not owner/expired (drain: not a member, or "
      "--wait ran out); 2 usage (or keys of different nodes); 3 unreachable (no answer, or a name "
      "that does not resolve; members, drain: etcd); 4 recovering; 5 server error, incomplete "
      "stats or a local failure (e.g. stdout could not be written); 6 replies failed "
      "authentication. run: the command's status (5 if it cannot be learned), -E's (69) when "
      "the lease was not acquired, or 75 when a lease was lost.");
  // In the order --help lists them.
  for (const auto add : {add_acquire_command, add_renew_command, add_release_command,
                         add_query_command, add_keygen_command, add_stats_command, add_top_command,
                         add_ping_command, add_run_command, add_elect_command, add_leader_command,
                         add_observe_command, add_members_command, add_drain_command}) {
    add(app, session);
  }

  std::vector<char*> args(argv, argv + argc);
  session.command = take_command(args);
  if (const auto status = parse(app, args)) return *status;
  Globals& g = session.globals;
  default_from_env(g.servers, "SHARDLOCK_SERVER");
  default_from_env(g.auth_key_file, "SHARDLOCK_AUTH_KEY_FILE");
  default_from_env(g.tenant, "SHARDLOCK_TENANT");
  default_from_env(g.cipher, "SHARDLOCK_CIPHER");
  if (const char* encrypt = std::getenv("SHARDLOCK_ENCRYPT"); encrypt != nullptr) {
    g.encrypt = g.encrypt || std::string_view(encrypt) == "1";
  }
  session.out.json = g.output.json();
  session.timeout.text = g.timeout;
  return session.action ? session.action() : kExitUsage;
}

}  // namespace

int main(int argc, char** argv) {
  return shardlock::tools::run_main(kTool, kExitError, run, argc, argv);
}
