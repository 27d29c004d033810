// The LeaseClient facade: start-up, the blocking and async calls, stats and
// the sync wrapper. Calls travel through the call engine (call_engine.h);
// leases are renewed by the watchdog (watchdog.h) and handled in lease.cc.
// Design notes in client.h and docs/client.md.
#include "shardlock/lease/client/client.h"

#include <sys/random.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <iterator>
#include <limits>
#include <utility>

#include "client/client_core.h"
#include "client/client_routing.h"
#include "shardlock/internal/futex.h"
#include "shardlock/lock_guard.h"
#include "wire/udp.h"

namespace shardlock::lease {
namespace internal {

using Clock = LeaseClock;
using std::chrono::milliseconds;

std::error_code ClientCore::choose_identity() {
  if (setup.options.client_id) {
    setup.id = *setup.options.client_id;
  } else {
    std::array<std::uint64_t, 2> words{};
    if (::getrandom(words.data(), sizeof words, 0) != static_cast<ssize_t>(sizeof words)) {
      error_detail = "getrandom failed";
      return {errno, std::system_category()};
    }
    setup.id = ClientId{words[0], words[1]};
  }
  if (setup.options.tenant) {
    // The server scopes owners so (TenantGate): choosing them so keeps the
    // ids this client sees in HOLDERS_REPLY its own.
    setup.id.hi =
        (setup.id.hi & 0x0000'0000'FFFF'FFFFULL) | (std::uint64_t{*setup.options.tenant} << 32);
  }
  return {};
}

namespace {

// The form the options seal datagrams in (tenant, encrypt, cipher), into
// `mode`; kBadArgument with `detail` set when they do not fit together.
std::error_code sealing_of(const LeaseClientOptions& o, std::string& detail, EnvelopeMode& mode) {
  if ((o.tenant || o.encrypt) && !o.auth_key) {
    detail = "a tenant (and encryption) needs the tenant's key (auth_key)";
    return LeaseErrc::kBadArgument;
  }
  if (o.encrypt && !o.tenant) {
    detail = "encryption needs a tenant key id (tenant)";
    return LeaseErrc::kBadArgument;
  }
  if (o.tenant) {
    const std::optional<EnvelopeMode> chosen = tenant_envelope_mode(o.encrypt, o.cipher);
    if (!chosen) {
      detail = "this CPU has no AES-GCM (AES-NI and PCLMULQDQ): seal with the portable cipher";
      return LeaseErrc::kBadArgument;
    }
    mode = *chosen;
  } else if (o.cipher == EnvelopeCipher::kAes) {
    detail = "the AES-GCM cipher seals a tenant's datagrams: it needs a tenant key id (tenant)";
    return LeaseErrc::kBadArgument;
  }
  return {};
}

}  // namespace

std::error_code ClientCore::start() {
  if (engine.started()) return LeaseErrc::kBadArgument;
  if (setup.options.nodes.empty()) {
    error_detail = "no nodes configured";
    return LeaseErrc::kBadAddress;
  }
  if (const std::error_code ec = sealing_of(setup.options, error_detail, setup.seal_mode)) {
    return ec;
  }
  int family = AF_UNSPEC;
  for (const std::string& node : setup.options.nodes) {
    Endpoint e;
    std::string why;
    if (const std::error_code ec = parse_endpoint(node, e, why)) {
      // The resolver's own words for a name that does not resolve. Both
      // are kBadAddress here, as the C ABI documents; parse_endpoint()
      // tells them apart for a caller that needs to.
      error_detail = ec == LeaseErrc::kBadAddress
                         ? "bad node address '" + node + "' (want HOST:PORT or [IPV6]:PORT)"
                         : why;
      return LeaseErrc::kBadAddress;
    }
    if (family != AF_UNSPEC && e.address.ss_family != family) {
      error_detail = "nodes mix IPv4 and IPv6 addresses";
      return LeaseErrc::kBadAddress;
    }
    family = e.address.ss_family;
    for (const Endpoint& seen : setup.endpoints) {
      // Two spellings of one node ("localhost:7420", "127.0.0.1:7420").
      if (same_address(seen.address, e.address)) {
        error_detail = "nodes '" + seen.text + "' and '" + e.text +
                       "' are the same address: each server must be listed once";
        return LeaseErrc::kBadAddress;
      }
    }
    setup.endpoints.push_back(std::move(e));
  }
  if (setup.options.discover_cluster) {
    std::vector<const Endpoint*> seeds;
    for (const Endpoint& e : setup.endpoints) seeds.push_back(&e);
    setup.cluster = std::make_unique<ClusterDirectory>(engine, std::move(seeds), family);
  } else {
    setup.routing.assign(setup.options.nodes);
  }
  if (std::error_code ec = choose_identity()) return ec;
  if (setup.options.auth_key) setup.envelope_key = envelope_key(*setup.options.auth_key);
  // Request ids start at the wall-clock millisecond shifted left by 20,
  // plus 20 random bits. The server's dedup cache is keyed by (client id,
  // request id) and it ignores a holder's requests older than the last one
  // it applied, so another process acting for the same owner later
  // (shardlockctl renew --owner) must use higher ids than the one that took
  // the lease: it does unless that one made 2^20 calls per millisecond of
  // its life, or the wall clock stepped back. 2^41 ms (until 2039) << 20
  // stays below 2^62: no wrap-around for the life of the client.
  std::uint32_t random_bits = 0;
  if (::getrandom(&random_bits, sizeof random_bits, 0) !=
      static_cast<ssize_t>(sizeof random_bits)) {
    error_detail = "getrandom failed";
    return {errno, std::system_category()};
  }
  const auto wall_ms =
      std::chrono::duration_cast<milliseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  const std::uint64_t first_request_id =
      (static_cast<std::uint64_t>(std::max<std::int64_t>(wall_ms, 0)) << 20) |
      (random_bits & 0xFFFFFu);
  engine.set_first_request_id(first_request_id + 1);
  if (!(setup.options.clock_drift_factor >= 0.0 && setup.options.clock_drift_factor < 1.0) ||
      setup.options.clock_drift_allowance.count() < 0) {
    error_detail = "clock_drift_factor must be in [0, 1) and clock_drift_allowance >= 0";
    return LeaseErrc::kBadArgument;
  }
  margin.factor = setup.options.clock_drift_factor;
  margin.allowance = setup.options.clock_drift_allowance;
  if (setup.options.busy_poll.count() < 0 ||
      setup.options.busy_poll > std::chrono::milliseconds(10)) {
    error_detail = "busy_poll must be 0..10ms";
    return LeaseErrc::kBadArgument;
  }
  if (setup.options.max_batch == 0) setup.options.max_batch = 1;
  setup.options.max_batch = std::min(setup.options.max_batch, kMaxBatch);
  if (setup.options.initial_retransmit.count() <= 0)
    setup.options.initial_retransmit = milliseconds(1);
  setup.options.max_retransmit =
      std::max(setup.options.max_retransmit, setup.options.initial_retransmit);

  if (std::error_code ec =
          make_udp_transport(family, setup.transport, setup.options.auth_key.has_value())) {
    error_detail = "cannot open a UDP socket: " + ec.message();
    return ec;
  }
  if (setup.options.wrap_transport)
    setup.transport = setup.options.wrap_transport(std::move(setup.transport));
  if (std::error_code ec = engine.start()) {
    error_detail = "eventfd failed";
    return ec;
  }
  if (setup.cluster) {
    if (std::error_code ec = setup.cluster->discover(error_detail)) {
      engine.stop();  // calls fail kNotStarted from now on
      return ec;
    }
  }
  return {};
}

void ClientCore::shutdown() {
  engine.stop();
  watchdog.stop();
}

CallResult ClientCore::call_sync(std::unique_ptr<Call> call) {
  struct Waiter {
    std::atomic<std::uint32_t> done{0};
    CallResult result;
  };
  auto waiter = std::make_shared<Waiter>();
  call->done = [waiter](const CallResult& r) {
    waiter->result = r;
    // Release pairs with the acquire load below: the result is visible
    // before `done` reads 1.
    waiter->done.store(1, std::memory_order_release);
    shardlock::internal::futex_wake(&waiter->done, 1);
  };
  engine.submit(std::move(call));
  while (waiter->done.load(std::memory_order_acquire) == 0) {
    shardlock::internal::futex_wait(&waiter->done, 0);
  }
  return std::move(waiter->result);
}

ClientId ClientCore::next_owner() noexcept {
  const auto own = static_cast<std::uint32_t>(setup.id.lo);
  for (;;) {
    const std::uint32_t handle = handles.fetch_add(1, std::memory_order_relaxed) + 1;
    if (handle != own) return handle_owner(setup.id, handle);
  }
}

}  // namespace internal

using internal::Call;
using internal::ClientCore;
using internal::close_lease;
using internal::LeaseState;
using internal::make_renewal;
using internal::send_release;
using Clock = LeaseClock;
using std::chrono::milliseconds;

namespace {

std::error_code check_key(std::string_view key) noexcept {
  if (key.size() < kMinKeyLength || key.size() > kMaxKeyLength) return LeaseErrc::kBadArgument;
  return {};
}

CallResult failed(std::error_code e) {
  CallResult r;
  r.error = e;
  r.first_sent = Clock::now();
  return r;
}

bool valid_lease_options(const LeaseOptions& options) noexcept {
  return options.renew_fraction > 0.0 && options.renew_fraction < 1.0 &&
         options.value.size() <= kMaxHolderValueLength;
}

bool valid_timing(milliseconds ttl, milliseconds wait) noexcept {
  return ttl.count() > 0 && wait.count() >= 0;
}

// The ACQUIRE, ACQUIRE_SHARED or ACQUIRE_PERMIT of `key`, or kBadArgument
// for what the server would refuse anyway (the key's length, a TTL of 0, a
// negative wait, permits outside 1..kMaxPermits, an unknown mode).
std::error_code make_acquire_call(ClientCore& core, std::string_view key, LeaseMode mode,
                                  std::uint32_t permits, milliseconds ttl, milliseconds wait,
                                  std::string_view value, const ClientId& owner,
                                  std::unique_ptr<Call>& out) {
  if (check_key(key) || !valid_timing(ttl, wait)) return LeaseErrc::kBadArgument;
  if (mode != LeaseMode::kExclusive && mode != LeaseMode::kShared && mode != LeaseMode::kPermit)
    return LeaseErrc::kBadArgument;
  if (mode == LeaseMode::kPermit && (permits == 0 || permits > kMaxPermits))
    return LeaseErrc::kBadArgument;
  out = core.engine.make_call(acquire_type(mode), key);
  out->owner = owner;
  out->ttl_ms = internal::clamp_ms(ttl);
  out->wait_ms = internal::clamp_ms(wait);
  out->permits = mode == LeaseMode::kPermit ? permits : 0;
  out->value = value;
  out->budget += wait;
  return {};
}

// The ACQUIRE_MANY of `keys`, or why not: kBadArgument for a list the server
// would refuse (0 or more than kMaxKeysPerRequest keys, a key twice or of a
// bad length, a mode other than exclusive or shared, a request too large for
// one datagram) or bad timing; kCrossNode when the keys are not all owned by
// one node, since one server can only grant its own keys all-or-nothing.
std::error_code make_acquire_many_call(ClientCore& core, std::span<const std::string_view> keys,
                                       LeaseMode mode, milliseconds ttl, milliseconds wait,
                                       const ClientId& owner, std::unique_ptr<Call>& out) {
  if (keys.empty() || keys.size() > kMaxKeysPerRequest || !valid_timing(ttl, wait) ||
      (mode != LeaseMode::kExclusive && mode != LeaseMode::kShared)) {
    return LeaseErrc::kBadArgument;
  }
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (check_key(keys[i])) return LeaseErrc::kBadArgument;
    // At most 16 keys: the quadratic scan is cheaper than a set.
    for (std::size_t j = 0; j < i; ++j) {
      if (keys[j] == keys[i]) return LeaseErrc::kBadArgument;
    }
  }
  auto call = core.engine.make_call(MessageType::kAcquireMany, {});
  call->owner = owner;
  if (!core.engine.route_keys(keys, *call)) return LeaseErrc::kCrossNode;
  call->mode = mode;
  call->ttl_ms = internal::clamp_ms(ttl);
  call->wait_ms = internal::clamp_ms(wait);
  call->budget += wait;
  call->key_count = static_cast<std::uint8_t>(keys.size());
  if (!encode_key_list(keys, call->key_list) || !core.engine.fits_one_datagram(*call))
    return LeaseErrc::kBadArgument;
  out = std::move(call);
  return {};
}

// A waiting acquire's rounds. The server takes at most its max_wait in one
// request (ERROR kWaitOutOfRange beyond) and answers TIMEOUT when that is
// spent; neither ends the caller's wait. `make(wait, call)` builds one round
// for `wait`; the answer that ends the wait (or the last round's) is
// returned. Each round is a fresh request, queued behind the waiters already
// there.
template <typename MakeCall>
CallResult acquire_in_rounds(ClientCore& core, milliseconds wait, const MakeCall& make) {
  // shardlockd's default --max-wait: the first guess when a longer wait is
  // refused; halved from there while refused.
  constexpr milliseconds kUsualMaxWait{300'000};
  constexpr milliseconds kWireLongest{std::numeric_limits<std::uint32_t>::max()};
  const Clock::time_point start = Clock::now();
  // A wait past the clock's range (shardlockctl's "forever") never ends.
  const bool forever =
      wait >= std::chrono::duration_cast<milliseconds>(Clock::time_point::max() - start);
  const Clock::time_point end = forever ? Clock::time_point::max() : start + wait;
  milliseconds round = std::min(wait, kWireLongest);
  for (;;) {
    milliseconds left = wait;
    if (!forever && wait.count() > 0) {
      left = std::max(milliseconds(1), std::chrono::ceil<milliseconds>(end - Clock::now()));
    }
    const milliseconds asked = std::min(round, left);
    std::unique_ptr<Call> call;
    if (const std::error_code ec = make(asked, call)) return failed(ec);
    CallResult r = core.call_sync(std::move(call));
    if (r.error == LeaseErrc::kServerError && r.wire_error == WireError::kWaitOutOfRange &&
        asked > milliseconds(1)) {
      round = asked > kUsualMaxWait ? kUsualMaxWait : asked / 2;
      continue;
    }
    if (r.error == LeaseErrc::kTimeout && wait.count() > 0 && Clock::now() < end) continue;
    return r;
  }
}

// The leases of one grant, a state per key (keys[i] holds tokens[i]), each
// watched when its options ask for it. A grant whose client-side expiry had
// passed on arrival (a wait longer than the TTL, or a GRANTED recovered late
// by retransmission) is first renewed, key by key. Empty when that fails:
// then every key is released, best effort, and the caller reports
// kGrantExpired, so a returned Lease is valid when it is returned.
std::vector<std::shared_ptr<LeaseState>> admit_grant(const std::shared_ptr<ClientCore>& core,
                                                     std::span<const std::string_view> keys,
                                                     std::span<const std::uint64_t> tokens,
                                                     LeaseState::Kind kind,
                                                     LeaseOptions lease_options,
                                                     const CallResult& grant, milliseconds ttl) {
  const bool watched = lease_options.watchdog || static_cast<bool>(lease_options.on_lost);
  std::vector<std::shared_ptr<LeaseState>> states;
  states.reserve(keys.size());
  const auto add = [&](std::size_t i, LeaseOptions options) {
    states.push_back(std::make_shared<LeaseState>(std::string(keys[i]), tokens[i], kind,
                                                  grant.owner, std::move(options), core->margin,
                                                  grant, ttl));
  };
  // Each lease renews and is lost on its own, with its own copy of the
  // options (and of on_lost); the last takes the caller's.
  for (std::size_t i = 0; i + 1 < keys.size(); ++i) add(i, lease_options);
  add(keys.size() - 1, std::move(lease_options));
  const auto expired = [&states] {
    return std::any_of(states.begin(), states.end(), [](const std::shared_ptr<LeaseState>& s) {
      LockGuard lock(s->mutex);
      return Clock::now() >= s->expiry;
    });
  };
  if (expired()) {
    // The grant may have been made any time after the request's first
    // transmission, so its expiry counts from there: a wait longer than the
    // TTL (a campaign, run's wait for a long holder) ends past it. A RENEW
    // proves the lease still stands and moves the expiry to its own send
    // time + TTL; refused (the lease ended at the server meanwhile), the
    // grant is given back below.
    for (const auto& state : states) {
      auto call = make_renewal(core->engine, *state, ttl);
      const std::uint64_t request_id = call->request_id;
      const CallResult r = core->call_sync(std::move(call));
      LockGuard lock(state->mutex);
      (void)state->apply_renewal(r, request_id, ttl, Clock::now());
    }
  }
  if (expired()) {
    // The leases may still stand on the server for a moment, but the client
    // cannot prove it: give them back.
    for (const auto& state : states) {
      (void)close_lease(*core, *state);
      send_release(*core, *state);
    }
    return {};
  }
  if (watched) {
    for (const auto& state : states) core->watchdog.watch(state);
  }
  return states;
}

}  // namespace

// ------------------------------------------------------------- LeaseClient

LeaseClient::LeaseClient(LeaseClientOptions options)
    : core_(std::make_shared<ClientCore>(std::move(options))) {}

LeaseClient::~LeaseClient() { core_->shutdown(); }

std::error_code LeaseClient::start() { return core_->start(); }
const std::string& LeaseClient::error_detail() const noexcept { return core_->error_detail; }
ClientId LeaseClient::client_id() const noexcept { return core_->setup.id; }
std::size_t LeaseClient::node_for(std::string_view key) const noexcept {
  if (core_->setup.cluster) {
    const auto view = core_->setup.cluster->current();
    return view ? view->owner_index(key) : 0;
  }
  return core_->setup.routing.node_for(key);
}

std::string LeaseClient::address_for(std::string_view key) const {
  const auto call = core_->engine.make_call(MessageType::kQuery, key);
  return call->to != nullptr ? call->to->text : std::string();
}

std::uint64_t LeaseClient::map_epoch() const noexcept {
  if (!core_->setup.cluster) return 0;
  const auto view = core_->setup.cluster->current();
  return view ? view->epoch : 0;
}

std::vector<MapMember> LeaseClient::map_members() const {
  if (!core_->setup.cluster) return {};
  const auto view = core_->setup.cluster->current();
  return view ? view->members : std::vector<MapMember>{};
}

AcquireResult LeaseClient::acquire(std::string_view key, milliseconds ttl, milliseconds wait,
                                   LeaseOptions lease_options) {
  return acquire_one(key, LeaseMode::kExclusive, 0, ttl, wait, std::move(lease_options));
}

AcquireResult LeaseClient::acquire_shared(std::string_view key, milliseconds ttl, milliseconds wait,
                                          LeaseOptions lease_options) {
  return acquire_one(key, LeaseMode::kShared, 0, ttl, wait, std::move(lease_options));
}

AcquireResult LeaseClient::acquire_permit(std::string_view key, std::uint32_t permits,
                                          milliseconds ttl, milliseconds wait,
                                          LeaseOptions lease_options) {
  return acquire_one(key, LeaseMode::kPermit, permits, ttl, wait, std::move(lease_options));
}

AcquireResult LeaseClient::acquire_one(std::string_view key, LeaseMode mode, std::uint32_t permits,
                                       milliseconds ttl, milliseconds wait,
                                       LeaseOptions lease_options) {
  AcquireResult result;
  if (!valid_timing(ttl, wait) || !valid_lease_options(lease_options)) {
    result.error = LeaseErrc::kBadArgument;
    return result;
  }
  // One owner for every round: each round is a new request of the same
  // contender.
  const ClientId owner = lease_options.owner.value_or(core_->next_owner());
  const CallResult r =
      acquire_in_rounds(*core_, wait, [&](milliseconds round, std::unique_ptr<Call>& call) {
        return make_acquire_call(*core_, key, mode, permits, ttl, round, lease_options.value, owner,
                                 call);
      });
  result.error = r.error;
  result.holder_ttl_left_ms = r.reply == MessageType::kBusy ? r.ttl_ms : 0;
  result.retry_after_ms = r.retry_after_ms;
  result.wire_error = r.wire_error;
  if (r.error) return result;
  const std::string_view keys[] = {key};
  const std::uint64_t tokens[] = {r.token};
  std::vector<std::shared_ptr<LeaseState>> states =
      admit_grant(core_, keys, tokens, {mode, mode == LeaseMode::kPermit ? permits : 0},
                  std::move(lease_options), r, ttl);
  if (states.empty()) {
    result.error = LeaseErrc::kGrantExpired;
    return result;
  }
  result.lease = Lease(core_, std::move(states.front()));
  return result;
}

MultiAcquireResult LeaseClient::acquire_many(std::span<const std::string_view> keys,
                                             milliseconds ttl, milliseconds wait, LeaseMode mode,
                                             LeaseOptions lease_options) {
  MultiAcquireResult result;
  // ACQUIRE_MANY carries no holder value (protocol.h, kItemFlagValue).
  if (!valid_timing(ttl, wait) || !valid_lease_options(lease_options) ||
      !lease_options.value.empty()) {
    result.error = LeaseErrc::kBadArgument;
    return result;
  }
  const ClientId owner = lease_options.owner.value_or(core_->next_owner());
  const CallResult r =
      acquire_in_rounds(*core_, wait, [&](milliseconds round, std::unique_ptr<Call>& call) {
        return make_acquire_many_call(*core_, keys, mode, ttl, round, owner, call);
      });
  result.error = r.error;
  if (r.reply == MessageType::kBusyMany) {
    // The engine took BUSY_MANY only with an index inside the key list.
    result.busy_key = std::string(keys[r.busy_index]);
    result.holder_ttl_left_ms = r.ttl_ms;
  }
  result.retry_after_ms = r.retry_after_ms;
  result.wire_error = r.wire_error;
  if (r.error) return result;
  // The engine took GRANTED_MANY only with a token per key.
  std::vector<std::shared_ptr<LeaseState>> states =
      admit_grant(core_, keys, r.tokens, {mode, 0}, std::move(lease_options), r, ttl);
  if (states.empty()) {
    result.error = LeaseErrc::kGrantExpired;
    return result;
  }
  result.leases.reserve(states.size());
  for (auto& state : states) result.leases.push_back(Lease(core_, std::move(state)));
  return result;
}

CallResult LeaseClient::renew(std::string_view key, std::uint64_t token, milliseconds ttl,
                              std::optional<ClientId> owner) {
  if (check_key(key) || ttl.count() <= 0) return failed(LeaseErrc::kBadArgument);
  auto call = core_->engine.make_call(MessageType::kRenew, key);
  call->token = token;
  call->ttl_ms = internal::clamp_ms(ttl);
  if (owner) call->owner = *owner;
  return core_->call_sync(std::move(call));
}

CallResult LeaseClient::release(std::string_view key, std::uint64_t token,
                                std::optional<ClientId> owner) {
  if (check_key(key)) return failed(LeaseErrc::kBadArgument);
  auto call = core_->engine.make_call(MessageType::kRelease, key);
  call->token = token;
  if (owner) call->owner = *owner;
  return core_->call_sync(std::move(call));
}

CallResult LeaseClient::query(std::string_view key) {
  if (check_key(key)) return failed(LeaseErrc::kBadArgument);
  return core_->call_sync(core_->engine.make_call(MessageType::kQuery, key));
}

namespace {

// Whether a QUERY_HOLDERS answer says the server does not know the request:
// an older codec drops the unknown type (no answer), a server that decodes
// it without serving it answers ERROR kNotARequest.
bool predates_holders(const CallResult& r) noexcept {
  return r.error == LeaseErrc::kUnreachable ||
         (r.error == LeaseErrc::kServerError && r.wire_error == WireError::kNotARequest);
}

}  // namespace

HoldersReply LeaseClient::holders(std::string_view key) {
  HoldersReply out;
  if (check_key(key)) {
    out.error = LeaseErrc::kBadArgument;
    return out;
  }
  // Bounded by the holders the server reports, and a hard cap should a
  // server never make progress.
  for (int page = 0; page < 65536; ++page) {
    auto call = core_->engine.make_call(MessageType::kQueryHolders, key);
    call->first_holder = static_cast<std::uint32_t>(out.holders.size());
    CallResult r = core_->call_sync(std::move(call));
    if (r.error && page == 0 && predates_holders(r)) {
      const CallResult q = query(key);
      out.listed = false;
      out.error = q.error;
      out.wire_error = q.wire_error;
      out.held = q.held;
      out.mode = q.mode;
      out.token = q.token;
      out.ttl_left = milliseconds(q.ttl_ms);
      out.waiters = q.waiters;
      out.holder_count = q.holders;
      out.permits = q.permits;
      return out;
    }
    if (r.error) {
      out.error = r.error;
      out.wire_error = r.wire_error;
      return out;
    }
    out.mode = r.mode;
    out.waiters = r.waiters;
    out.holder_count = r.holders;
    out.permits = r.permits;
    // A holder granted between two pages joins the end of the list, so no
    // holder is listed twice.
    std::move(r.holder_list.begin(), r.holder_list.end(), std::back_inserter(out.holders));
    if (out.holders.size() >= r.holders || r.holder_list.empty()) break;
  }
  out.held = out.holder_count > 0;
  for (const HolderInfo& h : out.holders) {
    out.token = std::max(out.token, h.token);
    out.ttl_left = std::max(out.ttl_left, h.ttl_left);
  }
  return out;
}

namespace {

// One STATS page of node `node` from `first_shard` into `out` (the tokens
// appended); false with out.error set when it failed.
bool stats_page(internal::ClientCore& core, std::size_t node, std::uint32_t first_shard,
                ServerStatsReply& out) {
  auto call = core.engine.make_call(MessageType::kStats, {});
  if (node < core.setup.endpoints.size()) call->to = &core.setup.endpoints[node];
  call->first_shard = first_shard;
  const CallResult r = core.call_sync(std::move(call));
  if (r.error) {
    out.error = r.error;
    return false;
  }
  if (out.round_trip.count() == 0) {
    out.round_trip =
        std::chrono::duration_cast<std::chrono::microseconds>(LeaseClock::now() - r.first_sent);
  }
  out.shard_count = r.shard_count;
  out.counters = r.counters;
  out.counters_sent = r.counters_sent;
  out.shard_tokens.insert(out.shard_tokens.end(), r.shard_tokens.begin(), r.shard_tokens.end());
  return true;
}

}  // namespace

ServerStatsReply LeaseClient::stats(std::size_t node) {
  ServerStatsReply out;
  if (node >= core_->setup.options.nodes.size()) {
    out.error = LeaseErrc::kBadArgument;
    return out;
  }
  // Page through the shard tokens; bounded by the shard count the server
  // reports (and a hard cap, should a server never make progress).
  for (int page = 0; page < 65536; ++page) {
    const std::size_t before = out.shard_tokens.size();
    if (!stats_page(*core_, node, static_cast<std::uint32_t>(before), out)) return out;
    if (out.shard_tokens.size() >= out.shard_count || out.shard_tokens.size() == before) break;
  }
  return out;
}

HotKeysReply LeaseClient::hot_keys(std::size_t node) {
  HotKeysReply out;
  if (node >= core_->setup.options.nodes.size()) {
    out.error = LeaseErrc::kBadArgument;
    return out;
  }
  auto call = core_->engine.make_call(MessageType::kHotKeys, {});
  if (node < core_->setup.endpoints.size()) call->to = &core_->setup.endpoints[node];
  CallResult r = core_->call_sync(std::move(call));
  out.error = r.error;
  out.keys = std::move(r.hot_keys);
  out.window = milliseconds(r.window_ms);
  return out;
}

WatchEvent watch_event(const CallResult& r) {
  WatchEvent e;
  e.error = r.error;
  e.wire_error = r.wire_error;
  e.retry_after_ms = r.retry_after_ms;
  if (r.error) return e;
  e.mode = r.mode;
  e.permits = r.permits;
  e.waiters = r.waiters;
  e.holder_count = r.holders;
  e.holders = r.holder_list;
  // The page ends at the newest holder (the server lists a tail), so the
  // version is read off its last entry.
  e.version = KeyVersion{e.holders.empty() ? 0 : e.holders.back().token, r.holders};
  return e;
}

namespace {

// The WATCH of `key` from `since` for `wait`, or kBadArgument.
std::error_code make_watch_call(ClientCore& core, std::string_view key, KeyVersion since,
                                milliseconds wait, std::unique_ptr<Call>& out) {
  if (check_key(key) || wait.count() < 0) return LeaseErrc::kBadArgument;
  out = core.engine.make_call(MessageType::kWatch, key);
  out->token = since.token;
  out->holders = since.holders;
  out->wait_ms = internal::clamp_ms(wait);
  out->budget += wait;
  return {};
}

}  // namespace

WatchEvent LeaseClient::watch_once(std::string_view key, KeyVersion since, milliseconds wait) {
  std::unique_ptr<Call> call;
  if (const std::error_code e = make_watch_call(*core_, key, since, wait, call)) {
    WatchEvent out;
    out.error = e;
    return out;
  }
  return watch_event(core_->call_sync(std::move(call)));
}

void LeaseClient::watch_async(std::string_view key, KeyVersion since, milliseconds wait,
                              Completion done) {
  std::unique_ptr<Call> call;
  if (const std::error_code e = make_watch_call(*core_, key, since, wait, call)) {
    done(failed(e));
    return;
  }
  call->done = std::move(done);
  core_->engine.submit(std::move(call));
}

ServerStatsReply LeaseClient::ping(std::size_t node) {
  ServerStatsReply out;
  if (node >= core_->setup.options.nodes.size()) {
    out.error = LeaseErrc::kBadArgument;
    return out;
  }
  // Past any shard: the reply carries no tokens, only the values.
  (void)stats_page(*core_, node, UINT32_MAX, out);
  return out;
}

void LeaseClient::acquire_async(std::string_view key, milliseconds ttl, milliseconds wait,
                                Completion done, std::optional<ClientId> owner) {
  acquire_async(key, LeaseMode::kExclusive, 0, ttl, wait, std::move(done), owner);
}

void LeaseClient::acquire_async(std::string_view key, LeaseMode mode, std::uint32_t permits,
                                milliseconds ttl, milliseconds wait, Completion done,
                                std::optional<ClientId> owner) {
  std::unique_ptr<Call> call;
  if (std::error_code ec = make_acquire_call(*core_, key, mode, permits, ttl, wait, {},
                                             owner.value_or(core_->next_owner()), call)) {
    done(failed(ec));
    return;
  }
  call->done = std::move(done);
  core_->engine.submit(std::move(call));
}

void LeaseClient::acquire_many_async(std::span<const std::string_view> keys, LeaseMode mode,
                                     milliseconds ttl, milliseconds wait, Completion done,
                                     std::optional<ClientId> owner) {
  std::unique_ptr<Call> call;
  if (std::error_code ec = make_acquire_many_call(*core_, keys, mode, ttl, wait,
                                                  owner.value_or(core_->next_owner()), call)) {
    done(failed(ec));
    return;
  }
  call->done = std::move(done);
  core_->engine.submit(std::move(call));
}

void LeaseClient::renew_async(std::string_view key, std::uint64_t token, milliseconds ttl,
                              Completion done, std::optional<ClientId> owner) {
  if (check_key(key) || ttl.count() <= 0) {
    done(failed(LeaseErrc::kBadArgument));
    return;
  }
  auto call = core_->engine.make_call(MessageType::kRenew, key);
  call->token = token;
  call->ttl_ms = internal::clamp_ms(ttl);
  call->done = std::move(done);
  if (owner) call->owner = *owner;
  core_->engine.submit(std::move(call));
}

void LeaseClient::release_async(std::string_view key, std::uint64_t token, Completion done,
                                std::optional<ClientId> owner) {
  if (check_key(key)) {
    done(failed(LeaseErrc::kBadArgument));
    return;
  }
  auto call = core_->engine.make_call(MessageType::kRelease, key);
  call->token = token;
  call->done = std::move(done);
  if (owner) call->owner = *owner;
  core_->engine.submit(std::move(call));
}

void LeaseClient::post(std::function<void()> fn) { core_->engine.post(std::move(fn)); }

std::uint64_t LeaseClient::datagrams_sent() const noexcept {
  return core_->engine.datagrams_sent();
}
std::uint64_t LeaseClient::malformed_replies() const noexcept {
  return core_->engine.malformed_replies();
}
std::uint64_t LeaseClient::retransmissions() const noexcept {
  return core_->engine.retransmissions();
}
TransportCounters LeaseClient::transport_counters() const noexcept {
  return core_->setup.transport ? core_->setup.transport->counters() : TransportCounters{};
}

}  // namespace shardlock::lease
