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
// Sampling: recording costs the request path a scan of the slot hashes and,
// for a key without a slot once all are taken, a scan of the counts and a
// copy of the key (about 20 ns, a tenth of a QUERY through the dispatcher).
// So while the (decayed) counts sum to less than `exact_requests` (default
// kExactRequests) every request is recorded as above, exactly; beyond that
// one request in kSampleEvery, drawn by a per-sketch xorshift (no period a
// traffic pattern could fall in step with), is recorded with weight
// kSampleEvery and the others only cost the draw. The algorithm's bounds
// then hold for the weighted stream, whose count for each key is an unbiased
// estimate of its true count n with a standard deviation of
// sqrt((kSampleEvery - 1) n), about 3.9 sqrt(n): 12% at n = 1000, 4% at
// 10000, 1.2% at 100000; likewise for the sum N, so the smallest count is
// about N / capacity, and the busy counts are estimates of the same kind.
// At kExactRequests = 4096 and 16 slots that noise, sqrt(15 N), is already
// below the algorithm's own error bound N / 16 (N > 3840).
//
// Cost, measured with build/release/bench/lease_benchmark
// --benchmark_filter='Dispatcher|ShardAcquire|HotKeys' (release preset, GCC
// 12, a shared 2-vCPU AMD EPYC VM; the table is in docs/lease-server.md,
// "Hot keys"): sketch off against 16 slots 1.00-1.03, within the runs'
// noise; one record() 6.4 ns (24.3 ns before sampling).
//
// Keys are told apart by their 64-bit seeded hash (Shard's), so two keys
// that collide share a slot.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

namespace shardlock::lease::internal {

class HotKeys {
 public:
  static constexpr std::int64_t kDefaultHalfLifeMs = 10'000;
  // Every request is recorded until the counts sum to this; then one in
  // kSampleEvery, with that weight (see Sampling above).
  static constexpr std::uint64_t kExactRequests = 4096;
  static constexpr std::uint32_t kSampleEvery = 16;
  static constexpr std::uint64_t kNeverSample = UINT64_MAX;

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
  // halve at origin_ms + k x half_life_ms. `exact_requests`: the sum of the
  // counts below which every request is recorded (kNeverSample: always);
  // `sample_seed` seeds the draw (not 0).
  HotKeys(std::size_t capacity, std::size_t max_key_length, std::int64_t half_life_ms,
          std::int64_t origin_ms, std::uint64_t exact_requests = kExactRequests,
          std::uint64_t sample_seed = 0x9e3779b97f4a7c15);

  [[nodiscard]] bool enabled() const noexcept { return capacity_ > 0; }
  [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }
  // Slots with a key (those halved to 0 included).
  [[nodiscard]] std::size_t size() const noexcept { return used_; }
  [[nodiscard]] std::int64_t origin_ms() const noexcept { return origin_ms_; }
  // The sum of the counts: the (decayed, weighted) requests recorded.
  [[nodiscard]] std::uint64_t total() const noexcept { return total_; }
  // Whether record() samples now (the counts reached exact_requests).
  [[nodiscard]] bool sampling() const noexcept { return total_ >= exact_requests_; }

  // Counts one request for `key` (hash `key_hash`) at `now_ms`, and one BUSY
  // answer if `busy`. Never allocates, never throws.
  void record(std::uint64_t key_hash, std::string_view key, bool busy,
              std::int64_t now_ms) noexcept {
    if (capacity_ == 0 || key.size() > max_key_length_) return;
    if (half_life_ms_ > 0 && now_ms >= next_halving_ms_) halve_until(now_ms);
    std::uint32_t weight = 1;
    if (sampling()) {
      // xorshift64 (Marsaglia); its top bits are the better ones.
      random_ ^= random_ << 13;
      random_ ^= random_ >> 7;
      random_ ^= random_ << 17;
      if ((random_ >> kSampleShift) != 0) return;
      weight = kSampleEvery;
    }
    // Four hashes per branch: a miss, the common case for a cold key, takes
    // capacity / 4 well-predicted branches instead of capacity.
    const std::uint64_t* h = hashes_.data();
    for (std::size_t i = 0; i < used_; i += 4) {
      if ((h[i] == key_hash) | (h[i + 1] == key_hash) | (h[i + 2] == key_hash) |
          (h[i + 3] == key_hash)) {
        for (std::size_t j = i; j < i + 4 && j < used_; ++j) {
          if (h[j] == key_hash) {
            add(j, busy, weight);
            return;
          }
        }
      }
    }
    take_slot(key_hash, key, busy, weight);
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

  // A draw keeps a request when these top bits of the state are all 0.
  static constexpr int kSampleShift = 64 - std::countr_zero(kSampleEvery);
  static_assert(std::has_single_bit(kSampleEvery));

  static void saturating_add(std::uint32_t& value, std::uint32_t weight) noexcept {
    value = value > UINT32_MAX - weight ? UINT32_MAX : value + weight;
  }
  void add(std::size_t i, bool busy, std::uint32_t weight) noexcept {
    saturating_add(counts_[i], weight);
    if (busy) saturating_add(slots_[i].busy, weight);
    total_ += weight;
  }
  // Steps 2 and 3 above: a free slot, else the smallest count's.
  void take_slot(std::uint64_t key_hash, std::string_view key, bool busy,
                 std::uint32_t weight) noexcept;
  // Halves every count once per boundary passed by `now_ms`.
  void halve_until(std::int64_t now_ms) noexcept;

  std::size_t capacity_;
  std::size_t max_key_length_;
  std::int64_t half_life_ms_;
  std::int64_t origin_ms_;
  std::int64_t next_halving_ms_ = 0;
  std::uint64_t exact_requests_;
  std::uint64_t random_;  // the sampling draw's state, never 0
  std::uint64_t total_ = 0;
  std::size_t used_ = 0;
  // capacity() rounded up to 4 (the lookup reads four at a time); [0,
  // used_) hold keys.
  std::vector<std::uint64_t> hashes_;
  std::vector<std::uint32_t> counts_;
  std::vector<Slot> slots_;
  std::vector<char> key_bytes_;  // max_key_length_ per slot
};

}  // namespace shardlock::lease::internal
