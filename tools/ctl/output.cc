#include "ctl/output.h"

#include <algorithm>

#include "common/json.h"
#include "shardlock/lease/duration.h"

namespace shardlock::ctl {

using namespace lease;
using tools::escaped_key;
using tools::hex_bytes;
using tools::valid_utf8;

bool is_conflict(const std::error_code& ec) {
  return ec == LeaseErrc::kBusy || ec == LeaseErrc::kTimeout || ec == LeaseErrc::kRecovering;
}

int exit_code_for(const std::error_code& ec) {
  if (!ec) return kExitOk;
  if (ec == LeaseErrc::kBusy || ec == LeaseErrc::kTimeout || ec == LeaseErrc::kNotOwner ||
      ec == LeaseErrc::kExpired || ec == LeaseErrc::kGrantExpired) {
    return kExitRefused;
  }
  if (ec == LeaseErrc::kUnreachable) return kExitUnreachable;
  if (ec == LeaseErrc::kRecovering) return kExitRecovering;
  if (ec == LeaseErrc::kBadArgument || ec == LeaseErrc::kCrossNode) return kExitUsage;
  return kExitError;
}

std::string error_name(const std::error_code& ec) {
  std::string name(ec.category() == lease_category()
                       ? std::string(to_string(static_cast<LeaseErrc>(ec.value())))
                       : ec.message());
  for (char& ch : name) {
    if (ch == ' ') ch = '_';
  }
  return name;
}

void put_key(Json& j, const std::string& name, std::string_view key) {
  if (valid_utf8(key)) {
    j[name] = key;
  } else {
    j[name] = escaped_key(key, /*controls=*/false);
    j[name + "_hex"] = hex_bytes(key);
  }
}

void put_keys(Json& j, const std::vector<std::string>& keys) {
  if (keys.size() == 1) {
    put_key(j, "key", keys[0]);
    return;
  }
  Json list = Json::array();
  for (const std::string& key : keys) {
    list.push_back(valid_utf8(key) ? key : escaped_key(key, /*controls=*/false));
  }
  j["keys"] = std::move(list);
  if (!std::all_of(keys.begin(), keys.end(), [](const std::string& k) { return valid_utf8(k); })) {
    Json hex = Json::array();
    for (const std::string& key : keys) hex.push_back(hex_bytes(key));
    j["keys_hex"] = hex;
  }
}

std::string shown(std::string_view key) { return escaped_key(key, /*controls=*/true); }

std::string shown_keys(const std::vector<std::string>& keys) {
  std::string out;
  for (const std::string& key : keys) out += (out.empty() ? "" : " ") + shown(key);
  return out;
}

std::string joined(const std::vector<std::string>& items, char separator) {
  std::string out;
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += separator;
    out += items[i];
  }
  return out;
}

std::string seconds_text(std::uint64_t ms) {
  std::string text = std::to_string(ms / 1000);
  if (const std::uint64_t part = ms % 1000; part != 0) {
    char digits[8];
    std::snprintf(digits, sizeof digits, ".%03u", static_cast<unsigned>(part));
    std::string fraction = digits;
    while (fraction.back() == '0') fraction.pop_back();
    text += fraction;
  }
  return text + "s";
}

std::string tenths_text(std::uint64_t ms) { return seconds_text((ms + 50) / 100 * 100); }

void print_json(const Json& j, std::FILE* to) {
  std::fprintf(to, "%s\n", j.dump(-1, ' ', false, Json::error_handler_t::replace).c_str());
}

void print_result(const Output& out, const Json& j, const std::string& text) {
  if (out.json) {
    print_json(j);
  } else {
    std::fputs(text.c_str(), stdout);
  }
}

std::string failure_name(const Failure& f) {
  return f.auth_failed ? "auth_failed" : error_name(f.error);
}

int failure_status(const Failure& f) {
  return f.auth_failed ? kExitAuthFailed : exit_code_for(f.error);
}

std::string failure_text(const Failure& f, milliseconds ttl, milliseconds wait) {
  const auto& e = f.error;
  if (f.auth_failed || e == LeaseErrc::kUnreachable) return f.detail;
  if (e == LeaseErrc::kBusy) {
    return (f.busy_key.empty() ? std::string("busy") : "busy: " + shown(f.busy_key) + " is held") +
           " (another owner holds it, " + seconds_text(f.ttl_left_ms) + " left on its lease)";
  }
  if (e == LeaseErrc::kTimeout) {
    return "not acquired: still held when the wait (" + seconds_text(wait.count()) + ") ran out";
  }
  if (e == LeaseErrc::kRecovering) {
    return "the server is recovering (its lock-delay after a start): it grants in " +
           seconds_text(f.retry_after_ms);
  }
  if (e == LeaseErrc::kNotOwner) return "not owner: the lease is held by another owner or token";
  if (e == LeaseErrc::kExpired) return "expired: the server no longer holds this lease";
  if (e == LeaseErrc::kGrantExpired) {
    return "granted, but the grant's ttl had run out by the time it arrived (wait >= ttl?)";
  }
  if (e == LeaseErrc::kCrossNode) {
    return "the keys are owned by different nodes; one acquire takes keys of one node";
  }
  if (e == LeaseErrc::kServerError) {
    if (f.wire_error == WireError::kTtlOutOfRange) {
      return "--ttl " + to_string(ttl) + " is above the server's maximum TTL" +
             (f.max_ttl_ms ? ", " + to_string(milliseconds(*f.max_ttl_ms)) : std::string()) +
             " (shardlockd --max-ttl)";
    }
    return "the server refused the request: " + std::string(to_string(f.wire_error));
  }
  return e.message();
}

int report(const Output& out, const std::vector<std::string>& keys, const Failure& f,
           milliseconds ttl, milliseconds wait) {
  const bool silent = out.quiet && !f.auth_failed && is_conflict(f.error);
  // For people: on stderr always (with JSON too, unless the JSON goes there).
  if (!silent && (!out.json || !out.errors_to_stderr)) {
    std::fprintf(stderr, "shardlockctl: %s%s%s\n", shown_keys(keys).c_str(),
                 keys.empty() ? "" : ": ", failure_text(f, ttl, wait).c_str());
  }
  if (!out.json || (silent && out.errors_to_stderr)) return failure_status(f);
  Json j;
  if (!keys.empty()) put_keys(j, keys);
  j["error"] = failure_name(f);
  if (f.error == LeaseErrc::kServerError) j["wire_error"] = std::string(to_string(f.wire_error));
  if (f.error == LeaseErrc::kBusy) {
    if (!f.busy_key.empty()) put_key(j, "busy_key", f.busy_key);
    j["ttl_left_ms"] = f.ttl_left_ms;
  }
  if (f.error == LeaseErrc::kRecovering) j["retry_after_ms"] = f.retry_after_ms;
  if (f.max_ttl_ms) j["max_ttl_ms"] = *f.max_ttl_ms;
  if (f.error != LeaseErrc::kBusy) j["message"] = failure_text(f, ttl, wait);
  print_json(j, out.errors_to_stderr ? stderr : stdout);
  return failure_status(f);
}

}  // namespace shardlock::ctl
