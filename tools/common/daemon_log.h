// daemon_log.h: shardlockd's log. One line per event on stderr, each with a
// level; a UTC timestamp on a terminal or in a file, and a syslog "<N>"
// priority prefix instead when stderr is journald's stream (the journal
// stamps lines itself and reads their priority from that prefix). Not API.
//
//   2026-11-25T12:00:00.250Z info shardlockd: listening on 127.0.0.1:7420 ...
//   <6>listening on 127.0.0.1:7420 ...                      (under systemd)
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace shardlock::tools {

// Syslog priorities, so a level is its own journald prefix.
enum class LogLevel : std::uint8_t { kError = 3, kWarning = 4, kInfo = 6, kDebug = 7 };

// "error", "warning", "info", "debug".
[[nodiscard]] std::string_view to_string(LogLevel level) noexcept;
// The words above, and "warn"; nullopt otherwise.
[[nodiscard]] std::optional<LogLevel> parse_log_level(std::string_view text) noexcept;

// `t` as the log writes it, UTC with milliseconds: "2026-11-25T12:00:00.250Z".
[[nodiscard]] std::string utc_iso8601(std::chrono::system_clock::time_point t);

// Whether `fd` is the stream journald gave this process: $JOURNAL_STREAM
// ("DEVICE:INODE") names the same file (systemd.exec(5)). A child that
// inherits the variable but not the stream is not fooled.
[[nodiscard]] bool is_journal_stream(int fd) noexcept;

class DaemonLog {
 public:
  // Lines at `threshold` or more severe go to `fd`; `journal` chooses the
  // "<N>" form (see is_journal_stream()).
  DaemonLog(std::string tool, LogLevel threshold, int fd, bool journal);

  [[nodiscard]] bool enabled(LogLevel level) const noexcept { return level <= threshold_; }
  // Writes one line (a newline is added) with a single write(2), so lines
  // from several threads never interleave. Thread-safe; never throws past
  // allocation.
  void write(LogLevel level, std::string_view message) const;
  // A line from a library's log callback, which carries no level: "warning: "
  // at its start makes it a warning (the prefix is dropped), "cannot",
  // "could not" or "failed" in it an error, anything else info.
  void write_library_line(std::string_view line) const;

 private:
  std::string tool_;
  LogLevel threshold_;
  int fd_;
  bool journal_;
};

}  // namespace shardlock::tools
