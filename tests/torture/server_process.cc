// See server_process.h.
#include "server_process.h"

#include <signal.h>

#include <thread>
#include <utility>

#include "support/daemon.h"

namespace shardlock::torture {

using namespace std::chrono_literals;

void ServerUnderTest::record(EventKind kind) const {
  Event e;
  e.kind = kind;
  e.incarnation = incarnation_;
  e.node = config_.node;
  if (kind == EventKind::kServerStart) e.lock_delay_ms = config_.lock_delay_ms;
  nemesis_.record(e);
}

bool ServerUnderTest::start(std::string& error) {
  for (int attempt = 0; attempt < 50; ++attempt) {
    ++incarnation_;
    std::vector<std::string> argv = {config_.shardlockd, "--listen",
                                     "127.0.0.1:" + std::to_string(config_.port)};
    argv.insert(argv.end(), config_.arguments.begin(), config_.arguments.end());
    record(EventKind::kServerStart);
    test_support::ChildOptions wiring;
    wiring.stderr_path = log_path_;
    std::string why;
    // A cluster node restarted after kill -9 first waits out its previous
    // run's etcd lease.
    const std::string address = test_support::start_daemon(process_, argv, wiring, 30s, why);
    if (!process_.running()) {
      error = why;
      return false;
    }
    if (!address.empty()) {
      config_.port = static_cast<std::uint16_t>(std::stoi(address.substr(address.rfind(':') + 1)));
      record(EventKind::kServerReady);
      return true;
    }
    process_.kill();  // it failed to bind (the old one's port not yet free)
    std::this_thread::sleep_for(50ms);
  }
  error = "shardlockd did not become ready; see " + log_path_;
  return false;
}

void ServerUnderTest::note_if_dead() {
  if (process_.running() && process_.wait_for(0ms)) {
    crashes_ += "shardlockd " + (config_.node.empty() ? "" : "node " + config_.node + " ") +
                "incarnation " + std::to_string(incarnation_) + " exited by itself (wait status " +
                std::to_string(process_.exit_status()) + "); see " + log_path_ + "\n";
  }
}

void ServerUnderTest::kill() {
  note_if_dead();
  process_.kill();
  record(EventKind::kServerKill);
}

void ServerUnderTest::pause(std::chrono::milliseconds how_long) {
  suspend();
  std::this_thread::sleep_for(how_long);
  resume();
}

void ServerUnderTest::suspend() {
  process_.signal(SIGSTOP);
  record(EventKind::kServerPause);
}

void ServerUnderTest::resume() {
  process_.signal(SIGCONT);
  record(EventKind::kServerResume);
}

void ServerUnderTest::hangup() {
  process_.signal(SIGHUP);
  Event e;
  e.kind = EventKind::kFault;
  e.fault = "tenant_reload";
  nemesis_.record(e);
}

void ServerUnderTest::reconfigure(std::vector<std::string> arguments, std::int64_t lock_delay_ms) {
  config_.arguments = std::move(arguments);
  config_.lock_delay_ms = lock_delay_ms;
}

void ServerUnderTest::stop() {
  note_if_dead();
  process_.signal(SIGCONT);
  process_.signal(SIGTERM);
  if (!process_.wait_for(5s)) process_.kill();
}

}  // namespace shardlock::torture
