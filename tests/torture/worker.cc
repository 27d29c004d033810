// See worker.h.
#include "worker.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "recorder.h"
#include "resource.h"
#include "shardlock/lease/client/client.h"
#include "shardlock/lease/client/election.h"
#include "shardlock/lease/wire/protocol.h"
#include "shardlock/workload/zipf.h"
#include "tenancy.h"

namespace shardlock::torture {
namespace {

using namespace std::chrono_literals;
using lease::AcquireResult;
using lease::Lease;
using lease::LeaseClient;
using lease::LeaseClientOptions;
using lease::LeaseClock;
using lease::LeaseErrc;
using lease::LeaseLost;
using lease::LeaseMode;
using lease::LeaseOptions;
using lease::MultiAcquireResult;

// The client-side expiry of `lease` on the history's clock. Lease::expiry()
// runs on CLOCK_BOOTTIME, which differs from CLOCK_MONOTONIC by a constant
// while nothing suspends; read both now and carry the distance over.
std::int64_t expiry_on_monotonic(const Lease& lease) {
  const auto left = lease.expiry() - LeaseClock::now();
  return monotonic_ns() + std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
}

// The name a failure is recorded under; an ERROR answer of the server is
// "server_error", but for the one the checker judges: a refusal for want of
// rights, "permission_denied".
std::string error_name(const std::error_code& ec,
                       lease::WireError wire_error = lease::WireError::kInternal) {
  if (ec == LeaseErrc::kServerError && wire_error == lease::WireError::kPermissionDenied) {
    return "permission_denied";
  }
  std::string name = ec.category() == lease::lease_category()
                         ? std::string(lease::to_string(static_cast<LeaseErrc>(ec.value())))
                         : ec.message();
  for (char& c : name) {
    if (c == ' ') c = '_';
  }
  return name.empty() ? "-" : name;
}

// The event of a loss the on_lost callback reports: kLost for a lease,
// kDeposed for an election's. A refusal names the server's answer; the
// client's own expiry passing with no confirmed renewal is "no_renewal"
// (the kept property tells the two apart).
Event loss_event(EventKind kind, std::int64_t client, const LeaseLost& lost) {
  Event e;
  e.kind = kind;
  e.client = client;
  e.key = lost.key;
  e.token = lost.token;
  e.error = lost.refused_by_server ? error_name(lost.reason) : "no_renewal";
  return e;
}

// "a,b,c" -> {a, b, c}.
std::vector<std::string> split(std::string_view text, char separator) {
  std::vector<std::string> items;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t end = std::min(text.find(separator, start), text.size());
    if (end > start) items.emplace_back(text.substr(start, end - start));
    start = end + 1;
  }
  return items;
}

// Cluster mode: which node answered each grant. Wraps the client's
// transport; remembers where each request id was last sent, and when a
// GRANTED (key, token) or GRANTED_MANY (tokens) comes back, files the
// grant under that node until the worker asks.
class AnsweringNodes final : public lease::DatagramTransport {
 public:
  AnsweringNodes(std::unique_ptr<lease::DatagramTransport> inner,
                 std::shared_ptr<const std::map<std::string, std::string>> names)
      : inner_(std::move(inner)), names_(std::move(names)) {}

  std::error_code send(const lease::Endpoint& to, std::span<const std::uint8_t> bytes) override {
    note_sent(to, bytes);
    return inner_->send(to, bytes);
  }
  void send_many(std::span<const Outgoing> datagrams) override {
    for (const Outgoing& d : datagrams) note_sent(*d.to, d.bytes);
    inner_->send_many(datagrams);
  }
  std::size_t receive(const std::function<void(std::span<const std::uint8_t>)>& deliver) override {
    return inner_->receive([&](std::span<const std::uint8_t> bytes) {
      note_received(bytes);
      deliver(bytes);
    });
  }
  [[nodiscard]] int fd() const noexcept override { return inner_->fd(); }
  [[nodiscard]] std::chrono::milliseconds poll_interval() const noexcept override {
    return inner_->poll_interval();
  }

