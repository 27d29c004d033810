#include "shardlock/internal/futex.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <ctime>

#include "shardlock/internal/cpu.h"

namespace shardlock::internal {
namespace {

// std::atomic<uint32_t> is layout-compatible with uint32_t on every target we
// build for; the kernel only reads the word.
static_assert(sizeof(std::atomic<std::uint32_t>) == sizeof(std::uint32_t));

std::uint32_t* raw(std::atomic<std::uint32_t>* word) noexcept {
  return reinterpret_cast<std::uint32_t*>(word);
}

}  // namespace

bool futex_wait(std::atomic<std::uint32_t>* word, std::uint32_t expected,
                std::int64_t deadline_ns) noexcept {
  if (deadline_ns < 0) {
    syscall(SYS_futex, raw(word), FUTEX_WAIT_PRIVATE, expected, nullptr, nullptr, 0);
    return true;
  }
  if (monotonic_nanos() >= deadline_ns) return false;
  // FUTEX_WAIT_BITSET takes an absolute CLOCK_MONOTONIC deadline, so a
  // spurious wake-up does not stretch the total wait.
  timespec abs{static_cast<time_t>(deadline_ns / 1'000'000'000),
               static_cast<long>(deadline_ns % 1'000'000'000)};
  const long rc = syscall(SYS_futex, raw(word), FUTEX_WAIT_BITSET_PRIVATE, expected, &abs, nullptr,
                          FUTEX_BITSET_MATCH_ANY);
  return !(rc == -1 && errno == ETIMEDOUT);
}

int futex_wake(std::atomic<std::uint32_t>* word, int count) noexcept {
  return static_cast<int>(
      syscall(SYS_futex, raw(word), FUTEX_WAKE_PRIVATE, count, nullptr, nullptr, 0));
}

}  // namespace shardlock::internal
