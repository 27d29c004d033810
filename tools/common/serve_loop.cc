// shardlockd's main loop. See serve_loop.h.
#include "common/serve_loop.h"

#include <ctime>

#include "common/traffic_summary.h"

namespace shardlock::tools {

// The daemon between its ready line and its stop. Until `granting` returns a
// line, asks it every 50 ms; logs that line once and passes it to
// `on_granting`. Logs what the server refused or dropped at most once per
// `summary_interval` (never when it is 0), and what is left of that at the
// stop. Passes SIGHUP to `on_sighup`. Returns SIGTERM or SIGINT; all three
// signals are blocked in every thread, so only this loop receives them.
int serve_until_stopped(const sigset_t& signals, const DaemonLog& log,
                        const lease::LeaseServer& server,
                        std::chrono::milliseconds summary_interval,
                        const std::function<std::optional<std::string>()>& granting,
                        const std::function<void(const std::string&)>& on_granting,
                        const std::function<void()>& on_sighup) {
  using Clock = TrafficSummary::Clock;
  // The server counts from zero at its start, and all of it is news: the
  // first datagrams may arrive before this line.
  TrafficSummary summary(TrafficSummary::Counters{},
                                           Clock::now());
  // The first news is logged at once; the rate limit starts from there. The
  // counters are read at most once per check period (each read takes every
  // shard lock briefly), however often the loop wakes for `granting`.
  auto last_summary = Clock::now() - summary_interval;
  const bool summaries = summary_interval.count() > 0;
  const auto check_period =
      std::min<std::chrono::nanoseconds>(summary_interval, std::chrono::seconds(1));
  auto next_check = Clock::now();
  bool granting_told = false;
  for (;;) {
    if (!granting_told) {
      if (const auto line = granting()) {
        log.write(LogLevel::kInfo, *line);
        on_granting(*line);
        granting_told = true;
      }
    }
    const auto now = Clock::now();
    if (summaries && now >= next_check && now - last_summary >= summary_interval) {
      next_check = now + check_period;
      if (const auto line = summary.take(server.stats().counters, now)) {
        log.write(LogLevel::kWarning, *line);
        last_summary = now;
      }
    }
    std::chrono::nanoseconds poll = std::chrono::milliseconds(50);
    if (granting_told) poll = summaries ? check_period : std::chrono::hours(1);
    const auto seconds = std::chrono::floor<std::chrono::seconds>(poll);
    const timespec timeout{.tv_sec = static_cast<time_t>(seconds.count()),
                           .tv_nsec = static_cast<long>((poll - seconds).count())};
    const int signal_number = sigtimedwait(&signals, nullptr, &timeout);
    if (signal_number == SIGHUP) {
      on_sighup();
      continue;
    }
    if (signal_number > 0) {
      // Granting since the last look: said before the stop is.
      if (!granting_told) {
        if (const auto line = granting()) log.write(LogLevel::kInfo, *line);
      }
      if (summaries) {
        if (const auto line = summary.take(server.stats().counters, Clock::now())) {
          log.write(LogLevel::kWarning, *line);
        }
      }
      return signal_number;
    }
    // -1: EAGAIN (the poll is over) or EINTR; look again.
  }
}

}  // namespace shardlock::tools
