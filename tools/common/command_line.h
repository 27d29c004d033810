// command_line.h: what every shardlock tool's main() does with its command
// line, written once: parse with CLI11, report usage errors the same way,
// read duration and --auth-key flags. Not API.
#pragma once

#include <CLI/CLI.hpp>
#include <chrono>
#include <optional>
#include <string>
#include <string_view>

#include "shardlock/lease/wire/auth.h"

namespace shardlock::tools {

// The exit status of every tool for a usage error (bad or missing flags).
inline constexpr int kExitUsage = 2;

// Prints "<tool>: <message>" and a hint to run --help on stderr; returns
// kExitUsage.
int usage_error(std::string_view tool, std::string_view message);

// Gives `app` --version, which prints "<tool> <version>" (PROJECT_VERSION,
// shardlock_version.h) and exits 0.
void add_version_flag(CLI::App& app, std::string_view tool);

// How a tool prints its results: for people (the default) or as JSON for
// scripts. The same switch on every tool and subcommand: --json, or
// -w/--write-out json (etcdctl's spelling).
struct OutputFlags {
  std::string write_out = "text";
  bool json_flag = false;
  [[nodiscard]] bool json() const noexcept { return json_flag || write_out == "json"; }
};

// Adds --json and --write-out (also -w unless `with_short_w` is false: in
// shardlockctl run, -w is flock's --wait) to `app`, bound to `flags`, in the
// option group `group` (empty: none).
void add_output_flags(CLI::App& app, OutputFlags& flags, bool with_short_w = true,
                      const std::string& group = {});

// Parses the command line into `app`. Returns nullopt when main() should go
// on; otherwise the status main() returns: 0 after --help or --version
// (printed on stdout), kExitUsage after a usage error (see usage_error()).
[[nodiscard]] std::optional<int> parse_command_line(CLI::App& app, int argc, char** argv,
                                                    std::string_view tool);

// What main() returns: run(argc, argv), or `failure_status` when an exception
// escapes it (allocation failure, in practice), after printing
// "<tool>: fatal: <what>" on stderr rather than calling std::terminate().
// Also `failure_status` in place of a 0 when stdout could not be written
// (flushed here; e.g. a full disk), after saying so on stderr.
int run_main(std::string_view tool, int failure_status, int (*run)(int, char**), int argc,
             char** argv) noexcept;

// The longest duration the wire carries: TTLs and waits are u32 milliseconds.
inline constexpr std::chrono::milliseconds kLongestWireDuration{UINT32_MAX};

// Whether a duration flag accepts "0".
enum class ZeroDuration { kAllowed, kRejected };

struct DurationFlag {
  std::chrono::milliseconds value{0};
  std::string error;  // why the text is not a valid value for the flag; empty when it is
};

// Parses the text of a duration flag (lease::parse_duration: "500ms", "30s",
// "1m30s", "0") and checks it against the flag's bounds. The error names
// the flag, e.g. `--ttl: invalid duration "soon" (use e.g. 500ms, 1.5s, 30 (seconds), 2m)`.
[[nodiscard]] DurationFlag parse_duration_flag(
    std::string_view flag, std::string_view text, ZeroDuration zero,
    std::chrono::milliseconds longest = kLongestWireDuration);

struct AuthKeyFlag {
  std::optional<lease::AuthKey> key;  // empty when no file was named, or on error
  std::string error;                  // "--auth-key: <why>" when the file is unusable
};

// The key in the file named by --auth-key; no key and no error for an empty
// path (the flag was not given).
[[nodiscard]] AuthKeyFlag load_auth_key_flag(const std::string& path);

}  // namespace shardlock::tools
