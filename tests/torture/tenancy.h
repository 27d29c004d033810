// tenancy.h: the tenants of a torture run (--tenants N; docs/reliability.md,
// "Tenants"): who they are, the files the server and the workers read, which
// tenant each lease client is, and the tenant file's reload fault.
//
// Tenant i is named "t<i>", has key id i + 1 and a key of its own (the key
// file t<i>.key beside the tenant file), and may acquire and query on its
// own prefix "t<i>/" and on "shared/", which every tenant shares: exclusion,
// tokens and fencing on a shared key are judged across tenants. With
// `encrypt`, the even-numbered tenants' datagrams are encrypted and the
// others' only authenticated, so shared keys are contended in both forms at
// once. No tenant has admin: the harness sends no STATS.
//
// A LeaseClient speaks for one tenant. A worker deals its LeaseClients
// (groups of --threads-per-client lease clients) and its election roles
// round-robin over the tenants; every lease client takes its keys under its
// own prefix or the shared one, and now and then probes a key of another
// tenant's, which the server must refuse (history.h: outside=1).
#pragma once

#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <string_view>

#include "shardlock/lease/client/call.h"

namespace shardlock::torture {

class ServerUnderTest;

// The prefix every tenant may use.
inline constexpr std::string_view kSharedPrefix = "shared/";

struct TenantPlan {
  int tenants = 0;       // 0: no tenants (the server runs without a key)
  bool encrypt = false;  // the even-numbered tenants encrypt

  [[nodiscard]] bool enabled() const noexcept { return tenants > 0; }
  [[nodiscard]] static std::string name(int tenant) { return "t" + std::to_string(tenant); }
  [[nodiscard]] static std::string prefix(int tenant) { return name(tenant) + "/"; }
  // Not 0: key id 0 is the legacy single key's.
  [[nodiscard]] static std::uint32_t key_id(int tenant) noexcept {
    return static_cast<std::uint32_t>(tenant) + 1;
  }
  [[nodiscard]] bool encrypted(int tenant) const noexcept { return encrypt && tenant % 2 == 0; }
  // The tenant of the `index`-th LeaseClient of its kind (round-robin).
  [[nodiscard]] int tenant_of(int index) const noexcept { return index % tenants; }
};

// The tenant file in `dir`, which shardlockd --tenants reads.
[[nodiscard]] std::filesystem::path tenant_file(const std::filesystem::path& dir);

// Creates `dir` with a fresh key per tenant (t<i>.key) and the tenant file,
// every file readable by its owner only. False, with `error` set, when a
// file cannot be written.
[[nodiscard]] bool write_tenant_files(const TenantPlan& plan, const std::filesystem::path& dir,
                                      std::string& error);

// Sets `options` up as tenant `tenant`: its key id, its key (read from its
// key file in `dir`) and whether it encrypts. False, with `error` set, when
// the key file cannot be read.
[[nodiscard]] bool use_tenant(const TenantPlan& plan, const std::filesystem::path& dir, int tenant,
                              lease::LeaseClientOptions& options, std::string& error);

// The reload fault (Fault::kTenantReload) on `server`, whose --tenants file
// is in `dir`: takes a lease of tenant 0 straight at the server (not through
// the proxy: its losses are not what this judges), with the watchdog on;
// writes the tenant file again, the same tenants in a seeded order, and
// swaps it in at once (rename); sends SIGHUP and waits for the server to log
// the reload; then lets the watchdog renew for a max TTL under the new
// table, renews once more and releases. Blocks for a little over a max TTL.
// Returns what went wrong, one line, or "" when the server reloaded and the
// lease held across it was never lost.
[[nodiscard]] std::string reload_keeping_a_lease(ServerUnderTest& server, const TenantPlan& plan,
                                                 const std::filesystem::path& dir,
                                                 std::mt19937_64& random, int max_ttl_ms,
                                                 int max_wait_ms);

}  // namespace shardlock::torture
