// ServerError's std::error_category and the IoBackend names.
#include <string>

#include "shardlock/lease/server/server.h"

namespace shardlock::lease {
namespace {

class ServerCategory final : public std::error_category {
 public:
  const char* name() const noexcept override { return "shardlock.lease.server"; }
  std::string message(int e) const override {
    switch (static_cast<ServerError>(e)) {
      case ServerError::kOk:
        return "ok";
      case ServerError::kBadOptions:
        return "invalid server options";
      case ServerError::kBadAddress:
        return "invalid bind address";
      case ServerError::kDataDirCorrupt:
        return "data dir is corrupt";
      case ServerError::kDataDirLocked:
        return "data dir is in use by another server";
      case ServerError::kUringUnavailable:
        return "io_uring is unavailable";
      case ServerError::kAlreadyStarted:
        return "server already started";
    }
    return "unknown server error";
  }
};

}  // namespace

const std::error_category& server_category() noexcept {
  static const ServerCategory category;
  return category;
}

std::string_view to_string(IoBackend backend) noexcept {
  switch (backend) {
    case IoBackend::kAuto:
      return "auto";
    case IoBackend::kUring:
      return "uring";
    case IoBackend::kSocket:
      return "socket";
  }
  return "unknown";
}

std::optional<IoBackend> parse_io_backend(std::string_view text) noexcept {
  if (text == "auto") return IoBackend::kAuto;
  if (text == "uring" || text == "io_uring") return IoBackend::kUring;
  if (text == "socket") return IoBackend::kSocket;
  return std::nullopt;
}

}  // namespace shardlock::lease
