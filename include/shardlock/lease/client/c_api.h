/* c_api.h: a small, stable C interface to the shardlock lease client
 * (libshardlock_c.so), so that C and any language with a C FFI can take
 * leases with fencing tokens.
 *
 *   shardlock_client* client = NULL;
 *   if (shardlock_client_create("127.0.0.1:7420", NULL, 0, &client) != SHARDLOCK_OK) {
 *     fprintf(stderr, "%s\n", shardlock_last_error_detail());
 *   }
 *   shardlock_lease* lease = NULL;
 *   int rc = shardlock_acquire(client, "orders/42", 10000, 2000, SHARDLOCK_EXCLUSIVE, 0,
 *                              SHARDLOCK_WATCHDOG, on_lost, &my_state, &lease);
 *   if (rc == SHARDLOCK_OK) {
 *     write_with_fence(shardlock_lease_token(lease));
 *     shardlock_lease_destroy(lease);  // releases it
 *   } else if (rc == SHARDLOCK_BUSY) { ... }
 *   shardlock_client_destroy(client);
 *
 * It wraps shardlock::lease::LeaseClient and Lease (client.h, docs/client.md),
 * whose semantics it keeps: every lease is its own owner (two acquires of one
 * key through one client, from one thread or many, exclude each other as two
 * processes do), retransmission with the same request id, a client-side expiry that errs early, a
 * watchdog that renews at ttl / 3, and a lost-lease callback that fires at most once.
 *
 * ABI rules. Handles are opaque. The one struct that crosses the interface,
 * shardlock_client_options, is read only by the library and starts with its
 * own size, so fields can be added at its end without breaking callers built
 * against an older header. Every function that can fail returns an int, one
 * of enum shardlock_status, whose values never change (new codes may be
 * added). No function throws, aborts or exits on bad input: NULL handles,
 * NULL or over-long keys, bad modes and unknown flags are
 * SHARDLOCK_BAD_ARGUMENT. The library exports only shardlock_* symbols,
 * versioned SHARDLOCK_C_1 (and SHARDLOCK_C_1.1, 1.2 for those added since); its
 * SONAME is libshardlock_c.so.1 and changes only with an incompatible change
 * here.
 *
 * Threads. A client may be used from any number of threads at once. A lease
 * handle is one object: its functions may be called from any thread, but
 * not concurrently with its own shardlock_lease_destroy(). */
#ifndef SHARDLOCK_LEASE_C_API_H_
#define SHARDLOCK_LEASE_C_API_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The library is built with hidden visibility; these are its exports. */
#if defined(__GNUC__)
#define SHARDLOCK_C_EXPORT __attribute__((visibility("default")))
#else
#define SHARDLOCK_C_EXPORT
#endif

/* The version of this interface: the number in the SONAME and in the
 * symbol version node (SHARDLOCK_C_1). */
#define SHARDLOCK_C_API_VERSION 1
/* The minor version: functions added without breaking the ABI. 1 added
 * shardlock_client_create_ex() (symbol version SHARDLOCK_C_1.1); 2 added
 * shardlock_query_holders(), the shardlock_holders_* functions,
 * shardlock_acquire_with_value(), shardlock_acquire_reentrant(),
 * shardlock_lease_hold_count(), and the shardlock_watch_* and
 * shardlock_election_* functions and shardlock_holders_leader()
 * (SHARDLOCK_C_1.2). Test it at compile time; a program that uses a
 * newer function needs a library at least that new, which the dynamic loader checks by symbol
 * version. */
/* Minor 3 adds no symbol: every lease is its own owner, reentrant acquires
 * are per thread, and SHARDLOCK_REENTRANT_PER_CLIENT asks for the old
 * per-client reentrancy. Minor 5 adds no symbol either: the cipher flags
 * SHARDLOCK_CLIENT_CIPHER_PORTABLE and SHARDLOCK_CLIENT_CIPHER_AES. */
#define SHARDLOCK_C_API_MINOR 5

/* The typedefs below are C, which has no `using`; clang-tidy's
 * modernize-use-using is silenced on each for that reason. */

/* A lease client: one UDP socket, one client identity (each lease it takes is
 * an owner of its own), an I/O thread and, from the first lease that needs
 * it, a watchdog thread. */
