// recorder.h: appends history events (history.h) to one writer's file.
//
// Each event is one write(2) of one line to a file opened O_APPEND, with no
// user-space buffer: a writer that is paused or killed loses nothing it
// completed, and several threads may share a Recorder (the kernel does not
// interleave the bytes of one small append).
#pragma once

#include <cstdint>
#include <string>

#include "history.h"

namespace shardlock::torture {

// CLOCK_MONOTONIC in nanoseconds: the history's clock.
[[nodiscard]] std::int64_t monotonic_ns() noexcept;

class Recorder {
 public:
  Recorder() = default;
  ~Recorder();
  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;

  // Creates (truncates) `path`. False, with errno set, on failure.
  [[nodiscard]] bool open(const std::string& path);
  // Stamps `e` with monotonic_ns() unless it has a time, and appends it.
  void record(Event e) const noexcept;

 private:
  int fd_ = -1;
};

}  // namespace shardlock::torture
