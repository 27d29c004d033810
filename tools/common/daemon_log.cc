#include "common/daemon_log.h"

#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>
#include <utility>

namespace shardlock::tools {

std::string utc_iso8601(std::chrono::system_clock::time_point t) {
  const auto ms = std::chrono::floor<std::chrono::milliseconds>(t.time_since_epoch());
  const auto seconds = std::chrono::floor<std::chrono::seconds>(ms);
  const auto time = static_cast<std::time_t>(seconds.count());
  std::tm utc{};
  gmtime_r(&time, &utc);
  std::array<char, 40> text{};
  const std::size_t n = std::strftime(text.data(), text.size(), "%Y-%m-%dT%H:%M:%S", &utc);
  std::snprintf(text.data() + n, text.size() - n, ".%03dZ",
                static_cast<int>((ms - seconds).count()));
  return text.data();
}

std::string_view to_string(LogLevel level) noexcept {
  switch (level) {
    case LogLevel::kError:
      return "error";
    case LogLevel::kWarning:
      return "warning";
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kDebug:
      return "debug";
  }
  return "info";
}

std::optional<LogLevel> parse_log_level(std::string_view text) noexcept {
  for (const LogLevel level :
       {LogLevel::kError, LogLevel::kWarning, LogLevel::kInfo, LogLevel::kDebug}) {
    if (text == to_string(level)) return level;
  }
  if (text == "warn") return LogLevel::kWarning;
  return std::nullopt;
}

bool is_journal_stream(int fd) noexcept {
  const char* stream = std::getenv("JOURNAL_STREAM");
  if (stream == nullptr) return false;
  unsigned long long device = 0;
  unsigned long long inode = 0;
  if (std::sscanf(stream, "%llu:%llu", &device, &inode) != 2) return false;
  struct stat st {};
  if (::fstat(fd, &st) != 0) return false;
  return st.st_dev == device && st.st_ino == inode;
}

DaemonLog::DaemonLog(std::string tool, LogLevel threshold, int fd, bool journal)
    : tool_(std::move(tool)), threshold_(threshold), fd_(fd), journal_(journal) {}

void DaemonLog::write(LogLevel level, std::string_view message) const {
  if (!enabled(level)) return;
  std::string line;
  if (journal_) {
    line = "<" + std::to_string(static_cast<int>(level)) + ">";
  } else {
    line = utc_iso8601(std::chrono::system_clock::now());
    line += ' ';
    line += to_string(level);
    line += ' ';
    line += tool_;
    line += ": ";
  }
  line += message;
  line += '\n';
  // Nothing useful to do when stderr is gone; a short write is retried.
  for (std::size_t done = 0; done < line.size();) {
    const ssize_t n = ::write(fd_, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += static_cast<std::size_t>(n);
  }
}

void DaemonLog::write_library_line(std::string_view line) const {
  constexpr std::string_view kWarningPrefix = "warning: ";
  if (line.starts_with(kWarningPrefix)) {
    write(LogLevel::kWarning, line.substr(kWarningPrefix.size()));
    return;
  }
  for (const std::string_view failure : {"cannot ", "could not ", "failed"}) {
    if (line.find(failure) != std::string_view::npos) {
      write(LogLevel::kError, line);
      return;
    }
  }
  write(LogLevel::kInfo, line);
}

}  // namespace shardlock::tools