  // A multi-key grant's record: all its tokens. Two nodes number their
  // tokens alike in one epoch (epoch << 32 | counter), so the first token
  // alone could name another thread's grant from another node.
  static std::string multi_grant_key(const std::vector<std::uint64_t>& tokens) {
    std::string key = "many:";
    for (const std::uint64_t t : tokens) key += std::to_string(t) + ",";
    return key;
  }

  // The node that granted `token` on `key` (for a multi-key grant, key
  // multi_grant_key() of its tokens and token 0), forgotten once asked; "-"
  // when unknown.
  std::string take(const std::string& key, std::uint64_t token) {
    std::lock_guard lock(mutex_);
    const auto it = granted_.find({key, token});
    if (it == granted_.end()) return "-";
    std::string node = std::move(it->second);
    granted_.erase(it);
    return node;
  }

 private:
  // Bounds the memory of request ids whose reply never came.
  static constexpr std::size_t kRemembered = 4096;

  void note_sent(const lease::Endpoint& to, std::span<const std::uint8_t> bytes) {
    lease::Datagram d;
    if (lease::decode(bytes, d) != lease::ProtocolError::kOk) return;
    const auto named = names_->find(to.text);
    const std::string& node = named == names_->end() ? to.text : named->second;
    std::lock_guard lock(mutex_);
    for (const lease::Message& m : d.items()) {
      if (sent_.insert_or_assign(m.request_id, node).second) order_.push_back(m.request_id);
    }
    while (order_.size() > kRemembered) {
      sent_.erase(order_.front());
      order_.pop_front();
    }
  }

  void note_received(std::span<const std::uint8_t> bytes) {
    lease::Datagram d;
    if (lease::decode(bytes, d) != lease::ProtocolError::kOk) return;
    std::lock_guard lock(mutex_);
    for (const lease::Message& m : d.items()) {
      if (m.type != lease::MessageType::kGranted && m.type != lease::MessageType::kGrantedMany) {
        continue;
      }
      const auto sent = sent_.find(m.request_id);
      if (sent == sent_.end()) continue;
      if (m.type == lease::MessageType::kGranted) {
        remember({std::string(m.key), m.token}, sent->second);
      } else {
        std::vector<std::uint64_t> tokens;
        for (std::size_t n = 0; n < m.listed_token_count(); ++n)
          tokens.push_back(m.listed_token(n));
        remember({multi_grant_key(tokens), 0}, sent->second);
      }
    }
  }

  // Records a grant's node, forgetting the oldest ones past kRemembered
  // (grants nobody takes: answers that came after their call gave up). By
  // age, not by key: a map ordered by key dropped the multi-key grants
  // first, which threads sharing one LeaseClient (and so this transport)
  // then found missing, as "-".
  void remember(std::pair<std::string, std::uint64_t> grant, const std::string& node) {
    if (granted_.insert_or_assign(grant, node).second) granted_order_.push_back(grant);
    while (granted_order_.size() > kRemembered) {
      granted_.erase(granted_order_.front());
      granted_order_.pop_front();
    }
  }

  std::unique_ptr<lease::DatagramTransport> inner_;
  const std::shared_ptr<const std::map<std::string, std::string>> names_;  // address -> id
  std::mutex mutex_;
  std::map<std::uint64_t, std::string> sent_;  // request id -> node
  std::deque<std::uint64_t> order_;            // request ids, oldest first
  std::map<std::pair<std::string, std::uint64_t>, std::string> granted_;
  std::deque<std::pair<std::string, std::uint64_t>> granted_order_;  // oldest first
};

// What one cycle of a client does.
enum class Cycle { kExclusive, kShared, kPermit, kMulti, kOutside };

// With tenants, the share of cycles that probe outside the client's rights.
constexpr std::uint64_t kOutsidePerMillion = 20'000;

// One lease client's loop: its history, its resource connection and its
// LeaseClient, and the steps every kind of cycle shares.
class ClientLoop {
 public:
  // `tenant`: the LeaseClient's tenant, or -1 without tenants.
  ClientLoop(const WorkerOptions& o, int client, int tenant, const Recorder& history,
             ResourceConnection& resource, LeaseClient& lease_client, AnsweringNodes* nodes)
      : o_(o),
        client_(client),
        tenant_(tenant),
        history_(history),
        resource_(resource),
        lease_client_(lease_client),
        nodes_(nodes),
        random_(o.seed * 1000003 + static_cast<std::uint64_t>(client)) {}

