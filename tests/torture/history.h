// history.h: the event history of a shardlock-torture run, as the harness
// writes it and the checker reads it.
//
// One event per line, in files of one writer each (every worker process, the
// nemesis, the resource) under the run's history directory, flushed per
// event so a paused or killed writer loses nothing it completed:
//
//   <t_ns> <kind> <field>=<value> <field>=<value> ...
//
// t_ns is CLOCK_MONOTONIC in nanoseconds: every process of the run shares
// that clock on one machine, so intervals from different files compare
// exactly. Values contain no spaces (keys are generated without them).
//
// This header is the only thing the harness and the checker share. The
// checker shares no code with the lease client or server.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace shardlock::torture {

// Every kind of event, with the fields it carries.
enum class EventKind : std::uint8_t {
  // Workers (client = the worker's index; op = per-worker operation number).
  kAcquireInvoke,  // client op key ttl_ms wait_ms
  kAcquireOk,      // client op key token expiry_ns  (t = grant received)
  kAcquireFail,    // client op key error            (error: busy, timeout, ...)
  kHold,           // client key token expiry_ns     (the worker relies on the lease at t)
  kRenewInvoke,    // client op key token ttl_ms
  kRenewOk,        // client op key token expiry_ns
  kRenewFail,      // client op key token error
  kReleaseInvoke,  // client op key token            (validity ends here)
  kReleaseOk,      // client op key token
  kReleaseFail,    // client op key token error
  kLost,           // client key token error         (the on_lost callback ran)
  kRead,           // client key value               (a counter read from the resource)
  kWriteInvoke,    // client key token value
  // The resource (client = the writer).
  kWriteAccepted,  // client key token value
  kWriteRejected,  // client key token value highest
  kFinalCounter,   // key value                      (at the end of the run)
  // The nemesis.
  kServerStart,   // incarnation lock_delay_ms      (t = before exec)
  kServerReady,   // incarnation
  kServerKill,    // incarnation                    (SIGKILL sent; t = after waitpid)
  kServerPause,   // incarnation
  kServerResume,  // incarnation
  kClientPause,   // client
  kClientResume,  // client
  kNetFaultsOn,   // (loss/duplication/reordering/delay active)
  kNetFaultsOff,  //
  kHealed,        // (the last fault has healed; liveness is measured from here)
};

// "acquire_invoke", "acquire_ok", ... (the kinds' names on the wire).
[[nodiscard]] std::string_view to_string(EventKind kind) noexcept;
[[nodiscard]] std::optional<EventKind> parse_event_kind(std::string_view name) noexcept;

struct Event {
  std::int64_t t_ns = 0;
  EventKind kind = EventKind::kAcquireInvoke;
  std::int64_t client = -1;  // worker index; -1 when not applicable
  std::int64_t op = -1;      // per-worker operation number
  std::string key;
  std::uint64_t token = 0;
  std::int64_t expiry_ns = 0;  // the client's own expiry, on CLOCK_MONOTONIC
  std::int64_t ttl_ms = 0;
  std::int64_t wait_ms = 0;
  std::int64_t value = 0;          // counter value read / written / final
  std::uint64_t highest = 0;       // kWriteRejected: the token that fenced it out
  std::int64_t incarnation = 0;    // server events
  std::int64_t lock_delay_ms = 0;  // kServerStart
  std::string error;               // *Fail, kLost
};

// The line for `e` (no newline): only the fields its kind carries.
[[nodiscard]] std::string format_event(const Event& e);
// Parses one line; nullopt (and `error` says why) for a malformed line.
[[nodiscard]] std::optional<Event> parse_event(std::string_view line, std::string* error = nullptr);

// Every event of every *.log file in `dir`, sorted by t_ns (stable). Returns
// false, with `error` set, when a file cannot be read or a line does not
// parse (a torn last line of a killed writer is skipped, not an error).
[[nodiscard]] bool read_history(const std::string& dir, std::vector<Event>& out,
                                std::string& error);

}  // namespace shardlock::torture
