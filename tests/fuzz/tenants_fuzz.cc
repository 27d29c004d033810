// libFuzzer target for the tenant file parser: any bytes must parse to a
// table or to an error that names a line of the input, without reading
// outside it or touching the disk. A table that parses must keep its
// invariants: every tenant found by its key id and its name, key ids
// ascending, one rule per prefix, sorted, each rule's rights granted on its
// own prefix, admin on "" only, and the same tenants again through build().
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "shardlock/lease/tenants.h"

namespace lease = shardlock::lease;

namespace {

// Key files without a disk: a path containing "missing" is unreadable; any
// other holds a key made of its bytes (never all zeros).
lease::AuthKeyFile fake_key_file(const std::string& path) {
  lease::AuthKeyFile file;
  if (path.find("missing") != std::string::npos) {
    file.error = "cannot read key file " + path;
    return file;
  }
  lease::AuthKey key{};
  for (std::size_t i = 0; i < path.size(); ++i)
    key[i % key.size()] ^= static_cast<std::uint8_t>(path[i]);
  key[0] ^= 0x5a;
  key[1] = 1;
  file.key = key;
  return file;
}

void check_error(const lease::TenantTableResult& result, std::string_view text) {
  if (result.error.empty() || result.table.has_value()) std::abort();
  if (result.line == 0) return;
  std::size_t lines = 1;
  for (const char c : text) lines += c == '\n' ? 1 : 0;
  if (result.line > lines || result.column == 0) std::abort();
  if (result.message().empty()) std::abort();
}

void check_table(const lease::TenantTable& table) {
  if (table.empty()) std::abort();
  const lease::Tenant* previous = nullptr;
  for (const lease::Tenant& tenant : table.tenants()) {
    if (table.find(tenant.key_id) != &tenant || table.find_by_name(tenant.name) != &tenant) {
      std::abort();
    }
    if (previous != nullptr && previous->key_id >= tenant.key_id) std::abort();
    previous = &tenant;
    for (std::size_t i = 0; i < tenant.rules.size(); ++i) {
      const lease::PrefixRule& rule = tenant.rules[i];
      if (i > 0 && !(tenant.rules[i - 1].prefix < rule.prefix)) std::abort();
      if (!lease::contains(lease::rights_for(tenant, rule.prefix), rule.rights)) std::abort();
      if (lease::contains(rule.rights, lease::Rights::kAdmin) && !rule.prefix.empty()) std::abort();
    }
  }
  const std::vector<lease::Tenant> copy(table.tenants().begin(), table.tenants().end());
  const lease::TenantTableResult again = lease::TenantTable::build(copy);
  if (!again.ok() || !std::equal(copy.begin(), copy.end(), again.table->tenants().begin(),
                                 again.table->tenants().end())) {
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  // Copy so the parser sees a buffer whose end ASan guards exactly.
  const std::string text(reinterpret_cast<const char*>(data), size);
  const lease::TenantTableResult result = lease::parse_tenant_file(text, "base", fake_key_file);
  if (result.ok()) {
    if (!result.table) std::abort();
    check_table(*result.table);
  } else {
    check_error(result, text);
  }
  return 0;
}
