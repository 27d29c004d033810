// shardlockctl run KEY... -- COMMAND and elect NAME -- COMMAND: a command
// run under a lease, like flock(1), or while leader of an election.
//
// run waits for the lease (as flock, etcdctl lock and consul lock do)
// unless -n, or up to -w DUR, then runs the command with the lease in its
// environment, renews the lease while it runs, forwards SIGTERM, SIGINT
// and SIGHUP to it, and releases the lease when it ends. A lease lost
// meanwhile gets the command --on-lost's signal (SIGTERM, then SIGKILL
// after --kill-after, as timeout -k does) and run exits 75.
#include <signal.h>  // POSIX sigtimedwait, sigset_t: not in <csignal>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string_view>

#include "ctl/acquiring.h"
#include "ctl/commands.h"

extern char** environ;

namespace shardlock::ctl {

using namespace lease;
using tools::usage_error;

namespace {

// What run was asked to do.
struct RunArgs {
  std::vector<std::string> keys;
  KindArg kind;
  milliseconds ttl;
  milliseconds wait;  // kForever: until granted
  int conflict_status = kExitConflictDefault;
  std::string on_lost = "term";
  // --on-lost term: SIGKILL this long after the SIGTERM if the command is
  // still running (as timeout -k, consul lock); 0: never.
  milliseconds kill_after{0};
  std::vector<std::string> command;
  bool election = false;  // elect: the lease is leadership, its token the term
};

// The flags of run and elect.
struct RunFlags {
  KeyFlags key;
  bool nonblock = false;
  int conflict_status = kExitConflictDefault;
  std::string on_lost = "term";
  DurationArg kill_after{"5s"};
};

// The first loss of a lease, and when it was seen: written on the
// watchdog thread, read by the loop that waits for the command.
struct LossWatch {
  std::mutex mutex;
  std::optional<LeaseLost> event;
  LeaseClock::time_point at;
  std::atomic<bool> lost{false};