typedef struct shardlock_client shardlock_client; /* NOLINT(modernize-use-using) */
/* A lease acquired through a client: key, fencing token, client-side expiry. */
typedef struct shardlock_lease shardlock_lease; /* NOLINT(modernize-use-using) */
/* Who held a key when it was asked (shardlock_query_holders()): a snapshot. */
typedef struct shardlock_holders shardlock_holders; /* NOLINT(modernize-use-using) */

/* What a call returns. The first thirteen mirror LeaseErrc (client.h). */
enum shardlock_status {
  SHARDLOCK_OK = 0,
  SHARDLOCK_BUSY = 1,            /* held by another owner (acquire, wait_ms == 0) */
  SHARDLOCK_TIMEOUT = 2,         /* the wait ran out before the lease was handed over */
  SHARDLOCK_UNREACHABLE = 3,     /* no answer before the call's deadline */
  SHARDLOCK_RECOVERING = 4,      /* the server is in its lock-delay after a start */
  SHARDLOCK_NOT_OWNER = 5,       /* renew/release refused: another owner holds it */
  SHARDLOCK_EXPIRED = 6,         /* renew/release refused: the server no longer has it */
  SHARDLOCK_SERVER_ERROR = 7,    /* the server answered ERROR (see the detail) */
  SHARDLOCK_BAD_ARGUMENT = 8,    /* refused before sending: NULL, key length, TTL 0, ... */
  SHARDLOCK_NOT_STARTED = 9,     /* the client is shutting down */
  SHARDLOCK_BAD_ADDRESS = 10,    /* a node address does not parse or resolve */
  SHARDLOCK_LEASE_INACTIVE = 11, /* the lease was released or lost */
  SHARDLOCK_GRANT_EXPIRED = 12,  /* granted, but expired on arrival (and released) */
  SHARDLOCK_AUTH_KEY = 13,       /* the auth key file cannot be read or is not a key */
  SHARDLOCK_NO_MEMORY = 14,      /* an allocation failed */
  SHARDLOCK_INTERNAL = 15,       /* anything else (a bug: please report it) */
  /* A cluster node answered REDIRECT (the key is another node's) and the
   * call could not reach the owner: not in cluster mode, or still redirected
   * at its deadline. */
  SHARDLOCK_REDIRECTED = 16
};

/* How a lease holds its key. */
enum shardlock_mode {
  SHARDLOCK_EXCLUSIVE = 0, /* the only holder */
  SHARDLOCK_SHARED = 1,    /* with other shared holders, never with an exclusive one */
  SHARDLOCK_PERMIT = 2     /* one of at most `permits` holders (a counting semaphore) */
};

/* Flags of shardlock_acquire(). */
#define SHARDLOCK_WATCHDOG 0x1u /* renew automatically at ttl / 3 */
/* shardlock_acquire_reentrant() only: every thread of the client shares the
 * holds (the behaviour before SHARDLOCK_C_API_MINOR 3), instead of the
 * acquiring thread alone. */
#define SHARDLOCK_REENTRANT_PER_CLIENT 0x2u

/* Called when a lease is lost: a renewal was refused (reason
 * SHARDLOCK_NOT_OWNER or SHARDLOCK_EXPIRED, refused_by_server 1) or answered
 * with ERROR (SHARDLOCK_SERVER_ERROR), or the client-side expiry passed with
 * no confirmed renewal (SHARDLOCK_EXPIRED, refused_by_server 0: server down,
 * network partition, or no watchdog).
 *
 * Called at most once per lease, and never once shardlock_lease_release() or
 * shardlock_lease_destroy() of that lease has begun (both wait for a callback
 * that is running). It runs on the client's watchdog thread, never on the
 * caller's: it must be thread-safe with the rest of the program, should
 * return quickly, and may call the client (acquire; renew or release
 * leases, its own included), but must not destroy its own lease (the handle
 * belongs to the code that acquired it) nor its client (whose destruction
 * joins the watchdog thread). `key` is valid only during the call. */
/* NOLINTNEXTLINE(modernize-use-using) */
typedef void (*shardlock_lost_fn)(const char* key, uint64_t token, int reason,
                                  int refused_by_server, void* user_data);

/* A short English description of a shardlock_status ("busy", ...); "unknown
 * status" for other values. The string is static. */
SHARDLOCK_C_EXPORT const char* shardlock_strerror(int status);

