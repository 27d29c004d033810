// See process.h.
#include "support/process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>
#include <utility>

extern char** environ;

namespace shardlock::test_support {
namespace {

int exit_code_of(int status) {
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// Appends what one read() of `fd` gives; false at end of file or error.
bool read_some(int fd, std::string& into) {
  char chunk[4096];
  const ssize_t n = ::read(fd, chunk, sizeof chunk);
  if (n <= 0) return false;
  into.append(chunk, static_cast<std::size_t>(n));
  return true;
}

}  // namespace

ChildProcess::ChildProcess(const std::string& path, std::vector<std::string> args,
                           const std::vector<std::string>& extra_env) {
  args.insert(args.begin(), path);
  ChildOptions options;
  options.capture_stdout = true;
  options.capture_stderr = true;
  options.extra_env = extra_env;
  (void)start(args, options);  // on failure pid() is -1 and finish() says why
}

ChildProcess::~ChildProcess() {
  kill();
  close_streams();
}

ChildProcess::ChildProcess(ChildProcess&& other) noexcept
    : pid_(std::exchange(other.pid_, -1)),
      status_(other.status_),
      out_(std::exchange(other.out_, Stream{})),
      err_(std::exchange(other.err_, Stream{})),
      error_(std::move(other.error_)) {}

ChildProcess& ChildProcess::operator=(ChildProcess&& other) noexcept {
  if (this != &other) {
    kill();
    close_streams();
    pid_ = std::exchange(other.pid_, -1);
    status_ = other.status_;
    out_ = std::exchange(other.out_, Stream{});
    err_ = std::exchange(other.err_, Stream{});
    error_ = std::move(other.error_);
  }
  return *this;
}

void ChildProcess::close_streams() noexcept {
  for (Stream* s : {&out_, &err_}) {
    if (s->fd >= 0) ::close(s->fd);
    s->fd = -1;
    s->buffered.clear();
  }
}

bool ChildProcess::start(const std::vector<std::string>& argv, bool capture_stdout,
                         const std::string& stderr_path) {
  ChildOptions options;
  options.capture_stdout = capture_stdout;
  options.stderr_path = stderr_path;
  return start(argv, options);
}

bool ChildProcess::start(const std::vector<std::string>& argv, const ChildOptions& options) {
  close_streams();
  int out[2] = {-1, -1};
  int err[2] = {-1, -1};
  const auto close_pipes = [&] {
    for (int fd : {out[0], out[1], err[0], err[1]}) {
      if (fd >= 0) ::close(fd);
    }
  };
  if ((options.capture_stdout && ::pipe2(out, O_CLOEXEC) != 0) ||
      (options.capture_stderr && ::pipe2(err, O_CLOEXEC) != 0)) {
    error_ = std::string("pipe: ") + std::strerror(errno);
    close_pipes();
    return false;
  }
  // Everything the child needs is built before fork(): from fork to exec
  // only async-signal-safe calls (other threads may hold allocator locks).
  std::vector<char*> args;
  args.reserve(argv.size() + 1);
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::vector<char*> envp;
  for (char** e = environ; *e != nullptr; ++e) envp.push_back(*e);
  for (const std::string& e : options.extra_env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  const int stderr_file =
      options.capture_stderr || options.stderr_path.empty()
          ? -1
          : ::open(options.stderr_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    error_ = std::string("fork: ") + std::strerror(errno);
    close_pipes();
    if (stderr_file >= 0) ::close(stderr_file);
    return false;
  }
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);  // the parent died before prctl
    ::setpgid(0, 0);
    if (options.capture_stdout) ::dup2(out[1], STDOUT_FILENO);
    if (options.capture_stderr) ::dup2(err[1], STDERR_FILENO);
    if (stderr_file >= 0) ::dup2(stderr_file, STDERR_FILENO);
    ::execve(args[0], args.data(), envp.data());
    ::_exit(127);
  }
  pid_ = pid;
  if (stderr_file >= 0) ::close(stderr_file);
  if (options.capture_stdout) {
    ::close(out[1]);
    out_.fd = out[0];
  }
  if (options.capture_stderr) {
    ::close(err[1]);
    err_.fd = err[0];
  }
  return true;
}

std::string ChildProcess::line_of(Stream& stream, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const std::size_t newline = stream.buffered.find('\n');
    if (newline != std::string::npos) {
      std::string line = stream.buffered.substr(0, newline);
      stream.buffered.erase(0, newline + 1);
      return line;
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (stream.fd < 0 || left.count() <= 0) return {};
    pollfd p{stream.fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    if (!read_some(stream.fd, stream.buffered)) return std::exchange(stream.buffered, {});
  }
}

std::string ChildProcess::read_line(std::chrono::milliseconds timeout) {
  return line_of(out_, timeout);
}

std::string ChildProcess::read_stderr_line(std::chrono::milliseconds timeout) {
  return line_of(err_, timeout);
}

std::string ChildProcess::read_stderr() {
  std::string all = std::exchange(err_.buffered, {});
  for (;;) {
    pollfd p{err_.fd, POLLIN, 0};
    if (err_.fd < 0 || ::poll(&p, 1, 2000) <= 0 || !read_some(err_.fd, all)) break;
  }
  return all;
}

ToolResult ChildProcess::finish(std::chrono::milliseconds timeout) {
  ToolResult r;
  if (pid_ <= 0 && out_.fd < 0 && err_.fd < 0) {
    r.err = error_;
    return r;
  }
  r.out = std::exchange(out_.buffered, {});
  r.err = std::exchange(err_.buffered, {});
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  bool out_open = out_.fd >= 0;
  bool err_open = err_.fd >= 0;
  while ((out_open || err_open) && std::chrono::steady_clock::now() < deadline) {
    pollfd p[2] = {{out_open ? out_.fd : -1, POLLIN, 0}, {err_open ? err_.fd : -1, POLLIN, 0}};
    if (::poll(p, 2, 50) <= 0) continue;
    if (p[0].revents != 0) out_open = read_some(out_.fd, r.out);
    if (p[1].revents != 0) err_open = read_some(err_.fd, r.err);
  }
  while (pid_ > 0 && std::chrono::steady_clock::now() < deadline) {
    if (::waitpid(pid_, &status_, WNOHANG) == pid_) {
      pid_ = -1;
      r.exit_code = exit_code_of(status_);
      return r;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  kill();
  r.exit_code = -1;
  return r;
}

void ChildProcess::signal(int sig) const noexcept {
  if (pid_ > 0) ::kill(pid_, sig);
}

int ChildProcess::wait() {
  if (pid_ <= 0) return -1;
  while (::waitpid(pid_, &status_, 0) < 0 && errno == EINTR) {
  }
  pid_ = -1;
  return exit_code_of(status_);
}

bool ChildProcess::wait_for(std::chrono::milliseconds timeout) {
  if (pid_ <= 0) return true;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const pid_t r = ::waitpid(pid_, &status_, WNOHANG);
    if (r == pid_ || (r < 0 && errno == ECHILD)) {
      pid_ = -1;
      return true;
    }
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

void ChildProcess::kill() noexcept {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  ::kill(pid_, SIGCONT);  // a stopped child must run to die
  while (::waitpid(pid_, &status_, 0) < 0 && errno == EINTR) {
  }
  pid_ = -1;
}

ToolResult run_tool(const std::string& path, const std::vector<std::string>& args,
                    std::chrono::milliseconds timeout, const std::vector<std::string>& extra_env) {
  ChildProcess child(path, args, extra_env);
  return child.finish(timeout);
}

std::string self_executable() {
  char path[4096];
  const ssize_t n = ::readlink("/proc/self/exe", path, sizeof path - 1);
  if (n <= 0) return {};
  return {path, static_cast<std::size_t>(n)};
}

}  // namespace shardlock::test_support
