// TokenStore: the durable per-shard token high-water marks behind
// --data-dir, and ShardTokens, the per-shard counter that issues from them.
//
// Not API: LeaseServer uses it; tests drive it directly.
//
// Layout of the data dir
//   lock               flock(2)ed while a server owns the directory
//   meta               magic, format version, shard count, lease bound (the
//                      longest a lease granted so far may outlive the
//                      server, in ms: the next run's default lock-delay),
//                      xxh3 checksum
//   shard-NNNNN.hwm    magic, shard index, high-water mark, xxh3 checksum
//   *.tmp              a write interrupted by a crash; removed at open
//
// Invariant: a token t of shard s is issued only after shard-s.hwm durably
// holds a value >= t (write temp, fsync, rename, fsync the directory). At
// open, every shard starts above floor() = the largest mark in any file, so
// every token issued after a restart exceeds every token issued before it,
// whatever the shard counts of the two runs.
//
// Write order: initialize() writes every shard file, then meta; meta is only
// ever replaced by a rename, never removed. So a dir with shard files but no
// meta is a first start cut short, before any token was issued: open()
// accepts it (tokens start above the marks anyway).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <system_error>

#include "shardlock/lease/internal/latency_histogram.h"
#include "shardlock/lease/server.h"

namespace shardlock::lease::internal {

class TokenStore {
 public:
  ~TokenStore();
  TokenStore(const TokenStore&) = delete;
  TokenStore& operator=(const TokenStore&) = delete;

  // Opens `dir` (creating it, but not its parents, if missing), takes its
  // lock and reads every mark. A missing, truncated or mis-checksummed file
  // that a previous run wrote is kDataDirCorrupt (a ServerError), never a
  // silent reset; `detail` names the file. Another live owner is
  // kDataDirLocked. Shard files without meta are a first start cut short
  // (see above), not an error.
  [[nodiscard]] static std::error_code open(const std::string& dir,
                                            std::unique_ptr<TokenStore>& out, std::string& detail);

  // Every token issued by any earlier run is <= floor().
  [[nodiscard]] std::uint64_t floor() const noexcept { return floor_; }

  // The longest a lease granted by an earlier run may still be live, as
  // recorded by it (see record_lease_bound); 0 if unknown (fresh dir).
  [[nodiscard]] std::uint64_t previous_lease_bound_ms() const noexcept { return lease_bound_ms_; }

  // Durably records `high_water` for shards 0..shards-1, the shard count and
  // `lease_bound_ms`, before the server issues anything.
  [[nodiscard]] std::error_code initialize(std::uint32_t shards, std::uint64_t high_water,
                                           std::uint64_t lease_bound_ms, std::string& detail);

  // Durably records in meta how long a lease of this or an earlier run may
  // still be live after this run dies: the next run's default lock-delay.
  // Not thread-safe against itself (the server calls it from one thread).
  [[nodiscard]] std::error_code record_lease_bound(std::uint64_t lease_bound_ms,
                                                   std::string& detail);

  // Durably records `high_water` for one shard. Thread-safe for distinct
  // shards (each call writes its own files); blocks for the fsyncs.
  [[nodiscard]] std::error_code reserve(std::uint32_t shard, std::uint64_t high_water,
                                        std::string& detail);

  [[nodiscard]] const std::string& dir() const noexcept { return dir_; }
  // Reservations made so far and their durations, added to `stats`.
  void add_stats(ServerStats& stats) const noexcept;

 private:
  TokenStore() = default;

  std::string dir_;
  int dir_fd_ = -1;
  int lock_fd_ = -1;
  std::uint64_t floor_ = 0;
  std::uint64_t lease_bound_ms_ = 0;
  std::uint32_t shards_ = 0;
  std::atomic<std::uint64_t> reservations_{0};
  AtomicLatencyHistogram reservation_latency_;
};

// One shard's token counter. Not thread-safe: the shard lock guards it.
class ShardTokens {
 public:
  // In-memory counter starting after `last` (no data dir).
  explicit ShardTokens(std::uint64_t last = 0) noexcept
      : last_(last), reserved_(~std::uint64_t{0}) {}
  // Durable counter: `reserved` is already on disk for this shard.
  ShardTokens(TokenStore* store, std::uint32_t shard, std::uint64_t last, std::uint64_t reserved,
              std::uint64_t block) noexcept
      : store_(store), shard_(shard), block_(block), last_(last), reserved_(reserved) {}

  // Issues the next token, reserving (durably) a new block first when the
  // current one is used up. Returns 0 if the reservation failed; then no
  // token is issued and `detail` says why.
  [[nodiscard]] std::uint64_t next(std::string& detail);

  [[nodiscard]] std::uint64_t last() const noexcept { return last_; }

 private:
  TokenStore* store_ = nullptr;
  std::uint32_t shard_ = 0;
  std::uint64_t block_ = 0;
  std::uint64_t last_;
  std::uint64_t reserved_;
};

}  // namespace shardlock::lease::internal