/* A description of the last failure of a call on this thread (which node did
 * not parse, the server's ERROR code, the holder's TTL left on BUSY, the
 * retry hint of RECOVERING); "" when the last call succeeded. Valid until
 * the thread's next shardlock_* call. */
SHARDLOCK_C_EXPORT const char* shardlock_last_error_detail(void);

/* ---- Clients ------------------------------------------------------------ */

/* Creates and starts a client. `nodes`: "HOST:PORT" or a comma-separated list
 * (keys are routed to their owner node). `auth_key_file`: NULL, or a file of
 * 64 hex digits shared with the servers (shardlockctl keygen); then every
 * datagram is sealed and only sealed replies are believed.
 * `request_timeout_ms`: how long a call retransmits before it gives up as
 * SHARDLOCK_UNREACHABLE (0: the default, 2000). On success *out is a client
 * to free with shardlock_client_destroy(); on failure *out is NULL and
 * shardlock_last_error_detail() says why. Blocks only to resolve host names. */
SHARDLOCK_C_EXPORT int shardlock_client_create(const char* nodes, const char* auth_key_file,
                                               uint32_t request_timeout_ms, shardlock_client** out);

/* Flags of shardlock_client_options. */
/* Cluster mode (docs/cluster.md): `nodes` are seeds. Creation asks them, in
 * turn, for the cluster's map and fails with SHARDLOCK_UNREACHABLE (the
 * detail names each seed's reason) when none answers with one. Keys are then
 * routed to their owners by the map, REDIRECTs are followed, and a waiting
 * acquire rides through a failover: when the key's node dies it moves to the
 * new owner once the cluster has published the new map and is granted when
 * that owner's lock-delay ends, within its wait (docs/client.md, "Riding
 * through a lock-delay or a failover"). The map's members must share the
 * seeds' address family. */
#define SHARDLOCK_CLIENT_DISCOVER_CLUSTER 0x1u
/* `tenant` is set: auth_key_file holds that tenant's key (docs/security.md),
 * requests name its key id, and owner ids carry it. Since
 * SHARDLOCK_C_API_MINOR 4. */
#define SHARDLOCK_CLIENT_TENANT 0x2u
/* With SHARDLOCK_CLIENT_TENANT: every datagram encrypted (the tenant's
 * encrypt=yes). Since SHARDLOCK_C_API_MINOR 4. */
#define SHARDLOCK_CLIENT_ENCRYPT 0x4u
/* With SHARDLOCK_CLIENT_TENANT, the cipher suite (docs/security.md). By
 * default a tenant's datagrams use AES-256-GCM where this CPU has AES-NI,
 * else BLAKE2b / XChaCha20-Poly1305 (the portable suite). PORTABLE always
 * uses the portable suite: for a server without AES-NI, which drops AES
 * datagrams. AES always uses AES-256-GCM; creation fails with
 * SHARDLOCK_BAD_ARGUMENT where this CPU lacks it, and with both flags, or
 * AES without SHARDLOCK_CLIENT_TENANT. Since SHARDLOCK_C_API_MINOR 5. */
#define SHARDLOCK_CLIENT_CIPHER_PORTABLE 0x8u
#define SHARDLOCK_CLIENT_CIPHER_AES 0x10u

/* What shardlock_client_create_ex() is asked for. Zero it, then set `size`
 * (memset, or = {sizeof(shardlock_client_options)}): a field added to a
 * later version sits past the end of an older caller's struct, and the
 * library treats what the caller's size leaves out as zero. */
typedef struct shardlock_client_options { /* NOLINT(modernize-use-using) */
  /* sizeof(shardlock_client_options) as the caller compiled it. */
  size_t size;
  /* As shardlock_client_create(): "HOST:PORT" or a comma-separated list;
   * with SHARDLOCK_CLIENT_DISCOVER_CLUSTER, the seeds. */
  const char* nodes;
  /* NULL, or a file of 64 hex digits shared with the servers. */
  const char* auth_key_file;
  /* How long a call retransmits before SHARDLOCK_UNREACHABLE (0: 2000). */
  uint32_t request_timeout_ms;
  /* SHARDLOCK_CLIENT_DISCOVER_CLUSTER, SHARDLOCK_CLIENT_TENANT,
   * SHARDLOCK_CLIENT_ENCRYPT and a SHARDLOCK_CLIENT_CIPHER_* flag, or 0. */
  uint32_t flags;
  /* With SHARDLOCK_CLIENT_TENANT: the tenant's key id. Since
   * SHARDLOCK_C_API_MINOR 4; a caller's struct without it reads 0. */
  uint32_t tenant;
} shardlock_client_options;

