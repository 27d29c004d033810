// The C ABI (include/shardlock/lease/c_api.h) over LeaseClient and Lease.
// Every entry point is noexcept: C++ exceptions (allocation failures) become
// status codes here and never unwind into a C caller.
#include "shardlock/lease/client/c_api.h"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "shardlock/lease/client/client.h"
#include "shardlock/lease/client/election.h"
#include "shardlock/lease/client/reentrant.h"
#include "shardlock/lease/client/watch.h"
#include "shardlock/lease/wire/auth.h"
#include "shardlock/lease/wire/protocol.h"

namespace lease = shardlock::lease;
using lease::LeaseErrc;
using std::chrono::milliseconds;

struct shardlock_client {
  explicit shardlock_client(lease::LeaseClientOptions options) : client(std::move(options)) {}
  lease::LeaseClient client;
  // shardlock_acquire_reentrant()'s holds: per thread, and (with
  // SHARDLOCK_REENTRANT_PER_CLIENT) shared by every thread.
  lease::ReentrantLeases reentrant{client, lease::ReentrancyScope::kThread};
  lease::ReentrantLeases reentrant_per_client{client, lease::ReentrancyScope::kClient};
};

// A plain lease, or one hold of a reentrant grant (`reentrant` not empty).
struct shardlock_lease {
  lease::Lease lease;
  lease::ReentrantLease reentrant;
  // A reentrant hold's key and token, which outlive its release (as a
  // released Lease's do): shardlock_lease_key()'s string lives until destroy.
  std::string reentrant_key;
  std::uint64_t reentrant_token = 0;

  [[nodiscard]] bool is_reentrant() const noexcept { return !reentrant_key.empty(); }
  // The grant: the plain Lease, or the reentrant hold's (empty once released).
  [[nodiscard]] const lease::Lease& grant() const noexcept {
    return is_reentrant() ? reentrant.lease() : lease;
  }
};

struct shardlock_holders {
  lease::HoldersReply reply;
  std::vector<std::string> owners;  // each holder's id in hex
};

struct shardlock_watch {
  shardlock_watch(lease::LeaseClient& client, std::string key) : watch(client, std::move(key)) {}
  lease::KeyWatch watch;
};

struct shardlock_election {
  shardlock_election(lease::LeaseClient& client, std::string name, lease::ElectionOptions options)
      : election(client, std::move(name), options) {}
  lease::Election election;
};

namespace {

// The C codes that mirror LeaseErrc keep its numbers, so a LeaseErrc
// converts by value; these pin that.
static_assert(SHARDLOCK_OK == static_cast<int>(LeaseErrc::kOk));
static_assert(SHARDLOCK_BUSY == static_cast<int>(LeaseErrc::kBusy));
static_assert(SHARDLOCK_TIMEOUT == static_cast<int>(LeaseErrc::kTimeout));
static_assert(SHARDLOCK_UNREACHABLE == static_cast<int>(LeaseErrc::kUnreachable));
static_assert(SHARDLOCK_RECOVERING == static_cast<int>(LeaseErrc::kRecovering));
static_assert(SHARDLOCK_NOT_OWNER == static_cast<int>(LeaseErrc::kNotOwner));
static_assert(SHARDLOCK_EXPIRED == static_cast<int>(LeaseErrc::kExpired));
static_assert(SHARDLOCK_SERVER_ERROR == static_cast<int>(LeaseErrc::kServerError));
static_assert(SHARDLOCK_BAD_ARGUMENT == static_cast<int>(LeaseErrc::kBadArgument));
static_assert(SHARDLOCK_NOT_STARTED == static_cast<int>(LeaseErrc::kNotStarted));
static_assert(SHARDLOCK_BAD_ADDRESS == static_cast<int>(LeaseErrc::kBadAddress));
static_assert(SHARDLOCK_LEASE_INACTIVE == static_cast<int>(LeaseErrc::kLeaseInactive));
static_assert(SHARDLOCK_GRANT_EXPIRED == static_cast<int>(LeaseErrc::kGrantExpired));
static_assert(SHARDLOCK_REDIRECTED != static_cast<int>(LeaseErrc::kRedirected),
              "kRedirected's number is taken by SHARDLOCK_NO_MEMORY: to_status() maps it");
static_assert(static_cast<int>(lease::LeaseMode::kExclusive) == SHARDLOCK_EXCLUSIVE);
static_assert(static_cast<int>(lease::LeaseMode::kShared) == SHARDLOCK_SHARED);
static_assert(static_cast<int>(lease::LeaseMode::kPermit) == SHARDLOCK_PERMIT);

// shardlock_last_error_detail(): per thread, as errno and dlerror().
thread_local std::string last_detail;

void set_detail(std::string_view text) noexcept {
  try {
    last_detail.assign(text);
  } catch (...) {
    last_detail.clear();  // out of memory: an empty detail beats none at all
  }
}

// The status of an error from the client: its LeaseErrc, or kInternal for
// another category (a failed syscall in start()), whose message becomes the
// detail.
int to_status(const std::error_code& ec) noexcept {
  if (!ec) return SHARDLOCK_OK;
  if (ec.category() == lease::lease_category()) {
    if (ec.value() <= SHARDLOCK_GRANT_EXPIRED) return ec.value();
    if (ec == LeaseErrc::kRedirected) return SHARDLOCK_REDIRECTED;
    return SHARDLOCK_INTERNAL;  // kCrossNode: acquire_many(), which this API does not offer
  }
  return SHARDLOCK_INTERNAL;
}

int fail(int status, std::string_view detail) noexcept {
  set_detail(detail);
  return status;
}

// Runs `body` (which returns a status), turning any exception into one.
template <typename Body>
int guarded(Body&& body) noexcept {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return fail(SHARDLOCK_NO_MEMORY, "out of memory");
  } catch (const std::exception& e) {
    return fail(SHARDLOCK_INTERNAL, e.what());
  } catch (...) {
    return fail(SHARDLOCK_INTERNAL, "unknown exception");
  }
}

