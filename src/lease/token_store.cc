// Durable token high-water marks. See internal/token_store.h.
#include "shardlock/lease/internal/token_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <array>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <set>
#include <string_view>

#include "shardlock/internal/durable_file.h"
#include "shardlock/lease/server.h"

namespace shardlock::lease::internal {

using shardlock::internal::replace_file_durably;
namespace {

constexpr std::size_t kRecordSize = 32;
constexpr char kShardMagic[8] = {'S', 'L', 'T', 'O', 'K', 'E', 'N', '1'};
constexpr char kMetaMagic[8] = {'S', 'L', 'M', 'E', 'T', 'A', '0', '1'};
constexpr std::uint32_t kFormatVersion = 1;

using Record = std::array<std::uint8_t, kRecordSize>;

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

// Reads exactly one record; false (with `why`) if the file is not one.
std::error_code read_record(int dir_fd, const std::string& name, Record& r, std::string& why) {
  const int fd = ::openat(dir_fd, name.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const std::error_code ec = errno_code();
    why = "cannot open: " + ec.message();
    return ec;
  }
  std::size_t got = 0;
  std::array<std::uint8_t, kRecordSize + 1> buf{};
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
  if (got != kRecordSize) {
    why = "size " + std::to_string(got) + " bytes, expected " + std::to_string(kRecordSize);
    return ServerError::kDataDirCorrupt;
  }
  std::memcpy(r.data(), buf.data(), kRecordSize);
  return {};
}

// temp file, write, fsync, rename over `name`. The caller fsyncs the directory.
std::error_code write_record(int dir_fd, const std::string& name, const Record& r) {
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
      std::uint32_t index = 0;
      std::uint32_t zero = 0;
      std::uint64_t mark = 0;
      if ((failure = read_record(store->dir_fd_, name, r, why))) {
      } else if (!parse_record(r, kShardMagic, index, zero, mark) || index != shard || zero != 0) {
        why = "bad magic, shard index or checksum";
        failure = ServerError::kDataDirCorrupt;
      } else {
        shard_files.insert(shard);
        if (mark > store->floor_) store->floor_ = mark;
      }
    }
    if (failure) {
      detail = "data dir " + dir;
      detail.append(": ").append(name).append(": ").append(why);
      detail +=
          " (refusing to start: tokens could go backwards; restore the file or "
          "remove the whole directory to reset tokens deliberately)";
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
  out = std::move(store);
  return {};
}

namespace {

// Writes one record file (temp file, fsync, rename); a failure is explained
// in `detail`. The directory entry is durable only after sync_dir().
std::error_code write_named(int dir_fd, const std::string& dir, const std::string& name,
                            const Record& record, std::string& detail) {
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

std::error_code TokenStore::initialize(std::uint32_t shards, std::uint64_t high_water,
                                       std::uint64_t lease_bound_ms, std::string& detail) {
  for (std::uint32_t i = 0; i < shards; ++i) {
    if (const std::error_code ec =
            write_named(dir_fd_, dir_, shard_file_name(i),
                        make_record(kShardMagic, i, 0, high_water), detail)) {
      return ec;
    }
  }
  // The shard files must be durable before meta names them as required.
  if (const std::error_code ec = sync_dir(dir_fd_, dir_, detail)) return ec;
  shards_ = shards;
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
                                    std::string& detail) {
  const auto start = std::chrono::steady_clock::now();
  std::error_code ec = write_named(dir_fd_, dir_, shard_file_name(shard),
                                   make_record(kShardMagic, shard, 0, high_water), detail);
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
    if (store_ == nullptr || reserved_ > ~std::uint64_t{0} - block_) {
      detail = "token space exhausted";
      return 0;
    }
    const std::uint64_t mark = reserved_ + block_;
    if (store_->reserve(shard_, mark, detail)) return 0;
    reserved_ = mark;
  }
  return ++last_;
}

}  // namespace shardlock::lease::internal