/* Creates and starts a client as shardlock_client_create() does, with the
 * options above. SHARDLOCK_BAD_ARGUMENT, *out NULL, for: NULL options or
 * out; a `size` smaller than the first version of the struct (32 bytes on
 * LP64: offsetof(flags) + 4); a larger `size` whose bytes past the fields
 * this library knows are not all zero (a newer caller asking for something
 * this library cannot do); unknown flags; no node. Otherwise as
 * shardlock_client_create(), and in cluster mode SHARDLOCK_UNREACHABLE when
 * no seed answers with a map. Blocks to resolve host names and, in cluster
 * mode, while it asks the seeds for the map. Since
 * SHARDLOCK_C_API_MINOR 1. */
SHARDLOCK_C_EXPORT int shardlock_client_create_ex(const shardlock_client_options* options,
                                                  shardlock_client** out);

/* Stops the client's threads and frees it. Calls in flight on other threads
 * return SHARDLOCK_NOT_STARTED; leases still alive become inert (their
 * release is not sent, they stay held on the server until their TTL runs
 * out) and must still be destroyed. Must not be called from a lost-lease
 * callback. NULL is ignored. */
SHARDLOCK_C_EXPORT void shardlock_client_destroy(shardlock_client* client);

/* The client's owner identity: 32 lowercase hex digits and a NUL written to
 * `out` (at least 33 bytes). Returns SHARDLOCK_BAD_ARGUMENT for NULL. */
SHARDLOCK_C_EXPORT int shardlock_client_id(const shardlock_client* client, char* out,
                                           size_t out_size);

/* ---- Leases ------------------------------------------------------------- */

/* Acquires `key` (a NUL-terminated string of 1..256 bytes) for `ttl_ms`,
 * waiting up to `wait_ms` for a holder to let go (0: SHARDLOCK_BUSY at once).
 * `mode`: a shardlock_mode; `permits`: the semaphore's limit (1..65535) for
 * SHARDLOCK_PERMIT, 0 otherwise. `flags`: 0 or SHARDLOCK_WATCHDOG.
 * `on_lost`: NULL, or called as described at shardlock_lost_fn with
 * `user_data`, which must stay valid until the lease is destroyed.
 *
 * Blocks at most wait_ms + the request timeout. On SHARDLOCK_OK *out is a
 * lease, valid when this returns, to free with shardlock_lease_destroy();
 * otherwise *out is NULL. Acquiring a key this client already holds gives a
 * new grant with a new token; the older lease is lost at its next renewal. */
SHARDLOCK_C_EXPORT int shardlock_acquire(shardlock_client* client, const char* key, uint32_t ttl_ms,
                                         uint32_t wait_ms, int mode, uint32_t permits,
                                         unsigned flags, shardlock_lost_fn on_lost, void* user_data,
                                         shardlock_lease** out);

/* As shardlock_acquire(), with a value of `value_length` bytes (at most
 * 256; NULL with 0: none) that the lease carries for others to see: listed
 * with its holder by shardlock_query_holders(), kept through renewals
 * (a leader's address, a host name and pid). A value longer than
 * 256 bytes is SHARDLOCK_BAD_ARGUMENT. A server that predates values drops
 * the request (SHARDLOCK_UNREACHABLE). Since SHARDLOCK_C_API_MINOR 2. */
SHARDLOCK_C_EXPORT int shardlock_acquire_with_value(shardlock_client* client, const char* key,
                                                    uint32_t ttl_ms, uint32_t wait_ms, int mode,
                                                    uint32_t permits, unsigned flags,
                                                    shardlock_lost_fn on_lost, void* user_data,
                                                    const void* value, size_t value_length,
                                                    shardlock_lease** out);

/* Renews the lease for `ttl_ms` (0: the TTL it has). Blocks up to the request
 * timeout. SHARDLOCK_NOT_OWNER or SHARDLOCK_EXPIRED mean the lease is lost
 * (and its callback fires); SHARDLOCK_LEASE_INACTIVE that it was released
 * or lost before. */