// The status of a failed acquire (an AcquireResult or a
// ReentrantAcquireResult), with what the server told us besides the code as
// the detail.
template <typename Result>
int acquire_failed(const Result& r) {
  const int status = to_status(r.error);
  if (status == SHARDLOCK_INTERNAL) return fail(status, r.error.message());
  std::string text(lease::to_string(static_cast<LeaseErrc>(r.error.value())));
  switch (static_cast<LeaseErrc>(r.error.value())) {
    case LeaseErrc::kBusy:
      text += " (the holder has " + std::to_string(r.holder_ttl_left_ms) + " ms left)";
      break;
    case LeaseErrc::kRecovering:
      text += " (retry after " + std::to_string(r.retry_after_ms) + " ms)";
      break;
    case LeaseErrc::kServerError:
      text += ": ";
      text += lease::to_string(r.wire_error);
      break;
    default:
      break;
  }
  return fail(status, text);
}

// The size of the first version of shardlock_client_options: what every
// caller passes at least. Later fields go after `flags`, so this never changes.
constexpr std::size_t kClientOptionsSizeV1 =
    offsetof(shardlock_client_options, flags) + sizeof(shardlock_client_options::flags);
static_assert(kClientOptionsSizeV1 <= sizeof(shardlock_client_options));

// The size of the first version of shardlock_holder_info.
constexpr std::size_t kHolderInfoSizeV1 =
    offsetof(shardlock_holder_info, value_length) + sizeof(shardlock_holder_info::value_length);

// What every keyed call checks first: a client, and a NUL-terminated key of
// 1..kMaxKeyLength bytes (strnlen: a longer one is refused without reading
// past it). SHARDLOCK_OK with `view` set, else the failure.
int keyed_arguments(const shardlock_client* client, const char* key,
                    std::string_view& view) noexcept {
  if (client == nullptr || key == nullptr) {
    return fail(SHARDLOCK_BAD_ARGUMENT, "client or key is NULL");
  }
  view = std::string_view(key, ::strnlen(key, lease::kMaxKeyLength + 1));
  if (view.size() < lease::kMinKeyLength || view.size() > lease::kMaxKeyLength) {
    return fail(SHARDLOCK_BAD_ARGUMENT, "the key must be 1..256 bytes");
  }
  return SHARDLOCK_OK;
}

