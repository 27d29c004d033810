// process.h: the child processes of a torture run (shardlockd, workers).
//
// Every child gets PR_SET_PDEATHSIG(SIGKILL), so nothing outlives a harness
// that dies, and its own process group, so a signal aimed at it never hits
// the harness.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

namespace shardlock::torture {

class ChildProcess {
 public:
  ChildProcess() = default;
  ~ChildProcess();  // SIGKILLs and reaps a child still running
  ChildProcess(ChildProcess&& other) noexcept;
  ChildProcess& operator=(ChildProcess&& other) noexcept;
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  // Starts argv[0] with argv. With `capture_stdout`, read_line() reads its
  // stdout; its stderr goes to `stderr_path` (or is inherited when empty).
  // False, with error() set, when it cannot start.
  [[nodiscard]] bool start(const std::vector<std::string>& argv, bool capture_stdout,
                           const std::string& stderr_path);
  // One line of stdout (without the newline), waiting up to `timeout`; empty
  // on timeout or end of file.
  [[nodiscard]] std::string read_line(std::chrono::milliseconds timeout);

  void signal(int sig) const noexcept;
  // Waits up to `timeout` for the child to exit; true if it did (then
  // exit_status() holds its wait status).
  [[nodiscard]] bool wait_for(std::chrono::milliseconds timeout);
  // SIGKILL and reap.
  void kill() noexcept;

  [[nodiscard]] pid_t pid() const noexcept { return pid_; }
  [[nodiscard]] bool running() const noexcept { return pid_ > 0; }
  [[nodiscard]] int exit_status() const noexcept { return status_; }
  [[nodiscard]] const std::string& error() const noexcept { return error_; }

 private:
  pid_t pid_ = -1;
  int stdout_fd_ = -1;
  int status_ = 0;
  std::string buffered_;
  std::string error_;
};

// The path of the running executable (/proc/self/exe).
[[nodiscard]] std::string self_executable();

}  // namespace shardlock::torture
