// Durable token high-water marks. See internal/token_store.h.
#include "shardlock/lease/server/internal/token_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <set>
#include <span>
#include <string_view>

#include "shardlock/internal/durable_file.h"
#include "shardlock/lease/server/server.h"
#include "shardlock/lease/wire/epoch_token.h"

namespace shardlock::lease::internal {

using shardlock::internal::replace_file_durably;
namespace {

constexpr std::size_t kRecordSize = 32;       // meta, and shard files of format 1
constexpr std::size_t kShardRecordSize = 40;  // shard files of format 2
constexpr std::size_t kLargestRecord = kShardRecordSize;
constexpr char kShardMagicV1[8] = {'S', 'L', 'T', 'O', 'K', 'E', 'N', '1'};
constexpr char kShardMagic[8] = {'S', 'L', 'T', 'O', 'K', 'E', 'N', '2'};
constexpr char kMetaMagic[8] = {'S', 'L', 'M', 'E', 'T', 'A', '0', '1'};
constexpr std::uint32_t kFormatVersion = 1;

using Record = std::array<std::uint8_t, kRecordSize>;
using ShardRecord = std::array<std::uint8_t, kShardRecordSize>;

void put_u32(std::uint8_t* p, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<std::uint8_t>(v >> (8 * i));
}
void put_u64(std::uint8_t* p, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<std::uint8_t>(v >> (8 * i));
}
std::uint32_t get_u32(const std::uint8_t* p) {
  std::uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= std::uint32_t{p[i]} << (8 * i);
  return v;
}
std::uint64_t get_u64(const std::uint8_t* p) {
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= std::uint64_t{p[i]} << (8 * i);
  return v;
}

// Layout: magic[8], u32 a, u32 b, u64 c, u64 xxh3(bytes 0..23).
Record make_record(const char (&magic)[8], std::uint32_t a, std::uint32_t b, std::uint64_t c) {
  Record r{};
  std::memcpy(r.data(), magic, 8);
  put_u32(r.data() + 8, a);
  put_u32(r.data() + 12, b);
  put_u64(r.data() + 16, c);
  put_u64(r.data() + 24, XXH3_64bits(r.data(), 24));
  return r;
}

bool parse_record(const Record& r, const char (&magic)[8], std::uint32_t& a, std::uint32_t& b,
                  std::uint64_t& c) {
  if (std::memcmp(r.data(), magic, 8) != 0) return false;
  if (get_u64(r.data() + 24) != XXH3_64bits(r.data(), 24)) return false;
  a = get_u32(r.data() + 8);
  b = get_u32(r.data() + 12);
  c = get_u64(r.data() + 16);
  return true;
}

// Shard file, format 2: magic[8], u32 shard, u32 mode (TokenMode), u64 raw
// mark, u64 token ceiling, u64 xxh3(bytes 0..31).
ShardRecord make_shard_record(std::uint32_t shard, TokenMode mode, std::uint64_t mark,
                              std::uint64_t ceiling) {
  ShardRecord r{};
  std::memcpy(r.data(), kShardMagic, 8);
  put_u32(r.data() + 8, shard);
  put_u32(r.data() + 12, static_cast<std::uint32_t>(mode));
  put_u64(r.data() + 16, mark);
  put_u64(r.data() + 24, ceiling);
  put_u64(r.data() + 32, XXH3_64bits(r.data(), 32));
  return r;
}

struct ShardMark {
  std::uint32_t shard = 0;
  TokenMode mode = TokenMode::kPlain;
  std::uint64_t mark = 0;
  std::uint64_t ceiling = 0;
};

// Either format; format 1 (before the data dir recorded cluster tokens) had plain tokens only, so
// its ceiling is its mark.
bool parse_shard_record(std::span<const std::uint8_t> bytes, ShardMark& out) {
  if (bytes.size() == kRecordSize) {
    Record r{};
    std::memcpy(r.data(), bytes.data(), kRecordSize);
    std::uint32_t zero = 0;
    if (!parse_record(r, kShardMagicV1, out.shard, zero, out.mark) || zero != 0) return false;
    out.mode = TokenMode::kPlain;
    out.ceiling = out.mark;
    return true;
  }
  if (bytes.size() != kShardRecordSize || std::memcmp(bytes.data(), kShardMagic, 8) != 0 ||
      get_u64(bytes.data() + 32) != XXH3_64bits(bytes.data(), 32)) {
    return false;
  }
  const std::uint32_t mode = get_u32(bytes.data() + 12);
  if (mode > static_cast<std::uint32_t>(TokenMode::kCluster)) return false;
  out.shard = get_u32(bytes.data() + 8);
  out.mode = static_cast<TokenMode>(mode);
  out.mark = get_u64(bytes.data() + 16);
  out.ceiling = get_u64(bytes.data() + 24);
  return true;
}

std::string shard_file_name(std::uint32_t shard) {
  char name[32];
  std::snprintf(name, sizeof name, "shard-%05u.hwm", shard);
  return name;
}

// "shard-NNNNN.hwm" -> NNNNN.
bool parse_shard_file_name(std::string_view name, std::uint32_t& shard) {
  constexpr std::string_view kPrefix = "shard-";
  constexpr std::string_view kSuffix = ".hwm";
  if (name.size() <= kPrefix.size() + kSuffix.size() || !name.starts_with(kPrefix) ||
      !name.ends_with(kSuffix)) {
    return false;
  }
  const std::string_view digits =
      name.substr(kPrefix.size(), name.size() - kPrefix.size() - kSuffix.size());
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), shard);
  return ec == std::errc{} && end == digits.data() + digits.size();
}