// Both create functions: builds, starts and hands out a client.
int create_client(const char* nodes, const char* auth_key_file, uint32_t request_timeout_ms,
                  uint32_t flags, uint32_t tenant, shardlock_client** out) {
  const bool discover_cluster = (flags & SHARDLOCK_CLIENT_DISCOVER_CLUSTER) != 0;
  if (nodes == nullptr) return fail(SHARDLOCK_BAD_ARGUMENT, "nodes is NULL");
  lease::LeaseClientOptions options;
  options.nodes = lease::split_node_list(nodes);
  if (options.nodes.empty()) return fail(SHARDLOCK_BAD_ARGUMENT, "no node in the node list");
  options.discover_cluster = discover_cluster;
  if (request_timeout_ms != 0) options.request_timeout = milliseconds(request_timeout_ms);
  if (auth_key_file != nullptr) {
    lease::AuthKeyFile file = lease::load_auth_key(auth_key_file);
    if (!file.key) return fail(SHARDLOCK_AUTH_KEY, file.error);
    options.auth_key = file.key;
  }
  if ((flags & SHARDLOCK_CLIENT_TENANT) != 0) options.tenant = tenant;
  options.encrypt = (flags & SHARDLOCK_CLIENT_ENCRYPT) != 0;
  const bool portable = (flags & SHARDLOCK_CLIENT_CIPHER_PORTABLE) != 0;
  const bool aes = (flags & SHARDLOCK_CLIENT_CIPHER_AES) != 0;
  if (portable && aes) {
    return fail(SHARDLOCK_BAD_ARGUMENT,
                "SHARDLOCK_CLIENT_CIPHER_PORTABLE and SHARDLOCK_CLIENT_CIPHER_AES both set");
  }
  options.cipher = portable ? lease::EnvelopeCipher::kPortable
                   : aes    ? lease::EnvelopeCipher::kAes
                            : lease::EnvelopeCipher::kAuto;
  auto client = std::make_unique<shardlock_client>(std::move(options));
  if (const std::error_code ec = client->client.start()) {
    const std::string& detail = client->client.error_detail();
    return fail(to_status(ec), detail.empty() ? ec.message() : detail);
  }
  *out = client.release();
  return fail(SHARDLOCK_OK, "");
}

}  // namespace