SHARDLOCK_C_EXPORT int shardlock_lease_renew(shardlock_lease* lease, uint32_t ttl_ms);

/* Releases the lease and waits for the answer (up to the request timeout).
 * Afterwards the lease is inactive whatever the answer, and its callback will
 * not fire. SHARDLOCK_LEASE_INACTIVE if it was released or lost before. */
SHARDLOCK_C_EXPORT int shardlock_lease_release(shardlock_lease* lease);

/* Releases the lease if it is still held (one RELEASE, retransmitted but not
 * waited for) and frees the handle. Waits for the lease's callback if it is
 * running. NULL is ignored. */
SHARDLOCK_C_EXPORT void shardlock_lease_destroy(shardlock_lease* lease);

/* The fencing token: pass it to the resource, which rejects older tokens.
 * 0 for NULL. Fixed for the lease's life. */
SHARDLOCK_C_EXPORT uint64_t shardlock_lease_token(const shardlock_lease* lease);

/* The key, NUL-terminated, valid until the lease is destroyed; "" for NULL. */
SHARDLOCK_C_EXPORT const char* shardlock_lease_key(const shardlock_lease* lease);

/* A shardlock_mode; SHARDLOCK_EXCLUSIVE for NULL. */
SHARDLOCK_C_EXPORT int shardlock_lease_mode(const shardlock_lease* lease);

/* 1 while the lease is held: not released, not lost, and its client-side
 * expiry is in the future; 0 otherwise (and for NULL). Never blocks. Check it
 * before each write that the lease protects. */
SHARDLOCK_C_EXPORT int shardlock_lease_valid(const shardlock_lease* lease);

/* Milliseconds until the client-side expiry (the send time of the granting
 * or last confirmed renewing request + TTL - drift margin, on
 * CLOCK_BOOTTIME), rounded down; 0 once it has passed, or when the lease is
 * released or lost, or NULL. */
SHARDLOCK_C_EXPORT int64_t shardlock_lease_remaining_ms(const shardlock_lease* lease);

/* ---- Who holds a key ---------------------------------------------------- */

/* Asks who holds `key` (NUL-terminated, 1..256 bytes): every holder, oldest
 * grant first, with the mode, the waiters and the permit limit. Blocks up to
 * the request timeout per page of holders (a page is about 40 holders).
 * On SHARDLOCK_OK *out is a snapshot to free with
 * shardlock_holders_destroy(); otherwise *out is NULL. A server that
 * predates this request is asked QUERY instead once the request goes
 * unanswered: shardlock_holders_listed() is then 0 and only the summary is
 * filled. Since SHARDLOCK_C_API_MINOR 2. */
SHARDLOCK_C_EXPORT int shardlock_query_holders(shardlock_client* client, const char* key,
                                               shardlock_holders** out);

/* Frees a snapshot. NULL is ignored. */
SHARDLOCK_C_EXPORT void shardlock_holders_destroy(shardlock_holders* holders);

/* 1 when the server listed each holder, 0 when it predates that (then
 * shardlock_holders_count() is 0 and the summary comes from QUERY) or for
 * NULL. */
SHARDLOCK_C_EXPORT int shardlock_holders_listed(const shardlock_holders* holders);

/* How many holders the server counted (pending ones included); 0 for a
 * free key or NULL. */
SHARDLOCK_C_EXPORT uint32_t shardlock_holders_total(const shardlock_holders* holders);

/* A shardlock_mode, or -1 when nobody holds the key (and for NULL). */
SHARDLOCK_C_EXPORT int shardlock_holders_mode(const shardlock_holders* holders);

/* Acquires queued behind the holders; 0 for NULL. */
SHARDLOCK_C_EXPORT uint32_t shardlock_holders_waiters(const shardlock_holders* holders);

/* A semaphore key's limit, 0 for a lock key (and for NULL). */
SHARDLOCK_C_EXPORT uint32_t shardlock_holders_permits(const shardlock_holders* holders);

/* How many holders the snapshot lists (shardlock_holders_get() takes
 * 0..count-1); 0 for NULL. A key whose holders changed while its pages were
 * fetched may list fewer than shardlock_holders_total(). */
SHARDLOCK_C_EXPORT size_t shardlock_holders_count(const shardlock_holders* holders);

