// HotKeys: a bounded top-K of one shard's busiest keys, for HOT_KEYS
// (shardlockctl top). Not API: a Shard's member, touched under its lock.
//
// Algorithm: space-saving (Metwally, Agrawal and El Abbadi, "Efficient
// computation of frequent and top-k elements in data streams", ICDT 2005).
// `capacity` slots, each a key, a count and an error:
//   1. a request for a key in a slot adds 1 to its count;
//   2. for a key in no slot, a free slot takes it with count 1, error 0;
//   3. with none free, the slot of the smallest count m is given to it, with
//      count m + 1 and error m (it may have been requested up to m times
//      before, uncounted).
// Counts sum to the requests recorded, so the smallest is at most
// N / capacity, and for each slot count - error <= true count <= count. A
// key requested more than N / capacity times is always in a slot. Memory is
// fixed at construction (the keys' bytes included): no per-key growth.
//
// Decay: a live view wants the hot keys of now, not of last week. Every
// `half_life_ms` from `origin_ms` (the server's start, the same in every
// shard, so their counts weigh alike and merge), each count and error is
// halved (rounded down), so a request weighs 2^-k after k boundaries; the
// bounds above hold for the weighted counts, give or take the rounding
// (under 1). window_ms() is the weighted time the counts cover: count /
// window is a rate.
//
// Cost per record(): a scan of `capacity` hashes in one array (two cache
// lines at 16), four per branch; a miss when full also scans the counts
// (one cache line) for the smallest and copies the key. Measured with
// build/bench/bench/lease_benchmark --benchmark_filter='Dispatcher|HotKeys'
// (bench preset, GCC 12, a shared 2-vCPU AMD EPYC VM): one record() of a
// Zipf(0.99) key over 100000, 24 ns at 16 slots; a QUERY datagram through
// the dispatcher 208 ns with or without the sketch when its key has a slot,
// 215 -> 236 ns when every key misses (docs/lease-server.md, "Hot keys").
// Keys are told apart by their 64-bit seeded hash (Shard's), so two keys
// that collide share a slot.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

namespace shardlock::lease::internal {

class HotKeys {
 public:
  static constexpr std::int64_t kDefaultHalfLifeMs = 10'000;

  // One slot, as for_each() shows it: `key` views the sketch's own buffer,
  // valid until the next record().
  struct Entry {
    std::uint64_t hash = 0;  // the key_hash it was recorded with
    std::string_view key;
    std::uint32_t requests = 0;  // the (decayed) count: an upper bound
    std::uint32_t error = 0;     // requests - error is a lower bound
    std::uint32_t busy = 0;      // BUSY answers counted while the key held its slot
  };

  // `capacity` 0: disabled, record() does nothing. Keys longer than
  // `max_key_length` are not recorded. half_life_ms 0: no decay; else counts
  // halve at origin_ms + k x half_life_ms.
  HotKeys(std::size_t capacity, std::size_t max_key_length, std::int64_t half_life_ms,
          std::int64_t origin_ms);

  [[nodiscard]] bool enabled() const noexcept { return capacity_ > 0; }
  [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }
  // Slots with a key (those halved to 0 included).
  [[nodiscard]] std::size_t size() const noexcept { return used_; }
  [[nodiscard]] std::int64_t origin_ms() const noexcept { return origin_ms_; }

  // Counts one request for `key` (hash `key_hash`) at `now_ms`, and one BUSY
  // answer if `busy`. Never allocates, never throws.
  void record(std::uint64_t key_hash, std::string_view key, bool busy,
              std::int64_t now_ms) noexcept {
    if (capacity_ == 0 || key.size() > max_key_length_) return;
    if (half_life_ms_ > 0 && now_ms >= next_halving_ms_) halve_until(now_ms);
    // Four hashes per branch: a miss, the common case for a cold key, takes
    // capacity / 4 well-predicted branches instead of capacity.
    const std::uint64_t* h = hashes_.data();
    for (std::size_t i = 0; i < used_; i += 4) {
      if ((h[i] == key_hash) | (h[i + 1] == key_hash) | (h[i + 2] == key_hash) |
          (h[i + 3] == key_hash)) {
        for (std::size_t j = i; j < i + 4 && j < used_; ++j) {
          if (h[j] == key_hash) {
            add(j, busy);
            return;
          }
        }
      }
    }
    take_slot(key_hash, key, busy);
  }

  // Calls fn(const Entry&) for each slot with a count above 0, in no order,
  // after the halvings due by `now_ms`.
  template <class Fn>
  void for_each(std::int64_t now_ms, Fn&& fn) {
    if (half_life_ms_ > 0 && now_ms >= next_halving_ms_) halve_until(now_ms);
    for (std::size_t i = 0; i < used_; ++i) {
      if (counts_[i] == 0) continue;
      const Slot& s = slots_[i];
      fn(Entry{hashes_[i], std::string_view(&key_bytes_[i * max_key_length_], s.key_length),
               counts_[i], s.error, s.busy});
    }
  }

  // The weight in milliseconds of the time from `origin_ms` to `now_ms`,
  // each millisecond weighing as a request made then does after the
  // halvings since (half_life_ms 0: now_ms - origin_ms): a key requested r
  // times a second throughout has a count near r * window_ms / 1000.
  [[nodiscard]] static std::int64_t window_ms(std::int64_t origin_ms, std::int64_t now_ms,
                                              std::int64_t half_life_ms) noexcept;

 private:
  // What a slot holds besides its hash and count, which live in arrays of
  // their own: a hit scans the hashes alone, a miss the counts alone.
  struct Slot {
    std::uint32_t error = 0;
    std::uint32_t busy = 0;
    std::uint32_t key_length = 0;
  };
  static_assert(sizeof(Slot) == 12);

  void add(std::size_t i, bool busy) noexcept {
    if (counts_[i] != UINT32_MAX) ++counts_[i];  // saturates
    if (busy && slots_[i].busy != UINT32_MAX) ++slots_[i].busy;
  }
  // Steps 2 and 3 above: a free slot, else the smallest count's.
  void take_slot(std::uint64_t key_hash, std::string_view key, bool busy) noexcept;
  // Halves every count once per boundary passed by `now_ms`.
  void halve_until(std::int64_t now_ms) noexcept;

  std::size_t capacity_;
  std::size_t max_key_length_;
  std::int64_t half_life_ms_;
  std::int64_t origin_ms_;
  std::int64_t next_halving_ms_ = 0;
  std::size_t used_ = 0;
  // capacity() rounded up to 4 (the lookup reads four at a time); [0,
  // used_) hold keys.
  std::vector<std::uint64_t> hashes_;
  std::vector<std::uint32_t> counts_;
  std::vector<Slot> slots_;
  std::vector<char> key_bytes_;  // max_key_length_ per slot
};

}  // namespace shardlock::lease::internal