extern "C" {

const char* shardlock_strerror(int status) {
  switch (status) {
    case SHARDLOCK_OK:
      return "ok";
    case SHARDLOCK_BUSY:
      return "busy: held by another owner";
    case SHARDLOCK_TIMEOUT:
      return "timeout: the wait ran out";
    case SHARDLOCK_UNREACHABLE:
      return "unreachable: no answer before the deadline";
    case SHARDLOCK_RECOVERING:
      return "recovering: the server is in its lock-delay";
    case SHARDLOCK_NOT_OWNER:
      return "not owner: another owner holds the lease";
    case SHARDLOCK_EXPIRED:
      return "expired: the server no longer has the lease";
    case SHARDLOCK_SERVER_ERROR:
      return "server error";
    case SHARDLOCK_BAD_ARGUMENT:
      return "bad argument";
    case SHARDLOCK_NOT_STARTED:
      return "client not started or shutting down";
    case SHARDLOCK_BAD_ADDRESS:
      return "bad node address";
    case SHARDLOCK_LEASE_INACTIVE:
      return "lease inactive: released or lost";
    case SHARDLOCK_GRANT_EXPIRED:
      return "grant expired on arrival";
    case SHARDLOCK_AUTH_KEY:
      return "auth key file unreadable or malformed";
    case SHARDLOCK_NO_MEMORY:
      return "out of memory";
    case SHARDLOCK_INTERNAL:
      return "internal error";
    case SHARDLOCK_REDIRECTED:
      return "redirected: the key's owner could not be reached";
    default:
      return "unknown status";
  }
}

const char* shardlock_last_error_detail(void) { return last_detail.c_str(); }

int shardlock_client_create(const char* nodes, const char* auth_key_file,
                            uint32_t request_timeout_ms, shardlock_client** out) {
  return guarded([&]() -> int {
    if (out == nullptr) return fail(SHARDLOCK_BAD_ARGUMENT, "out is NULL");
    *out = nullptr;
    return create_client(nodes, auth_key_file, request_timeout_ms, /*flags=*/0, /*tenant=*/0, out);
  });
}

int shardlock_client_create_ex(const shardlock_client_options* options, shardlock_client** out) {
  return guarded([&]() -> int {
    if (out == nullptr) return fail(SHARDLOCK_BAD_ARGUMENT, "out is NULL");
    *out = nullptr;
    if (options == nullptr) return fail(SHARDLOCK_BAD_ARGUMENT, "options is NULL");
    if (options->size < kClientOptionsSizeV1) {
      return fail(SHARDLOCK_BAD_ARGUMENT, "options->size is " + std::to_string(options->size) +
                                              ", less than the smallest options (" +
                                              std::to_string(kClientOptionsSizeV1) +
                                              "): set it to sizeof(shardlock_client_options)");
    }
    // A newer caller's struct: the fields this library does not know must be
    // zero (not asked for), as openat2() and clone3() treat theirs.
    if (options->size > sizeof(shardlock_client_options)) {
      // NOLINTNEXTLINE(cppcoreguidelines-pro-type-reinterpret-cast): reads the caller's tail bytes
      const auto* bytes = reinterpret_cast<const unsigned char*>(options);
      if (!std::all_of(bytes + sizeof(shardlock_client_options), bytes + options->size,
                       [](unsigned char b) { return b == 0; })) {
        return fail(SHARDLOCK_BAD_ARGUMENT,
                    "options sets fields this library does not know (options->size " +
                        std::to_string(options->size) + " > " +
                        std::to_string(sizeof(shardlock_client_options)) + ")");
      }
    }
    constexpr std::uint32_t kKnownFlags =
        SHARDLOCK_CLIENT_DISCOVER_CLUSTER | SHARDLOCK_CLIENT_TENANT | SHARDLOCK_CLIENT_ENCRYPT |
        SHARDLOCK_CLIENT_CIPHER_PORTABLE | SHARDLOCK_CLIENT_CIPHER_AES;
    if ((options->flags & ~kKnownFlags) != 0) {
      return fail(SHARDLOCK_BAD_ARGUMENT, "unknown options->flags");
    }
    // The tenant field came with SHARDLOCK_C_API_MINOR 4: an older caller's
    // struct ends before it, and reads as 0.
    const std::uint32_t tenant =
        options->size >= offsetof(shardlock_client_options, tenant) + sizeof(options->tenant)
            ? options->tenant
            : 0;
    return create_client(options->nodes, options->auth_key_file, options->request_timeout_ms,
                         options->flags, tenant, out);
  });
}

void shardlock_client_destroy(shardlock_client* client) {
  (void)guarded([&] {
    delete client;  // NOLINT(cppcoreguidelines-owning-memory): the C API owns it by pointer
    return SHARDLOCK_OK;
  });
}

int shardlock_client_id(const shardlock_client* client, char* out, size_t out_size) {
  return guarded([&]() -> int {
    if (client == nullptr || out == nullptr) {
      return fail(SHARDLOCK_BAD_ARGUMENT, "client or out is NULL");
    }
    const std::string hex = lease::to_hex(client->client.client_id());
    if (out_size <= hex.size()) return fail(SHARDLOCK_BAD_ARGUMENT, "out is shorter than 33 bytes");
    std::memcpy(out, hex.c_str(), hex.size() + 1);
    return fail(SHARDLOCK_OK, "");
  });
}

}  // extern "C"

