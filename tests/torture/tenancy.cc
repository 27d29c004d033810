// See tenancy.h.
#include "tenancy.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <iterator>
#include <mutex>
#include <numeric>
#include <optional>
#include <thread>
#include <vector>

#include "server_process.h"
#include "shardlock/lease/client/client.h"
#include "shardlock/lease/wire/auth.h"

namespace shardlock::torture {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

fs::path key_file(const fs::path& dir, int tenant) {
  return dir / (TenantPlan::name(tenant) + ".key");
}

// Writes `text` to `path` (created or truncated), readable by its owner only:
// shardlockd warns about a tenant file others can read.
bool write_private(const fs::path& path, const std::string& text, std::string& error) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  bool ok = fd >= 0;
  for (std::size_t done = 0; ok && done < text.size();) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    ok = n > 0;
    if (ok) done += static_cast<std::size_t>(n);
  }
  if (!ok) error = "cannot write " + path.string() + ": " + std::strerror(errno);
  if (fd >= 0 && ::close(fd) != 0 && ok) {
    error = "cannot write " + path.string() + ": " + std::strerror(errno);
    ok = false;
  }
  return ok;
}

// The tenant file's text, the tenants in `order`.
std::string tenant_file_text(const TenantPlan& plan, const std::vector<int>& order) {
  std::string text =
      "# shardlock-torture's tenants (tests/torture/tenancy.h): each its own prefix and "
      "\"shared/\"\n";
  for (const int t : order) {
    const std::string name = TenantPlan::name(t);
    text += "tenant " + name;
    text += " id=" + std::to_string(TenantPlan::key_id(t));
    text += " key-file=" + name + ".key";
    text += plan.encrypted(t) ? " encrypt=yes\n" : " encrypt=no\n";
    for (const std::string& prefix : {TenantPlan::prefix(t), std::string(kSharedPrefix)}) {
      text.append("allow ").append(name).append(" \"").append(prefix).append("\" acquire,query\n");
    }
  }
  return text;
}

// How often `needle` occurs in the file at `path` (0 when it cannot be read).
std::size_t occurrences(const std::string& path, std::string_view needle) {
  std::ifstream in(path);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::size_t count = 0;
  for (std::size_t at = text.find(needle); at != std::string::npos;
       at = text.find(needle, at + needle.size())) {
    ++count;
  }
  return count;
}

// What the probe lease's lost callback reported (it runs on the watchdog's
// thread).
struct LossReport {
  std::mutex mutex;
  std::optional<std::string> reason;
};

}  // namespace

fs::path tenant_file(const fs::path& dir) { return dir / "tenants.txt"; }

bool write_tenant_files(const TenantPlan& plan, const fs::path& dir, std::string& error) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    error = "cannot create " + dir.string() + ": " + ec.message();
    return false;
  }
  std::vector<int> order(static_cast<std::size_t>(plan.tenants));
  std::iota(order.begin(), order.end(), 0);
  for (const int t : order) {
    if (!write_private(key_file(dir, t), lease::format_auth_key(lease::generate_auth_key()) + "\n",
                       error)) {
      return false;
    }
  }
  return write_private(tenant_file(dir), tenant_file_text(plan, order), error);
}

bool use_tenant(const TenantPlan& plan, const fs::path& dir, int tenant,
                lease::LeaseClientOptions& options, std::string& error) {
  const lease::AuthKeyFile key = lease::load_auth_key(key_file(dir, tenant).string());
  if (!key.key) {
    error = "tenant " + TenantPlan::name(tenant) + ": " + key.error;
    return false;
  }
  options.auth_key = key.key;
  options.tenant = TenantPlan::key_id(tenant);
  options.encrypt = plan.encrypted(tenant);
  return true;
}

std::string reload_keeping_a_lease(ServerUnderTest& server, const TenantPlan& plan,
                                   const fs::path& dir, std::mt19937_64& random, int max_ttl_ms,
                                   int max_wait_ms) {
  lease::LeaseClientOptions options;
  options.nodes = {"127.0.0.1:" + std::to_string(server.port())};
  std::string error;
  if (!use_tenant(plan, dir, 0, options, error)) return "tenant reload: " + error;
  lease::LeaseClient client(options);
  if (client.start()) return "tenant reload: " + client.error_detail();

  // The lease held across the reload, on a key of tenant 0's no worker uses.
  const std::string key = TenantPlan::prefix(0) + "reload-" + std::to_string(random() % 1000000);
  const std::chrono::milliseconds ttl(max_ttl_ms);
  LossReport loss;
  lease::LeaseOptions watch;
  watch.watchdog = true;
  watch.on_lost = [&loss](const lease::LeaseLost& lost) {
    const std::lock_guard lock(loss.mutex);
    loss.reason = lost.refused_by_server ? "refused: " + lost.reason.message()
                                         : "no renewal answered before its expiry";
  };
  // The server may be in its lock-delay after a kill: ride it out.
  lease::AcquireResult got;
  for (const auto give_up = std::chrono::steady_clock::now() + 10s;;) {
    got = client.acquire(key, ttl, std::chrono::milliseconds(max_wait_ms), watch);
    if (got || std::chrono::steady_clock::now() >= give_up) break;
    if (got.error != lease::LeaseErrc::kRecovering && got.error != lease::LeaseErrc::kTimeout &&
        got.error != lease::LeaseErrc::kUnreachable) {
      break;
    }
    std::this_thread::sleep_for(20ms);
  }
  if (!got) return "tenant reload: the lease to hold across it was refused: " + got.error.message();

  std::vector<int> order(static_cast<std::size_t>(plan.tenants));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), random);
  const fs::path file = tenant_file(dir);
  const fs::path next = file.string() + ".next";
  if (!write_private(next, tenant_file_text(plan, order), error)) return "tenant reload: " + error;
  std::error_code ec;
  fs::rename(next, file, ec);
  if (ec) return "tenant reload: cannot replace " + file.string() + ": " + ec.message();

  constexpr std::string_view kReloaded = "received SIGHUP: reloaded ";
  constexpr std::string_view kKept = "received SIGHUP: kept the tenants in force";
  const std::size_t reloaded = occurrences(server.log_path(), kReloaded);
  const std::size_t kept = occurrences(server.log_path(), kKept);
  server.hangup();
  for (const auto give_up = std::chrono::steady_clock::now() + 10s;;) {
    if (occurrences(server.log_path(), kKept) > kept) {
      return "tenant reload: shardlockd kept its old tenants (it found the same file bad); see " +
             server.log_path();
    }
    if (occurrences(server.log_path(), kReloaded) > reloaded) break;
    if (std::chrono::steady_clock::now() >= give_up) {
      return "tenant reload: shardlockd logged no reload within 10 s of SIGHUP; see " +
             server.log_path();
    }
    std::this_thread::sleep_for(10ms);
  }

  // The watchdog renews every third of the TTL: a TTL is three renewals
  // under the table just loaded.
  std::this_thread::sleep_for(ttl);
  {
    const std::lock_guard lock(loss.mutex);
    if (loss.reason)
      return "tenant reload: the lease " + key + " held across it was lost (" + *loss.reason + ")";
  }
  if (const std::error_code renewed = got.lease.renew(ttl)) {
    return "tenant reload: the lease " + key +
           " held across it was not renewed: " + renewed.message();
  }
  if (const std::error_code released = got.lease.release()) {
    return "tenant reload: the lease " + key +
           " held across it was not released: " + released.message();
  }
  return "";
}

}  // namespace shardlock::torture
