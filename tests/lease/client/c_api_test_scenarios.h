// The C ABI's scenarios (c_api_test_scenarios.c, compiled as C); each returns
// NULL when it passes, or what failed and where.
#ifndef SHARDLOCK_TESTS_LEASE_C_API_TEST_SCENARIOS_H_
#define SHARDLOCK_TESTS_LEASE_C_API_TEST_SCENARIOS_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

const char* c_api_exclusive(const char* server);
const char* c_api_shared_and_permits(const char* server);
const char* c_api_bad_arguments(const char* server);
// shardlock_client_create_ex(): bad options are refused with their codes.
const char* c_api_create_ex(const char* server);
// Against a server whose tenant `tenant` (encrypt=yes) has key_file's key
// and acquire on "c/".
const char* c_api_tenant(const char* server, const char* key_file, uint32_t tenant);
// The same server: the SHARDLOCK_CLIENT_CIPHER_* flags' checks, and the
// tenant served in each suite this host has (AES-GCM when `have_aes`).
const char* c_api_tenant_ciphers(const char* server, const char* key_file, uint32_t tenant,
                                 int have_aes);
// shardlock_query_holders() and the snapshot's accessors.
const char* c_api_holders(const char* server);
// shardlock_acquire_reentrant(): shared grants, hold counts, the last release.
const char* c_api_reentrant(const char* server);
// shardlock_election_*, shardlock_watch_* and shardlock_holders_leader().
const char* c_api_election_and_watch(const char* server);
// Threads sharing one client: leases exclude each other, reentrancy is per
// thread unless SHARDLOCK_REENTRANT_PER_CLIENT.
const char* c_api_threads(const char* server);
// Calls stop_server(context) part way, to lose a lease.
const char* c_api_watchdog_and_lost(const char* server, void (*stop_server)(void*), void* context);

#ifdef __cplusplus
}
#endif

#endif  // SHARDLOCK_TESTS_LEASE_C_API_TEST_SCENARIOS_H_
