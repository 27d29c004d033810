// See tenancy.h.
#include "tenancy.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <numeric>
#include <vector>

#include "shardlock/lease/wire/auth.h"

namespace shardlock::torture {
namespace {

namespace fs = std::filesystem;

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

}  // namespace shardlock::torture
