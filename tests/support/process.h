// process.h: the one child-process runner of the tests and the torture
// harness (shardlockd, shardlockctl, etcd, torture workers, /bin/sh).
//
//   ChildProcess ctl(path, {"--json", "stats"});    // stdout and stderr captured
//   ToolResult r = ctl.finish(30s);                  // exit code, out, err
//
//   ChildProcess daemon;                             // or start() it by hand:
//   daemon.start({path, "--listen", "127.0.0.1:0"}, /*capture_stdout=*/true, log);
//   std::string ready = daemon.read_line(30s);
//
// Every child gets PR_SET_PDEATHSIG(SIGKILL), so nothing outlives a test or
// a harness that dies, and its own process group, so a signal aimed at it
// never hits the parent. The destructor SIGKILLs and reaps a child still
// running. Nothing here depends on GoogleTest: a child that cannot start
// leaves pid() at -1 and error() saying why, and finish() reports it.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

namespace shardlock::test_support {

// What a finished tool said.
struct ToolResult {
  int exit_code = -1;  // or 128 + signal; -1 when it had to be killed or never started
  std::string out;
  std::string err;
};

// How start() wires the child.
struct ChildOptions {
  bool capture_stdout = false;  // read with read_line() / finish()
  bool capture_stderr = false;  // read with read_stderr*() / finish()
  // Without capture_stderr: where stderr goes (appended); empty inherits it.
  std::string stderr_path;
  // "NAME=value" strings appended to this process's environment.
  std::vector<std::string> extra_env;
};

class ChildProcess {
 public:
  ChildProcess() = default;
  // Starts `path` with `args` (argv[0] is `path`), stdout and stderr
  // captured, the environment plus `extra_env`.
  ChildProcess(const std::string& path, std::vector<std::string> args,
               const std::vector<std::string>& extra_env = {});
  ~ChildProcess();  // SIGKILLs and reaps a child still running
  ChildProcess(ChildProcess&& other) noexcept;
  ChildProcess& operator=(ChildProcess&& other) noexcept;
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  // Starts argv[0] with argv. False, with error() set, when it cannot start.
  // Call on an object without a running child.
  [[nodiscard]] bool start(const std::vector<std::string>& argv, const ChildOptions& options);
  // The torture harness's form: stdout captured or not, stderr to a file.
  [[nodiscard]] bool start(const std::vector<std::string>& argv, bool capture_stdout,
                           const std::string& stderr_path);

  // One line of stdout (without the newline), waiting up to `timeout`: empty
  // on timeout (what came of the line stays for the next call); at end of
  // file, what is left of a last line without a newline.
  [[nodiscard]] std::string read_line(std::chrono::milliseconds timeout);
  // One line of stderr, likewise.
  [[nodiscard]] std::string read_stderr_line(std::chrono::milliseconds timeout);
  // Everything on stderr until it stays quiet for 2 s or closes.
  [[nodiscard]] std::string read_stderr();
  // Collects stdout and stderr until both close and the child exits, or
  // `timeout` passes (then kills it and reports exit_code -1).
  [[nodiscard]] ToolResult finish(std::chrono::milliseconds timeout);

  void signal(int sig) const noexcept;
  // Waits for the child to exit; its exit code, or 128 + signal (-1 when
  // there is no child).
  int wait();
  // Waits up to `timeout` for the child to exit; true if it did (then
  // exit_status() holds its wait status).
  [[nodiscard]] bool wait_for(std::chrono::milliseconds timeout);
  // SIGKILL (and SIGCONT, so a stopped child runs to die) and reap.
  void kill() noexcept;

  [[nodiscard]] pid_t pid() const noexcept { return pid_; }
  [[nodiscard]] bool running() const noexcept { return pid_ > 0; }
  // The last wait status (waitpid's).
  [[nodiscard]] int exit_status() const noexcept { return status_; }
  [[nodiscard]] const std::string& error() const noexcept { return error_; }

 private:
  struct Stream {
    int fd = -1;
    std::string buffered;  // read but not yet returned
  };
  static std::string line_of(Stream& stream, std::chrono::milliseconds timeout);
  void close_streams() noexcept;

  pid_t pid_ = -1;
  int status_ = 0;
  Stream out_;
  Stream err_;
  std::string error_;
};

// Runs `path` with `args` to the end (ChildProcess::finish()).
[[nodiscard]] ToolResult run_tool(const std::string& path, const std::vector<std::string>& args,
                                  std::chrono::milliseconds timeout = std::chrono::seconds{60},
                                  const std::vector<std::string>& extra_env = {});

// The path of the running executable (/proc/self/exe).
[[nodiscard]] std::string self_executable();

}  // namespace shardlock::test_support