std::error_code errno_code() { return {errno, std::generic_category()}; }

std::string describe(const std::string& what, const std::string& path, std::error_code ec) {
  return what + " " + path + ": " + ec.message();
}

// Reads a whole record file (at most kLargestRecord bytes; `size` is what
// it held); an error (with `why`) if it cannot be read or is larger.
std::error_code read_file(int dir_fd, const std::string& name,
                          std::array<std::uint8_t, kLargestRecord>& out, std::size_t& size,
                          std::string& why) {
  const int fd = ::openat(dir_fd, name.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const std::error_code ec = errno_code();
    why = "cannot open: " + ec.message();
    return ec;
  }
  std::size_t got = 0;
  std::array<std::uint8_t, kLargestRecord + 1> buf{};
  for (;;) {
    const ssize_t n = ::read(fd, buf.data() + got, buf.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const std::error_code ec = errno_code();
      ::close(fd);
      why = "cannot read: " + ec.message();
      return ec;
    }
    if (n == 0) break;
    got += static_cast<std::size_t>(n);
    if (got == buf.size()) break;
  }
  ::close(fd);
  if (got > kLargestRecord) {
    why = "larger than " + std::to_string(kLargestRecord) + " bytes";
    return ServerError::kDataDirCorrupt;
  }
  std::memcpy(out.data(), buf.data(), got);
  size = got;
  return {};
}

// Reads exactly one record; an error (with `why`) if the file is not one.
std::error_code read_record(int dir_fd, const std::string& name, Record& r, std::string& why) {
  std::array<std::uint8_t, kLargestRecord> buf{};
  std::size_t got = 0;
  if (const std::error_code ec = read_file(dir_fd, name, buf, got, why)) return ec;
  if (got != kRecordSize) {
    why = "size " + std::to_string(got) + " bytes, expected " + std::to_string(kRecordSize);
    return ServerError::kDataDirCorrupt;
  }
  std::memcpy(r.data(), buf.data(), kRecordSize);
  return {};
}

// temp file, write, fsync, rename over `name`. The caller fsyncs the directory.
template <std::size_t N>
std::error_code write_record(int dir_fd, const std::string& name,
                             const std::array<std::uint8_t, N>& r) {
  return replace_file_durably(dir_fd, name,
                              std::span(reinterpret_cast<const char*>(r.data()), r.size()));
}

}  // namespace

TokenStore::~TokenStore() {
  if (lock_fd_ >= 0) ::close(lock_fd_);  // releases the flock
  if (dir_fd_ >= 0) ::close(dir_fd_);
}

