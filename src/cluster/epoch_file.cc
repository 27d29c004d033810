#include "epoch_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <array>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <string_view>

#include "shardlock/internal/durable_file.h"

namespace shardlock::cluster {
namespace {

constexpr std::string_view kHeader = "shardlock-cluster-epoch v1 ";

std::error_code errno_code() { return {errno, std::generic_category()}; }

std::string describe(const std::string& what, const std::string& path, std::error_code ec) {
  return what + " " + path + ": " + ec.message();
}

std::string hex64(std::uint64_t v) {
  std::array<char, 17> text{};
  std::snprintf(text.data(), text.size(), "%016llx", static_cast<unsigned long long>(v));
  return {text.data(), 16};
}

}  // namespace

EpochFile::~EpochFile() {
  if (dir_fd_ >= 0) ::close(dir_fd_);
}

std::string EpochFile::encode(std::uint64_t epoch) {
  std::string text(kHeader);
  text += std::to_string(epoch);
  const std::uint64_t check = XXH3_64bits(text.data(), text.size());
  text += ' ';
  text += hex64(check);
  text += '\n';
  return text;
}

bool EpochFile::decode(std::string_view text, std::uint64_t& epoch) noexcept {
  if (!text.starts_with(kHeader) || !text.ends_with('\n')) return false;
  const std::size_t space = text.rfind(' ');
  if (space == std::string_view::npos || space < kHeader.size()) return false;
  const std::string_view number = text.substr(kHeader.size(), space - kHeader.size());
  const std::string_view check = text.substr(space + 1, text.size() - space - 2);
  std::uint64_t value = 0;
  const auto [end, ec] = std::from_chars(number.data(), number.data() + number.size(), value);
  if (ec != std::errc{} || end != number.data() + number.size() || number.empty()) return false;
  std::uint64_t stored = 0;
  const auto [check_end, check_ec] =
      std::from_chars(check.data(), check.data() + check.size(), stored, 16);
  if (check_ec != std::errc{} || check_end != check.data() + check.size() || check.size() != 16) {
    return false;
  }
  if (stored != XXH3_64bits(text.data(), space)) return false;
  epoch = value;
  return true;
}

std::error_code EpochFile::open(const std::string& dir, std::unique_ptr<EpochFile>& out,
                                std::string& detail) {
  std::unique_ptr<EpochFile> file(new EpochFile());
  file->dir_ = dir;
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    const std::error_code ec = errno_code();
    detail = describe("cannot create data dir", dir, ec);
    return ec;
  }
  file->dir_fd_ = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (file->dir_fd_ < 0) {
    const std::error_code ec = errno_code();
    detail = describe("cannot open data dir", dir, ec);
    return ec;
  }
  const int fd = ::openat(file->dir_fd_, kFileName, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) {  // never recorded: epoch 0
      out = std::move(file);
      return {};
    }
    const std::error_code ec = errno_code();
    detail = describe("cannot open", file->path(), ec);
    return ec;
  }
  std::string text;
  std::array<char, 256> chunk{};
  for (;;) {
    const ssize_t n = ::read(fd, chunk.data(), chunk.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const std::error_code ec = errno_code();
      ::close(fd);
      detail = describe("cannot read", file->path(), ec);
      return ec;
    }
    if (n == 0) break;
    text.append(chunk.data(), static_cast<std::size_t>(n));
    if (text.size() > 4096) break;  // far larger than any valid file
  }
  ::close(fd);
  if (!decode(text, file->highest_)) {
    detail = file->path() +
             ": not a valid epoch file (bad format or checksum); refusing to start, since "
             "the node could adopt a map older than one it has seen. Restore it, or write "
             "the highest epoch any node knows";
    return std::make_error_code(std::errc::illegal_byte_sequence);
  }
  out = std::move(file);
  return {};
}

std::error_code EpochFile::record(std::uint64_t epoch, std::string& detail) {
  if (epoch <= highest_) return {};
  if (const std::error_code ec =
          shardlock::internal::replace_file_durably(dir_fd_, kFileName, encode(epoch))) {
    detail = describe("cannot write", path(), ec);
    return ec;
  }
  // The rename is durable only once the directory is.
  if (::fsync(dir_fd_) != 0) {
    const std::error_code ec = errno_code();
    detail = describe("cannot fsync data dir", dir_, ec);
    return ec;
  }
  highest_ = epoch;
  return {};
}

}  // namespace shardlock::cluster
