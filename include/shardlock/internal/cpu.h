// CPU-level helpers for spin loops: the pause hint, cache-line size and a
// cheap monotonic tick counter for time-budgeted backoff. Not API.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <ctime>
#include <string>
#include <type_traits>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace shardlock::internal {

// Destructive-interference size. 64 bytes on x86-64 and most AArch64 parts.
// Padding uses twice this (kFalseSharingRange) because x86's adjacent-line
// prefetcher pulls cache lines in pairs, so two hot words 64 bytes apart
// still ping-pong (as folly's hardware_destructive_interference_size notes).
inline constexpr std::size_t kCacheLine = 64;
inline constexpr std::size_t kFalseSharingRange = 128;

// Tells the core we are spinning: frees pipeline resources for a sibling
// hyperthread and avoids the memory-order-violation flush on loop exit.
inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#else
  asm volatile("" ::: "memory");
#endif
}

// Asks the cache for `address`'s line in exclusive state, without waiting.
// A lock word read by a plain load first (a TTAS fast path) and then
// exchanged costs two coherence transactions when another core wrote it
// last: one to share the line, one to upgrade it. Issued just before the
// load, PREFETCHW makes that one. On x86 CPUs without it (Intel before
// Broadwell) the opcode executes as a NOP. It is inline asm because
// __builtin_prefetch(p, 1) is no substitute: unless the build enables
// -mprfchw, GCC emits PREFETCHT0 for it, a read prefetch that fetches the
// line shared, which is exactly the first of the two transactions.
inline void prefetch_for_write(const void* address) noexcept {
#if defined(__x86_64__) || defined(__i386__)
  asm volatile("prefetchw %0" : : "m"(*static_cast<const char*>(address)));
#else
  __builtin_prefetch(address, 1, 3);
#endif
}

// Monotonic nanoseconds. clock_gettime(CLOCK_MONOTONIC) goes through the vDSO
// (about 20 ns), cheap enough to consult between batches of pauses.
inline std::int64_t monotonic_nanos() noexcept {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

// The CPU's name with its family and model numbers, from /proc/cpuinfo
// ("AMD EPYC (family 25 model 17)"), or "unknown CPU". Benchmarks print it next to every figure:
// the locks' ratios differ between CPU families, so numbers must never be
// compared across CPUs by accident. Reads a file; not for hot paths.
std::string cpu_model_name();

// Converts a steady_clock deadline to monotonic nanoseconds. libstdc++'s
// steady_clock is CLOCK_MONOTONIC, so this is exact on Linux.
inline std::int64_t to_monotonic_nanos(std::chrono::steady_clock::time_point t) noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

// Converts any clock's deadline to a CLOCK_MONOTONIC nanosecond deadline, the
// form the lock slow paths and FUTEX_WAIT_BITSET take.
template <class Clock, class Duration>
std::int64_t deadline_nanos(const std::chrono::time_point<Clock, Duration>& deadline) noexcept {
  if constexpr (std::is_same_v<Clock, std::chrono::steady_clock>) {
    return to_monotonic_nanos(std::chrono::time_point_cast<std::chrono::steady_clock::duration>(
        std::chrono::ceil<std::chrono::nanoseconds>(deadline)));
  } else {
    return to_monotonic_nanos(std::chrono::steady_clock::now() +
                              std::chrono::ceil<std::chrono::nanoseconds>(deadline - Clock::now()));
  }
}

}  // namespace shardlock::internal