  void run() {
    while (monotonic_ns() < o_.end_ns) {
      switch (pick_cycle()) {
        case Cycle::kExclusive:
          exclusive_cycle();
          break;
        case Cycle::kShared:
          shared_cycle();
          break;
        case Cycle::kPermit:
          permit_cycle();
          break;
        case Cycle::kMulti:
          multi_cycle();
          break;
        case Cycle::kOutside:
          outside_cycle();
          break;
      }
    }
  }

 private:
  Cycle pick_cycle() {
    if (tenant_ >= 0 && random_.uniform(1'000'000) < kOutsidePerMillion) return Cycle::kOutside;
    const double r = static_cast<double>(random_.uniform(1'000'000)) / 1e6;
    if (r < o_.read_fraction) return Cycle::kShared;
    if (r < o_.read_fraction + o_.permit_fraction) return Cycle::kPermit;
    if (r < o_.read_fraction + o_.permit_fraction + o_.multi_fraction) return Cycle::kMulti;
    return Cycle::kExclusive;
  }

  std::string random_key() {
    return within_rights("key-" + std::to_string(random_.uniform(o_.keys)));
  }

  // `name` as a key the client may use: itself without tenants; else under
  // the tenant's own prefix or, on a seeded half, the shared one.
  std::string within_rights(const std::string& name) {
    if (tenant_ < 0) return name;
    return (random_.uniform(2) == 0 ? std::string(kSharedPrefix) : TenantPlan::prefix(tenant_)) +
           name;
  }

  Event base(EventKind kind, const std::string& key) const {
    Event e;
    e.kind = kind;
    e.client = client_;
    e.key = key;
    return e;
  }

  // The acquire_invoke of a new operation, recorded: a quarter try-acquire,
  // the rest wait in the key's FIFO queue; a TTL of half to all the max.
  // A probe `outside` the client's rights is always a try-acquire.
  Event invoke(const std::string& key, AcquireMode mode, std::int64_t permits,
               std::vector<std::string> keys = {}, bool outside = false) {
    const bool try_only = random_.uniform(4) == 0 || outside;
    Event e = base(EventKind::kAcquireInvoke, key);
    e.op = ++op_;
    e.outside = outside;
    e.wait_ms = try_only ? 0 : static_cast<int>(1 + random_.uniform(o_.max_wait_ms));
    e.ttl_ms = o_.ttl_ms / 2 + static_cast<int>(random_.uniform(o_.ttl_ms / 2 + 1));
    e.mode = mode;
    e.permits = permits;
    e.keys = std::move(keys);
    history_.record(e);
    return e;
  }

  // Renewed by the watchdog; a loss is recorded when the callback runs.
  LeaseOptions watch() const {
    LeaseOptions watch;
    watch.watchdog = true;
    watch.on_lost = [&history = history_, client = client_](const LeaseLost& lost) {
      history.record(loss_event(EventKind::kLost, client, lost));
    };
    return watch;
  }

  // Records the failure `got` (an AcquireResult or MultiAcquireResult) of
  // `invoked` and backs off as the error asks.
  template <typename Result>
  void failed(const Event& invoked, const Result& got) {
    Event fail = base(EventKind::kAcquireFail, invoked.key);
    fail.op = invoked.op;
    fail.mode = invoked.mode;
    fail.permits = invoked.permits;
    fail.keys = invoked.keys;
    fail.outside = invoked.outside;
    fail.error = error_name(got.error, got.wire_error);
    history_.record(fail);
    if (got.error == LeaseErrc::kBusy) std::this_thread::sleep_for(1ms);
    if (got.error == LeaseErrc::kRecovering) {
      std::this_thread::sleep_for(
          std::chrono::milliseconds(std::min<std::uint32_t>(got.retry_after_ms, 100) + 1));
    }
  }

  Event granted(const Event& invoked, const Lease& lease) const {
    Event ok = base(EventKind::kAcquireOk, invoked.key);
    ok.op = invoked.op;
    ok.token = lease.token();
    ok.expiry_ns = expiry_on_monotonic(lease);
    ok.mode = invoked.mode;
    ok.permits = invoked.permits;
    ok.outside = invoked.outside;
    if (nodes_ != nullptr) ok.node = nodes_->take(lease.key(), lease.token());
    return ok;
  }

