// Test support for the client tools (shardlockctl_test, shardlock_bench_test):
// run a tool as a child process with captured output and a bounded wait, and
// a small strict JSON parser to check that what they print is well formed.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

extern char** environ;

namespace shardlock::lease::testing {

// ------------------------------------------------------------------ JSON

struct Json {
  enum class Kind { kNull, kBool, kNumber, kString, kArray, kObject } kind = Kind::kNull;
  bool boolean = false;
  double number = 0;
  std::string text;
  std::vector<Json> items;
  std::map<std::string, Json> fields;

  bool has(const std::string& key) const { return kind == Kind::kObject && fields.count(key) == 1; }
  const Json& operator[](const std::string& key) const {
    static const Json kNullValue;
    const auto it = fields.find(key);
    return it == fields.end() ? kNullValue : it->second;
  }
};

// Parses exactly one JSON value (surrounding whitespace allowed); nullopt if
// `text` is not well-formed JSON.
class JsonParser {
 public:
  static std::optional<Json> parse(std::string_view text) {
    JsonParser p(text);
    Json value;
    if (!p.value(value, 0)) return std::nullopt;
    p.skip_space();
    if (p.at_ != p.text_.size()) return std::nullopt;
    return value;
  }

 private:
  explicit JsonParser(std::string_view text) : text_(text) {}

  void skip_space() {
    while (at_ < text_.size() &&
           (text_[at_] == ' ' || text_[at_] == '\n' || text_[at_] == '\t' || text_[at_] == '\r')) {
      ++at_;
    }
  }
  bool literal(std::string_view word) {
    if (text_.substr(at_, word.size()) != word) return false;
    at_ += word.size();
    return true;
  }
  bool string(std::string& out) {
    if (at_ >= text_.size() || text_[at_] != '"') return false;
    ++at_;
    while (at_ < text_.size()) {
      const char c = text_[at_++];
      if (c == '"') return true;
      if (static_cast<unsigned char>(c) < 0x20) return false;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (at_ >= text_.size()) return false;
      const char e = text_[at_++];
      if (e == 'u') {
        if (at_ + 4 > text_.size()) return false;
        for (int i = 0; i < 4; ++i) {
          if (!std::isxdigit(static_cast<unsigned char>(text_[at_ + static_cast<std::size_t>(i)])))
            return false;
        }
        out += '?';
        at_ += 4;
      } else if (std::string_view("\"\\/bfnrt").find(e) != std::string_view::npos) {
        out += e;
      } else {
        return false;
      }
    }
    return false;
  }
  bool number(double& out) {
    const std::size_t begin = at_;
    if (at_ < text_.size() && text_[at_] == '-') ++at_;
    const std::size_t digits = at_;
    while (at_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[at_]))) ++at_;
    if (at_ == digits) return false;
    if (at_ < text_.size() && text_[at_] == '.') {
      ++at_;
      const std::size_t fraction = at_;
      while (at_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[at_]))) ++at_;
      if (at_ == fraction) return false;
    }
    if (at_ < text_.size() && (text_[at_] == 'e' || text_[at_] == 'E')) {
      ++at_;
      if (at_ < text_.size() && (text_[at_] == '+' || text_[at_] == '-')) ++at_;
      const std::size_t exponent = at_;
      while (at_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[at_]))) ++at_;
      if (at_ == exponent) return false;
    }
    out = std::strtod(std::string(text_.substr(begin, at_ - begin)).c_str(), nullptr);
    return true;
  }
  bool value(Json& out, int depth) {
    if (depth > 32) return false;
    skip_space();
    if (at_ >= text_.size()) return false;
    const char c = text_[at_];
    if (c == '{') {
      out.kind = Json::Kind::kObject;
      ++at_;
      skip_space();
      if (at_ < text_.size() && text_[at_] == '}') return ++at_, true;
      for (;;) {
        skip_space();
        std::string key;
        if (!string(key)) return false;
        skip_space();
        if (at_ >= text_.size() || text_[at_++] != ':') return false;
        Json item;
        if (!value(item, depth + 1)) return false;
        if (!out.fields.emplace(key, std::move(item)).second) return false;  // duplicate key
        skip_space();
        if (at_ >= text_.size()) return false;
        if (text_[at_] == ',') {
          ++at_;
          continue;
        }
        return text_[at_++] == '}';
      }
    }
    if (c == '[') {
      out.kind = Json::Kind::kArray;
      ++at_;
      skip_space();
      if (at_ < text_.size() && text_[at_] == ']') return ++at_, true;
      for (;;) {
        Json item;
        if (!value(item, depth + 1)) return false;
        out.items.push_back(std::move(item));
        skip_space();
        if (at_ >= text_.size()) return false;
        if (text_[at_] == ',') {
          ++at_;
          continue;
        }
        return text_[at_++] == ']';
      }
    }
    if (c == '"') {
      out.kind = Json::Kind::kString;
      return string(out.text);
    }
    if (literal("true")) {
      out.kind = Json::Kind::kBool;
      out.boolean = true;
      return true;
    }
    if (literal("false")) {
      out.kind = Json::Kind::kBool;
      return true;
    }
    if (literal("null")) return true;
    out.kind = Json::Kind::kNumber;
    return number(out.number);
  }

  std::string_view text_;
  std::size_t at_ = 0;
};

