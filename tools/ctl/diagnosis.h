// diagnosis.h: what shardlockctl says about a call that failed: for one
// that got no answer, whether replies failed authentication, nothing
// listens there or something drops the requests; for a TTL above the
// server's limit, the limit (learned by bisection). Not API.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "ctl/output.h"
#include "ctl/session.h"
#include "shardlock/lease/client/client.h"

namespace shardlock::ctl {

// Fills `f` in for a call that got no answer from `node` within `timeout`:
// replies that failed authentication, nothing listening there, or silence
// (and then what silence usually means). `have_key`: this client seals its
// requests (--auth-key).
void diagnose_silence(lease::LeaseClient& client, const std::string& node, milliseconds timeout,
                      bool have_key, Failure& f);

// The failure of a call for `keys` that ended with `error`, diagnosed: an
// unanswered call's node probed, a TTL's limit learned.
[[nodiscard]] Failure diagnosed(lease::LeaseClient& client, const Session& session,
                                const std::vector<std::string>& keys, std::error_code error,
                                lease::WireError wire, milliseconds ttl);

}  // namespace shardlock::ctl
