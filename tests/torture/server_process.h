// server_process.h: one shardlockd of a torture run and its incarnations:
// started, kill -9ed and restarted on the same port, paused (SIGSTOP), and
// stopped, each step recorded in the nemesis history (history.h). A single
// node run has one; cluster mode one per node, each naming its node id in
// its events.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "recorder.h"
#include "support/process.h"

namespace shardlock::torture {

struct ServerConfig {
  std::string shardlockd;  // the daemon's path
  // Every argument but --listen (which start() adds).
  std::vector<std::string> arguments;
  // The node id its events carry; empty for a single node.
  std::string node;
  // The lock delay the history records for each start: what a safe server
  // must keep (the checker's lock_delay), whatever the daemon is told.
  std::int64_t lock_delay_ms = 0;
  // The port to listen on; 0: any, and the restarts keep the first one's.
  std::uint16_t port = 0;
};

class ServerUnderTest {
 public:
  ServerUnderTest(ServerConfig config, std::string log_path, const Recorder& nemesis)
      : config_(std::move(config)), log_path_(std::move(log_path)), nemesis_(nemesis) {}

  // Starts an incarnation (on the port of the first one) and waits for its
  // ready line; retries while the port is still held by the one just killed.
  // False, with `error` set, when it never became ready.
  [[nodiscard]] bool start(std::string& error);
  // Whether an incarnation died on its own (a crash, a sanitizer report): a
  // failure of the system under test, whatever the history says.
  void note_if_dead();
  [[nodiscard]] const std::string& crashes() const noexcept { return crashes_; }

  void kill();
  // SIGSTOP for `how_long`, then SIGCONT. Blocks.
  void pause(std::chrono::milliseconds how_long);
  // The two halves of pause(), for a pause that other faults overlap:
  // SIGSTOP now, SIGCONT later (each recorded).
  void suspend();
  void resume();
  // SIGHUP: shardlockd reloads its --tenants file. Recorded as a
  // tenant_reload fault; whether the reload took is in the log.
  void hangup();
  // The arguments of the next start (say, a changed --max-ttl for a rolling
  // restart) and the lock-delay its start records.
  void reconfigure(std::vector<std::string> arguments, std::int64_t lock_delay_ms);
  // The next start is node `node` (its events carry it): a replacement
  // under a new id.
  void rename(std::string node) { config_.node = std::move(node); }
  // SIGTERM (after SIGCONT), and SIGKILL if it has not exited within 5 s.
  void stop();

  [[nodiscard]] bool running() const noexcept { return process_.running(); }
  [[nodiscard]] std::uint16_t port() const noexcept { return config_.port; }
  [[nodiscard]] const std::string& node() const noexcept { return config_.node; }
  [[nodiscard]] const std::string& log_path() const noexcept { return log_path_; }

 private:
  void record(EventKind kind) const;

  ServerConfig config_;
  std::string log_path_;
  const Recorder& nemesis_;
  test_support::ChildProcess process_;
  std::int64_t incarnation_ = 0;
  std::string crashes_;
};

}  // namespace shardlock::torture