namespace {

// What every acquire checks and builds: a client and key (`key_view`), a
// TTL, flags, a value, and the LeaseOptions they make. SHARDLOCK_OK or the
// failure.
int lease_arguments(const shardlock_client* client, const char* key, uint32_t ttl_ms,
                    unsigned flags, shardlock_lost_fn on_lost, void* user_data,
                    std::string_view value, std::string_view& key_view,
                    lease::LeaseOptions& lease_options) {
  if (const int status = keyed_arguments(client, key, key_view); status != SHARDLOCK_OK) {
    return status;
  }
  if (ttl_ms == 0) return fail(SHARDLOCK_BAD_ARGUMENT, "ttl_ms is 0");
  if ((flags & ~SHARDLOCK_WATCHDOG) != 0) return fail(SHARDLOCK_BAD_ARGUMENT, "unknown flags");
  if (value.size() > lease::kMaxHolderValueLength) {
    return fail(SHARDLOCK_BAD_ARGUMENT, "the value is longer than 256 bytes");
  }
  lease_options.watchdog = (flags & SHARDLOCK_WATCHDOG) != 0;
  lease_options.value = value;
  if (on_lost != nullptr) {
    lease_options.on_lost = [on_lost, user_data](const lease::LeaseLost& lost) {
      on_lost(lost.key.c_str(), lost.token, to_status(lost.reason), lost.refused_by_server ? 1 : 0,
              user_data);
    };
  }
  return SHARDLOCK_OK;
}

// shardlock_acquire() and shardlock_acquire_with_value().
int acquire_lease(shardlock_client* client, const char* key, uint32_t ttl_ms, uint32_t wait_ms,
                  int mode, uint32_t permits, unsigned flags, shardlock_lost_fn on_lost,
                  void* user_data, std::string_view value, shardlock_lease** out) noexcept {
  return guarded([&]() -> int {
    if (out == nullptr) return fail(SHARDLOCK_BAD_ARGUMENT, "out is NULL");
    *out = nullptr;
    std::string_view key_view;
    lease::LeaseOptions lease_options;
    if (const int status = lease_arguments(client, key, ttl_ms, flags, on_lost, user_data, value,
                                           key_view, lease_options);
        status != SHARDLOCK_OK) {
      return status;
    }
    if (mode == SHARDLOCK_PERMIT) {
      if (permits == 0 || permits > lease::kMaxPermits) {
        return fail(SHARDLOCK_BAD_ARGUMENT, "permits must be 1..65535");
      }
    } else if (mode != SHARDLOCK_EXCLUSIVE && mode != SHARDLOCK_SHARED) {
      return fail(SHARDLOCK_BAD_ARGUMENT, "unknown mode");
    } else if (permits != 0) {
      return fail(SHARDLOCK_BAD_ARGUMENT, "permits must be 0 unless the mode is SHARDLOCK_PERMIT");
    }

    // Allocated before the call, so that a failure here cannot strand a
    // grant the server has already made.
    auto handle = std::make_unique<shardlock_lease>();
    lease::LeaseClient& c = client->client;
    const milliseconds ttl(ttl_ms);
    const milliseconds wait(wait_ms);
    lease::AcquireResult result;
    switch (mode) {
      case SHARDLOCK_SHARED:
        result = c.acquire_shared(key_view, ttl, wait, std::move(lease_options));
        break;
      case SHARDLOCK_PERMIT:
        result = c.acquire_permit(key_view, permits, ttl, wait, std::move(lease_options));
        break;
      default:
        result = c.acquire(key_view, ttl, wait, std::move(lease_options));
        break;
    }
    if (result.error) return acquire_failed(result);
    handle->lease = std::move(result.lease);
    *out = handle.release();
    return fail(SHARDLOCK_OK, "");
  });
}

}  // namespace

