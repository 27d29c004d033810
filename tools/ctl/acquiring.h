// acquiring.h: how acquire, run and elect take their keys: the flags they
// share (-w, --shared, --permits, --value), the checks on them, the acquire
// itself (one key, or several all or nothing), and the line a long wait
// prints once about what it waits for. Not API.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "ctl/output.h"
#include "ctl/session.h"
#include "shardlock/lease/client/client.h"

namespace shardlock::ctl {

// run's wait without -w or -n: until the lease is granted.
inline constexpr milliseconds kForever = milliseconds::max();

// How long a wait goes on before it says, once, what it waits for (as
// flock -v does): a wait that ends sooner prints nothing.
inline constexpr milliseconds kNoticeAfter{1000};

// How acquire and run take their keys.
struct KindArg {
  bool shared = false;
  std::uint32_t permits = 0;  // 0: not a semaphore
  std::string value;          // --value: the holder value (one key)
  [[nodiscard]] lease::LeaseMode mode() const noexcept {
    return permits > 0 ? lease::LeaseMode::kPermit
           : shared    ? lease::LeaseMode::kShared
                       : lease::LeaseMode::kExclusive;
  }
};

// The flags acquire, run and elect share.
struct KeyFlags {
  std::vector<std::string> keys;
  KindArg kind;
  DurationArg ttl;
  DurationArg wait;
  // -w: a duration (--wait, as flock's -w), or json/text (the output switch
  // everywhere else).
  std::string short_w;
  bool quiet = false;  // -q
};

// Adds -w, --shared, --permits and --value to `sub`, bound to `flags`.
void add_kind_flags(CLI::App& sub, KeyFlags& flags);

// Reads -w as the output switch or as the wait, and then whether the
// output is JSON; a usage error when the wait was given twice.
[[nodiscard]] std::optional<int> resolve_short_w(KeyFlags& flags, Session& session);

// The usage error of kind flags that do not fit the keys, if any.
[[nodiscard]] std::optional<int> check_kind(const KeyFlags& flags);

// The leases of one acquire or run: every key's, or none and why.
struct Acquired {
  std::error_code error;
  std::vector<lease::Lease> leases;
  std::string busy_key;
  std::uint32_t ttl_left_ms = 0;
  std::uint32_t retry_after_ms = 0;
  lease::WireError wire_error = lease::WireError::kInternal;
};

// One key: ACQUIRE, ACQUIRE_SHARED or ACQUIRE_PERMIT. Several: one
// ACQUIRE_MANY, all or nothing.
[[nodiscard]] Acquired acquire_keys(lease::LeaseClient& client,
                                    const std::vector<std::string>& keys, const KindArg& kind,
                                    milliseconds ttl, milliseconds wait,
                                    lease::LeaseOptions options);

// acquire_keys() on a thread of its own, waited for here: `pause` blocks
// for one turn of the loop (run takes its signals there). A wait that
// lasts kNoticeAfter prints what it waits for, once, unless `quiet`.
[[nodiscard]] Acquired acquire_telling(lease::LeaseClient& client,
                                       const std::vector<std::string>& keys, const KindArg& kind,
                                       milliseconds ttl, milliseconds wait,
                                       lease::LeaseOptions options, bool quiet, bool election,
                                       const std::function<void()>& pause);

// Why `keys` were not acquired, diagnosed.
[[nodiscard]] Failure acquire_failure(lease::LeaseClient& client, const Session& session,
                                      const std::vector<std::string>& keys, const Acquired& a,
                                      milliseconds ttl);

}  // namespace shardlock::ctl
