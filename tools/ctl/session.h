// session.h: one run of shardlockctl as its commands see it: the global
// flags, how to print, the command after "--", and the start of the lease
// client that every command but keygen, members and drain talks through.
//
// Each command (tools/ctl/<command>.cc, declared in commands.h) adds its
// CLI11 subcommand with its flags and a callback; the callback sets
// Session::action, which main() runs once the whole command line is parsed.
// Not API.
#pragma once

#include <signal.h>  // POSIX sigset_t: not in <csignal>

#include <CLI/CLI.hpp>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/command_line.h"
#include "ctl/output.h"
#include "shardlock/lease/client/client.h"

namespace shardlock::ctl {

using tools::ZeroDuration;

// The flags every subcommand takes, before or after its name.
struct Globals {
  std::string servers;  // --server, else $SHARDLOCK_SERVER
  std::string timeout = "2s";
  bool discover = false;
  std::string auth_key_file;  // --auth-key, else $SHARDLOCK_AUTH_KEY_FILE
  std::string tenant;         // --tenant, else $SHARDLOCK_TENANT: a key id
  bool encrypt = false;       // --encrypt, or $SHARDLOCK_ENCRYPT=1
  std::string cipher;         // --cipher, else $SHARDLOCK_CIPHER: auto, portable or aes
  tools::OutputFlags output;
};

// A duration flag: its text as given, and its value once parse_arg() read it.
struct DurationArg {
  std::string text;
  milliseconds value{0};
};

// Parses `d.text` (an unset subcommand flag stays empty and 0) into
// `d.value`; prints the usage error and returns false when it is not valid.
[[nodiscard]] bool parse_arg(DurationArg& d, const char* flag, ZeroDuration zero);

struct Session {
  Globals globals;
  Output out;
  std::vector<std::string> command;  // run, elect: the words after "--"
  DurationArg timeout;               // --timeout; parsed by the command
  std::function<int()> action;       // set by the parsed subcommand's callback
};

// Gives `app` (the top level or a subcommand) the global flags, bound to
// `g`: the last one given wins, wherever it stands. -w is the output
// switch, except where the subcommand takes -w itself (`short_w` false).
void add_global_flags(CLI::App& app, Globals& g, bool short_w);

// Makes `sub`'s callback set session.action to `action`, and gives `sub`
// the global flags.
void on_parsed(CLI::App& sub, Session& session, bool short_w, std::function<int()> action);

// What a command that talks to the lease servers has checked before its
// client starts, in this order after --auth-key is read.
struct ClientRequest {
  std::vector<std::string> keys;  // each must be 1..kMaxKeyLength bytes
  std::string owner_hex;          // --owner: 32 hex digits; empty: none
  bool takes_command = false;     // run, elect: the words after "--"
  // The command's own checks (the lease kind's flags): a status to exit
  // with, or nullopt.
  std::function<std::optional<int>()> check;
  bool takes_signals = false;  // run, elect: SIGCHLD, SIGTERM, SIGINT, SIGHUP
};

struct StartedClient {
  std::unique_ptr<lease::LeaseClient> client;  // null when the start failed: see status
  int status = kExitOk;
  std::vector<std::string> nodes;  // as --server named them
  bool have_key = false;           // --auth-key
  lease::LeaseOptions owner;       // acquire --owner: the lease's owner
};

// What every command that talks to the lease servers checks first: a
// usage error unless --server (or SHARDLOCK_SERVER) named the servers, or
// --timeout is not a valid duration; else nullopt, session.timeout parsed.
[[nodiscard]] std::optional<int> check_servers_and_timeout(Session& session);

// Checks `request`, then starts the client of `session`'s servers; says on
// stderr why it could not.
[[nodiscard]] StartedClient start_client(const Session& session, const ClientRequest& request);

// start_client() for a command on one key (renew, release, query, leader,
// observe), with --owner's `owner_hex` if any.
[[nodiscard]] StartedClient start_client_for_key(const Session& session, const std::string& key,
                                                 const std::string& owner_hex = {});

// The signals run and elect take synchronously (sigtimedwait).
[[nodiscard]] sigset_t handled_signals();

}  // namespace shardlock::ctl