  // Now and then a RENEW to the TTL asked for, besides the watchdog's.
  void maybe_renew(Lease& lease, std::int64_t ttl_ms) {
    if (random_.uniform(4) != 0) return;
    Event renew = base(EventKind::kRenewInvoke, lease.key());
    renew.op = ++op_;
    renew.token = lease.token();
    renew.ttl_ms = ttl_ms;
    history_.record(renew);
    const std::error_code ec = lease.renew(std::chrono::milliseconds(ttl_ms));
    Event done = base(ec ? EventKind::kRenewFail : EventKind::kRenewOk, lease.key());
    done.op = renew.op;
    done.token = renew.token;
    if (ec) {
      done.error = error_name(ec);
    } else {
      done.expiry_ns = expiry_on_monotonic(lease);
    }
    history_.record(done);
  }

  // Records that the client relies on `lease` now, if it is still valid.
  bool hold(const Lease& lease) const {
    if (!lease.valid()) return false;
    Event hold = base(EventKind::kHold, lease.key());
    hold.token = lease.token();
    hold.expiry_ns = expiry_on_monotonic(lease);
    history_.record(hold);
    return true;
  }

  // A fenced read of the lease's key; nullopt when refused or failed.
  std::optional<std::int64_t> read(const Lease& lease) {
    const std::string reply = resource_.call(
        "R " + lease.key() + " " + std::to_string(lease.token()) + " " + std::to_string(client_));
    if (reply.rfind("OK ", 0) != 0) return std::nullopt;
    Event r = base(EventKind::kRead, lease.key());
    r.value = std::stoll(reply.substr(3));
    history_.record(r);
    return r.value;
  }

  // The exclusive holder's read-modify-write, relying on the lease only
  // while it is valid.
  void increment(const Lease& lease) {
    if (!hold(lease)) return;
    const std::optional<std::int64_t> value = read(lease);
    if (!value || !hold(lease)) return;
    if (static_cast<int>(random_.uniform(1'000'000)) < o_.stall_per_million) {
      std::this_thread::sleep_for(std::chrono::milliseconds(o_.ttl_ms * 3 / 2));
    }
    Event w = base(EventKind::kWriteInvoke, lease.key());
    w.token = lease.token();
    w.value = *value + 1;
    history_.record(w);
    (void)resource_.call("W " + lease.key() + " " + std::to_string(lease.token()) + " " +
                         std::to_string(*value + 1) + " " + std::to_string(client_));
  }

  // Holds on for up to `max_ms` (at least 1 ms), then says it still holds.
  void linger(Lease& lease, int max_ms) {
    std::this_thread::sleep_for(
        std::chrono::milliseconds(1 + random_.uniform(static_cast<std::uint64_t>(max_ms))));
    (void)hold(lease);
  }

  void release(Lease& lease) {
    Event release = base(EventKind::kReleaseInvoke, lease.key());
    release.op = ++op_;
    release.token = lease.token();
    history_.record(release);
    const std::error_code ec = lease.release();
    Event done = base(ec ? EventKind::kReleaseFail : EventKind::kReleaseOk, release.key);
    done.op = release.op;
    done.token = release.token;
    if (ec) done.error = error_name(ec);
    history_.record(done);
  }

  // Acquire, maybe renew, read-modify-write, release.
  void exclusive_cycle() {
    const Event invoked = invoke(random_key(), AcquireMode::kExclusive, 0);
    AcquireResult got = lease_client_.acquire(invoked.key, ttl(invoked), wait(invoked), watch());
    if (!got) return failed(invoked, got);
    history_.record(granted(invoked, got.lease));
    maybe_renew(got.lease, invoked.ttl_ms);
    increment(got.lease);
    release(got.lease);
  }

  // A reader: shared lease, a fenced read, a short stay so readers overlap.
  void shared_cycle() {
    const Event invoked = invoke(random_key(), AcquireMode::kShared, 0);
    AcquireResult got =
        lease_client_.acquire_shared(invoked.key, ttl(invoked), wait(invoked), watch());
    if (!got) return failed(invoked, got);
    history_.record(granted(invoked, got.lease));
    maybe_renew(got.lease, invoked.ttl_ms);
    if (hold(got.lease)) {
      (void)read(got.lease);
      linger(got.lease, o_.ttl_ms / 16);
    }
    release(got.lease);
  }

