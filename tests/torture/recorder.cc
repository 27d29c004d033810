// See recorder.h.
#include "recorder.h"

#include <fcntl.h>
#include <time.h>
#include <unistd.h>

namespace shardlock::torture {

std::int64_t monotonic_ns() noexcept {
  timespec ts{};
  (void)::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

Recorder::~Recorder() {
  if (fd_ >= 0) ::close(fd_);
}

bool Recorder::open(const std::string& path) {
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
  return fd_ >= 0;
}

void Recorder::record(Event e) const noexcept {
  if (fd_ < 0) return;
  if (e.t_ns == 0) e.t_ns = monotonic_ns();
  try {
    std::string line = format_event(e);
    line += '\n';
    (void)!::write(fd_, line.data(), line.size());
  } catch (...) {
    // Out of memory while formatting: the event is lost, the run goes on.
  }
}

}  // namespace shardlock::torture