// ------------------------------------------------------------------ processes

struct ToolResult {
  int exit_code = -1;  // or 128 + signal; -1 when it had to be killed
  std::string out;
  std::string err;
};

// A child process with stdout and stderr captured. The destructor kills it
// if it is still running.
class ChildProcess {
 public:
  ChildProcess(const std::string& path, std::vector<std::string> args,
               const std::vector<std::string>& extra_env = {}) {
    int out[2];
    int err[2];
    EXPECT_EQ(::pipe2(out, O_CLOEXEC), 0);
    EXPECT_EQ(::pipe2(err, O_CLOEXEC), 0);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, out[1], 1);
    posix_spawn_file_actions_adddup2(&actions, err[1], 2);
    args.insert(args.begin(), path);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::vector<std::string> env_strings(extra_env);
    std::vector<char*> envp;
    for (char** e = environ; *e != nullptr; ++e) envp.push_back(*e);
    for (auto& e : env_strings) envp.push_back(e.data());
    envp.push_back(nullptr);
    EXPECT_EQ(posix_spawn(&pid_, path.c_str(), &actions, nullptr, argv.data(), envp.data()), 0);
    posix_spawn_file_actions_destroy(&actions);
    ::close(out[1]);
    ::close(err[1]);
    out_ = out[0];
    err_ = err[0];
  }
  ~ChildProcess() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      int status = 0;
      ::waitpid(pid_, &status, 0);
    }
    ::close(out_);
    ::close(err_);
  }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  void signal(int sig) { ::kill(pid_, sig); }

  // Waits for exit; returns the exit code, or 128 + signal.
  int wait() {
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

  // Everything on stderr until it stays quiet for 2 s or closes.
  std::string read_stderr() {
    std::string all;
    char buf[4096];
    for (;;) {
      pollfd p{err_, POLLIN, 0};
      if (::poll(&p, 1, 2000) <= 0) break;
      const ssize_t n = ::read(err_, buf, sizeof buf);
      if (n <= 0) break;
      all.append(buf, static_cast<std::size_t>(n));
    }
    return all;
  }

  // One stdout line, or "" if none arrives within `timeout`.
  std::string read_line(std::chrono::milliseconds timeout) { return line_of(out_, timeout); }
  // One stderr line, likewise.
  std::string read_stderr_line(std::chrono::milliseconds timeout) { return line_of(err_, timeout); }

  // Collects output until the child exits or `timeout` passes (then kills it
  // and reports exit_code -1).
  ToolResult finish(std::chrono::milliseconds timeout) {
    ToolResult r;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    bool out_open = true;
    bool err_open = true;
    while ((out_open || err_open) && std::chrono::steady_clock::now() < deadline) {
      pollfd p[2] = {{out_open ? out_ : -1, POLLIN, 0}, {err_open ? err_ : -1, POLLIN, 0}};
      if (::poll(p, 2, 50) <= 0) continue;
      char buf[4096];
      if (p[0].revents != 0) {
        const ssize_t n = ::read(out_, buf, sizeof buf);
        if (n <= 0)
          out_open = false;
        else
          r.out.append(buf, static_cast<std::size_t>(n));
      }
      if (p[1].revents != 0) {
        const ssize_t n = ::read(err_, buf, sizeof buf);
        if (n <= 0)
          err_open = false;
        else
          r.err.append(buf, static_cast<std::size_t>(n));
      }
    }
    int status = 0;
    while (std::chrono::steady_clock::now() < deadline) {
      const pid_t done = ::waitpid(pid_, &status, WNOHANG);
      if (done == pid_) {
        pid_ = -1;
        r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        return r;
      }
      ::usleep(10'000);
    }
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
    r.exit_code = -1;
    return r;
  }

 private:
  static std::string line_of(int fd, std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    std::string line;
    while (std::chrono::steady_clock::now() < deadline) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      char c = 0;
      if (::read(fd, &c, 1) != 1) break;
      if (c == '\n') return line;
      line += c;
    }
    return line;
  }

  pid_t pid_ = -1;
  int out_ = -1;
  int err_ = -1;
};

inline ToolResult run_tool(const std::string& path, const std::vector<std::string>& args,
                           std::chrono::milliseconds timeout = std::chrono::milliseconds{60'000},
                           const std::vector<std::string>& extra_env = {}) {
  ChildProcess child(path, args, extra_env);
  return child.finish(timeout);
}

// The single stdout line of `r` parsed as JSON (trailing newline allowed).
inline std::optional<Json> json_line(const ToolResult& r) {
  std::string text = r.out;
  while (!text.empty() && text.back() == '\n') text.pop_back();
  if (text.find('\n') != std::string::npos) return std::nullopt;
  return JsonParser::parse(text);
}

}  // namespace shardlock::lease::testing