  // One of P permits of a semaphore key, held for a while (now and then
  // past the watchdog's first renewal), then released.
  void permit_cycle() {
    const std::string key = within_rights("sem-" + std::to_string(random_.uniform(o_.permit_keys)));
    const Event invoked = invoke(key, AcquireMode::kPermit, o_.permits);
    AcquireResult got = lease_client_.acquire_permit(key, static_cast<std::uint32_t>(o_.permits),
                                                     ttl(invoked), wait(invoked), watch());
    if (!got) return failed(invoked, got);
    history_.record(granted(invoked, got.lease));
    maybe_renew(got.lease, invoked.ttl_ms);
    if (hold(got.lease)) linger(got.lease, o_.ttl_ms / 4);
    release(got.lease);
  }

  // 2..3 distinct keys all-or-nothing, exclusive; each key's counter
  // incremented with that key's token; every lease released.
  void multi_cycle() {
    const std::size_t count =
        std::min<std::size_t>(2 + random_.uniform(2), static_cast<std::size_t>(o_.keys));
    std::vector<std::string> keys;
    // In a cluster the keys of one acquire must share an owner node (else
    // the client refuses them, kCrossNode): the first key's owner in the
    // client's current map picks the rest, when enough of its keys turn up.
    const std::string owner = o_.cluster ? lease_client_.address_for(random_key()) : "";
    for (int attempt = 0; keys.size() < count; ++attempt) {
      std::string key = random_key();
      if (std::find(keys.begin(), keys.end(), key) != keys.end()) continue;
      if (!owner.empty() && attempt < 8 * o_.keys && lease_client_.address_for(key) != owner) {
        continue;
      }
      keys.push_back(std::move(key));
    }
    MultiAcquireResult got;
    if (!acquire_all(keys, false, got)) return;
    for (Lease& lease : got.leases) increment(lease);
    for (Lease& lease : got.leases) release(lease);
  }

  // A probe outside the client's rights (worker.h, "Tenants"), a try: one
  // key of another tenant's, or that and a key of its own all-or-nothing.
  // A grant (which isolation reports) is released at once, unwritten.
  void outside_cycle() {
    const int other =
        (tenant_ + 1 +
         static_cast<int>(random_.uniform(static_cast<std::uint64_t>(o_.tenants - 1)))) %
        o_.tenants;
    const std::string foreign =
        TenantPlan::prefix(other) + "key-" + std::to_string(random_.uniform(o_.keys));
    if (random_.uniform(2) == 0) {
      MultiAcquireResult got;
      if (!acquire_all({random_key(), foreign}, true, got)) return;
      for (Lease& lease : got.leases) release(lease);
      return;
    }
    const Event invoked = invoke(foreign, AcquireMode::kExclusive, 0, {}, true);
    AcquireResult got = lease_client_.acquire(foreign, ttl(invoked), wait(invoked), watch());
    if (!got) return failed(invoked, got);
    history_.record(granted(invoked, got.lease));
    release(got.lease);
  }

  // All of `keys` exclusive, all-or-nothing, recorded (`outside`: a probe);
  // true, with the leases in `got`, when granted.
  bool acquire_all(const std::vector<std::string>& keys, bool outside, MultiAcquireResult& got) {
    const Event invoked = invoke("", AcquireMode::kExclusive, 0, keys, outside);
    const std::vector<std::string_view> views(keys.begin(), keys.end());
    got = lease_client_.acquire_many(views, ttl(invoked), wait(invoked), LeaseMode::kExclusive,
                                     watch());
    if (!got) {
      failed(invoked, got);
      return false;
    }
    Event ok = base(EventKind::kAcquireOk, "");
    ok.op = invoked.op;
    ok.outside = outside;
    ok.expiry_ns = std::numeric_limits<std::int64_t>::max();
    for (const Lease& lease : got.leases) {
      ok.keys.push_back(lease.key());
      ok.tokens.push_back(lease.token());
      ok.expiry_ns = std::min(ok.expiry_ns, expiry_on_monotonic(lease));
    }
    if (nodes_ != nullptr && !got.leases.empty()) {
      ok.node = nodes_->take(AnsweringNodes::multi_grant_key(ok.tokens), 0);
    }
    if (got.leases.empty()) {
      // Success with no lease: recorded as the keys asked for with no
      // tokens, which the checker reports (all_or_nothing).
      ok.keys = invoked.keys;
      ok.expiry_ns = monotonic_ns();
    }
    history_.record(ok);
    return true;
  }

