// The space-saving sketch behind HOT_KEYS. See hot_keys.h.
#include "shardlock/lease/server/internal/hot_keys.h"

#include <algorithm>
#include <cstring>

namespace shardlock::lease::internal {

HotKeys::HotKeys(std::size_t capacity, std::size_t max_key_length, std::int64_t half_life_ms,
                 std::int64_t origin_ms, std::uint64_t exact_requests, std::uint64_t sample_seed)
    : capacity_(capacity),
      max_key_length_(max_key_length),
      half_life_ms_(std::max<std::int64_t>(half_life_ms, 0)),
      origin_ms_(origin_ms),
      exact_requests_(exact_requests),
      random_(sample_seed != 0 ? sample_seed : 1),
      hashes_((capacity + 3) / 4 * 4),
      counts_(capacity),
      slots_(capacity),
      key_bytes_(capacity * max_key_length) {
  if (half_life_ms_ > 0) next_halving_ms_ = origin_ms + half_life_ms_;
}

void HotKeys::take_slot(std::uint64_t key_hash, std::string_view key, bool busy,
                        std::uint32_t weight) noexcept {
  std::size_t i = used_;
  std::uint32_t floor = 0;
  if (used_ < capacity_) {
    ++used_;
  } else {
    // The smallest count, branch-free, then its first slot.
    floor = counts_[0];
    for (const std::uint32_t c : counts_) floor = std::min(floor, c);
    i = static_cast<std::size_t>(std::find(counts_.begin(), counts_.end(), floor) -
                                 counts_.begin());
  }
  hashes_[i] = key_hash;
  counts_[i] = floor;
  Slot& s = slots_[i];
  s.error = floor;
  s.busy = 0;
  s.key_length = static_cast<std::uint32_t>(key.size());
  if (!key.empty()) std::memcpy(&key_bytes_[i * max_key_length_], key.data(), key.size());
  add(i, busy, weight);
}

void HotKeys::halve_until(std::int64_t now_ms) noexcept {
  const std::int64_t periods = (now_ms - next_halving_ms_) / half_life_ms_ + 1;
  next_halving_ms_ += periods * half_life_ms_;
  const int shift = static_cast<int>(std::min<std::int64_t>(periods, 32));
  total_ = 0;
  for (std::size_t i = 0; i < used_; ++i) {
    Slot& s = slots_[i];
    // A u32 shifted by 32 is undefined: that many halvings leave nothing.
    counts_[i] = shift >= 32 ? 0 : counts_[i] >> shift;
    s.error = shift >= 32 ? 0 : s.error >> shift;
    s.busy = shift >= 32 ? 0 : s.busy >> shift;
    total_ += counts_[i];
  }
}

std::int64_t HotKeys::window_ms(std::int64_t origin_ms, std::int64_t now_ms,
                                std::int64_t half_life_ms) noexcept {
  if (now_ms <= origin_ms) return 0;
  if (half_life_ms <= 0) return now_ms - origin_ms;
  // Walk back from now, one period between boundaries at a time, each
  // weighing half the one after it, until the origin or the weight is gone.
  std::int64_t end = now_ms;
  std::int64_t start = origin_ms + (now_ms - origin_ms) / half_life_ms * half_life_ms;
  std::int64_t total = 0;
  for (int halvings = 0; halvings < 32 && end > origin_ms; ++halvings) {
    total += (end - start) >> halvings;
    end = start;
    start -= half_life_ms;
  }
  return total;
}

}  // namespace shardlock::lease::internal