extern "C" {

int shardlock_acquire(shardlock_client* client, const char* key, uint32_t ttl_ms, uint32_t wait_ms,
                      int mode, uint32_t permits, unsigned flags, shardlock_lost_fn on_lost,
                      void* user_data, shardlock_lease** out) {
  return acquire_lease(client, key, ttl_ms, wait_ms, mode, permits, flags, on_lost, user_data, {},
                       out);
}

int shardlock_acquire_with_value(shardlock_client* client, const char* key, uint32_t ttl_ms,
                                 uint32_t wait_ms, int mode, uint32_t permits, unsigned flags,
                                 shardlock_lost_fn on_lost, void* user_data, const void* value,
                                 size_t value_length, shardlock_lease** out) {
  if (value == nullptr && value_length != 0) {
    if (out != nullptr) *out = nullptr;
    return fail(SHARDLOCK_BAD_ARGUMENT, "value is NULL");
  }
  // NOLINTNEXTLINE(cppcoreguidelines-pro-type-reinterpret-cast): the caller's bytes
  const std::string_view bytes(static_cast<const char*>(value),
                               value == nullptr ? 0 : value_length);
  return acquire_lease(client, key, ttl_ms, wait_ms, mode, permits, flags, on_lost, user_data,
                       bytes, out);
}

int shardlock_lease_renew(shardlock_lease* lease, uint32_t ttl_ms) {
  return guarded([&]() -> int {
    if (lease == nullptr) return fail(SHARDLOCK_BAD_ARGUMENT, "lease is NULL");
    const std::error_code ec = lease->is_reentrant() ? lease->reentrant.renew(milliseconds(ttl_ms))
                                                     : lease->lease.renew(milliseconds(ttl_ms));
    return fail(to_status(ec), ec ? ec.message() : "");
  });
}

int shardlock_lease_release(shardlock_lease* lease) {
  return guarded([&]() -> int {
    if (lease == nullptr) return fail(SHARDLOCK_BAD_ARGUMENT, "lease is NULL");
    const std::error_code ec =
        lease->is_reentrant() ? lease->reentrant.release() : lease->lease.release();
    return fail(to_status(ec), ec ? ec.message() : "");
  });
}

int shardlock_acquire_reentrant(shardlock_client* client, const char* key, uint32_t ttl_ms,
                                uint32_t wait_ms, unsigned flags, shardlock_lost_fn on_lost,
                                void* user_data, shardlock_lease** out) {
  return guarded([&]() -> int {
    if (out == nullptr) return fail(SHARDLOCK_BAD_ARGUMENT, "out is NULL");
    *out = nullptr;
    std::string_view key_view;
    lease::LeaseOptions lease_options;
    const bool per_client = (flags & SHARDLOCK_REENTRANT_PER_CLIENT) != 0;
    if (const int status =
            lease_arguments(client, key, ttl_ms, flags & ~SHARDLOCK_REENTRANT_PER_CLIENT, on_lost,
                            user_data, {}, key_view, lease_options);
        status != SHARDLOCK_OK) {
      return status;
    }
    // Allocated before the call, as in acquire_lease().
    auto handle = std::make_unique<shardlock_lease>();
    handle->reentrant_key = key_view;
    lease::ReentrantLeases& leases = per_client ? client->reentrant_per_client : client->reentrant;
    lease::ReentrantAcquireResult result = leases.acquire(
        key_view, milliseconds(ttl_ms), milliseconds(wait_ms), std::move(lease_options));
    if (result.error) return acquire_failed(result);
    handle->reentrant_token = result.lease.token();
    handle->reentrant = std::move(result.lease);
    *out = handle.release();
    return fail(SHARDLOCK_OK, "");
  });
}

size_t shardlock_lease_hold_count(const shardlock_lease* lease) {
  if (lease == nullptr) return 0;
  if (lease->is_reentrant()) return lease->reentrant.hold_count();
  return lease->lease.empty() ? 0 : 1;
}

void shardlock_lease_destroy(shardlock_lease* lease) {
  (void)guarded([&] {
    delete lease;  // NOLINT(cppcoreguidelines-owning-memory): the C API owns it by pointer
    return SHARDLOCK_OK;
  });
}

uint64_t shardlock_lease_token(const shardlock_lease* lease) {
  if (lease == nullptr) return 0;
  return lease->is_reentrant() ? lease->reentrant_token : lease->lease.token();
}

const char* shardlock_lease_key(const shardlock_lease* lease) {
  if (lease == nullptr) return "";
  return lease->is_reentrant() ? lease->reentrant_key.c_str() : lease->lease.key().c_str();
}

int shardlock_lease_mode(const shardlock_lease* lease) {
  return lease == nullptr ? SHARDLOCK_EXCLUSIVE : static_cast<int>(lease->grant().mode());
}

int shardlock_lease_valid(const shardlock_lease* lease) {
  return lease != nullptr && lease->grant().valid() ? 1 : 0;
}

int64_t shardlock_lease_remaining_ms(const shardlock_lease* lease) {
  if (lease == nullptr || !lease->grant().valid()) return 0;
  const auto left = lease->grant().expiry() - lease::LeaseClock::now();
  if (left.count() <= 0) return 0;
  return std::chrono::duration_cast<milliseconds>(left).count();
}

int shardlock_query_holders(shardlock_client* client, const char* key, shardlock_holders** out) {
  return guarded([&]() -> int {
    if (out == nullptr) return fail(SHARDLOCK_BAD_ARGUMENT, "out is NULL");
    *out = nullptr;
    std::string_view key_view;
    if (const int status = keyed_arguments(client, key, key_view); status != SHARDLOCK_OK) {
      return status;
    }
    auto snapshot = std::make_unique<shardlock_holders>();
    snapshot->reply = client->client.holders(key_view);
    const lease::HoldersReply& r = snapshot->reply;
    if (r.error) {
      const int status = to_status(r.error);
      std::string detail = r.error.message();
      if (r.error == LeaseErrc::kServerError)
        detail += std::string(": ") + std::string(lease::to_string(r.wire_error));
      return fail(status, detail);
    }
    snapshot->owners.reserve(r.holders.size());
    for (const lease::HolderInfo& h : r.holders) snapshot->owners.push_back(lease::to_hex(h.owner));
    *out = snapshot.release();
    return fail(SHARDLOCK_OK, "");
  });
}

void shardlock_holders_destroy(shardlock_holders* holders) {
  delete holders;  // NOLINT(cppcoreguidelines-owning-memory): the C API owns it by pointer
}

int shardlock_holders_listed(const shardlock_holders* holders) {
  return holders != nullptr && holders->reply.listed ? 1 : 0;
}

uint32_t shardlock_holders_total(const shardlock_holders* holders) {
  return holders == nullptr ? 0 : holders->reply.holder_count;
}

int shardlock_holders_mode(const shardlock_holders* holders) {
  if (holders == nullptr || !holders->reply.held) return -1;
  return static_cast<int>(holders->reply.mode);
}

uint32_t shardlock_holders_waiters(const shardlock_holders* holders) {
  return holders == nullptr ? 0 : holders->reply.waiters;
}

uint32_t shardlock_holders_permits(const shardlock_holders* holders) {
  return holders == nullptr ? 0 : holders->reply.permits;
}

size_t shardlock_holders_count(const shardlock_holders* holders) {
  return holders == nullptr ? 0 : holders->reply.holders.size();
}

int shardlock_holders_get(const shardlock_holders* holders, size_t index,
                          shardlock_holder_info* out) {
  return guarded([&]() -> int {
    if (holders == nullptr || out == nullptr) {
      return fail(SHARDLOCK_BAD_ARGUMENT, "holders or out is NULL");
    }
    if (out->size < kHolderInfoSizeV1) {
      return fail(SHARDLOCK_BAD_ARGUMENT, "out->size is less than the smallest holder info (" +
                                              std::to_string(kHolderInfoSizeV1) +
                                              "): set it to sizeof(shardlock_holder_info)");
    }
    if (index >= holders->reply.holders.size()) {
      return fail(SHARDLOCK_BAD_ARGUMENT, "index " + std::to_string(index) + " past the " +
                                              std::to_string(holders->reply.holders.size()) +
                                              " holders listed");
    }
    const lease::HolderInfo& h = holders->reply.holders[index];
    const std::string& owner = holders->owners[index];
    std::memcpy(out->owner, owner.c_str(), std::min(owner.size() + 1, sizeof out->owner));
    out->token = h.token;
    out->ttl_left_ms = h.ttl_left.count();
    out->pending = h.pending ? 1 : 0;
    out->value = h.value.c_str();
    out->value_length = h.value.size();
    return fail(SHARDLOCK_OK, "");
  });
}

}  // extern "C"