  static std::chrono::milliseconds ttl(const Event& invoked) {
    return std::chrono::milliseconds(invoked.ttl_ms);
  }
  static std::chrono::milliseconds wait(const Event& invoked) {
    return std::chrono::milliseconds(invoked.wait_ms);
  }

  const WorkerOptions& o_;
  const int client_;
  const int tenant_;  // -1: no tenants
  const Recorder& history_;
  ResourceConnection& resource_;
  LeaseClient& lease_client_;
  AnsweringNodes* nodes_;  // cluster mode; else null
  workload::SplitMix64 random_;
  std::int64_t op_ = 0;
};

// One election campaigner (worker.h, "Elections").
class Campaigner {
 public:
  Campaigner(const WorkerOptions& o, int client, std::string name, const Recorder& history,
             LeaseClient& lease_client)
      : o_(o),
        client_(client),
        name_(std::move(name)),
        history_(history),
        lease_client_(lease_client),
        random_(o.seed * 1000003 + static_cast<std::uint64_t>(client)) {}

  void run() {
    while (monotonic_ns() < o_.end_ns) cycle();
  }

 private:
  Event event(EventKind kind, std::int64_t op, std::uint64_t term) const {
    Event e;
    e.kind = kind;
    e.client = client_;
    e.op = op;
    e.key = name_;
    e.token = term;
    return e;
  }

  void cycle() {
    Event invoked = event(EventKind::kCampaignInvoke, ++op_, 0);
    invoked.ttl_ms = o_.ttl_ms / 2 + static_cast<int>(random_.uniform(o_.ttl_ms / 2 + 1));
    invoked.wait_ms = o_.max_wait_ms;
    history_.record(invoked);
    lease::Election election(lease_client_, name_,
                             lease::ElectionOptions{std::chrono::milliseconds(invoked.ttl_ms)});
    // Runs on the client's watchdog thread (the history outlives the client).
    election.on_lost([&history = history_, client = client_](const LeaseLost& lost) {
      history.record(loss_event(EventKind::kDeposed, client, lost));
    });
    const std::string value = std::to_string(client_) + "." + std::to_string(invoked.op);
    if (const std::error_code ec =
            election.campaign(value, std::chrono::milliseconds(invoked.wait_ms))) {
      Event fail = event(EventKind::kCampaignFail, invoked.op, 0);
      fail.error = error_name(ec);
      history_.record(fail);
      std::this_thread::sleep_for(std::chrono::milliseconds(1 + random_.uniform(10)));
      return;
    }
    // term() is 0 when the lease was no longer valid to read it: a win
    // with no leadership (the checker orders no term 0).
    const std::uint64_t term = election.term();
    history_.record(event(EventKind::kElected, invoked.op, term));
    hold(election, term, invoked.ttl_ms);
    const Event resign = event(EventKind::kResignInvoke, ++op_, term);
    history_.record(resign);
    const std::error_code ec = election.resign();
    Event done = event(ec ? EventKind::kResignFail : EventKind::kResignOk, resign.op, term);
    if (ec) done.error = error_name(ec);
    history_.record(done);
    std::this_thread::sleep_for(
        std::chrono::milliseconds(random_.uniform(static_cast<std::uint64_t>(invoked.ttl_ms / 4))));
  }

  // Leads for a while, recording each moment the client can prove it leads.
  void hold(const lease::Election& election, std::uint64_t term, std::int64_t ttl_ms) {
    const std::int64_t until =
        monotonic_ns() + static_cast<std::int64_t>(1 + random_.uniform(static_cast<std::uint64_t>(
                                                           std::max(o_.max_wait_ms * 3 / 4, 1)))) *
                             1'000'000;
    const std::uint64_t step_ms =
        static_cast<std::uint64_t>(std::max<std::int64_t>(ttl_ms / 16, 1));
    for (;;) {
      // Stamped before the question: leadership valid when leading() says
      // so was valid at this earlier instant too (nothing revives it).
      Event lead = event(EventKind::kLead, -1, term);
      lead.t_ns = monotonic_ns();
      if (lead.t_ns >= until || !election.leading()) return;
      history_.record(lead);
      std::this_thread::sleep_for(std::chrono::milliseconds(1 + random_.uniform(step_ms)));
    }
  }