/* One holder. The caller zeroes it and sets `size` (as for
 * shardlock_client_options), so fields can be added at its end. */
typedef struct shardlock_holder_info { /* NOLINT(modernize-use-using) */
  /* sizeof(shardlock_holder_info) as the caller compiled it. */
  size_t size;
  /* The owner's id: 32 lowercase hex digits and a NUL. */
  char owner[33];
  /* Its fencing token. */
  uint64_t token;
  /* Milliseconds it had left when the server answered. */
  int64_t ttl_left_ms;
  /* 1: taken by a multi-key acquire that has not completed (no lease yet). */
  int pending;
  /* The value its acquire attached, `value_length` bytes plus a NUL (it may
   * hold NULs itself); "" when none. Valid until the snapshot is destroyed. */
  const char* value;
  size_t value_length;
} shardlock_holder_info;

/* Fills `out` with holder `index` (0 is the oldest grant).
 * SHARDLOCK_BAD_ARGUMENT for NULL, an index past shardlock_holders_count(),
 * or a `size` smaller than the first version of the struct. */
SHARDLOCK_C_EXPORT int shardlock_holders_get(const shardlock_holders* holders, size_t index,
                                             shardlock_holder_info* out);

/* ---- Reentrant leases ---------------------------------------------------- */

/* Acquires `key` exclusively, reentrantly for the calling thread
 * (ReentrantLeases in reentrant.h, docs/client.md "Reentrant leases"): when
 * this thread already holds `key` through an earlier
 * shardlock_acquire_reentrant() whose lease is still valid, *out is a new
 * handle of that same grant (same token, no round trip; `ttl_ms`,
 * `wait_ms`, `on_lost` and `user_data` are then ignored) and the grant's
 * hold count goes up by one. Otherwise as shardlock_acquire() with
 * SHARDLOCK_EXCLUSIVE: another thread of the process waits for the grant
 * like another process (FIFO at the server), or is SHARDLOCK_BUSY with no
 * wait. `flags`: SHARDLOCK_WATCHDOG, and SHARDLOCK_REENTRANT_PER_CLIENT for
 * holds that every thread of the client shares (and joins while another
 * thread's acquire is in flight, up to `wait_ms`): every such hold carries
 * the same fencing token, so do not use it to exclude threads of one
 * process from each other. Reentrant and plain acquires of one key exclude
 * each other as two owners do.
 *
 * The handle works with every shardlock_lease_* function:
 * shardlock_lease_release() and shardlock_lease_destroy() drop its hold, and
 * only the last hold's release or destroy releases the key (the first
 * answers SHARDLOCK_OK at once while other holds remain);
 * shardlock_lease_renew() renews the grant for every hold;
 * shardlock_lease_valid() is 0 for every hold once the grant is lost, and
 * `on_lost` fires once per grant. `user_data` must stay valid until the
 * grant's last hold is destroyed. Since SHARDLOCK_C_API_MINOR 2. */
SHARDLOCK_C_EXPORT int shardlock_acquire_reentrant(shardlock_client* client, const char* key,
                                                   uint32_t ttl_ms, uint32_t wait_ms,
                                                   unsigned flags, shardlock_lost_fn on_lost,
                                                   void* user_data, shardlock_lease** out);

/* How many handles hold the grant of a lease from
 * shardlock_acquire_reentrant(), this one included; 0 once its hold was
 * released. 1 for a lease from shardlock_acquire() that is not released, 0
 * for NULL. Since SHARDLOCK_C_API_MINOR 2. */
SHARDLOCK_C_EXPORT size_t shardlock_lease_hold_count(const shardlock_lease* lease);

/* ---- Watches ------------------------------------------------------------ */

/* Follows one key without polling (KeyWatch in watch.h; protocol.h,
 * "Watches"): each shardlock_watch_next() blocks until the key's holders
 * change. Since SHARDLOCK_C_API_MINOR 2. */
typedef struct shardlock_watch shardlock_watch; /* NOLINT(modernize-use-using) */

/* Starts following `key` (NUL-terminated, 1..256 bytes); nothing is sent
 * until the first shardlock_watch_next(). The client must outlive it. */
SHARDLOCK_C_EXPORT int shardlock_watch_create(shardlock_client* client, const char* key,
                                              shardlock_watch** out);