namespace {

// A snapshot of what a watch reported, read as shardlock_query_holders()'s.
std::unique_ptr<shardlock_holders> snapshot_of(lease::WatchEvent&& event) {
  auto snapshot = std::make_unique<shardlock_holders>();
  lease::HoldersReply& r = snapshot->reply;
  r.held = event.held();
  r.mode = event.mode;
  r.token = event.version.token;
  for (const lease::HolderInfo& h : event.holders) r.ttl_left = std::max(r.ttl_left, h.ttl_left);
  r.waiters = event.waiters;
  r.holder_count = event.holder_count;
  r.permits = event.permits;
  r.holders = std::move(event.holders);
  snapshot->owners.reserve(r.holders.size());
  for (const lease::HolderInfo& h : r.holders) snapshot->owners.push_back(lease::to_hex(h.owner));
  return snapshot;
}

}  // namespace

extern "C" {

int shardlock_watch_create(shardlock_client* client, const char* key, shardlock_watch** out) {
  return guarded([&]() -> int {
    if (out == nullptr) return fail(SHARDLOCK_BAD_ARGUMENT, "out is NULL");
    *out = nullptr;
    std::string_view key_view;
    if (const int status = keyed_arguments(client, key, key_view); status != SHARDLOCK_OK) {
      return status;
    }
    *out = std::make_unique<shardlock_watch>(client->client, std::string(key_view)).release();
    return fail(SHARDLOCK_OK, "");
  });
}

int shardlock_watch_next(shardlock_watch* watch, uint32_t timeout_ms, shardlock_holders** out) {
  return guarded([&]() -> int {
    if (watch == nullptr || out == nullptr)
      return fail(SHARDLOCK_BAD_ARGUMENT, "watch or out is NULL");
    *out = nullptr;
    std::optional<lease::WatchEvent> event = watch->watch.next(milliseconds(timeout_ms));
    if (!event) return fail(SHARDLOCK_TIMEOUT, "no change within the timeout");
    if (event->error) {
      std::string detail = event->error.message();
      if (event->error == LeaseErrc::kServerError)
        detail += std::string(": ") + std::string(lease::to_string(event->wire_error));
      return fail(to_status(event->error), detail);
    }
    *out = snapshot_of(std::move(*event)).release();
    return fail(SHARDLOCK_OK, "");
  });
}

void shardlock_watch_cancel(shardlock_watch* watch) {
  if (watch != nullptr) watch->watch.cancel();
}

void shardlock_watch_destroy(shardlock_watch* watch) {
  delete watch;  // NOLINT(cppcoreguidelines-owning-memory): the C API owns it by pointer
}

int shardlock_election_create(shardlock_client* client, const char* name, uint32_t ttl_ms,
                              shardlock_lost_fn on_lost, void* user_data,
                              shardlock_election** out) {
  return guarded([&]() -> int {
    if (out == nullptr) return fail(SHARDLOCK_BAD_ARGUMENT, "out is NULL");
    *out = nullptr;
    std::string_view name_view;
    if (const int status = keyed_arguments(client, name, name_view); status != SHARDLOCK_OK) {
      return status;
    }
    if (ttl_ms == 0) return fail(SHARDLOCK_BAD_ARGUMENT, "ttl_ms is 0");
    lease::ElectionOptions options;
    options.ttl = milliseconds(ttl_ms);
    auto handle =
        std::make_unique<shardlock_election>(client->client, std::string(name_view), options);
    if (on_lost != nullptr) {
      handle->election.on_lost([on_lost, user_data](const lease::LeaseLost& lost) {
        on_lost(lost.key.c_str(), lost.token, to_status(lost.reason),
                lost.refused_by_server ? 1 : 0, user_data);
      });
    }
    *out = handle.release();
    return fail(SHARDLOCK_OK, "");
  });
}

int shardlock_election_campaign(shardlock_election* election, const void* value,
                                size_t value_length, uint32_t wait_ms) {
  return guarded([&]() -> int {
    if (election == nullptr) return fail(SHARDLOCK_BAD_ARGUMENT, "election is NULL");
    if (value == nullptr && value_length != 0) {
      return fail(SHARDLOCK_BAD_ARGUMENT, "value is NULL with a length");
    }
    if (value_length > lease::kMaxHolderValueLength) {
      return fail(SHARDLOCK_BAD_ARGUMENT, "the value is longer than 256 bytes");
    }
    const milliseconds wait =
        wait_ms == SHARDLOCK_WAIT_FOREVER ? std::chrono::hours(24 * 365) : milliseconds(wait_ms);
    const std::string_view text(static_cast<const char*>(value), value_length);
    const std::error_code ec = election->election.campaign(text, wait);
    return fail(to_status(ec), ec ? ec.message() : "");
  });
}

int shardlock_election_resign(shardlock_election* election) {
  return guarded([&]() -> int {
    if (election == nullptr) return fail(SHARDLOCK_BAD_ARGUMENT, "election is NULL");
    const std::error_code ec = election->election.resign();
    return fail(to_status(ec), ec ? ec.message() : "");
  });
}

int shardlock_election_leading(const shardlock_election* election) {
  return election != nullptr && election->election.leading() ? 1 : 0;
}

uint64_t shardlock_election_term(const shardlock_election* election) {
  return election == nullptr ? 0 : election->election.term();
}

void shardlock_election_destroy(shardlock_election* election) {
  delete election;  // NOLINT(cppcoreguidelines-owning-memory): the C API owns it by pointer
}

int shardlock_holders_leader(const shardlock_holders* holders, shardlock_holder_info* out) {
  if (holders == nullptr || out == nullptr || out->size < kHolderInfoSizeV1) return -1;
  if (holders->reply.holder_count != 1 ||
      !lease::leader_of(holders->reply.mode, holders->reply.holders)) {
    return 0;
  }
  return shardlock_holders_get(holders, 0, out) == SHARDLOCK_OK ? 1 : -1;
}

}  // extern "C"
