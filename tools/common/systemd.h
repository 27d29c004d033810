// systemd.h: what shardlockd does for its service manager, without
// libsystemd: readiness and status notifications (sd_notify(3)'s protocol)
// and credentials (LoadCredential=). Outside systemd both do nothing. Not API.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <system_error>

namespace shardlock::tools {

// Whether a service manager waits for notify_service_manager(): $NOTIFY_SOCKET
// is set (Type=notify).
[[nodiscard]] bool service_manager_listens() noexcept;

// Sends `state` ("READY=1\nSTATUS=granting", newline-separated assignments)
// as one datagram to the AF_UNIX socket $NOTIFY_SOCKET names (a path, or
// "@name" for the abstract namespace), as sd_notify(3) does. Nothing and no
// error when the variable is unset; an error when the socket cannot be
// reached, which the caller may only log: the service manager decides what
// a missing READY=1 means.
[[nodiscard]] std::error_code notify_service_manager(std::string_view state);

// The file of the systemd credential `name` (LoadCredential=NAME:PATH,
// SetCredential=): $CREDENTIALS_DIRECTORY/NAME when that variable is set, the
// name is a plain file name and the file exists; nullopt otherwise.
[[nodiscard]] std::optional<std::string> credential_path(std::string_view name);

}  // namespace shardlock::tools