  const WorkerOptions& o_;
  const int client_;
  const std::string name_;
  const Recorder& history_;
  LeaseClient& lease_client_;
  workload::SplitMix64 random_;
  std::int64_t op_ = 0;
};

// Every change of leader of `name`, as a LeaderObserver reports it.
void observe(const WorkerOptions& o, int client, const std::string& name, const Recorder& history,
             LeaseClient& lease_client) {
  lease::KeyWatchOptions options;
  options.round = std::chrono::milliseconds(o.max_wait_ms);  // the server refuses longer waits
  lease::LeaderObserver observer(lease_client, name, options);
  for (std::int64_t now = monotonic_ns(); now < o.end_ns; now = monotonic_ns()) {
    const std::optional<lease::LeaderChange> change = observer.next(
        std::chrono::milliseconds(std::min<std::int64_t>((o.end_ns - now) / 1'000'000 + 1, 1000)));
    if (!change) continue;
    Event e;
    e.kind = EventKind::kObserve;
    e.client = client;
    e.key = name;
    e.token = change->leader ? change->leader->term : 0;
    e.leader = change->leader ? change->leader->value : "-";
    // A value that is no campaign's ("" or with blanks) must still be one
    // word of the history line; the checker reports it.
    if (e.leader.empty()) e.leader = "?";
    for (char& c : e.leader) {
      if (c <= ' ') c = '_';
    }
    history.record(e);
  }
}

// A slowly retransmitting client's first resend (WorkerOptions).
constexpr std::chrono::milliseconds kSlowRetransmit{600};

// What every client of the worker starts from: the server (or the
// cluster's seeds) and the retransmission timing.
LeaseClientOptions client_options(const WorkerOptions& o) {
  LeaseClientOptions options;
  options.nodes = split(o.server, ',');
  options.discover_cluster = o.cluster;
  options.request_timeout = std::chrono::milliseconds(o.request_timeout_ms);
  options.initial_retransmit = std::chrono::milliseconds(o.initial_retransmit_ms);
  options.max_retransmit = std::chrono::milliseconds(std::max(o.initial_retransmit_ms, 100));
  return options;
}

// `options` as tenant `tenant` (none when -1); false (said on stderr) when
// its key cannot be read.
bool as_tenant(const WorkerOptions& o, int tenant, LeaseClientOptions& options) {
  if (tenant < 0) return true;
  std::string error;
  if (use_tenant(TenantPlan{o.tenants, o.encrypt}, o.tenant_dir, tenant, options, error)) {
    return true;
  }
  std::fprintf(stderr, "worker: %s\n", error.c_str());
  return false;
}

// The tenant of the `index`-th LeaseClient of its kind, or -1 without tenants.
int tenant_of(const WorkerOptions& o, int index) {
  return o.tenants > 0 ? TenantPlan{o.tenants, o.encrypt}.tenant_of(index) : -1;
}

// A client's history file, created; false (said on stderr) when it cannot be.
bool open_history(const WorkerOptions& o, int client, Recorder& history) {
  if (history.open(o.history_dir + "/client-" + std::to_string(client) + ".log")) return true;
  std::fprintf(stderr, "worker: cannot create history: %s\n", std::strerror(errno));
  return false;
}

// Election role `role` (worker.h): a campaigner or an observer of its name.
int run_election_role(const WorkerOptions& o, int role) {
  const int client = o.election_base + role;
  Recorder history;
  if (!open_history(o, client, history)) return 3;
  LeaseClientOptions options = client_options(o);
  if (!as_tenant(o, tenant_of(o, client), options)) return 3;
  LeaseClient lease_client(options);
  if (const std::error_code ec = lease_client.start()) {
    std::fprintf(stderr, "worker: %s\n", lease_client.error_detail().c_str());
    return 3;
  }
  const int per_name = o.campaigners + o.observers;
  // With tenants every tenant campaigns for the same names.
  const std::string name =
      std::string(o.tenants > 0 ? kSharedPrefix : "") + "elect-" + std::to_string(role / per_name);
  if (role % per_name < o.campaigners) {
    Campaigner(o, client, name, history, lease_client).run();
  } else {
    observe(o, client, name, history, lease_client);
  }
  return 0;
}

// A LeaseClient for one group of lease clients, with the transport wrapper
// that names the answering node in cluster mode (null otherwise).
struct SharedClient {
  std::unique_ptr<LeaseClient> lease_client;
  AnsweringNodes* nodes = nullptr;
  int tenant = -1;  // -1: no tenants
};

// The started LeaseClient of a group; false (said on stderr) when it fails.
bool start_shared_client(const WorkerOptions& o, SharedClient& shared, bool slow) {
  LeaseClientOptions options = client_options(o);
  if (!as_tenant(o, shared.tenant, options)) return false;
  if (slow) {
    options.initial_retransmit = kSlowRetransmit;
    options.max_retransmit = std::max(options.max_retransmit, kSlowRetransmit);
  }
  if (o.cluster) {
    auto names = std::make_shared<std::map<std::string, std::string>>();
    for (const std::string& entry : split(o.node_names, ',')) {
      const std::size_t eq = entry.find('=');
      if (eq != std::string::npos) (*names)[entry.substr(eq + 1)] = entry.substr(0, eq);
    }
    options.wrap_transport = [&shared, names](std::unique_ptr<lease::DatagramTransport> inner) {
      auto wrapped = std::make_unique<AnsweringNodes>(std::move(inner), names);
      shared.nodes = wrapped.get();
      return wrapped;
    };
  }
  shared.lease_client = std::make_unique<LeaseClient>(options);
  if (const std::error_code ec = shared.lease_client->start()) {
    std::fprintf(stderr, "worker: %s\n", shared.lease_client->error_detail().c_str());
    return false;
  }
  return true;
}

// One lease client: its history file and resource connection, over its
// group's LeaseClient.
int run_client(const WorkerOptions& o, int client, SharedClient& shared) {
  Recorder history;
  if (!open_history(o, client, history)) return 3;
  ResourceConnection resource;
  if (!resource.connect(o.resource)) {
    std::fprintf(stderr, "worker: cannot reach the resource\n");
    return 3;
  }
  ClientLoop(o, client, shared.tenant, history, resource, *shared.lease_client, shared.nodes).run();
  return 0;
}

}  // namespace