std::error_code TokenStore::open(const std::string& dir, std::unique_ptr<TokenStore>& out,
                                 std::string& detail) {
  std::unique_ptr<TokenStore> store(new TokenStore());
  store->dir_ = dir;
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    const std::error_code ec = errno_code();
    detail = describe("cannot create data dir", dir, ec);
    return ec;
  }
  store->dir_fd_ = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (store->dir_fd_ < 0) {
    const std::error_code ec = errno_code();
    detail = describe("cannot open data dir", dir, ec);
    return ec;
  }
  store->lock_fd_ = ::openat(store->dir_fd_, "lock", O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (store->lock_fd_ < 0) {
    const std::error_code ec = errno_code();
    detail = describe("cannot create lock file in", dir, ec);
    return ec;
  }
  if (::flock(store->lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) {
      detail = "data dir " + dir + " is in use by another server (flock on " + dir + "/lock)";
      return ServerError::kDataDirLocked;
    }
    const std::error_code ec = errno_code();
    detail = describe("cannot lock data dir", dir, ec);
    return ec;
  }

  // Scan the directory.
  const int scan_fd = ::dup(store->dir_fd_);
  DIR* d = scan_fd >= 0 ? ::fdopendir(scan_fd) : nullptr;
  if (d == nullptr) {
    const std::error_code ec = errno_code();
    if (scan_fd >= 0) ::close(scan_fd);
    detail = describe("cannot list data dir", dir, ec);
    return ec;
  }
  ::rewinddir(d);
  std::set<std::uint32_t> shard_files;
  bool have_meta = false;
  std::uint32_t meta_shards = 0;
  std::error_code failure;
  while (const dirent* entry = ::readdir(d)) {
    const std::string name = entry->d_name;
    std::uint32_t shard = 0;
    std::string why;
    Record r{};
    if (name.ends_with(".tmp")) {
      // A write cut short by a crash: its rename never happened, so no token
      // from it was issued. The previous file is still the durable one.
      ::unlinkat(store->dir_fd_, name.c_str(), 0);
    } else if (name == "meta") {
      std::uint32_t version = 0;
      if ((failure = read_record(store->dir_fd_, name, r, why))) {
      } else if (!parse_record(r, kMetaMagic, version, meta_shards, store->lease_bound_ms_) ||
                 version != kFormatVersion || meta_shards == 0) {
        why = "bad magic, version or checksum";
        failure = ServerError::kDataDirCorrupt;
      }
      have_meta = true;
    } else if (parse_shard_file_name(name, shard)) {
      std::array<std::uint8_t, kLargestRecord> bytes{};
      std::size_t size = 0;
      ShardMark mark;
      if ((failure = read_file(store->dir_fd_, name, bytes, size, why))) {
      } else if (size != kShardRecordSize && size != kRecordSize) {
        why = "size " + std::to_string(size) + " bytes, expected " +
              std::to_string(kShardRecordSize) + " (or " + std::to_string(kRecordSize) +
              " in format 1)";
        failure = ServerError::kDataDirCorrupt;
      } else if (!parse_shard_record(std::span(bytes).first(size), mark) || mark.shard != shard) {
        why = "bad magic, mode, shard index or checksum";
        failure = ServerError::kDataDirCorrupt;
      } else {
        shard_files.insert(shard);
        store->floor_ = std::max(store->floor_, mark.mark);
        store->token_floor_ = std::max(store->token_floor_, mark.ceiling);
        if (mark.mode == TokenMode::kCluster) store->cluster_before_ = true;
      }
    }
    if (failure) {
      detail = "data dir " + dir;
      detail.append(": ").append(name).append(": ").append(why);
      detail +=
          " (refusing to start: tokens could go backwards; restore the file, or "
          "remove the whole directory to start afresh: tokens then start above a "
          "wall-clock floor)";
      break;
    }
  }
  ::closedir(d);
  if (failure) return failure;

  // No meta but shard files: the very first initialize() was cut short.
  // meta is written before any token is issued and only ever replaced by a
  // rename, so no token exists; floor() still starts above every mark.
  for (std::uint32_t i = 0; have_meta && i < meta_shards; ++i) {
    if (!shard_files.contains(i)) {
      detail = "data dir " + dir + ": missing " + shard_file_name(i) + " (meta lists " +
               std::to_string(meta_shards) + " shards; refusing to start)";
      return ServerError::kDataDirCorrupt;
    }
  }
  store->fresh_ = !have_meta;
  out = std::move(store);
  return {};
}