/* The key's next state, as a snapshot read like shardlock_query_holders()'s
 * (the newest holders, oldest first; every one unless their values fill more
 * than a datagram): at once on the first call, afterwards the first state
 * whose holders differ from the one last returned (renewals and waiters are
 * no change; after a gap, the newest state, not each one between). Blocks
 * up to `timeout_ms`. SHARDLOCK_OK with *out to free with
 * shardlock_holders_destroy(); SHARDLOCK_TIMEOUT when nothing changed by
 * then or the watch was cancelled; another status when the server could not
 * be read for the whole timeout. One thread at a time. */
SHARDLOCK_C_EXPORT int shardlock_watch_next(shardlock_watch* watch, uint32_t timeout_ms,
                                            shardlock_holders** out);

/* Wakes a blocked shardlock_watch_next() (it returns SHARDLOCK_TIMEOUT), and
 * every later one. Any thread. NULL is ignored. */
SHARDLOCK_C_EXPORT void shardlock_watch_cancel(shardlock_watch* watch);

/* Frees the watch; not while shardlock_watch_next() runs on it (cancel
 * first). NULL is ignored. */
SHARDLOCK_C_EXPORT void shardlock_watch_destroy(shardlock_watch* watch);

/* ---- Leader election ---------------------------------------------------- */

/* One campaigner for one name (Election in election.h; README, "Leader
 * election"): the leader is the name's exclusive holder, its value what its
 * campaign attached, its term the grant's fencing token. Since
 * SHARDLOCK_C_API_MINOR 2. */
typedef struct shardlock_election shardlock_election; /* NOLINT(modernize-use-using) */

/* A campaign wait with no end (about a year). */
#define SHARDLOCK_WAIT_FOREVER UINT32_MAX

/* A campaigner for `name` whose leadership is a lease of `ttl_ms` renewed by
 * the watchdog. `on_lost` (may be NULL) is called once, on the client's
 * watchdog thread, when leadership is lost rather than resigned (its `key`
 * is the name, its `token` the term). The client must outlive it. */
SHARDLOCK_C_EXPORT int shardlock_election_create(shardlock_client* client, const char* name,
                                                 uint32_t ttl_ms, shardlock_lost_fn on_lost,
                                                 void* user_data, shardlock_election** out);

/* Waits up to `wait_ms` (SHARDLOCK_WAIT_FOREVER: no end), FIFO behind
 * earlier campaigners, to lead with `value` (`value_length` bytes, at most
 * 256; NULL with 0 for none). SHARDLOCK_OK: leading, and
 * shardlock_election_term() tells the term. SHARDLOCK_TIMEOUT when the wait
 * ran out; SHARDLOCK_BUSY while already leading or campaigning. Blocks. */
SHARDLOCK_C_EXPORT int shardlock_election_campaign(shardlock_election* election, const void* value,
                                                   size_t value_length, uint32_t wait_ms);

/* Gives leadership up; the next campaigner is elected at once.
 * SHARDLOCK_LEASE_INACTIVE when not leading. Blocks up to the request
 * timeout. */
SHARDLOCK_C_EXPORT int shardlock_election_resign(shardlock_election* election);

/* 1 while this campaigner leads (as its client can prove), else 0. */
SHARDLOCK_C_EXPORT int shardlock_election_leading(const shardlock_election* election);

/* This campaigner's term while leading, else 0. */
SHARDLOCK_C_EXPORT uint64_t shardlock_election_term(const shardlock_election* election);

/* Resigns if leading, and frees it. Not while a campaign runs on it. NULL is
 * ignored. */
SHARDLOCK_C_EXPORT void shardlock_election_destroy(shardlock_election* election);

/* The leader of a snapshot (shardlock_query_holders() of a name, or
 * shardlock_watch_next() on one): 1 with `out` filled as
 * shardlock_holders_get() fills it (`out->token` is the term) when the key
 * has one exclusive holder, 0 when it has no leader, -1 for NULL or a bad
 * `out->size`.
 *
 * To observe a name's leader: shardlock_watch_create() on the name, then
 * this on each snapshot shardlock_watch_next() gives; one whose leader has
 * the term last seen is a change of holders but not of leader: skip it. */
SHARDLOCK_C_EXPORT int shardlock_holders_leader(const shardlock_holders* holders,
                                                shardlock_holder_info* out);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* SHARDLOCK_LEASE_C_API_H_ */
