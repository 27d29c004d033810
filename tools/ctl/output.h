// output.h: how shardlockctl's commands print, for people and for scripts:
// exit codes, keys shown safely, durations, JSON (nlohmann-json only) and
// the report of a failed call. Every command prints through these, so the
// same result reads the same wherever it comes from. Not API.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "common/command_line.h"
#include "shardlock/lease/client/client.h"

namespace shardlock::ctl {

using std::chrono::milliseconds;
// Fields in the order they are set: the output reads as it did.
using Json = nlohmann::ordered_json;
using tools::kExitUsage;

inline constexpr const char* kTool = "shardlockctl";
inline constexpr int kExitOk = 0;
inline constexpr int kExitRefused = 1;
inline constexpr int kExitUnreachable = 3;
inline constexpr int kExitRecovering = 4;
inline constexpr int kExitError = 5;
inline constexpr int kExitAuthFailed = 6;
inline constexpr int kExitLeaseLost = 75;
// run's status when the lease was not acquired (busy, or -w ran out) unless
// -E says otherwise: EX_UNAVAILABLE, apart from the command's own 1.
inline constexpr int kExitConflictDefault = 69;

// How results and errors are printed.
struct Output {
  bool json = false;
  bool errors_to_stderr = false;  // run: stdout is the command's
  // -q: no line while waiting, and a conflict (is_conflict()) is told by
  // the exit status alone, as flock -n tells it (acquire's JSON result on
  // stdout still says it).
  bool quiet = false;
};

// The key is not to be had now: another owner holds it (busy, or the wait
// ran out) or the server is in its lock-delay. run and elect exit -E's
// status for these; -q says nothing about them.
[[nodiscard]] bool is_conflict(const std::error_code& ec);

[[nodiscard]] int exit_code_for(const std::error_code& ec);

// The JSON spelling of an error: "busy", "not_owner", ...
[[nodiscard]] std::string error_name(const std::error_code& ec);

// `key` under `name` in `j`; a key that is not UTF-8 escaped (\xNN), with
// its exact bytes as hex under name + "_hex".
void put_key(Json& j, const std::string& name, std::string_view key);

// `keys` as JSON: "key" for one, "keys" (and "keys_hex" when one of them is
// not UTF-8) for several.
void put_keys(Json& j, const std::vector<std::string>& keys);

// A key for a terminal: control characters and bytes outside UTF-8 as \xNN.
[[nodiscard]] std::string shown(std::string_view key);

// shown() of each key, space separated.
[[nodiscard]] std::string shown_keys(const std::vector<std::string>& keys);

// `items` joined by `separator`.
[[nodiscard]] std::string joined(const std::vector<std::string>& items, char separator);

// 12.5s, 30s, 0.25s: a duration for people.
[[nodiscard]] std::string seconds_text(std::uint64_t ms);

// A duration in a line people read while they wait: to a tenth of a second.
[[nodiscard]] std::string tenths_text(std::uint64_t ms);

// `j` on one line, and a newline. Strings that are not UTF-8 are replaced
// (U+FFFD) rather than thrown on, though keys are escaped before they get
// here (put_key).
void print_json(const Json& j, std::FILE* to = stdout);

// Why a call failed, with what the answer or the diagnosis said.
struct Failure {
  std::error_code error;
  lease::WireError wire_error = lease::WireError::kInternal;
  std::string busy_key;  // several keys: the one that is held
  std::uint32_t ttl_left_ms = 0;
  std::uint32_t retry_after_ms = 0;
  std::optional<std::uint32_t> max_ttl_ms;  // kTtlOutOfRange: the server's limit, when learned
  std::string detail;                       // unreachable: what the diagnosis found
  bool auth_failed = false;
};

// What the failure is called in JSON, and its exit status.
[[nodiscard]] std::string failure_name(const Failure& f);
[[nodiscard]] int failure_status(const Failure& f);

// The failure for people, after "shardlockctl: KEY: ".
[[nodiscard]] std::string failure_text(const Failure& f, milliseconds ttl, milliseconds wait);

// Prints `f` for `keys` (for people on stderr; with JSON also one object on
// stdout, or for run only that object, on stderr) and returns its exit
// status.
int report(const Output& out, const std::vector<std::string>& keys, const Failure& f,
           milliseconds ttl = {}, milliseconds wait = {});

// Prints `j` as JSON or `text` as it is, by `out`; stdout is flushed.
void print_result(const Output& out, const Json& j, const std::string& text);

}  // namespace shardlock::ctl
