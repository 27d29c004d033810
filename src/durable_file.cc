// See include/shardlock/internal/durable_file.h.
#include "shardlock/internal/durable_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

namespace shardlock::internal {

namespace {
std::error_code errno_code() noexcept { return {errno, std::generic_category()}; }
}  // namespace

std::error_code replace_file_durably(int dir_fd, const std::string& name,
                                     std::span<const char> bytes) noexcept {
  std::string tmp;
  try {
    tmp = name + ".tmp";
  } catch (const std::bad_alloc&) {
    return std::make_error_code(std::errc::not_enough_memory);
  }
  const int fd = ::openat(dir_fd, tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return errno_code();
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const std::error_code ec = errno_code();
      ::close(fd);
      return ec;
    }
    done += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0) {
    const std::error_code ec = errno_code();
    ::close(fd);
    return ec;
  }
  if (::close(fd) != 0) return errno_code();
  if (::renameat(dir_fd, tmp.c_str(), dir_fd, name.c_str()) != 0) return errno_code();
  return {};
}

}  // namespace shardlock::internal
