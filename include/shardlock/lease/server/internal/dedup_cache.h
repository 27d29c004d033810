// DedupCache: the lease shard's memory of recent answers, keyed by (client
// id, request id) and bounded by count with first-in, first-out eviction.
//
// Not API: Shard's building block. Not thread-safe (the shard lock guards it).
//
// Layout
//   * ring_: the entries in insertion order, up to `capacity` of them; once
//     the ring is full a new key overwrites the oldest entry.
//   * index_: open addressing with linear probing, at most half full. A slot
//     holds a ring position (+1; 0 is empty) and the low 32 bits of the
//     key's hash, so probes, removal and the backward shift that follows it
//     (no tombstones) read only the index; the ring is read for a hash match.
// A lookup touches one index slot and, on a match, one ring entry. The
// std::unordered_map it replaces chased one heap node per probe and took a
// quarter of the server's CPU samples under shardlock-bench.
#pragma once

#include <xxhash.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "shardlock/lease/wire/protocol.h"

namespace shardlock::lease::internal {

template <typename Value>
class DedupCache {
 public:
  // Larger capacities are clamped to this (ring positions are 32-bit).
  static constexpr std::size_t kMaxCapacity = std::size_t{1} << 30;

  // capacity 0 disables the cache (find() never finds, put() keeps nothing).
  // The index is allocated here (16 bytes per entry of capacity); the ring
  // grows as entries arrive (put() may throw std::bad_alloc until it is
  // full, leaving the cache unchanged). `seed` keys the index hash: client
  // ids and request ids come from the network, so a server passes a secret.
  explicit DedupCache(std::size_t capacity, std::uint64_t seed = 0)
      : capacity_(std::min(capacity, kMaxCapacity)), seed_(seed) {
    std::size_t slots = 1;
    while (slots < 2 * capacity_) slots *= 2;
    index_.assign(capacity_ == 0 ? 0 : slots, Slot{});
    mask_ = slots - 1;
  }

  [[nodiscard]] std::size_t size() const noexcept { return ring_.size(); }
  [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }

  // The value remembered for (client, request_id), or nullptr. Valid until
  // the next put().
  [[nodiscard]] const Value* find(const ClientId& client, std::uint64_t request_id) const noexcept {
    if (capacity_ == 0) return nullptr;
    const std::uint32_t h = hash(client, request_id);
    for (std::size_t i = h & mask_;; i = (i + 1) & mask_) {
      if (index_[i].position == 0) return nullptr;
      if (index_[i].hash != h) continue;
      const Entry& e = ring_[index_[i].position - 1];
      if (e.request_id == request_id && e.client == client) return &e.value;
    }
  }

  // Remembers `value` for (client, request_id), replacing an earlier value
  // for the same key; a new key evicts the oldest entry when full.
  void put(const ClientId& client, std::uint64_t request_id, const Value& value) {
    if (capacity_ == 0) return;
    const std::uint32_t h = hash(client, request_id);
    std::size_t i = h & mask_;
    for (; index_[i].position != 0; i = (i + 1) & mask_) {
      if (index_[i].hash != h) continue;
      Entry& e = ring_[index_[i].position - 1];
      if (e.request_id == request_id && e.client == client) {
        e.value = value;
        return;
      }
    }
    std::size_t position = ring_.size();
    if (position < capacity_) {
      ring_.push_back(Entry{client, request_id, value});
    } else {
      position = oldest_;
      oldest_ = oldest_ + 1 == capacity_ ? 0 : oldest_ + 1;
      unlink(position);
      ring_[position] = Entry{client, request_id, value};
      // The removal may have shifted an entry into the empty slot found
      // above; search again from the key's home.
      i = h & mask_;
      while (index_[i].position != 0) i = (i + 1) & mask_;
    }
    index_[i] = Slot{static_cast<std::uint32_t>(position + 1), h};
  }

 private:
  struct Entry {
    ClientId client;
    std::uint64_t request_id = 0;
    Value value{};
  };

  struct Slot {
    std::uint32_t position = 0;  // ring position + 1; 0: empty
    std::uint32_t hash = 0;      // low bits of hash(): the slot's home is hash & mask_
  };

  // XXH3 over (client id, request id) with the cache's seed: both come from
  // the network, so with a secret seed the slots of chosen ids cannot be
  // predicted (no offline-built collision chains).
  std::uint32_t hash(const ClientId& client, std::uint64_t request_id) const noexcept {
    const std::uint64_t words[3] = {client.lo, client.hi, request_id};
    return static_cast<std::uint32_t>(XXH3_64bits_withSeed(words, sizeof words, seed_));
  }

  // Removes ring position `position` from the index (backward-shift delete).
  void unlink(std::size_t position) noexcept {
    const auto wanted = static_cast<std::uint32_t>(position + 1);
    std::size_t hole = hash(ring_[position].client, ring_[position].request_id) & mask_;
    while (index_[hole].position != wanted) hole = (hole + 1) & mask_;
    for (std::size_t next = (hole + 1) & mask_; index_[next].position != 0;
         next = (next + 1) & mask_) {
      const std::size_t want = index_[next].hash & mask_;
      // Move the entry back into the hole unless its home lies cyclically
      // in (hole, next]: then the hole is before its home and it must stay.
      const bool stays =
          hole <= next ? (hole < want && want <= next) : (hole < want || want <= next);
      if (!stays) {
        index_[hole] = index_[next];
        hole = next;
      }
    }
    index_[hole] = Slot{};
  }

  std::size_t capacity_;
  std::uint64_t seed_;
  std::vector<Entry> ring_;  // insertion order, wrapping at capacity_
  std::size_t oldest_ = 0;   // once full: the next position to overwrite
  std::vector<Slot> index_;
  std::size_t mask_ = 0;
};

}  // namespace shardlock::lease::internal