namespace {

// Writes one record file (temp file, fsync, rename); a failure is explained
// in `detail`. The directory entry is durable only after sync_dir().
template <std::size_t N>
std::error_code write_named(int dir_fd, const std::string& dir, const std::string& name,
                            const std::array<std::uint8_t, N>& record, std::string& detail) {
  const std::error_code ec = write_record(dir_fd, name, record);
  if (ec) detail = describe("cannot write", dir + "/" + name, ec);
  return ec;
}

// fsync of the data dir: makes the renames before it durable.
std::error_code sync_dir(int dir_fd, const std::string& dir, std::string& detail) {
  if (::fsync(dir_fd) == 0) return {};
  const std::error_code ec = errno_code();
  detail = describe("cannot fsync data dir", dir, ec);
  return ec;
}

}  // namespace

std::error_code TokenStore::initialize(std::uint32_t shards, TokenMode mode,
                                       std::uint64_t high_water, std::uint64_t token_ceiling,
                                       std::uint64_t lease_bound_ms, std::string& detail) {
  // Never below what an earlier run may have issued, whatever the caller says.
  token_ceiling = std::max(token_ceiling, token_floor_);
  for (std::uint32_t i = 0; i < shards; ++i) {
    if (const std::error_code ec =
            write_named(dir_fd_, dir_, shard_file_name(i),
                        make_shard_record(i, mode, high_water, token_ceiling), detail)) {
      return ec;
    }
  }
  // The shard files must be durable before meta names them as required.
  if (const std::error_code ec = sync_dir(dir_fd_, dir_, detail)) return ec;
  shards_ = shards;
  mode_ = mode;
  return record_lease_bound(lease_bound_ms, detail);
}

std::error_code TokenStore::record_lease_bound(std::uint64_t lease_bound_ms, std::string& detail) {
  if (const std::error_code ec =
          write_named(dir_fd_, dir_, "meta",
                      make_record(kMetaMagic, kFormatVersion, shards_, lease_bound_ms), detail)) {
    return ec;
  }
  return sync_dir(dir_fd_, dir_, detail);
}

std::error_code TokenStore::reserve(std::uint32_t shard, std::uint64_t high_water,
                                    std::uint64_t token_ceiling, std::string& detail) {
  const auto start = std::chrono::steady_clock::now();
  std::error_code ec = write_named(
      dir_fd_, dir_, shard_file_name(shard),
      make_shard_record(shard, mode_, high_water, std::max(token_ceiling, token_floor_)), detail);
  if (!ec) ec = sync_dir(dir_fd_, dir_, detail);
  reservation_latency_.record(std::chrono::steady_clock::now() - start);
  reservations_.fetch_add(1, std::memory_order_relaxed);  // relaxed: a statistic
  return ec;
}

void TokenStore::add_stats(ServerStats& stats) const noexcept {
  stats.token_reservations += reservations_.load(std::memory_order_relaxed);  // a statistic
  reservation_latency_.add_to(stats.token_reservation_latency);
}

std::uint64_t ShardTokens::next(std::string& detail) {
  if (last_ == reserved_) {
    if (store_ == nullptr || last_ > ~std::uint64_t{0} - block_) {
      detail = "token space exhausted";
      return 0;
    }
    const std::uint64_t mark = last_ + block_;
    if (store_->reserve(shard_, mark, ceiling(mark), detail)) return 0;
    reserved_ = mark;
  }
  return ++last_;
}

void ShardTokens::begin_epoch(std::uint64_t epoch) noexcept {
  epoch_ = epoch;
  epoch_base_ = last_;
  // The block on disk bounds the tokens of the previous epoch only: the next
  // token reserves a new one whose ceiling covers this epoch's.
  if (store_ != nullptr) reserved_ = last_;
}

std::uint64_t ShardTokens::ceiling(std::uint64_t mark) const noexcept {
  if (!composed_) return mark;
  // The largest counter a token of this block can carry in epoch_ (the
  // shard refuses, and asks for a new epoch, past 2^32 - 1).
  const std::uint64_t counter = std::min(mark - epoch_base_, cluster::kTokenHalfLimit - 1);
  return cluster::compose_token(std::min(epoch_, cluster::kTokenHalfLimit - 1), counter);
}

}  // namespace shardlock::lease::internal
