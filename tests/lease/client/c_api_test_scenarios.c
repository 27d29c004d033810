/* The C ABI's scenarios, written in C11 against c_api.h alone: compiling
 * this file proves the header is C, and linking it proves that
 * libshardlock_c.so exports what the header declares. c_api_test.cc runs
 * each one against a real LeaseServer on loopback. Each returns NULL when it
 * passes, or what failed and where. */
#define _POSIX_C_SOURCE 200809L

#include "c_api_test_scenarios.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "shardlock/lease/client/c_api.h"

static char failure[512];

#define CHECK(cond)                                                                            \
  do {                                                                                         \
    if (!(cond)) {                                                                             \
      snprintf(failure, sizeof failure, "%s:%d: %s (last detail: \"%s\")", __FILE__, __LINE__, \
               #cond, shardlock_last_error_detail());                                          \
      return failure;                                                                          \
    }                                                                                          \
  } while (0)

/* Checks a status, naming it on failure. */
#define CHECK_STATUS(call, expected)                                                              \
  do {                                                                                            \
    const int status_ = (call);                                                                   \
    if (status_ != (expected)) {                                                                  \
      snprintf(failure, sizeof failure, "%s:%d: %s returned %d (%s), expected %s (%s)", __FILE__, \
               __LINE__, #call, status_, shardlock_strerror(status_), #expected,                  \
               shardlock_last_error_detail());                                                    \
      return failure;                                                                             \
    }                                                                                             \
  } while (0)

static void sleep_ms(long ms) {
  struct timespec t;
  t.tv_sec = ms / 1000;
  t.tv_nsec = (ms % 1000) * 1000000L;
  nanosleep(&t, NULL);
}

const char* c_api_exclusive(const char* server) {
  shardlock_client* a = NULL;
  shardlock_client* b = NULL;
  shardlock_lease* held = NULL;
  shardlock_lease* other = NULL;
  char id_a[33];
  char id_b[33];
  uint64_t first_token;

  CHECK_STATUS(shardlock_client_create(server, NULL, 0, &a), SHARDLOCK_OK);
  CHECK_STATUS(shardlock_client_create(server, NULL, 0, &b), SHARDLOCK_OK);
  CHECK_STATUS(shardlock_client_id(a, id_a, sizeof id_a), SHARDLOCK_OK);
  CHECK_STATUS(shardlock_client_id(b, id_b, sizeof id_b), SHARDLOCK_OK);
  CHECK(strlen(id_a) == 32 && strcmp(id_a, id_b) != 0);

  CHECK_STATUS(
      shardlock_acquire(a, "c-api/x", 5000, 0, SHARDLOCK_EXCLUSIVE, 0, 0, NULL, NULL, &held),
      SHARDLOCK_OK);
  CHECK(held != NULL);
  CHECK(strcmp(shardlock_lease_key(held), "c-api/x") == 0);
  CHECK(shardlock_lease_mode(held) == SHARDLOCK_EXCLUSIVE);
  CHECK(shardlock_lease_valid(held) == 1);
  CHECK(shardlock_lease_remaining_ms(held) > 4000 && shardlock_lease_remaining_ms(held) <= 5000);
  first_token = shardlock_lease_token(held);
  CHECK(first_token > 0);
  CHECK(strcmp(shardlock_last_error_detail(), "") == 0);

  /* Another owner: BUSY at once, and the detail says for how long. */
  other = (shardlock_lease*)&other; /* must be reset to NULL on failure */
  CHECK_STATUS(
      shardlock_acquire(b, "c-api/x", 5000, 0, SHARDLOCK_EXCLUSIVE, 0, 0, NULL, NULL, &other),
      SHARDLOCK_BUSY);
  CHECK(other == NULL);
  CHECK(strstr(shardlock_last_error_detail(), "ms left") != NULL);

  /* Renewals: to the current TTL, then to a shorter one, which pulls the
   * expiry in. */
  CHECK_STATUS(shardlock_lease_renew(held, 0), SHARDLOCK_OK);
  CHECK_STATUS(shardlock_lease_renew(held, 2000), SHARDLOCK_OK);
  CHECK(shardlock_lease_remaining_ms(held) <= 2000);

  CHECK_STATUS(shardlock_lease_release(held), SHARDLOCK_OK);
  CHECK(shardlock_lease_valid(held) == 0);
  CHECK(shardlock_lease_remaining_ms(held) == 0);
  CHECK_STATUS(shardlock_lease_release(held), SHARDLOCK_LEASE_INACTIVE);
  CHECK_STATUS(shardlock_lease_renew(held, 0), SHARDLOCK_LEASE_INACTIVE);
  shardlock_lease_destroy(held);
  held = NULL;

  /* Free now: b gets it, with a larger token. */
  CHECK_STATUS(
      shardlock_acquire(b, "c-api/x", 5000, 0, SHARDLOCK_EXCLUSIVE, 0, 0, NULL, NULL, &other),
      SHARDLOCK_OK);
  CHECK(shardlock_lease_token(other) > first_token);

  /* Destroying a held lease releases it: a, waiting, is handed the key. */
  shardlock_lease_destroy(other);
  CHECK_STATUS(
      shardlock_acquire(a, "c-api/x", 5000, 3000, SHARDLOCK_EXCLUSIVE, 0, 0, NULL, NULL, &held),
      SHARDLOCK_OK);
  shardlock_lease_destroy(held);

  shardlock_client_destroy(a);
  shardlock_client_destroy(b);
  return NULL;
}

const char* c_api_shared_and_permits(const char* server) {
  shardlock_client* a = NULL;
  shardlock_client* b = NULL;
  shardlock_client* c = NULL;
  shardlock_lease* ra = NULL;
  shardlock_lease* rb = NULL;
  shardlock_lease* writer = NULL;
  shardlock_lease* pa = NULL;
  shardlock_lease* pb = NULL;
  shardlock_lease* pc = NULL;

  CHECK_STATUS(shardlock_client_create(server, NULL, 0, &a), SHARDLOCK_OK);
  CHECK_STATUS(shardlock_client_create(server, NULL, 0, &b), SHARDLOCK_OK);
  CHECK_STATUS(shardlock_client_create(server, NULL, 0, &c), SHARDLOCK_OK);

  /* Two shared holders coexist, each with its own token; a writer waits. */
  CHECK_STATUS(shardlock_acquire(a, "c-api/s", 5000, 0, SHARDLOCK_SHARED, 0, 0, NULL, NULL, &ra),
               SHARDLOCK_OK);
  CHECK_STATUS(shardlock_acquire(b, "c-api/s", 5000, 0, SHARDLOCK_SHARED, 0, 0, NULL, NULL, &rb),
               SHARDLOCK_OK);
  CHECK(shardlock_lease_mode(ra) == SHARDLOCK_SHARED);
  CHECK(shardlock_lease_token(ra) != shardlock_lease_token(rb));
  CHECK_STATUS(
      shardlock_acquire(c, "c-api/s", 5000, 0, SHARDLOCK_EXCLUSIVE, 0, 0, NULL, NULL, &writer),
      SHARDLOCK_BUSY);
  CHECK_STATUS(shardlock_lease_release(ra), SHARDLOCK_OK);
  CHECK_STATUS(shardlock_lease_release(rb), SHARDLOCK_OK);
  CHECK_STATUS(
      shardlock_acquire(c, "c-api/s", 5000, 0, SHARDLOCK_EXCLUSIVE, 0, 0, NULL, NULL, &writer),
      SHARDLOCK_OK);
  shardlock_lease_destroy(ra);
  shardlock_lease_destroy(rb);
  shardlock_lease_destroy(writer);

  /* A semaphore of two permits. */
  CHECK_STATUS(shardlock_acquire(a, "c-api/p", 5000, 0, SHARDLOCK_PERMIT, 2, 0, NULL, NULL, &pa),
               SHARDLOCK_OK);
  CHECK_STATUS(shardlock_acquire(b, "c-api/p", 5000, 0, SHARDLOCK_PERMIT, 2, 0, NULL, NULL, &pb),
               SHARDLOCK_OK);
  CHECK(shardlock_lease_mode(pb) == SHARDLOCK_PERMIT);
  CHECK_STATUS(shardlock_acquire(c, "c-api/p", 5000, 0, SHARDLOCK_PERMIT, 2, 0, NULL, NULL, &pc),
               SHARDLOCK_BUSY);
  /* Another limit while the key is in use: the server refuses it. */
  CHECK_STATUS(shardlock_acquire(c, "c-api/p", 5000, 0, SHARDLOCK_PERMIT, 3, 0, NULL, NULL, &pc),
               SHARDLOCK_SERVER_ERROR);
  CHECK(strstr(shardlock_last_error_detail(), "another lease kind") != NULL);
  shardlock_lease_destroy(pa);
  shardlock_lease_destroy(pb);

  shardlock_client_destroy(a);
  shardlock_client_destroy(b);
  shardlock_client_destroy(c);
  return NULL;
}

const char* c_api_bad_arguments(const char* server) {
  shardlock_client* client = NULL;
  shardlock_lease* lease = NULL;
  char long_key[300];
  char id[33];
  int status;

  CHECK_STATUS(shardlock_client_create(NULL, NULL, 0, &client), SHARDLOCK_BAD_ARGUMENT);
  CHECK(client == NULL);
  CHECK_STATUS(shardlock_client_create(server, NULL, 0, NULL), SHARDLOCK_BAD_ARGUMENT);
  CHECK_STATUS(shardlock_client_create("", NULL, 0, &client), SHARDLOCK_BAD_ARGUMENT);
  CHECK_STATUS(shardlock_client_create(",,", NULL, 0, &client), SHARDLOCK_BAD_ARGUMENT);
  CHECK_STATUS(shardlock_client_create("no-port", NULL, 0, &client), SHARDLOCK_BAD_ADDRESS);
  CHECK(strlen(shardlock_last_error_detail()) > 0);
  CHECK_STATUS(shardlock_client_create("127.0.0.1:99999", NULL, 0, &client), SHARDLOCK_BAD_ADDRESS);
  CHECK_STATUS(shardlock_client_create(server, "/nonexistent/shardlock.key", 0, &client),
               SHARDLOCK_AUTH_KEY);
  CHECK(client == NULL);

  CHECK_STATUS(shardlock_client_create(server, NULL, 0, &client), SHARDLOCK_OK);
  CHECK_STATUS(shardlock_client_id(NULL, id, sizeof id), SHARDLOCK_BAD_ARGUMENT);
  CHECK_STATUS(shardlock_client_id(client, id, 32), SHARDLOCK_BAD_ARGUMENT);
  CHECK_STATUS(shardlock_client_id(client, NULL, 33), SHARDLOCK_BAD_ARGUMENT);

  /* Everything below is refused before sending; *out stays NULL. */
  CHECK_STATUS(shardlock_acquire(NULL, "k", 1000, 0, SHARDLOCK_EXCLUSIVE, 0, 0, NULL, NULL, &lease),
               SHARDLOCK_BAD_ARGUMENT);
  CHECK_STATUS(
      shardlock_acquire(client, NULL, 1000, 0, SHARDLOCK_EXCLUSIVE, 0, 0, NULL, NULL, &lease),
      SHARDLOCK_BAD_ARGUMENT);
  CHECK_STATUS(
      shardlock_acquire(client, "", 1000, 0, SHARDLOCK_EXCLUSIVE, 0, 0, NULL, NULL, &lease),
      SHARDLOCK_BAD_ARGUMENT);
  memset(long_key, 'k', sizeof long_key - 1);
  long_key[sizeof long_key - 1] = '\0';
  CHECK_STATUS(
      shardlock_acquire(client, long_key, 1000, 0, SHARDLOCK_EXCLUSIVE, 0, 0, NULL, NULL, &lease),
      SHARDLOCK_BAD_ARGUMENT);
  long_key[256] = '\0'; /* exactly the longest key: accepted */
  CHECK_STATUS(
      shardlock_acquire(client, long_key, 1000, 0, SHARDLOCK_EXCLUSIVE, 0, 0, NULL, NULL, &lease),
      SHARDLOCK_OK);
  shardlock_lease_destroy(lease);
  lease = NULL;
  CHECK_STATUS(shardlock_acquire(client, "k", 0, 0, SHARDLOCK_EXCLUSIVE, 0, 0, NULL, NULL, &lease),
               SHARDLOCK_BAD_ARGUMENT);
  CHECK_STATUS(shardlock_acquire(client, "k", 1000, 0, 7, 0, 0, NULL, NULL, &lease),
               SHARDLOCK_BAD_ARGUMENT);
  CHECK_STATUS(
      shardlock_acquire(client, "k", 1000, 0, SHARDLOCK_EXCLUSIVE, 2, 0, NULL, NULL, &lease),
      SHARDLOCK_BAD_ARGUMENT);
  CHECK_STATUS(shardlock_acquire(client, "k", 1000, 0, SHARDLOCK_PERMIT, 0, 0, NULL, NULL, &lease),
               SHARDLOCK_BAD_ARGUMENT);
  CHECK_STATUS(
      shardlock_acquire(client, "k", 1000, 0, SHARDLOCK_PERMIT, 65536, 0, NULL, NULL, &lease),
      SHARDLOCK_BAD_ARGUMENT);
  CHECK_STATUS(
      shardlock_acquire(client, "k", 1000, 0, SHARDLOCK_EXCLUSIVE, 0, 0x8u, NULL, NULL, &lease),
      SHARDLOCK_BAD_ARGUMENT);
  CHECK_STATUS(shardlock_acquire(client, "k", 1000, 0, SHARDLOCK_EXCLUSIVE, 0, 0, NULL, NULL, NULL),
               SHARDLOCK_BAD_ARGUMENT);
  CHECK(lease == NULL);
  /* A TTL above the server's maximum (60 s in the test) is the server's ERROR. */
  CHECK_STATUS(
      shardlock_acquire(client, "k", 3600000, 0, SHARDLOCK_EXCLUSIVE, 0, 0, NULL, NULL, &lease),
      SHARDLOCK_SERVER_ERROR);
  CHECK(strstr(shardlock_last_error_detail(), "ttl out of range") != NULL);

  /* NULL leases. */
  CHECK_STATUS(shardlock_lease_renew(NULL, 0), SHARDLOCK_BAD_ARGUMENT);
  CHECK_STATUS(shardlock_lease_release(NULL), SHARDLOCK_BAD_ARGUMENT);
  CHECK(shardlock_lease_token(NULL) == 0);
  CHECK(strcmp(shardlock_lease_key(NULL), "") == 0);
  CHECK(shardlock_lease_valid(NULL) == 0);
  CHECK(shardlock_lease_remaining_ms(NULL) == 0);
  CHECK(shardlock_lease_mode(NULL) == SHARDLOCK_EXCLUSIVE);
  shardlock_lease_destroy(NULL);
  shardlock_client_destroy(NULL);

  /* Every status has its own text. */
  for (status = SHARDLOCK_OK; status <= SHARDLOCK_REDIRECTED; ++status) {
    CHECK(strcmp(shardlock_strerror(status), "unknown status") != 0);
    if (status > SHARDLOCK_OK) {
      CHECK(strcmp(shardlock_strerror(status), shardlock_strerror(status - 1)) != 0);
    }
  }
  CHECK(strcmp(shardlock_strerror(-1), "unknown status") == 0);
  CHECK(strcmp(shardlock_strerror(999), "unknown status") == 0);

  shardlock_client_destroy(client);
  return NULL;
}

const char* c_api_create_ex(const char* server) {
  shardlock_client* client = NULL;
  shardlock_lease* lease = NULL;
  shardlock_client_options options;
  /* A caller built against a newer header: its struct is longer. */
  struct {
    shardlock_client_options known;
    uint64_t newer_field;
  } newer;

  memset(&options, 0, sizeof options);
  options.size = sizeof options;
  options.nodes = server;

  /* Refused before anything starts; *out is NULL, nothing crashes. */
  CHECK_STATUS(shardlock_client_create_ex(&options, NULL), SHARDLOCK_BAD_ARGUMENT);
  client = (shardlock_client*)&client; /* must be reset to NULL on failure */
  CHECK_STATUS(shardlock_client_create_ex(NULL, &client), SHARDLOCK_BAD_ARGUMENT);
  CHECK(client == NULL);
  options.size = 0; /* a caller that forgot to set it */
  CHECK_STATUS(shardlock_client_create_ex(&options, &client), SHARDLOCK_BAD_ARGUMENT);
  CHECK(strstr(shardlock_last_error_detail(), "size") != NULL);
  /* Shorter than the first version of the struct. */
  options.size = offsetof(shardlock_client_options, flags) + sizeof options.flags - 1;
  CHECK_STATUS(shardlock_client_create_ex(&options, &client), SHARDLOCK_BAD_ARGUMENT);
  options.size = sizeof options;
  options.flags = 0x80u;
  CHECK_STATUS(shardlock_client_create_ex(&options, &client), SHARDLOCK_BAD_ARGUMENT);
  CHECK(strstr(shardlock_last_error_detail(), "flags") != NULL);
  options.flags = 0;
  options.nodes = NULL;
  CHECK_STATUS(shardlock_client_create_ex(&options, &client), SHARDLOCK_BAD_ARGUMENT);
  options.nodes = ",";
  CHECK_STATUS(shardlock_client_create_ex(&options, &client), SHARDLOCK_BAD_ARGUMENT);
  options.nodes = "no-port";
  CHECK_STATUS(shardlock_client_create_ex(&options, &client), SHARDLOCK_BAD_ADDRESS);
  options.nodes = server;
  options.auth_key_file = "/nonexistent/shardlock.key";
  CHECK_STATUS(shardlock_client_create_ex(&options, &client), SHARDLOCK_AUTH_KEY);
  options.auth_key_file = NULL;
  CHECK(client == NULL);

  /* Cluster mode against a single server: it answers MAP with epoch 0, so
   * there is no cluster to discover, and the detail says so. */
  options.flags = SHARDLOCK_CLIENT_DISCOVER_CLUSTER;
  options.request_timeout_ms = 500;
  CHECK_STATUS(shardlock_client_create_ex(&options, &client), SHARDLOCK_UNREACHABLE);
  CHECK(strstr(shardlock_last_error_detail(), "not a cluster node") != NULL);
  CHECK(client == NULL);
  options.flags = 0;

  /* A longer struct whose unknown tail is zero is served; a non-zero tail
   * asks for something this library cannot do. */
  memset(&newer, 0, sizeof newer);
  newer.known = options;
  newer.known.size = sizeof newer;
  newer.newer_field = 1;
  CHECK_STATUS(shardlock_client_create_ex(&newer.known, &client), SHARDLOCK_BAD_ARGUMENT);
  CHECK(strstr(shardlock_last_error_detail(), "does not know") != NULL);
  newer.newer_field = 0;
  CHECK_STATUS(shardlock_client_create_ex(&newer.known, &client), SHARDLOCK_OK);
  shardlock_client_destroy(client);
  client = NULL;

  /* Without flags it is shardlock_client_create(): a working client. */
  CHECK_STATUS(shardlock_client_create_ex(&options, &client), SHARDLOCK_OK);
  CHECK(client != NULL);
  CHECK(strcmp(shardlock_last_error_detail(), "") == 0);
  CHECK_STATUS(
      shardlock_acquire(client, "c-api/ex", 5000, 0, SHARDLOCK_EXCLUSIVE, 0, 0, NULL, NULL, &lease),
      SHARDLOCK_OK);
  CHECK(shardlock_lease_token(lease) > 0);
  CHECK_STATUS(shardlock_lease_release(lease), SHARDLOCK_OK);
  shardlock_lease_destroy(lease);
  shardlock_client_destroy(client);
  return NULL;
}

/* What the lost callback saw. */
struct lost_record {
  atomic_int calls;
  atomic_int reason;
  atomic_ullong token;
  char key[64];
};

static void record_lost(const char* key, uint64_t token, int reason, int refused_by_server,
                        void* user_data) {
  struct lost_record* record = user_data;
  (void)refused_by_server;
  snprintf(record->key, sizeof record->key, "%s", key);
  atomic_store(&record->token, token);
  atomic_store(&record->reason, reason);
  atomic_fetch_add(&record->calls, 1); /* last: the test reads the rest after it */
}

static void clear_lost(struct lost_record* record) {
  memset(record, 0, sizeof *record);
  atomic_init(&record->calls, 0);
}

/* Waits up to 5 s for the callback to have fired. */
static void wait_for_lost(struct lost_record* record) {
  int waited;
  for (waited = 0; waited < 5000 && atomic_load(&record->calls) == 0; waited += 10) sleep_ms(10);
}

const char* c_api_watchdog_and_lost(const char* server, void (*stop_server)(void*), void* context) {
  shardlock_client* client = NULL;
  shardlock_lease* kept = NULL;
  shardlock_lease* lost = NULL;
  struct lost_record kept_record;
  struct lost_record lost_record;

  clear_lost(&kept_record);
  clear_lost(&lost_record);
  CHECK_STATUS(shardlock_client_create(server, NULL, 300, &client), SHARDLOCK_OK);

  /* The watchdog keeps a 600 ms lease across three TTLs. */
  CHECK_STATUS(shardlock_acquire(client, "c-api/kept", 600, 0, SHARDLOCK_EXCLUSIVE, 0,
                                 SHARDLOCK_WATCHDOG, record_lost, &kept_record, &kept),
               SHARDLOCK_OK);
  sleep_ms(1800);
  CHECK(shardlock_lease_valid(kept) == 1);
  CHECK(atomic_load(&kept_record.calls) == 0);
  CHECK_STATUS(shardlock_lease_release(kept), SHARDLOCK_OK);
  shardlock_lease_destroy(kept);

  CHECK_STATUS(shardlock_acquire(client, "c-api/lost", 600, 0, SHARDLOCK_EXCLUSIVE, 0,
                                 SHARDLOCK_WATCHDOG, record_lost, &lost_record, &lost),
               SHARDLOCK_OK);
  /* The server goes away: renewals go unanswered, the client-side expiry
   * passes, and the callback fires once, on the watchdog thread. */
  stop_server(context);
  wait_for_lost(&lost_record);
  CHECK(atomic_load(&lost_record.calls) == 1);
  CHECK(atomic_load(&lost_record.reason) == SHARDLOCK_EXPIRED);
  CHECK(atomic_load(&lost_record.token) == shardlock_lease_token(lost));
  CHECK(strcmp(lost_record.key, "c-api/lost") == 0);
  CHECK(shardlock_lease_valid(lost) == 0);
  CHECK(shardlock_lease_remaining_ms(lost) == 0);
  CHECK_STATUS(shardlock_lease_renew(lost, 0), SHARDLOCK_LEASE_INACTIVE);
  sleep_ms(500);
  CHECK(atomic_load(&lost_record.calls) == 1); /* at most once */
  shardlock_lease_destroy(lost);
  CHECK(atomic_load(&lost_record.calls) == 1);

  /* With the server gone, a call is unreachable by its deadline. */
  CHECK_STATUS(
      shardlock_acquire(client, "c-api/lost", 600, 0, SHARDLOCK_EXCLUSIVE, 0, 0, NULL, NULL, &lost),
      SHARDLOCK_UNREACHABLE);
  shardlock_client_destroy(client);
  return NULL;
}

const char* c_api_holders(const char* server) {
  shardlock_client* a = NULL;
  shardlock_client* b = NULL;
  shardlock_lease* ra = NULL;
  shardlock_lease* rb = NULL;
  shardlock_holders* h = NULL;
  shardlock_holder_info info;
  char id_a[33];
  char id_b[33];

  CHECK_STATUS(shardlock_client_create(server, NULL, 0, &a), SHARDLOCK_OK);
  CHECK_STATUS(shardlock_client_create(server, NULL, 0, &b), SHARDLOCK_OK);
  CHECK_STATUS(shardlock_client_id(a, id_a, sizeof id_a), SHARDLOCK_OK);
  CHECK_STATUS(shardlock_client_id(b, id_b, sizeof id_b), SHARDLOCK_OK);

  /* A free key: no holders, no mode. */
  CHECK_STATUS(shardlock_query_holders(a, "c-api/h", &h), SHARDLOCK_OK);
  CHECK(shardlock_holders_listed(h) == 1);
  CHECK(shardlock_holders_mode(h) == -1);
  CHECK(shardlock_holders_total(h) == 0 && shardlock_holders_count(h) == 0);
  shardlock_holders_destroy(h);
  h = NULL;

  /* Two shared holders, oldest first. */
  CHECK_STATUS(shardlock_acquire(a, "c-api/h", 5000, 0, SHARDLOCK_SHARED, 0, 0, NULL, NULL, &ra),
               SHARDLOCK_OK);
  CHECK_STATUS(shardlock_acquire(b, "c-api/h", 5000, 0, SHARDLOCK_SHARED, 0, 0, NULL, NULL, &rb),
               SHARDLOCK_OK);
  CHECK_STATUS(shardlock_query_holders(b, "c-api/h", &h), SHARDLOCK_OK);
  CHECK(shardlock_holders_mode(h) == SHARDLOCK_SHARED);
  CHECK(shardlock_holders_total(h) == 2 && shardlock_holders_count(h) == 2);
  CHECK(shardlock_holders_waiters(h) == 0 && shardlock_holders_permits(h) == 0);
  memset(&info, 0, sizeof info);
  info.size = sizeof info;
  CHECK_STATUS(shardlock_holders_get(h, 0, &info), SHARDLOCK_OK);
  /* Each lease is its own owner: a's client id with its last 8 hex digits
   * (32 bits) a handle count. */
  CHECK(strlen(info.owner) == 32 && strncmp(info.owner, id_a, 24) == 0);
  CHECK(strcmp(info.owner, id_a) != 0);
  CHECK(info.token == shardlock_lease_token(ra));
  CHECK(info.ttl_left_ms > 0 && info.ttl_left_ms <= 5000);
  CHECK(info.pending == 0);
  CHECK(info.value != NULL && info.value_length == 0 && info.value[0] == 0);
  CHECK_STATUS(shardlock_holders_get(h, 1, &info), SHARDLOCK_OK);
  CHECK(strncmp(info.owner, id_b, 24) == 0);
  CHECK(info.token == shardlock_lease_token(rb));

  /* Bad arguments. */
  CHECK_STATUS(shardlock_holders_get(h, 2, &info), SHARDLOCK_BAD_ARGUMENT);
  info.size = 8;
  CHECK_STATUS(shardlock_holders_get(h, 0, &info), SHARDLOCK_BAD_ARGUMENT);
  CHECK_STATUS(shardlock_holders_get(NULL, 0, &info), SHARDLOCK_BAD_ARGUMENT);
  shardlock_holders_destroy(h);
  h = (shardlock_holders*)&h; /* must be reset to NULL on failure */
  CHECK_STATUS(shardlock_query_holders(a, "", &h), SHARDLOCK_BAD_ARGUMENT);
  CHECK(h == NULL);
  CHECK_STATUS(shardlock_query_holders(NULL, "k", &h), SHARDLOCK_BAD_ARGUMENT);
  CHECK_STATUS(shardlock_query_holders(a, "k", NULL), SHARDLOCK_BAD_ARGUMENT);
  CHECK(shardlock_holders_count(NULL) == 0 && shardlock_holders_mode(NULL) == -1);
  shardlock_holders_destroy(NULL);

  shardlock_lease_destroy(ra);
  shardlock_lease_destroy(rb);

  /* A value the lease carries, listed with its holder (bytes, NULs too). */
  CHECK_STATUS(shardlock_acquire_with_value(a, "c-api/v", 5000, 0, SHARDLOCK_EXCLUSIVE, 0, 0, NULL,
                                            NULL, "db\0:5432", 8, &ra),
               SHARDLOCK_OK);
  CHECK_STATUS(shardlock_query_holders(b, "c-api/v", &h), SHARDLOCK_OK);
  memset(&info, 0, sizeof info);
  info.size = sizeof info;
  CHECK_STATUS(shardlock_holders_get(h, 0, &info), SHARDLOCK_OK);
  CHECK(info.value_length == 8 && memcmp(info.value, "db\0:5432", 8) == 0);
  CHECK(info.value[8] == 0);
  shardlock_holders_destroy(h);
  rb = (shardlock_lease*)&rb;
  {
    char long_value[257];
    memset(long_value, 'v', sizeof long_value);
    CHECK_STATUS(shardlock_acquire_with_value(b, "c-api/w", 5000, 0, SHARDLOCK_EXCLUSIVE, 0, 0,
                                              NULL, NULL, long_value, sizeof long_value, &rb),
                 SHARDLOCK_BAD_ARGUMENT);
    CHECK(rb == NULL);
  }
  CHECK_STATUS(shardlock_acquire_with_value(b, "c-api/w", 5000, 0, SHARDLOCK_EXCLUSIVE, 0, 0, NULL,
                                            NULL, NULL, 3, &rb),
               SHARDLOCK_BAD_ARGUMENT);
  shardlock_lease_destroy(ra);

  shardlock_client_destroy(a);
  shardlock_client_destroy(b);
  return NULL;
}

const char* c_api_reentrant(const char* server) {
  shardlock_client* a = NULL;
  shardlock_client* b = NULL;
  shardlock_lease* outer = NULL;
  shardlock_lease* inner = NULL;
  shardlock_lease* other = NULL;
  struct lost_record record;
  uint64_t token;

  clear_lost(&record);
  CHECK_STATUS(shardlock_client_create(server, NULL, 0, &a), SHARDLOCK_OK);
  CHECK_STATUS(shardlock_client_create(server, NULL, 0, &b), SHARDLOCK_OK);

  /* A second acquire by the same client shares the grant and its token. */
  CHECK_STATUS(shardlock_acquire_reentrant(a, "c-api/r", 5000, 0, 0, NULL, NULL, &outer),
               SHARDLOCK_OK);
  CHECK(shardlock_lease_hold_count(outer) == 1);
  token = shardlock_lease_token(outer);
  CHECK_STATUS(shardlock_acquire_reentrant(a, "c-api/r", 5000, 0, 0, NULL, NULL, &inner),
               SHARDLOCK_OK);
  CHECK(shardlock_lease_token(inner) == token);
  CHECK(shardlock_lease_hold_count(outer) == 2 && shardlock_lease_hold_count(inner) == 2);
  CHECK(strcmp(shardlock_lease_key(inner), "c-api/r") == 0);
  CHECK(shardlock_lease_mode(inner) == SHARDLOCK_EXCLUSIVE);
  CHECK(shardlock_lease_valid(inner) == 1 && shardlock_lease_remaining_ms(inner) > 0);
  CHECK_STATUS(
      shardlock_acquire(b, "c-api/r", 5000, 0, SHARDLOCK_EXCLUSIVE, 0, 0, NULL, NULL, &other),
      SHARDLOCK_BUSY);

  /* Releasing one hold keeps the key; the handle keeps its key and token. */
  CHECK_STATUS(shardlock_lease_release(inner), SHARDLOCK_OK);
  CHECK(shardlock_lease_valid(inner) == 0 && shardlock_lease_hold_count(inner) == 0);
  CHECK(shardlock_lease_token(inner) == token);
  CHECK(strcmp(shardlock_lease_key(inner), "c-api/r") == 0);
  CHECK_STATUS(shardlock_lease_release(inner), SHARDLOCK_LEASE_INACTIVE);
  CHECK_STATUS(shardlock_lease_renew(inner, 0), SHARDLOCK_LEASE_INACTIVE);
  shardlock_lease_destroy(inner);
  CHECK(shardlock_lease_hold_count(outer) == 1);
  CHECK_STATUS(shardlock_lease_renew(outer, 4000), SHARDLOCK_OK);
  CHECK_STATUS(
      shardlock_acquire(b, "c-api/r", 5000, 0, SHARDLOCK_EXCLUSIVE, 0, 0, NULL, NULL, &other),
      SHARDLOCK_BUSY);

  /* Destroying the last hold releases the key: b, waiting, is handed it. */
  shardlock_lease_destroy(outer);
  CHECK_STATUS(
      shardlock_acquire(b, "c-api/r", 5000, 3000, SHARDLOCK_EXCLUSIVE, 0, 0, NULL, NULL, &other),
      SHARDLOCK_OK);
  CHECK(shardlock_lease_hold_count(other) == 1); /* a plain lease */
  shardlock_lease_destroy(other);

  /* A lost grant: every hold is invalid, and on_lost fires once. */
  CHECK_STATUS(
      shardlock_acquire_reentrant(a, "c-api/r-lost", 300, 0, 0, record_lost, &record, &outer),
      SHARDLOCK_OK);
  CHECK_STATUS(shardlock_acquire_reentrant(a, "c-api/r-lost", 300, 0, 0, NULL, NULL, &inner),
               SHARDLOCK_OK);
  wait_for_lost(&record);
  CHECK(atomic_load(&record.calls) == 1);
  CHECK(shardlock_lease_valid(outer) == 0 && shardlock_lease_valid(inner) == 0);
  shardlock_lease_destroy(inner);
  shardlock_lease_destroy(outer);
  CHECK(atomic_load(&record.calls) == 1);

  /* Bad arguments, as shardlock_acquire(). */
  CHECK(shardlock_lease_hold_count(NULL) == 0);
  CHECK_STATUS(shardlock_acquire_reentrant(a, "c-api/r", 0, 0, 0, NULL, NULL, &outer),
               SHARDLOCK_BAD_ARGUMENT);
  CHECK(outer == NULL);
  CHECK_STATUS(shardlock_acquire_reentrant(a, "c-api/r", 5000, 0, 0x80u, NULL, NULL, &outer),
               SHARDLOCK_BAD_ARGUMENT);
  CHECK_STATUS(shardlock_acquire_reentrant(NULL, "c-api/r", 5000, 0, 0, NULL, NULL, &outer),
               SHARDLOCK_BAD_ARGUMENT);
  CHECK_STATUS(shardlock_acquire_reentrant(a, "c-api/r", 5000, 0, 0, NULL, NULL, NULL),
               SHARDLOCK_BAD_ARGUMENT);

  shardlock_client_destroy(a);
  shardlock_client_destroy(b);
  return NULL;
}

const char* c_api_election_and_watch(const char* server) {
  shardlock_client* a = NULL;
  shardlock_client* b = NULL;
  shardlock_client* o = NULL;
  shardlock_election* ea = NULL;
  shardlock_election* eb = NULL;
  shardlock_watch* w = NULL;
  shardlock_holders* h = NULL;
  shardlock_holder_info info;
  uint64_t term_a;

  CHECK_STATUS(shardlock_client_create(server, NULL, 0, &a), SHARDLOCK_OK);
  CHECK_STATUS(shardlock_client_create(server, NULL, 0, &b), SHARDLOCK_OK);
  CHECK_STATUS(shardlock_client_create(server, NULL, 0, &o), SHARDLOCK_OK);
  CHECK_STATUS(shardlock_watch_create(o, "c-api/leader", &w), SHARDLOCK_OK);
  CHECK_STATUS(shardlock_election_create(a, "c-api/leader", 5000, NULL, NULL, &ea), SHARDLOCK_OK);
  CHECK_STATUS(shardlock_election_create(b, "", 5000, NULL, NULL, &eb), SHARDLOCK_BAD_ARGUMENT);
  CHECK(eb == NULL);
  CHECK_STATUS(shardlock_election_create(b, "c-api/leader", 0, NULL, NULL, &eb),
               SHARDLOCK_BAD_ARGUMENT);
  CHECK_STATUS(shardlock_election_create(b, "c-api/leader", 5000, NULL, NULL, &eb), SHARDLOCK_OK);

  /* The first state comes at once: nobody leads. */
  CHECK_STATUS(shardlock_watch_next(w, 5000, &h), SHARDLOCK_OK);
  memset(&info, 0, sizeof info);
  info.size = sizeof info;
  CHECK(shardlock_holders_leader(h, &info) == 0);
  shardlock_holders_destroy(h);
  h = NULL;

  CHECK_STATUS(shardlock_election_campaign(ea, "host-a", 6, SHARDLOCK_WAIT_FOREVER), SHARDLOCK_OK);
  CHECK(shardlock_election_leading(ea) == 1);
  term_a = shardlock_election_term(ea);
  CHECK(term_a != 0);
  CHECK_STATUS(shardlock_election_campaign(ea, "host-a", 6, 0), SHARDLOCK_BUSY);
  CHECK_STATUS(shardlock_election_campaign(eb, "host-b", 6, 100), SHARDLOCK_TIMEOUT);
  CHECK(shardlock_election_leading(eb) == 0 && shardlock_election_term(eb) == 0);

  /* The watch wakes with A as leader, its value and term. */
  CHECK_STATUS(shardlock_watch_next(w, 5000, &h), SHARDLOCK_OK);
  CHECK(shardlock_holders_leader(h, &info) == 1);
  CHECK(info.token == term_a);
  CHECK(info.value_length == 6 && memcmp(info.value, "host-a", 6) == 0);
  shardlock_holders_destroy(h);
  h = NULL;
  CHECK_STATUS(shardlock_watch_next(w, 200, &h), SHARDLOCK_TIMEOUT); /* renewals: no change */
  CHECK(h == NULL);

  /* A resigns; B is elected with a later term, and the watch sees it. */
  CHECK_STATUS(shardlock_election_resign(ea), SHARDLOCK_OK);
  CHECK_STATUS(shardlock_election_resign(ea), SHARDLOCK_LEASE_INACTIVE);
  CHECK_STATUS(shardlock_election_campaign(eb, "host-b", 6, 5000), SHARDLOCK_OK);
  CHECK(shardlock_election_term(eb) > term_a);
  for (int i = 0; i < 3; ++i) {
    CHECK_STATUS(shardlock_watch_next(w, 5000, &h), SHARDLOCK_OK);
    if (shardlock_holders_leader(h, &info) == 1) break;
    shardlock_holders_destroy(h);
    h = NULL;
  }
  CHECK(h != NULL);
  CHECK(info.token == shardlock_election_term(eb));
  CHECK(info.value_length == 6 && memcmp(info.value, "host-b", 6) == 0);
  shardlock_holders_destroy(h);
  CHECK(shardlock_holders_leader(NULL, &info) == -1);

  shardlock_watch_cancel(w);
  CHECK_STATUS(shardlock_watch_next(w, 5000, &h), SHARDLOCK_TIMEOUT);
  shardlock_watch_destroy(w);
  shardlock_election_destroy(ea);
  shardlock_election_destroy(eb); /* resigns */
  shardlock_client_destroy(a);
  shardlock_client_destroy(b);
  shardlock_client_destroy(o);
  return NULL;
}

/* Threads sharing one client, as a thread pool shares one global client. */
enum { kThreadCount = 8, kThreadRounds = 4 };

struct shared_counter {
  shardlock_client* client;
  atomic_int inside;
  atomic_int overlaps;
  atomic_int failures;
  int value; /* guarded by the lease alone */
};

static void* increment_under_lease(void* arg) {
  struct shared_counter* c = arg;
  int round;
  for (round = 0; round < kThreadRounds; ++round) {
    shardlock_lease* lease = NULL;
    int seen;
    if (shardlock_acquire(c->client, "c-api/threads", 10000, 30000, SHARDLOCK_EXCLUSIVE, 0, 0, NULL,
                          NULL, &lease) != SHARDLOCK_OK) {
      atomic_fetch_add(&c->failures, 1);
      continue;
    }
    if (atomic_fetch_add(&c->inside, 1) != 0) atomic_fetch_add(&c->overlaps, 1);
    seen = c->value;
    sleep_ms(3);
    c->value = seen + 1;
    atomic_fetch_sub(&c->inside, 1);
    if (shardlock_lease_release(lease) != SHARDLOCK_OK) atomic_fetch_add(&c->failures, 1);
    shardlock_lease_destroy(lease);
  }
  return NULL;
}

struct reentrant_try {
  shardlock_client* client;
  unsigned flags;
  int status;
  uint64_t token;
};

static void* try_reentrant(void* arg) {
  struct reentrant_try* t = arg;
  shardlock_lease* lease = NULL;
  t->status = shardlock_acquire_reentrant(t->client, "c-api/r-thread", 5000, 0, t->flags, NULL,
                                          NULL, &lease);
  t->token = t->status == SHARDLOCK_OK ? shardlock_lease_token(lease) : 0;
  shardlock_lease_destroy(lease);
  return NULL;
}

const char* c_api_threads(const char* server) {
  struct shared_counter counter;
  struct reentrant_try other_thread;
  pthread_t threads[kThreadCount];
  shardlock_lease* outer = NULL;
  shardlock_lease* inner = NULL;
  int i;

  memset(&counter, 0, sizeof counter);
  CHECK_STATUS(shardlock_client_create(server, NULL, 0, &counter.client), SHARDLOCK_OK);

  /* Every lease is its own owner: the threads exclude each other. */
  for (i = 0; i < kThreadCount; ++i) {
    CHECK(pthread_create(&threads[i], NULL, increment_under_lease, &counter) == 0);
  }
  for (i = 0; i < kThreadCount; ++i) pthread_join(threads[i], NULL);
  CHECK(atomic_load(&counter.failures) == 0);
  CHECK(atomic_load(&counter.overlaps) == 0);
  CHECK(counter.value == kThreadCount * kThreadRounds);

  /* Reentrant per thread: this thread re-enters, another one is busy. */
  CHECK_STATUS(
      shardlock_acquire_reentrant(counter.client, "c-api/r-thread", 5000, 0, 0, NULL, NULL, &outer),
      SHARDLOCK_OK);
  CHECK_STATUS(
      shardlock_acquire_reentrant(counter.client, "c-api/r-thread", 5000, 0, 0, NULL, NULL, &inner),
      SHARDLOCK_OK);
  CHECK(shardlock_lease_hold_count(inner) == 2);
  memset(&other_thread, 0, sizeof other_thread);
  other_thread.client = counter.client;
  CHECK(pthread_create(&threads[0], NULL, try_reentrant, &other_thread) == 0);
  pthread_join(threads[0], NULL);
  CHECK(other_thread.status == SHARDLOCK_BUSY);
  shardlock_lease_destroy(inner);
  shardlock_lease_destroy(outer);

  /* SHARDLOCK_REENTRANT_PER_CLIENT: the other thread joins the grant. */
  CHECK_STATUS(shardlock_acquire_reentrant(counter.client, "c-api/r-thread", 5000, 0,
                                           SHARDLOCK_REENTRANT_PER_CLIENT, NULL, NULL, &outer),
               SHARDLOCK_OK);
  other_thread.flags = SHARDLOCK_REENTRANT_PER_CLIENT;
  CHECK(pthread_create(&threads[0], NULL, try_reentrant, &other_thread) == 0);
  pthread_join(threads[0], NULL);
  CHECK(other_thread.status == SHARDLOCK_OK);
  CHECK(other_thread.token == shardlock_lease_token(outer));
  shardlock_lease_destroy(outer);

  shardlock_client_destroy(counter.client);
  return NULL;
}

/* Zeroed options for `server` under key_file's key, a second's timeout. */
static void tenant_options(shardlock_client_options* options, const char* server,
                           const char* key_file) {
  memset(options, 0, sizeof *options);
  options->size = sizeof *options;
  options->nodes = server;
  options->auth_key_file = key_file;
  options->request_timeout_ms = 1000;
}

const char* c_api_tenant(const char* server, const char* key_file, uint32_t tenant) {
  shardlock_client* client = NULL;
  shardlock_lease* lease = NULL;
  shardlock_client_options options;
  tenant_options(&options, server, key_file);

  /* Encryption needs a tenant. */
  options.flags = SHARDLOCK_CLIENT_ENCRYPT;
  CHECK_STATUS(shardlock_client_create_ex(&options, &client), SHARDLOCK_BAD_ARGUMENT);
  CHECK(client == NULL);
  /* The tenant's key without its key id is no datagram the server takes. */
  options.flags = 0;
  CHECK_STATUS(shardlock_client_create_ex(&options, &client), SHARDLOCK_OK);
  CHECK_STATUS(
      shardlock_acquire(client, "c/a", 5000, 0, SHARDLOCK_EXCLUSIVE, 0, 0, NULL, NULL, &lease),
      SHARDLOCK_UNREACHABLE);
  shardlock_client_destroy(client);
  client = NULL;

  options.flags = SHARDLOCK_CLIENT_TENANT | SHARDLOCK_CLIENT_ENCRYPT;
  options.tenant = tenant;
  CHECK_STATUS(shardlock_client_create_ex(&options, &client), SHARDLOCK_OK);
  CHECK_STATUS(
      shardlock_acquire(client, "c/a", 5000, 0, SHARDLOCK_EXCLUSIVE, 0, 0, NULL, NULL, &lease),
      SHARDLOCK_OK);
  CHECK_STATUS(shardlock_lease_release(lease), SHARDLOCK_OK);
  shardlock_lease_destroy(lease);
  lease = NULL;
  /* Outside the tenant's prefix: refused, and the detail says why. */
  CHECK_STATUS(
      shardlock_acquire(client, "other", 5000, 0, SHARDLOCK_EXCLUSIVE, 0, 0, NULL, NULL, &lease),
      SHARDLOCK_SERVER_ERROR);
  CHECK(strstr(shardlock_last_error_detail(), "permission denied") != NULL);
  shardlock_client_destroy(client);
  return NULL;
}

/* Acquires and releases "c/a" as `tenant`, encrypted, with `cipher_flag`
 * (0, SHARDLOCK_CLIENT_CIPHER_PORTABLE or SHARDLOCK_CLIENT_CIPHER_AES). */
static const char* tenant_round_trip(shardlock_client_options* options, uint32_t cipher_flag) {
  shardlock_client* client = NULL;
  shardlock_lease* lease = NULL;
  options->flags = SHARDLOCK_CLIENT_TENANT | SHARDLOCK_CLIENT_ENCRYPT | cipher_flag;
  CHECK_STATUS(shardlock_client_create_ex(options, &client), SHARDLOCK_OK);
  CHECK_STATUS(
      shardlock_acquire(client, "c/a", 5000, 0, SHARDLOCK_EXCLUSIVE, 0, 0, NULL, NULL, &lease),
      SHARDLOCK_OK);
  CHECK_STATUS(shardlock_lease_release(lease), SHARDLOCK_OK);
  shardlock_lease_destroy(lease);
  shardlock_client_destroy(client);
  return NULL;
}

const char* c_api_tenant_ciphers(const char* server, const char* key_file, uint32_t tenant,
                                 int have_aes) {
  shardlock_client* client = NULL;
  const char* failed = NULL;
  shardlock_client_options options;
  tenant_options(&options, server, key_file);
  options.tenant = tenant;

  /* One cipher at a time, and AES-GCM only for a tenant. */
  options.flags =
      SHARDLOCK_CLIENT_TENANT | SHARDLOCK_CLIENT_CIPHER_PORTABLE | SHARDLOCK_CLIENT_CIPHER_AES;
  CHECK_STATUS(shardlock_client_create_ex(&options, &client), SHARDLOCK_BAD_ARGUMENT);
  CHECK(client == NULL);
  options.flags = SHARDLOCK_CLIENT_CIPHER_AES;
  CHECK_STATUS(shardlock_client_create_ex(&options, &client), SHARDLOCK_BAD_ARGUMENT);
  CHECK(strstr(shardlock_last_error_detail(), "tenant") != NULL);

  failed = tenant_round_trip(&options, SHARDLOCK_CLIENT_CIPHER_PORTABLE);
  if (failed != NULL) return failed;
  if (have_aes) {
    failed = tenant_round_trip(&options, SHARDLOCK_CLIENT_CIPHER_AES);
    if (failed != NULL) return failed;
  } else {
    options.flags =
        SHARDLOCK_CLIENT_TENANT | SHARDLOCK_CLIENT_ENCRYPT | SHARDLOCK_CLIENT_CIPHER_AES;
    CHECK_STATUS(shardlock_client_create_ex(&options, &client), SHARDLOCK_BAD_ARGUMENT);
    CHECK(strstr(shardlock_last_error_detail(), "AES") != NULL);
  }
  return tenant_round_trip(&options, 0);
}
