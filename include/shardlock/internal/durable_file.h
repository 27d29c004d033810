// replace_file_durably(): the one way shardlock replaces a small state file
// so that a crash leaves either the old contents or the new, never a torn
// mix: the lease server's token marks (token_store.cc) and a cluster node's
// highest epoch (epoch_file.cc) both go through it.
//
// Not API.
#pragma once

#include <span>
#include <string>
#include <system_error>

namespace shardlock::internal {

// Writes `bytes` to `name`.tmp in the directory open as `dir_fd`, fsyncs it,
// and renames it over `name`. The rename is durable only once the directory
// itself is fsynced, which the caller does (once for several files). Returns
// the first failing call's errno; a failure before the rename leaves `name`
// as it was.
[[nodiscard]] std::error_code replace_file_durably(int dir_fd, const std::string& name,
                                                   std::span<const char> bytes) noexcept;

}  // namespace shardlock::internal