int run_worker(const WorkerOptions& o) {
  // This worker's election roles: every workers-th, from its index on.
  std::vector<int> roles;
  for (int role = o.index; role < o.elections * (o.campaigners + o.observers);
       role += std::max(o.workers, 1)) {
    roles.push_back(role);
  }
  // One LeaseClient per group of threads_per_client lease clients, started
  // before any of them runs (a deque: the transport wrapper keeps a pointer
  // into its element).
  const int per_group = std::max(o.threads_per_client, 1);
  std::deque<SharedClient> groups(
      static_cast<std::size_t>((o.clients + per_group - 1) / per_group));
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const bool slow = g < static_cast<std::size_t>(std::max(o.slow_retransmit_groups, 0));
    groups[g].tenant =
        tenant_of(o, o.index * static_cast<int>(groups.size()) + static_cast<int>(g));
    if (!start_shared_client(o, groups[g], slow)) return 3;
  }
  std::vector<int> status(static_cast<std::size_t>(o.clients) + roles.size(), 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < o.clients; ++t) {
    threads.emplace_back([&, t] {
      status[static_cast<std::size_t>(t)] =
          run_client(o, o.index * o.clients + t, groups[static_cast<std::size_t>(t / per_group)]);
    });
  }
  for (std::size_t n = 0; n < roles.size(); ++n) {
    threads.emplace_back([&, n] {
      status[static_cast<std::size_t>(o.clients) + n] = run_election_role(o, roles[n]);
    });
  }
  for (std::thread& t : threads) t.join();
  for (const int s : status) {
    if (s != 0) return s;
  }
  return 0;
}

}  // namespace shardlock::torture
