#include "common/systemd.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <cstring>

namespace shardlock::tools {

bool service_manager_listens() noexcept {
  const char* socket_name = std::getenv("NOTIFY_SOCKET");
  return socket_name != nullptr && socket_name[0] != '\0';
}

std::error_code notify_service_manager(std::string_view state) {
  const char* socket_name = std::getenv("NOTIFY_SOCKET");
  if (socket_name == nullptr || socket_name[0] == '\0') return {};
  const std::string_view name = socket_name;
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  // A path, or "@name" in the abstract namespace (a leading NUL instead).
  if ((name[0] != '/' && name[0] != '@') || name.size() >= sizeof address.sun_path) {
    return std::make_error_code(std::errc::invalid_argument);
  }
  std::memcpy(address.sun_path, name.data(), name.size());
  if (name[0] == '@') address.sun_path[0] = '\0';
  const auto length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name.size() +
                                             (name[0] == '@' ? 0 : 1));
  const int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return {errno, std::system_category()};
  std::error_code ec;
  if (::sendto(fd, state.data(), state.size(), MSG_NOSIGNAL,
               reinterpret_cast<const sockaddr*>(&address), length) < 0) {
    ec = {errno, std::system_category()};
  }
  ::close(fd);
  return ec;
}

std::optional<std::string> credential_path(std::string_view name) {
  const char* directory = std::getenv("CREDENTIALS_DIRECTORY");
  if (directory == nullptr || directory[0] == '\0') return std::nullopt;
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string_view::npos) {
    return std::nullopt;
  }
  std::string path = std::string(directory) + "/" + std::string(name);
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return std::nullopt;
  return path;
}

}  // namespace shardlock::tools
