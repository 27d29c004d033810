// serve_loop.h: shardlockd's main loop between its ready line and its stop:
// the signals, the "granting" line and the summaries of refused traffic.
#pragma once

#include <signal.h>

#include <chrono>
#include <functional>
#include <optional>
#include <string>

#include "common/daemon_log.h"
#include "shardlock/lease/server/server.h"

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
                        const std::function<void()>& on_sighup);

}  // namespace shardlock::tools