  void record(const LeaseLost& lost_event) {
    {
      std::lock_guard lock(mutex);
      if (!event) {
        event = lost_event;
        at = LeaseClock::now();
      }
    }
    // Relaxed is enough: the loss rides under `mutex`, not on the flag.
    lost.store(true, std::memory_order_relaxed);
  }
  [[nodiscard]] bool happened() const { return lost.load(std::memory_order_relaxed); }
};

// One variable of the command's environment. Every SHARDLOCK_* variable run
// sets is named here once: the inherited one is dropped and this one set.
struct ChildVariable {
  std::string name;
  std::optional<std::string> value;  // nullopt: not set
  bool overrides = true;             // the inherited variable is dropped, set or not
};

// The SHARDLOCK_* variables the command sees: its lease (several keys and
// their tokens comma separated, in the order given), who holds it, where.
std::vector<ChildVariable> lease_variables(const Session& session, const RunArgs& args,
                                           const std::vector<std::string>& tokens,
                                           const Lease& first) {
  const std::string& auth_key_file = session.globals.auth_key_file;
  return {
      {"SHARDLOCK_KEY", joined(args.keys, ',')},
      {"SHARDLOCK_TOKEN", joined(tokens, ',')},
      {"SHARDLOCK_MODE", std::string(to_string(args.kind.mode()))},
      {"SHARDLOCK_OWNER", to_hex(first.owner())},
      {"SHARDLOCK_SERVER", session.globals.servers},
      // elect: the term, by the name etcd's and Consul's recipes use for it.
      {"SHARDLOCK_TERM", args.election ? std::optional(tokens.front()) : std::nullopt},
      // So the command's own shardlockctl calls reach an --auth-key server
      // too; without one, an inherited SHARDLOCK_AUTH_KEY_FILE stays.
      {"SHARDLOCK_AUTH_KEY_FILE",
       auth_key_file.empty() ? std::nullopt : std::optional(auth_key_file), !auth_key_file.empty()},
      {"SHARDLOCK_TENANT",
       session.globals.tenant.empty() ? std::nullopt : std::optional(session.globals.tenant),
       !session.globals.tenant.empty()},
      {"SHARDLOCK_ENCRYPT", session.globals.encrypt ? std::optional<std::string>("1") : std::nullopt,
       session.globals.encrypt},
      {"SHARDLOCK_CIPHER",
       session.globals.cipher.empty() ? std::nullopt : std::optional(session.globals.cipher),
       !session.globals.cipher.empty()},
  };
}

// `inherited` (NAME=VALUE strings, null-terminated) with `variables` in
// place of the ones they override.
std::vector<std::string> child_environment(const std::vector<ChildVariable>& variables,
                                           char** inherited) {
  std::vector<std::string> env;
  for (char** e = inherited; *e != nullptr; ++e) {
    const std::string_view entry = *e;
    const bool overridden =
        std::any_of(variables.begin(), variables.end(), [&](const ChildVariable& v) {
          return v.overrides && entry.size() > v.name.size() && entry.starts_with(v.name) &&
                 entry[v.name.size()] == '=';
        });
    if (!overridden) env.emplace_back(entry);
  }
  for (const ChildVariable& v : variables) {
    if (v.value) env.push_back(v.name + "=" + *v.value);
  }
  return env;
}

// Starts `command` with `env`, an empty signal mask and `handled` at their
// default dispositions. Returns the child's pid, or -1 with `error` set.
pid_t spawn_command(const std::vector<std::string>& command, std::vector<std::string>& env,
                    const sigset_t& handled, int& error) {
  std::vector<char*> envp;
  envp.reserve(env.size() + 1);
  for (std::string& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::vector<char*> argv;
  argv.reserve(command.size() + 1);
  for (const std::string& a : command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t empty;
  sigemptyset(&empty);
  posix_spawnattr_setsigmask(&attr, &empty);
  posix_spawnattr_setsigdefault(&attr, &handled);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  pid_t child = -1;
  error = ::posix_spawnp(&child, argv[0], nullptr, &attr, argv.data(), envp.data());
  posix_spawnattr_destroy(&attr);
  return error == 0 ? child : -1;
}

// Why a lease was lost, for "lease on 'KEY' lost: ...". `unconfirmed`: how
// long before the loss the last confirmed grant or renewal was sent.
std::string loss_text(const LeaseLost& lost, milliseconds unconfirmed, const std::string& node) {
  const std::error_code& reason = lost.reason;
  if (reason == LeaseErrc::kExpired && !lost.refused_by_server) {
    return "expired: no renewal confirmed for " +
           tenths_text(static_cast<std::uint64_t>(std::max<std::int64_t>(unconfirmed.count(), 0))) +
           " (its ttl): the server " + node + " did not answer in time";
  }
  if (reason == LeaseErrc::kNotOwner) {
    return "the server " + node +
           " refused its renewal: not owner (the lease was released or taken over; another owner "
           "may hold it now)";
  }
  if (reason == LeaseErrc::kExpired) {
    return "the server " + node +
           " refused its renewal: expired (it no longer holds this lease: it ran out there, or "
           "the key moved to another node)";
  }
  if (reason == LeaseErrc::kServerError) {
    return "the server " + node + " answered its renewal with ERROR";
  }
  return reason.message();
}

// Says which lease was lost and why, and signals the command as --on-lost
// says. Returns when a SIGKILL is due (--kill-after), or time_point::max().
std::chrono::steady_clock::time_point act_on_loss(LeaseClient& client, const RunArgs& args,
                                                  const std::vector<Lease>& leases, LossWatch& loss,
                                                  pid_t child) {
  LeaseLost event;
  LeaseClock::time_point lost_at;
  {
    std::lock_guard lock(loss.mutex);
    event = *loss.event;
    lost_at = loss.at;
  }
  milliseconds unconfirmed{0};
  for (const Lease& lease : leases) {
    if (lease.key() == event.key && lease.token() == event.token) {
      unconfirmed =
          std::chrono::duration_cast<milliseconds>(lost_at - lease.expiry()) + lease.ttl();
    }
  }
  const std::string& on_lost = args.on_lost;
  const std::string action =
      on_lost == "ignore" ? std::string("not signalling the command (--on-lost ignore)")
      : on_lost == "kill" ? std::string("sending SIGKILL to the command")
      : args.kill_after.count() > 0
          ? "sending SIGTERM to the command, SIGKILL if it is still running in " +
                seconds_text(static_cast<std::uint64_t>(args.kill_after.count())) +
                " (--kill-after)"
          : std::string("sending SIGTERM to the command");
  std::fprintf(stderr, "shardlockctl: lease on '%s' lost: %s; %s\n", shown(event.key).c_str(),
               loss_text(event, unconfirmed, client.address_for(event.key)).c_str(),
               action.c_str());
  std::fflush(stderr);
  auto kill_at = std::chrono::steady_clock::time_point::max();
  if (on_lost == "term") {
    ::kill(child, SIGTERM);
    if (args.kill_after.count() > 0) kill_at = std::chrono::steady_clock::now() + args.kill_after;
  }
  if (on_lost == "kill") ::kill(child, SIGKILL);
  return kill_at;
}

// How the command ended: its wait status, unless it could not be learned.
struct CommandEnd {
  int status = 0;
  bool known = true;
};

// Waits for `child` to end, forwarding the stop signals to it and acting on
// a lost lease.
CommandEnd supervise(LeaseClient& client, const RunArgs& args, const std::vector<Lease>& leases,
                     LossWatch& loss, pid_t child, const sigset_t& handled) {
  bool signalled_for_loss = false;
  // --kill-after: when the command, sent SIGTERM for a lost lease, gets
  // SIGKILL if it is still running; time_point::max(): none (a sentinel,
  // not an optional, which GCC 12 at -O1 calls maybe-uninitialized).
  constexpr auto kNoKill = std::chrono::steady_clock::time_point::max();
  std::chrono::steady_clock::time_point kill_at = kNoKill;
  CommandEnd end;
  for (;;) {
    const pid_t done = ::waitpid(child, &end.status, WNOHANG);
    if (done == child) break;
    if (done < 0 && errno != EINTR) {
      // Not a 0 by default: the command's fate is unknown.
      std::fprintf(stderr, "shardlockctl: cannot learn how the command ended: waitpid: %s\n",
                   std::strerror(errno));
      end.known = false;
      break;
    }
    if (loss.happened() && !signalled_for_loss) {
      signalled_for_loss = true;
      kill_at = act_on_loss(client, args, leases, loss, child);
    }
    if (kill_at != kNoKill && std::chrono::steady_clock::now() >= kill_at) {
      kill_at = kNoKill;
      std::fprintf(stderr,
                   "shardlockctl: the command is still running %s after SIGTERM: sending "
                   "SIGKILL\n",
                   seconds_text(static_cast<std::uint64_t>(args.kill_after.count())).c_str());
      std::fflush(stderr);
      ::kill(child, SIGKILL);
    }
    // Wake for a child exit or a signal to forward; the 20 ms bound is
    // how late a lost lease may be noticed.
    const timespec tick{0, 20'000'000};
    siginfo_t info{};
    const int sig = ::sigtimedwait(&handled, &info, &tick);
    if (sig == SIGTERM || sig == SIGINT || sig == SIGHUP) ::kill(child, sig);
  }
  return end;
}

// run's exit status once the command ended as `end`, the leases released
// (unless one was lost).
int finish(std::vector<Lease>& leases, bool was_lost, const CommandEnd& end) {
  if (was_lost) {
    // The other keys' leases (each is lost on its own) get one RELEASE each,
    // not waited for: their server may be the one that stopped answering.
    leases.clear();
  }
  for (Lease& lease : leases) {
    const std::error_code released = lease.release();
    if (released) {
      std::fprintf(stderr, "shardlockctl: release of '%s' failed: %s\n", shown(lease.key()).c_str(),
                   released.message().c_str());
    }
  }
  if (was_lost) return kExitLeaseLost;
  if (!end.known) return kExitError;
  if (WIFEXITED(end.status)) return WEXITSTATUS(end.status);
  if (WIFSIGNALED(end.status)) return 128 + WTERMSIG(end.status);
  return kExitError;
}

int run_command(LeaseClient& client, const Session& session, const RunArgs& args) {
  const std::vector<std::string>& keys = args.keys;
  // Signals ctl handles itself: they are blocked in every thread (the client
  // threads inherit the mask, so they must be blocked before the client
  // starts; start_client() does that) and taken synchronously with
  // sigtimedwait.
  const sigset_t handled = handled_signals();
  LossWatch loss;
  LeaseOptions options;
  options.watchdog = true;
  options.on_lost = [&loss](const LeaseLost& event) { loss.record(event); };
  // The wait may be long (by default, until granted): it runs on its own
  // thread so that a signal can end it here. The queued ACQUIRE cannot be
  // taken back: should the server grant it after we left, the lease stands
  // until its TTL runs out, as a crashed holder's would.
  const auto take_signals = [&] {
    const timespec tick{0, 20'000'000};
    siginfo_t info{};
    const int sig = ::sigtimedwait(&handled, &info, &tick);
    if (sig == SIGTERM || sig == SIGINT || sig == SIGHUP) {
      std::fprintf(stderr, "shardlockctl: %s while waiting for %s; not acquired\n", strsignal(sig),
                   shown_keys(keys).c_str());
      std::fflush(stderr);
      std::_Exit(128 + sig);  // the acquirer is blocked in the client: no unwinding
    }
  };
  Acquired acquired =
      acquire_telling(client, keys, args.kind, args.ttl, args.wait, std::move(options),
                      session.out.quiet, args.election, take_signals);
  if (acquired.error) {
    const Failure f = acquire_failure(client, session, keys, acquired, args.ttl);
    const int status = report(session.out, keys, f, args.ttl, args.wait);
    return is_conflict(f.error) ? args.conflict_status : status;
  }
  std::vector<Lease>& leases = acquired.leases;
  std::vector<std::string> tokens;
  tokens.reserve(leases.size());
  for (const Lease& lease : leases) tokens.push_back(std::to_string(lease.token()));
  std::vector<std::string> env =
      child_environment(lease_variables(session, args, tokens, leases.front()), environ);
  int spawn_error = 0;
  const pid_t child = spawn_command(args.command, env, handled, spawn_error);
  if (child < 0) {
    std::fprintf(stderr, "shardlockctl: cannot run '%s': %s\n", args.command.front().c_str(),
                 std::strerror(spawn_error));
    for (Lease& lease : leases) (void)lease.release();
    return spawn_error == ENOENT ? 127 : 126;
  }
  const CommandEnd end = supervise(client, args, leases, loss, child, handled);
  return finish(leases, loss.happened(), end);
}

// run or elect (`election`) with `flags`, after the command line is parsed.
int run_or_elect(Session& session, RunFlags& flags, bool election) {
  KeyFlags& key = flags.key;
  if (const auto status = resolve_short_w(key, session)) return *status;
  session.out.errors_to_stderr = true;
  session.out.quiet = key.quiet;
  if (const auto status = check_servers_and_timeout(session)) return *status;
  if (key.ttl.text.empty()) key.ttl.text = election ? "10s" : "30s";
  if (!parse_arg(key.ttl, "--ttl", ZeroDuration::kRejected) ||
      !parse_arg(key.wait, "--wait", ZeroDuration::kAllowed) ||
      !parse_arg(flags.kill_after, "--kill-after", ZeroDuration::kAllowed)) {
    return kExitUsage;
  }
  if (flags.nonblock && !key.wait.text.empty()) {
    return usage_error(kTool, "-n (do not wait) and -w/--wait exclude each other");
  }
  // run waits until granted unless told otherwise; acquire answers at once.
  if (!flags.nonblock && key.wait.text.empty()) key.wait.value = kForever;
  const auto check = [&]() -> std::optional<int> {
    if (const auto refused = check_kind(key)) return refused;
    if (session.command.empty()) {
      return usage_error(
          kTool, election ? "elect: give the command after --" : "run: give the command after --");
    }
    return std::nullopt;
  };
  ClientRequest request;
  request.keys = key.keys;
  request.takes_command = true;
  request.check = check;
  request.takes_signals = true;
  StartedClient started = start_client(session, request);
  if (!started.client) return started.status;
  const RunArgs args{.keys = key.keys,
                     .kind = key.kind,
                     .ttl = key.ttl.value,
                     .wait = key.wait.value,
                     .conflict_status = flags.conflict_status,
                     .on_lost = flags.on_lost,
                     .kill_after = flags.kill_after.value,
                     .command = session.command,
                     .election = election};
  return run_command(*started.client, session, args);
}

// The flags run and elect share after their keys' flags: -n, -E, -q.
void add_wait_flags(CLI::App& sub, RunFlags& flags, const char* nonblock_help,
                    const char* conflict_help, const char* quiet_help) {
  sub.add_flag("-n,--nonblock", flags.nonblock, nonblock_help);
  sub.add_option("-E,--conflict-exit-code", flags.conflict_status, conflict_help)
      ->check(CLI::Range(0, 255))
      ->capture_default_str();
  sub.add_flag("-q,--quiet", flags.key.quiet, quiet_help);
}

// --on-lost and --kill-after.
void add_loss_flags(CLI::App& sub, RunFlags& flags, const char* on_lost_help,
                    const char* kill_after_help) {
  sub.add_option("--on-lost", flags.on_lost, on_lost_help)
      ->check(CLI::IsMember({"term", "kill", "ignore"}))
      ->capture_default_str();
  sub.add_option("--kill-after", flags.kill_after.text, kill_after_help)->capture_default_str();
}

}  // namespace

void add_run_command(CLI::App& app, Session& session) {
  auto flags = std::make_shared<RunFlags>();
  KeyFlags& key = flags->key;
  CLI::App* sub = app.add_subcommand(
      "run",
      "Hold a lease (or several keys' leases, all or nothing) while COMMAND runs, like flock: "
      "waits for it unless -n or -w; the command sees SHARDLOCK_KEY, SHARDLOCK_TOKEN (comma "
      "separated for several keys, in the order given), SHARDLOCK_MODE, SHARDLOCK_OWNER and "
      "SHARDLOCK_SERVER. Not acquired: nothing on stdout, the reason on stderr (unless -q), "
      "exit -E's status");
  sub->add_option("key", key.keys, "The key(s), then -- COMMAND ARGS...")->required();
  sub->add_option("--ttl", key.ttl.text,
                  "Lease duration; renewed every ttl/3 while the command runs")
      ->default_str("30s");
  sub->add_option("--wait", key.wait.text,
                  "Wait at most this long for the holder(s) to let go (default: until granted; a "
                  "wait beyond the server's --max-wait queues again until it is spent)");
  add_wait_flags(*sub, *flags,
                 "Do not wait: fail at once if a key is held or the server is in its lock-delay",
                 "Exit status when the lease is not acquired: busy, the server recovering (its "
                 "lock-delay after a restart), or the wait ran out. -n -E 0 -q: skip quietly",
                 "Say nothing on stderr about waiting (after 1s of waiting a line says what holds "
                 "the lease up and how long it waits at most) or about not acquiring it (busy, "
                 "recovering, the wait ran out): the exit status says it, as with flock -n");
  add_kind_flags(*sub, key);
  add_loss_flags(*sub, *flags,
                 "What to do to the command if a lease is lost: term (SIGTERM, then SIGKILL "
                 "after --kill-after), kill (SIGKILL) or ignore",
                 "With --on-lost term: SIGKILL the command if it is still running this long "
                 "after the SIGTERM, so it cannot work on past another holder's grant (as "
                 "timeout -k); 0: never");
  on_parsed(*sub, session, /*short_w=*/false,
            [&session, flags] { return run_or_elect(session, *flags, /*election=*/false); });
  sub->footer(
      "The command follows --: shardlockctl run KEY... [-w 10s | -n] -- COMMAND ARGS...\n"
      "A wait of over 1s prints one line on stderr saying what it waits for (a holder and its "
      "time left, or the server's lock-delay) and how long at most, unless -q.\n"
      "A lease lost while the command runs (it expired unrenewed, or the server refused its "
      "renewal; the message says which): SIGTERM to the command, SIGKILL after --kill-after "
      "(--on-lost), and exit 75.");
}

void add_elect_command(CLI::App& app, Session& session) {
  auto flags = std::make_shared<RunFlags>();
  KeyFlags& key = flags->key;
  CLI::App* sub = app.add_subcommand(
      "elect",
      "Run COMMAND while leader of NAME (leader election, as etcdctl elect and consul lock): "
      "waits, FIFO behind earlier campaigners, until elected (unless -n or -w), then holds the "
      "leadership lease with --value while the command runs; the command sees SHARDLOCK_TERM "
      "(the leadership's term, a fencing token) besides run's variables. Lost leadership: "
      "--on-lost's signal to the command, and exit 75. Not elected: exit -E's status");
  sub->add_option("name", key.keys, "The election's name, then -- COMMAND ARGS...")
      ->required()
      ->expected(1);
  sub->add_option("--value", key.kind.value,
                  "V: what others see as the leader (leader, observe): an address, a host name "
                  "and pid; at most 256 bytes");
  sub->add_option("--ttl", key.ttl.text,
                  "Leadership lease; renewed every ttl/3. A leader that dies silently keeps "
                  "the others waiting this long")
      ->default_str("10s");
  sub->add_option("-w", key.short_w, "DUR: same as --wait; json or text: same as --write-out");
  sub->add_option("--wait", key.wait.text, "Campaign at most this long (default: until elected)");
  add_wait_flags(*sub, *flags,
                 "Do not wait: fail at once if another leads or the server is in its lock-delay",
                 "Exit status when not elected: another leads, the server is recovering (its "
                 "lock-delay after a restart), or the wait ran out",
                 "Say nothing on stderr about campaigning (after 1s a line says who leads and "
                 "how long it waits at most) or about not being elected: the exit status says it");
  add_loss_flags(*sub, *flags,
                 "What to do to the command if leadership is lost: term (SIGTERM, then SIGKILL "
                 "after --kill-after), kill (SIGKILL) or ignore",
                 "With --on-lost term: SIGKILL the command if it is still running this long "
                 "after the SIGTERM, so it cannot act on past the next leader's election; 0: "
                 "never");
  on_parsed(*sub, session, /*short_w=*/false,
            [&session, flags] { return run_or_elect(session, *flags, /*election=*/true); });
  sub->footer(
      "shardlockctl elect NAME --value HOST:PORT -- COMMAND ARGS...\n"
      "Lost leadership (the message says why): SIGTERM to the command, SIGKILL after "
      "--kill-after (--on-lost), and exit 75.");
}

}  // namespace shardlock::ctl
