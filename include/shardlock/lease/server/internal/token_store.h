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
//   shard-NNNNN.hwm    magic "SLTOKEN2", shard index, mode (plain or cluster),
//                      high-water mark of the raw counter, token ceiling,
//                      xxh3 checksum (40 bytes; "SLTOKEN1" files, 32 bytes
//                      without mode and ceiling, are still read: plain,
//                      ceiling = mark)
//   *.tmp              a write interrupted by a crash; removed at open
//
// Invariant: a raw counter value r of shard s is drawn only after
// shard-s.hwm durably holds a mark >= r and a ceiling >= every token r can
// become (r itself in plain mode; epoch << 32 | counter in cluster mode,
// docs/cluster.md) - one write, one set of fsyncs (write temp, fsync, rename,
// fsync the directory). At open, floor() is the largest mark in any file and
// token_floor() the largest ceiling: every token any earlier run issued, in
// either mode, is <= token_floor(). A plain run starts its counters above
// both; a cluster run composes only in epochs above token_floor() >> 32
// (Shard refuses the others), so a data dir reused in the other mode never
// issues a token below one it issued before.
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

#include "shardlock/lease/server/internal/latency_histogram.h"
#include "shardlock/lease/server/server_types.h"

namespace shardlock::lease::internal {

// How a run turns its raw counter into tokens: as they are (a single
// node), or as epoch << 32 | counter (cluster mode). Recorded per shard file.
enum class TokenMode : std::uint32_t { kPlain = 0, kCluster = 1 };

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

  // Every raw counter value drawn by any earlier run is <= floor().
  [[nodiscard]] std::uint64_t floor() const noexcept { return floor_; }
  // Every token (as clients saw it, composed or not) issued by any earlier
  // run is <= token_floor().
  [[nodiscard]] std::uint64_t token_floor() const noexcept { return token_floor_; }
  // Whether an earlier run used the dir in cluster mode (some shard file
  // says so).
  [[nodiscard]] bool used_in_cluster_mode() const noexcept { return cluster_before_; }

  // Whether no earlier run ever issued a token from this dir: it had no
  // meta at open (new or empty, or a first start cut short before meta).
  // Such a dir has no lease of its own to wait out (LeaseServer skips the
  // lock-delay) but may have replaced a wiped one: a plain run starts its
  // tokens above wall_clock_token_floor() then.
  [[nodiscard]] bool fresh() const noexcept { return fresh_; }
  // The longest a lease granted by an earlier run may still be live, as
  // recorded by it (see record_lease_bound); 0 if unknown (fresh dir).
  [[nodiscard]] std::uint64_t previous_lease_bound_ms() const noexcept { return lease_bound_ms_; }

  // Durably records, before the server issues anything, for shards
  // 0..shards-1 this run's `mode`, `high_water` (raw) and `token_ceiling`
  // (raised to token_floor() if lower), then the shard count and
  // `lease_bound_ms`. Later reserve()s write `mode` too.
  [[nodiscard]] std::error_code initialize(std::uint32_t shards, TokenMode mode,
                                           std::uint64_t high_water, std::uint64_t token_ceiling,
                                           std::uint64_t lease_bound_ms, std::string& detail);

  // Durably records in meta how long a lease of this or an earlier run may
  // still be live after this run dies: the next run's default lock-delay.
  // Not thread-safe against itself (the server calls it from one thread).
  [[nodiscard]] std::error_code record_lease_bound(std::uint64_t lease_bound_ms,
                                                   std::string& detail);

  // Durably records `high_water` (raw) and `token_ceiling` (the largest
  // token the block up to it can become; raised to token_floor() if lower)
  // for one shard. Thread-safe for distinct shards (each call writes its own
  // files); blocks for the fsyncs.
  [[nodiscard]] std::error_code reserve(std::uint32_t shard, std::uint64_t high_water,
                                        std::uint64_t token_ceiling, std::string& detail);

  [[nodiscard]] const std::string& dir() const noexcept { return dir_; }
  // Reservations made so far and their durations, added to `stats`.
  void add_stats(ServerStats& stats) const noexcept;

 private:
  TokenStore() = default;

  std::string dir_;
  int dir_fd_ = -1;
  int lock_fd_ = -1;
  std::uint64_t floor_ = 0;
  std::uint64_t token_floor_ = 0;
  bool cluster_before_ = false;
  bool fresh_ = false;
  std::uint64_t lease_bound_ms_ = 0;
  std::uint32_t shards_ = 0;
  TokenMode mode_ = TokenMode::kPlain;
  std::atomic<std::uint64_t> reservations_{0};
  AtomicLatencyHistogram reservation_latency_;
};

// The first raw counter value of a plain run on a fresh data dir:
// `wall_ms` (milliseconds since the Unix epoch) << 20. A fresh dir may be a
// wiped one whose clients still hold leases (docs/lease-server.md, "A fresh
// data dir"): every token that dir's runs issued is below this floor as long
// as they started at a floor of their own (or from 1, before floors
// existed) and drew fewer than 2^20 tokens per millisecond of wall clock
// since, about a billion a second. 2026's floor is about 2^60.7, leaving
// centuries of tokens.
[[nodiscard]] constexpr std::uint64_t wall_clock_token_floor(std::uint64_t wall_ms) noexcept {
  return wall_ms << 20;
}

// One shard's token counter. Not thread-safe: the shard lock guards it.
class ShardTokens {
 public:
  // In-memory counter starting after `last` (no data dir).
  explicit ShardTokens(std::uint64_t last = 0) noexcept
      : last_(last), reserved_(~std::uint64_t{0}) {}
  // Durable counter: `reserved` is already on disk for this shard (pass
  // `last` when nothing is: the first next() reserves). `mode` kCluster:
  // the raw values become epoch << 32 | counter (begin_epoch()), and each
  // reservation records the largest such token as its ceiling.
  ShardTokens(TokenStore* store, std::uint32_t shard, std::uint64_t last, std::uint64_t reserved,
              std::uint64_t block, TokenMode mode = TokenMode::kPlain) noexcept
      : store_(store),
        shard_(shard),
        block_(block),
        last_(last),
        reserved_(reserved),
        composed_(mode == TokenMode::kCluster),
        epoch_base_(last) {}

  // Draws the next raw value, reserving (durably) a new block first when
  // the current one is used up. Returns 0 if the reservation failed; then
  // nothing is drawn and `detail` says why.
  [[nodiscard]] std::uint64_t next(std::string& detail);

  // Cluster mode: from the next value on, tokens are composed in `epoch`
  // with counter = raw - epoch_base(), so the first one is counter 1. With a
  // store, the next value reserves a new block, whose ceiling covers the new
  // epoch (once per epoch per shard; the old block's rest is skipped).
  void begin_epoch(std::uint64_t epoch) noexcept;
  [[nodiscard]] std::uint64_t epoch_base() const noexcept { return epoch_base_; }

  [[nodiscard]] std::uint64_t last() const noexcept { return last_; }

 private:
  // The largest token a raw value up to `mark` can become now.
  [[nodiscard]] std::uint64_t ceiling(std::uint64_t mark) const noexcept;

  TokenStore* store_ = nullptr;
  std::uint32_t shard_ = 0;
  std::uint64_t block_ = 0;
  std::uint64_t last_;
  std::uint64_t reserved_;
  bool composed_ = false;
  std::uint64_t epoch_ = 0;
  std::uint64_t epoch_base_ = 0;
};

}  // namespace shardlock::lease::internal
