#include "membership.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <utility>

#include "next_map.h"
#include "shardlock/lock_guard.h"

namespace shardlock::cluster {
namespace {

using std::chrono::milliseconds;
using std::chrono::nanoseconds;
using std::chrono::seconds;

constexpr std::string_view kMembersDir = "members/";
constexpr std::string_view kHandoffDir = "handoff/";
constexpr std::string_view kDrainDir = "drain/";
constexpr std::string_view kMapKey = "map";

class MembershipCategory final : public std::error_category {
 public:
  const char* name() const noexcept override { return "shardlock.membership"; }
  std::string message(int e) const override {
    return std::string(to_string(static_cast<MembershipErrc>(e)));
  }
};

bool parse_u64(std::string_view text, std::uint64_t& out) noexcept {
  if (text.empty()) return false;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  return ec == std::errc{} && end == text.data() + text.size();
}

// One read of the prefix, decoded: the view's members, hand-offs and drains,
// and the map key (still encoded: reconcile() adopts it, read_view() only
// decodes it).
struct DecodedPrefix {
  ClusterView view;
  const KeyValue* map_kv = nullptr;  // into the read
  std::uint64_t bad = 0;             // values skipped: members, hand-offs, drain ids
};

DecodedPrefix decode_prefix(std::string_view prefix, const RangeResult& read) {
  DecodedPrefix out;
  out.view.revision = read.revision;
  // The id after `dir` in `key`, when `key` is prefix + dir + something.
  const auto id_in = [prefix](std::string_view key,
                              std::string_view dir) -> std::optional<std::string_view> {
    if (!key.starts_with(prefix)) return std::nullopt;
    key.remove_prefix(prefix.size());
    if (!key.starts_with(dir)) return std::nullopt;
    return key.substr(dir.size());
  };
  // etcd answers in key order, so each list comes out sorted by id.
  for (const KeyValue& kv : read.kvs) {
    if (kv.key.size() == prefix.size() + kMapKey.size() && kv.key.starts_with(prefix) &&
        kv.key.ends_with(kMapKey)) {
      out.map_kv = &kv;
    } else if (const auto member_id = id_in(kv.key, kMembersDir)) {
      if (!valid_node_id(*member_id)) {
        ++out.bad;
        continue;
      }
      // A record this version cannot read (say, a state a newer version
      // added) is still a live node: present, and out of the map.
      std::optional<MemberRecord> record = decode_member(kv.value);
      if (!record) ++out.bad;
      out.view.members.push_back({std::string(*member_id), record.value_or(MemberRecord{}),
                                  kv.create_revision, kv.lease, record.has_value()});
    } else if (const auto handoff_id = id_in(kv.key, kHandoffDir)) {
      std::uint64_t epoch = 0;
      if (!valid_node_id(*handoff_id) || !parse_u64(kv.value, epoch)) {
        ++out.bad;
        continue;
      }
      out.view.handoffs.push_back({std::string(*handoff_id), epoch});
    } else if (const auto drain_id = id_in(kv.key, kDrainDir)) {
      if (!valid_node_id(*drain_id)) {
        ++out.bad;
        continue;
      }
      out.view.drains.emplace_back(*drain_id);
    }
    // Any other key is a later addition: ignored.
  }
  return out;
}

EtcdStatus status_of(const std::error_code& error, std::string detail) {
  EtcdStatus status;
  status.error = error;
  status.detail = std::move(detail);
  return status;
}

}  // namespace

// ---------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------

std::string_view to_string(MembershipErrc e) noexcept {
  switch (e) {
    case MembershipErrc::kOk:
      return "ok";
    case MembershipErrc::kInvalidOptions:
      return "invalid membership options";
    case MembershipErrc::kMemberExists:
      return "member id is registered under another live etcd lease";
    case MembershipErrc::kStaleMap:
      return "cluster map older than the highest epoch seen";
    case MembershipErrc::kEpochFileFailed:
      return "epoch file unreadable or unwritable";
    case MembershipErrc::kReplicasMismatch:
      return "a live member runs with another replica count";
  }
  return "unknown membership error";
}

const std::error_category& membership_category() noexcept {
  static const MembershipCategory category;
  return category;
}

// ---------------------------------------------------------------------------
// Membership
// ---------------------------------------------------------------------------

Membership::Membership(MembershipOptions options) : options_(std::move(options)) {
  map_ = std::make_shared<const ClusterMap>();
}

Membership::~Membership() { stop(StopMode::kRevokeLease); }

std::error_code Membership::start(MembershipOptions options, std::unique_ptr<Membership>& out,
                                  std::string& detail) {
  const auto invalid = [&](std::string why) {
    detail = std::move(why);
    return make_error_code(MembershipErrc::kInvalidOptions);
  };
  if (!valid_node_id(options.node_id)) {
    return invalid("node id '" + options.node_id + "' is not 1..128 bytes of [A-Za-z0-9._-]");
  }
  if (!valid_member_address(options.advertise)) {
    return invalid("advertise address '" + options.advertise + "' is not HOST:PORT");
  }
  if (options.weight < 1 || options.weight > RouterSnapshot::kMaxWeight) {
    return invalid("weight " + std::to_string(options.weight) + " is not in 1.." +
                   std::to_string(RouterSnapshot::kMaxWeight));
  }
  if (options.prefix.empty() || options.prefix.back() != '/') {
    return invalid("cluster prefix '" + options.prefix + "' must end in '/'");
  }
  if (options.data_dir.empty()) return invalid("a data dir is required (the epoch file)");
  if (options.lease_ttl < seconds(1) || options.drift_margin < milliseconds(0) ||
      options.drift_margin * 2 >= options.lease_ttl) {
    return invalid("lease TTL must be >= 1 s and the drift margin below half of it");
  }
  if (options.call_timeout <= milliseconds(0)) {
    options.call_timeout = std::chrono::duration_cast<milliseconds>(options.lease_ttl) / 3;
  }
  if (!options.clock) {
    options.clock = [] { return std::chrono::steady_clock::now().time_since_epoch(); };
  }
  if (!options.log) {
    options.log = [](std::string_view line) {
      std::fprintf(stderr, "shardlock-cluster: %.*s\n", static_cast<int>(line.size()), line.data());
    };
  }

  std::unique_ptr<Membership> member(new Membership(std::move(options)));
  const MembershipOptions& o = member->options_;
  if (EpochFile::open(o.data_dir, member->epoch_file_, detail)) {
    return make_error_code(MembershipErrc::kEpochFileFailed);
  }
  {
    LockGuard lock(member->mutex_);
    member->stats_.highest_epoch = member->epoch_file_->highest();
  }
  EtcdClientOptions client_options;
  client_options.endpoints = o.endpoints;
  client_options.tls = o.tls;
  client_options.credentials = o.credentials;
  client_options.call_timeout = o.call_timeout;
  auto connected = EtcdClient::connect(client_options);
  if (!connected.ok()) {
    detail = connected.detail;
    return connected.error;
  }
  member->client_ = std::move(connected.value);
  if (const std::error_code ec = member->check_replicas(detail)) return ec;
  std::int64_t registered_at = 0;
  if (const std::error_code ec = member->register_member(detail, &registered_at)) return ec;
  {
    // Every start begins a new epoch: one published after this registration
    // (docs/cluster.md, Epochs).
    LockGuard lock(member->mutex_);
    member->epoch_wanted_ = true;
    member->epoch_wanted_after_revision_ = registered_at;
    member->epoch_floor_ = member->options_.min_epoch;
  }

  const std::optional<std::int64_t> revision = member->reconcile();
  member->keep_alive_thread_ = std::thread([m = member.get()] { m->keep_alive_loop(); });
  member->map_thread_ =
      std::thread([m = member.get(), from = revision ? *revision + 1 : 0] { m->map_loop(from); });
  out = std::move(member);
  return {};
}

void Membership::stop(StopMode mode) {
  {
    LockGuard lock(mutex_);
    if (stopped_) return;
    stopped_ = true;
    stopping_ = true;
  }
  wake_.notify_all();
  if (keep_alive_thread_.joinable()) keep_alive_thread_.join();
  if (map_thread_.joinable()) map_thread_.join();
  deadline_ns_.store(0, std::memory_order_relaxed);  // relaxed: see lease_deadline()
  std::int64_t lease = 0;
  {
    LockGuard lock(mutex_);
    lease = std::exchange(lease_id_, 0);
  }
  if (mode == StopMode::kRevokeLease && lease != 0 && client_) {
    const EtcdStatus revoked = client_->revoke_lease(lease);
    if (!revoked.ok() && revoked.error != EtcdErrc::kNotFound) {
      note("could not revoke etcd lease " + std::to_string(lease) + " on stop (it expires " +
           "after its TTL): " + revoked.detail);
    }
  }
}

std::shared_ptr<const ClusterMap> Membership::current_map() const {
  LockGuard lock(mutex_);
  return map_;
}

std::int64_t Membership::lease_id() const {
  LockGuard lock(mutex_);
  return lease_id_;
}

MembershipStats Membership::stats() const {
  LockGuard lock(mutex_);
  return stats_;
}

EtcdStatus Membership::drain() {
  LockGuard order(member_key_mutex_);
  std::int64_t lease = 0;
  {
    LockGuard lock(mutex_);
    state_ = MemberState::kDraining;  // a re-registration keeps it
    drained_by_key_ = false;          // code's drain: a drain key going away leaves it
    lease = lease_id_;
  }
  // Not registered right now: the next registration puts the draining state.
  if (lease == 0) return {};
  return put_member_state(MemberState::kDraining, lease);
}

EtcdStatus Membership::caught_up() {
  LockGuard order(member_key_mutex_);
  MemberState state = MemberState::kActive;
  std::int64_t lease = 0;
  {
    LockGuard lock(mutex_);
    if (!learning_) return {};
    learning_ = false;
    state = state_;
    lease = lease_id_;
  }
  if (lease == 0) return {};
  EtcdStatus put = put_member_state(state, lease);
  if (!put.ok()) {
    LockGuard lock(mutex_);
    learning_ = lease == lease_id_;  // the next call tries again
  }
  return put;
}

bool Membership::learning() const {
  LockGuard lock(mutex_);
  return learning_;
}

EtcdStatus Membership::put_member_state(MemberState state, std::int64_t lease) {
  {
    LockGuard lock(mutex_);
    if (learning_ && state == MemberState::kActive) state = MemberState::kJoining;
  }
  const auto put = client_->put(member_key(), encode_member(record_of(state)), lease);
  return status_of(put.error, put.detail);
}

std::optional<bool> Membership::follow_drain_key(bool drain_key_present) {
  LockGuard order(member_key_mutex_);
  MemberState target = MemberState::kActive;
  std::int64_t lease = 0;
  {
    LockGuard lock(mutex_);
    if (drain_key_present && state_ == MemberState::kActive) {
      state_ = MemberState::kDraining;
      drained_by_key_ = true;
      ++stats_.drains_by_key;
    } else if (!drain_key_present && state_ == MemberState::kDraining && drained_by_key_) {
      state_ = MemberState::kActive;
      drained_by_key_ = false;
      ++stats_.drains_cancelled;
    } else {
      return false;
    }
    target = state_;
    lease = lease_id_;
  }
  note(std::string(target == MemberState::kDraining ? "draining: " : "active again: ") +
       options_.prefix + std::string(kDrainDir) + options_.node_id +
       (target == MemberState::kDraining ? " was put" : " was deleted"));
  // Not registered right now: the next registration puts the new state.
  if (lease == 0) return false;
  const EtcdStatus put = put_member_state(target, lease);
  if (!put.ok()) {
    note_etcd_error("cannot put " + member_key(), put.detail);
    return std::nullopt;
  }
  return true;
}

EtcdStatus Membership::put_handoff(std::uint64_t epoch) {
  const std::int64_t lease = lease_id();
  if (lease == 0) {
    return status_of(make_error_code(EtcdErrc::kNotFound),
                     "node " + options_.node_id +
                         " is not registered right now (no etcd lease); not putting " +
                         handoff_key());
  }
  const auto put = client_->put(handoff_key(), std::to_string(epoch), lease);
  return status_of(put.error, put.detail);
}

EtcdStatus Membership::evict(std::string_view id, std::int64_t lease) {
  const std::int64_t own = lease_id();
  if (lease == 0 || lease == own || id == options_.node_id) {
    return status_of(make_error_code(EtcdErrc::kNotFound),
                     "not evicting lease " + std::to_string(lease) + " (none, or this node's own)");
  }
  if (own == 0) {
    return status_of(make_error_code(EtcdErrc::kNotFound),
                     "not evicting " + std::string(id) + ": this node is not registered right now");
  }
  const std::string victim = options_.prefix + std::string(kMembersDir) + std::string(id);
  const auto deleted = client_->delete_if_leases(victim, lease, member_key(), own);
  if (!deleted.ok()) return status_of(deleted.error, deleted.detail);
  if (!deleted.value.applied) {
    return status_of(make_error_code(EtcdErrc::kNotFound),
                     "not evicting " + std::string(id) +
                         ": its member key is no longer under lease " + std::to_string(lease) +
                         ", or this node's own is no longer under lease " + std::to_string(own) +
                         " (evicted first)");
  }
  EtcdStatus revoked = client_->revoke_lease(lease);
  // Its member key is gone already; a lease that ran out meanwhile is fine.
  if (!revoked.ok() && revoked.error != EtcdErrc::kNotFound) return revoked;
  return {};
}

void Membership::request_new_epoch(std::uint64_t at_least) {
  {
    LockGuard lock(mutex_);
    if (!epoch_wanted_) {
      epoch_wanted_ = true;
      epoch_wanted_above_ = map_->epoch;
      epoch_wanted_after_revision_ = 0;
    } else {
      epoch_wanted_above_ = std::max(epoch_wanted_above_, map_->epoch);
    }
    epoch_wanted_above_ = std::max(epoch_wanted_above_, at_least > 0 ? at_least - 1 : 0);
    epoch_floor_ = std::max(epoch_floor_, at_least);
    ++stats_.epochs_requested;
    map_dirty_ = true;
  }
  wake_.notify_all();
}

EtcdStatus Membership::request_drain(EtcdClient& client, std::string_view prefix,
                                     std::string_view node_id) {
  if (!valid_node_id(node_id)) {
    return status_of(
        make_error_code(EtcdErrc::kInvalidArgument),
        "node id '" + std::string(node_id) + "' is not 1..128 bytes of [A-Za-z0-9._-]");
  }
  const auto put =
      client.put(std::string(prefix) + std::string(kDrainDir) + std::string(node_id), "1");
  return status_of(put.error, put.detail);
}

EtcdStatus Membership::cancel_drain(EtcdClient& client, std::string_view prefix,
                                    std::string_view node_id) {
  if (!valid_node_id(node_id)) {
    return status_of(
        make_error_code(EtcdErrc::kInvalidArgument),
        "node id '" + std::string(node_id) + "' is not 1..128 bytes of [A-Za-z0-9._-]");
  }
  const auto deleted =
      client.delete_key(std::string(prefix) + std::string(kDrainDir) + std::string(node_id));
  return status_of(deleted.error, deleted.detail);
}

EtcdResult<ClusterView> Membership::read_view(EtcdClient& client, std::string_view prefix,
                                              std::uint64_t* bad_values) {
  EtcdResult<ClusterView> result;
  const auto read = client.get_prefix(prefix);
  if (!read.ok()) {
    result.error = read.error;
    result.detail = read.detail;
    return result;
  }
  DecodedPrefix decoded = decode_prefix(prefix, read.value);
  if (decoded.map_kv != nullptr) {
    if (auto map = decode_map(decoded.map_kv->value,
                              static_cast<std::uint64_t>(decoded.map_kv->mod_revision))) {
      decoded.view.map = std::make_shared<const ClusterMap>(std::move(*map));
    } else {
      ++decoded.bad;
    }
  }
  if (bad_values != nullptr) *bad_values = decoded.bad;
  result.value = std::move(decoded.view);
  return result;
}

void Membership::note(std::string_view line) { options_.log(line); }

void Membership::note_etcd_error(std::string_view what, const std::string& detail) {
  {
    LockGuard lock(mutex_);
    ++stats_.etcd_errors;
  }
  note(std::string(what) + ": " + detail);
}

void Membership::set_deadline(nanoseconds send_time, std::int64_t ttl_seconds) {
  const nanoseconds deadline = send_time + seconds(ttl_seconds) - options_.drift_margin;
  // Release: pairs with lease_deadline_of(), publishing registration_ as
  // raised before it. Only this node's registration and keep-alive paths
  // store it, one at a time (start(), then the keep-alive thread).
  deadline_ns_.store(deadline.count(), std::memory_order_release);
}

std::error_code Membership::check_replicas(std::string& detail) {
  if (options_.replicas == 0) return {};
  auto read = read_view(*client_, options_.prefix);
  if (!read.ok()) {
    detail = "cannot read the members: " + read.detail;
    return read.error;
  }
  for (const ClusterView::Member& member : read.value.members) {
    if (member.id == options_.node_id || !member.readable) continue;
    // A record without the field is a node of an earlier version: it does
    // not replicate.
    const std::uint32_t theirs = std::max<std::uint32_t>(member.record.replicas, 1);
    if (theirs == options_.replicas) continue;
    detail = "node " + member.id + " runs with --replicas " + std::to_string(theirs) +
             " and this node with --replicas " + std::to_string(options_.replicas) +
             ": every node of a cluster needs the same count (each decides a bucket's " +
             "backups from it; docs/cluster.md, \"Replication\")";
    return make_error_code(MembershipErrc::kReplicasMismatch);
  }
  return {};
}

std::error_code Membership::register_member(std::string& detail, std::int64_t* revision) {
  LockGuard order(member_key_mutex_);
  const nanoseconds send_time = now();
  const auto granted = client_->grant_lease(options_.lease_ttl.count());
  if (!granted.ok()) {
    detail = "cannot grant an etcd lease: " + granted.detail;
    return granted.error;
  }
  MemberState state = MemberState::kActive;
  {
    // Each registration is a new incarnation: with replication, it learns
    // before it owns anything.
    LockGuard lock(mutex_);
    learning_ = options_.join_as_learner;
    state = learning_ && state_ == MemberState::kActive ? MemberState::kJoining : state_;
  }
  const std::int64_t lease = granted.value.id;
  const auto put = client_->put_if_absent(member_key(), encode_member(record_of(state)), lease);
  if (!put.ok() || !put.value.applied) {
    (void)client_->revoke_lease(lease);  // best effort; it expires anyway
    if (!put.ok()) {
      detail = "cannot put " + member_key() + ": " + put.detail;
      return put.error;
    }
    detail = member_key() + " is held by etcd lease " +
             std::to_string(put.value.current ? put.value.current->lease : 0) + " (value '" +
             (put.value.current ? put.value.current->value : std::string()) +
             "'): another live node has this id, or a previous run's lease has not expired yet";
    return make_error_code(MembershipErrc::kMemberExists);
  }
  // The new registration is counted before its deadline is published
  // (set_deadline's release), so lease_deadline_of() never pairs an earlier
  // registration with this lease's deadline.
  registration_.fetch_add(1, std::memory_order_relaxed);
  set_deadline(send_time, granted.value.ttl_seconds);
  if (revision != nullptr) *revision = put.value.revision;
  LockGuard lock(mutex_);
  lease_id_ = lease;
  ++stats_.registrations;
  return {};
}

void Membership::keep_alive_loop() {
  // Paced on real time; the deadline is on the injected clock.
  const milliseconds interval =
      std::max(milliseconds(100), std::chrono::duration_cast<milliseconds>(options_.lease_ttl) / 3);
  bool failing = false;
  for (;;) {
    std::int64_t lease = 0;
    {
      LockGuard lock(mutex_);
      wake_.wait_for(mutex_, interval, [&]() SHARDLOCK_REQUIRES(mutex_) { return stopping_; });
      if (stopping_) return;
      lease = lease_id_;
    }
    if (lease == 0) {
      std::string detail;
      if (const std::error_code ec = register_member(detail)) {
        note("re-registration failed (" + ec.message() + "): " + detail);
      } else {
        note("registered again under etcd lease " + std::to_string(this->lease_id()));
        failing = false;
      }
      continue;
    }
    const nanoseconds send_time = now();
    const auto kept = client_->keep_alive_once(lease);
    if (kept.ok()) {
      set_deadline(send_time, kept.value);
      LockGuard lock(mutex_);
      ++stats_.keep_alives_acked;
      if (failing) note("keep-alives acknowledged again");
      failing = false;
      continue;
    }
    if (kept.error == EtcdErrc::kLeaseExpired || kept.error == EtcdErrc::kNotFound) {
      // etcd says the lease is gone: fail closed now, not at the deadline.
      deadline_ns_.store(0, std::memory_order_relaxed);  // relaxed: see lease_deadline()
      {
        LockGuard lock(mutex_);
        ++stats_.leases_lost;
        ++stats_.keep_alives_failed;
        lease_id_ = 0;
      }
      note("etcd lease " + std::to_string(lease) + " is gone; registering again");
      continue;  // re-registers after the next interval; no tight loop on a flapping etcd
    }
    {
      LockGuard lock(mutex_);
      ++stats_.keep_alives_failed;
    }
    if (!failing) note_etcd_error("keep-alive failed", kept.detail);
    failing = true;
  }
}

void Membership::map_loop(std::int64_t watch_from) {
  std::unique_ptr<EtcdWatch> watch;
  const auto open_watch = [&](std::int64_t from) {
    watch = client_->watch_prefix(options_.prefix, from, [this](const WatchUpdate& update) {
      // Every map put, in revision order: a pass that reads the prefix sees
      // only the newest map, and these are the ones in between.
      std::vector<RevisedMap> maps;
      for (const WatchEvent& event : update.events) {
        if (event.type != WatchEventType::kPut || event.kv.key != map_key()) continue;
        if (auto map =
                decode_map(event.kv.value, static_cast<std::uint64_t>(event.kv.mod_revision))) {
          maps.push_back({std::move(*map), event.kv.mod_revision});
        }
      }
      LockGuard lock(mutex_);
      if (update.error) {
        watch_failed_ = true;
      } else {
        map_dirty_ = true;
        for (auto& map : maps) watched_maps_.push_back(std::move(map));
      }
      wake_.notify_all();
    });
  };
  if (watch_from > 0) open_watch(watch_from);
  bool retry = watch_from <= 0;
  for (;;) {
    bool reopen = false;
    {
      LockGuard lock(mutex_);
      const auto ready = [&]() SHARDLOCK_REQUIRES(mutex_) {
        return stopping_ || map_dirty_ || watch_failed_;
      };
      if (retry) {
        wake_.wait_for(mutex_, options_.retry_interval, ready);
      } else {
        wake_.wait(mutex_, ready);
      }
      if (stopping_) break;
      reopen = watch_failed_ || !watch;
      watch_failed_ = false;
      map_dirty_ = false;
    }
    if (reopen && watch) {
      note("watch of " + options_.prefix + " ended; reading the prefix again");
      watch.reset();  // joins the watch's thread, which has stopped calling back
    }
    const std::optional<std::int64_t> revision = reconcile();
    retry = !revision.has_value();
    if (revision && !watch) open_watch(*revision + 1);
  }
  watch.reset();
}

std::optional<std::int64_t> Membership::reconcile() {
  const std::string map_key = this->map_key();
  std::optional<ClusterView> view;
  std::vector<std::shared_ptr<const ClusterMap>> adopted_in_pass;
  // Losing a CAS means another node published, and a drain key makes this
  // node put its own member key: either way, read again. The attempts bound
  // a pass; the next watch event starts another.
  for (int attempt = 0; attempt < 4; ++attempt) {
    const auto read = client_->get_prefix(options_.prefix);
    if (!read.ok()) {
      note_etcd_error("cannot read " + options_.prefix, read.detail);
      return std::nullopt;
    }
    DecodedPrefix decoded = decode_prefix(options_.prefix, read.value);
    view = std::move(decoded.view);
    const bool drain_key =
        std::binary_search(view->drains.begin(), view->drains.end(), options_.node_id);
    const std::optional<bool> put_own_key = follow_drain_key(drain_key);
    if (!put_own_key) return std::nullopt;  // the put failed; retried after retry_interval

    std::optional<ClusterMap> published;
    const std::int64_t published_revision =
        decoded.map_kv != nullptr ? decoded.map_kv->mod_revision : 0;
    if (decoded.map_kv != nullptr) {
      published = decode_map(decoded.map_kv->value, static_cast<std::uint64_t>(published_revision));
      if (published) {
        adopt_maps_through({*published, published_revision}, adopted_in_pass);
      } else {
        ++decoded.bad;
      }
    }
    if (decoded.bad != 0) {
      LockGuard lock(mutex_);
      stats_.bad_values += decoded.bad;
    }
    if (*put_own_key) continue;  // this read is already out of date

    MapInputs inputs{.view = *view,
                     .published = published,
                     .self_id = options_.node_id,
                     .self_lease = lease_id(),
                     .highest_epoch_seen = epoch_file_->highest()};
    {
      LockGuard lock(mutex_);
      if (epoch_wanted_ && map_revision_ > epoch_wanted_after_revision_ &&
          map_->epoch > epoch_wanted_above_) {
        epoch_wanted_ = false;
      }
      inputs.epoch_wanted = epoch_wanted_;
      inputs.epoch_floor = epoch_floor_;
    }
    MapDecision decision = next_map(inputs);  // next_map.h: the rules
    if (!decision.next) break;
    const bool unchanged = decision.unchanged;
    ClusterMap next = std::move(*decision.next);
    const auto swapped =
        client_->put_if_mod_revision(map_key, encode_map(next), published_revision);
    if (!swapped.ok()) {
      note_etcd_error("cannot publish " + map_key, swapped.detail);
      return std::nullopt;
    }
    if (swapped.value.applied) {
      {
        LockGuard lock(mutex_);
        ++stats_.maps_published;
        if (unchanged) ++stats_.maps_republished;
        // Served whether or not adopt() takes it: a map above every wanted
        // epoch now exists, and wanting more would re-put forever.
        epoch_wanted_ = false;
      }
      // The transaction's revision is the map key's new mod_revision.
      adopt(std::move(next), swapped.value.revision, &adopted_in_pass);
      break;
    }
  }
  if (options_.on_view) {
    view->map = current_map();
    view->adopted = std::move(adopted_in_pass);
    options_.on_view(*view);
  }
  return view->revision;
}

void Membership::adopt_maps_through(RevisedMap published,
                                    std::vector<std::shared_ptr<const ClusterMap>>& adopted) {
  std::vector<RevisedMap> watched;
  std::uint64_t current_epoch = 0;
  {
    LockGuard lock(mutex_);
    watched.swap(watched_maps_);
    current_epoch = map_->epoch;
  }
  const std::string key = map_key();
  std::size_t read_back = 0;
  const ReadMapBefore read_before = [&](std::int64_t revision) -> std::optional<RevisedMap> {
    const auto read = client_->get_at(key, revision - 1);
    if (!read.ok()) {
      note_etcd_error("cannot read " + key + " at revision " + std::to_string(revision - 1),
                      read.detail);
      return std::nullopt;
    }
    if (read.value.kvs.empty()) return std::nullopt;
    const KeyValue& kv = read.value.kvs.front();
    auto map = decode_map(kv.value, static_cast<std::uint64_t>(kv.mod_revision));
    if (!map) return std::nullopt;
    ++read_back;
    return RevisedMap{std::move(*map), kv.mod_revision};
  };
  const std::uint64_t published_epoch = published.map.epoch;
  std::vector<RevisedMap> maps = maps_to_adopt(
      current_epoch, std::move(watched), std::move(published), kMaxMapHistoryReads, read_before);
  if (read_back != 0) {
    {
      LockGuard lock(mutex_);
      stats_.maps_read_back += read_back;
    }
    note("read " + std::to_string(read_back) + " cluster map(s) the watch had not delivered back" +
         " from etcd's history, to adopt every epoch from " + std::to_string(current_epoch) +
         " to " + std::to_string(published_epoch) + " in order");
  }
  for (RevisedMap& m : maps) adopt(std::move(m.map), m.mod_revision, &adopted);
}

void Membership::adopt(ClusterMap map, std::int64_t mod_revision,
                       std::vector<std::shared_ptr<const ClusterMap>>* adopted_in_pass) {
  const std::uint64_t epoch = map.epoch;
  {
    LockGuard lock(mutex_);
    if (map_->epoch == epoch) return;
  }
  const std::uint64_t highest = epoch_file_->highest();
  if (epoch < highest) {
    bool first_time = false;
    {
      LockGuard lock(mutex_);
      ++stats_.maps_refused;
      first_time = stats_.last_refused_epoch != epoch;
      stats_.last_refused_epoch = epoch;
    }
    if (first_time) {
      note("refusing cluster map epoch " + std::to_string(epoch) + ": this node has seen epoch " +
           std::to_string(highest) + " (" + std::string(to_string(MembershipErrc::kStaleMap)) +
           "; was etcd restored from a snapshot? see docs/cluster.md, Runbook)");
    }
    return;
  }
  // Durable before anyone acts on it: after a crash the node must still
  // refuse every map older than this one.
  std::string detail;
  if (epoch_file_->record(epoch, detail)) {
    {
      LockGuard lock(mutex_);
      ++stats_.epoch_file_errors;
    }
    note("not adopting cluster map epoch " + std::to_string(epoch) + ": " + detail);
    return;
  }
  auto adopted = std::make_shared<const ClusterMap>(std::move(map));
  {
    LockGuard lock(mutex_);
    map_ = adopted;
    map_revision_ = mod_revision;
    ++stats_.maps_adopted;
    stats_.highest_epoch = epoch_file_->highest();
  }
  if (adopted_in_pass != nullptr) adopted_in_pass->push_back(adopted);
  if (options_.on_map_change) options_.on_map_change(*adopted);
}

}  // namespace shardlock::cluster
