#include "membership.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <utility>

#include "shardlock/lock_guard.h"

namespace shardlock::cluster {
namespace {

using std::chrono::milliseconds;
using std::chrono::nanoseconds;
using std::chrono::seconds;

constexpr std::string_view kMapVersionLine = "shardlock-map v1";
constexpr std::size_t kMaxNodeIdBytes = 128;

class MembershipCategory final : public std::error_category {
 public:
  const char* name() const noexcept override { return "shardlock.membership"; }
  std::string message(int e) const override {
    return std::string(to_string(static_cast<MembershipErrc>(e)));
  }
};

bool parse_u32(std::string_view text, std::uint32_t& out) noexcept {
  if (text.empty()) return false;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  return ec == std::errc{} && end == text.data() + text.size();
}

bool valid_weight(std::uint32_t weight) noexcept {
  return weight >= 1 && weight <= RouterSnapshot::kMaxWeight;
}

// HOST:PORT with a non-empty host (an IPv6 host in brackets) and a port in
// 1..65535; no whitespace, which would break the map's line format.
bool valid_address(std::string_view address) noexcept {
  if (address.empty() || address.size() > 300) return false;
  for (const char c : address) {
    if (c <= ' ' || c == 0x7f) return false;
  }
  const std::size_t colon = address.rfind(':');
  if (colon == std::string_view::npos || colon == 0) return false;
  std::uint32_t port = 0;
  return parse_u32(address.substr(colon + 1), port) && port >= 1 && port <= 65535;
}

// Splits on single spaces; empty fields are kept (and then rejected).
std::vector<std::string_view> split(std::string_view text, char separator) {
  std::vector<std::string_view> fields;
  std::size_t start = 0;
  for (;;) {
    const std::size_t end = text.find(separator, start);
    if (end == std::string_view::npos) {
      fields.push_back(text.substr(start));
      return fields;
    }
    fields.push_back(text.substr(start, end - start));
    start = end + 1;
  }
}

}  // namespace

// ---------------------------------------------------------------------------
// Encodings
// ---------------------------------------------------------------------------

std::string_view to_string(MemberState state) noexcept {
  return state == MemberState::kDraining ? "draining" : "active";
}

bool valid_node_id(std::string_view id) noexcept {
  if (id.empty() || id.size() > kMaxNodeIdBytes) return false;
  return std::all_of(id.begin(), id.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == '-';
  });
}

std::string encode_member(const MemberRecord& record) {
  return "address=" + record.address + " weight=" + std::to_string(record.weight) +
         " state=" + std::string(to_string(record.state));
}

std::optional<MemberRecord> decode_member(std::string_view text) {
  MemberRecord record;
  bool have_address = false;
  bool have_weight = false;
  bool have_state = false;
  for (const std::string_view field : split(text, ' ')) {
    const std::size_t equals = field.find('=');
    if (equals == std::string_view::npos) return std::nullopt;
    const std::string_view name = field.substr(0, equals);
    const std::string_view value = field.substr(equals + 1);
    if (name == "address") {
      if (!valid_address(value)) return std::nullopt;
      record.address = std::string(value);
      have_address = true;
    } else if (name == "weight") {
      if (!parse_u32(value, record.weight) || !valid_weight(record.weight)) return std::nullopt;
      have_weight = true;
    } else if (name == "state") {
      if (value == "active") {
        record.state = MemberState::kActive;
      } else if (value == "draining") {
        record.state = MemberState::kDraining;
      } else {
        return std::nullopt;
      }
      have_state = true;
    }
  }
  if (!have_address || !have_weight || !have_state) return std::nullopt;
  return record;
}

std::string encode_map_members(const std::vector<ClusterMember>& members) {
  std::string text(kMapVersionLine);
  text += '\n';
  for (const ClusterMember& member : members) {
    text += member.id;
    text += ' ';
    text += member.address;
    text += ' ';
    text += std::to_string(member.weight);
    text += '\n';
  }
  return text;
}

std::optional<std::vector<ClusterMember>> decode_map_members(std::string_view text) {
  if (!text.ends_with('\n')) return std::nullopt;
  std::vector<std::string_view> lines = split(text.substr(0, text.size() - 1), '\n');
  if (lines.empty() || lines.front() != kMapVersionLine) return std::nullopt;
  std::vector<ClusterMember> members;
  members.reserve(lines.size() - 1);
  for (std::size_t i = 1; i < lines.size(); ++i) {
    const std::vector<std::string_view> fields = split(lines[i], ' ');
    if (fields.size() != 3 || !valid_node_id(fields[0]) || !valid_address(fields[1])) {
      return std::nullopt;
    }
    ClusterMember member{std::string(fields[0]), std::string(fields[1]), 0};
    if (!parse_u32(fields[2], member.weight) || !valid_weight(member.weight)) return std::nullopt;
    if (!members.empty() && !(members.back().id < member.id)) return std::nullopt;
    members.push_back(std::move(member));
  }
  return members;
}

// ---------------------------------------------------------------------------
// Routing
// ---------------------------------------------------------------------------

RouterStatus ClusterRouting::build(const ClusterMap& map, const RouterOptions& options,
                                   std::unique_ptr<ClusterRouting>& out) {
  std::unique_ptr<ClusterRouting> routing(new ClusterRouting());
  routing->map_ = map;
  // The Router keeps its nodes sorted by id; so must the map, for table
  // indices to be member indices.
  std::sort(routing->map_.members.begin(), routing->map_.members.end(),
            [](const ClusterMember& a, const ClusterMember& b) { return a.id < b.id; });
  std::vector<Node> nodes;
  nodes.reserve(routing->map_.members.size());
  for (const ClusterMember& member : routing->map_.members) {
    nodes.push_back(Node{member.id, member.weight});
  }
  Router router(options);
  if (const RouterStatus status = router.assign(nodes); status != RouterStatus::kOk) {
    return status;
  }
  routing->snapshot_ = router.snapshot();  // outlives the Router
  out = std::move(routing);
  return RouterStatus::kOk;
}

const ClusterMember* ClusterRouting::owner_of_bucket(std::size_t bucket) const noexcept {
  const std::span<const std::uint16_t> table = snapshot_->table();
  if (bucket >= table.size()) return nullptr;
  const std::uint16_t index = table[bucket];
  if (index == RouterSnapshot::kNoOwner || index >= map_.members.size()) return nullptr;
  return &map_.members[index];
}

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
  if (!valid_address(options.advertise)) {
    return invalid("advertise address '" + options.advertise + "' is not HOST:PORT");
  }
  if (!valid_weight(options.weight)) {
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
  client_options.call_timeout = o.call_timeout;
  auto connected = EtcdClient::connect(client_options);
  if (!connected.ok()) {
    detail = connected.detail;
    return connected.error;
  }
  member->client_ = std::move(connected.value);
  if (const std::error_code ec = member->register_member(detail)) return ec;

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
  std::int64_t lease = 0;
  {
    LockGuard lock(mutex_);
    state_ = MemberState::kDraining;  // a re-registration keeps it
    lease = lease_id_;
  }
  EtcdStatus result;
  if (lease == 0) {
    // Not registered right now; the next registration puts the draining state.
    return result;
  }
  const auto put = client_->put(
      member_key(), encode_member({options_.advertise, options_.weight, MemberState::kDraining}),
      lease);
  result.error = put.error;
  result.detail = put.detail;
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
  // Relaxed: see lease_deadline(). Only this node's registration and
  // keep-alive paths store it, one at a time (start(), then the keep-alive
  // thread).
  deadline_ns_.store(deadline.count(), std::memory_order_relaxed);
}

std::error_code Membership::register_member(std::string& detail) {
  const nanoseconds send_time = now();
  const auto granted = client_->grant_lease(options_.lease_ttl.count());
  if (!granted.ok()) {
    detail = "cannot grant an etcd lease: " + granted.detail;
    return granted.error;
  }
  MemberState state = MemberState::kActive;
  {
    LockGuard lock(mutex_);
    state = state_;
  }
  const std::int64_t lease = granted.value.id;
  const auto put = client_->put_if_absent(
      member_key(), encode_member({options_.advertise, options_.weight, state}), lease);
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
  set_deadline(send_time, granted.value.ttl_seconds);
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
      LockGuard lock(mutex_);
      if (update.error) {
        watch_failed_ = true;
      } else {
        map_dirty_ = true;
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
  const std::string members_prefix = options_.prefix + "members/";
  const std::string map_key = this->map_key();
  std::int64_t revision = 0;
  // Losing a CAS means another node published; read again to adopt its map.
  for (int attempt = 0; attempt < 4; ++attempt) {
    const auto read = client_->get_prefix(options_.prefix);
    if (!read.ok()) {
      note_etcd_error("cannot read " + options_.prefix, read.detail);
      return std::nullopt;
    }
    revision = read.value.revision;
    std::vector<ClusterMember> live;
    const KeyValue* map_kv = nullptr;
    std::uint64_t bad = 0;
    for (const KeyValue& kv : read.value.kvs) {
      if (kv.key == map_key) {
        map_kv = &kv;
        continue;
      }
      if (!kv.key.starts_with(members_prefix)) continue;  // handoff/ and later keys
      std::string id = kv.key.substr(members_prefix.size());
      const std::optional<MemberRecord> record = decode_member(kv.value);
      if (!valid_node_id(id) || !record) {
        ++bad;
        continue;
      }
      if (record->state == MemberState::kActive) {
        live.push_back({std::move(id), record->address, record->weight});
      }
    }
    std::sort(live.begin(), live.end(),
              [](const ClusterMember& a, const ClusterMember& b) { return a.id < b.id; });
    std::optional<std::vector<ClusterMember>> published;
    if (map_kv != nullptr) {
      published = decode_map_members(map_kv->value);
      if (published) {
        adopt(*published, static_cast<std::uint64_t>(map_kv->mod_revision));
      } else {
        ++bad;
      }
    }
    if (bad != 0) {
      LockGuard lock(mutex_);
      stats_.bad_values += bad;
    }
    // An empty membership gives no owners at all; keep the last map instead.
    if (live.empty() || (published && *published == live)) return revision;
    const auto swapped = client_->put_if_mod_revision(map_key, encode_map_members(live),
                                                      map_kv != nullptr ? map_kv->mod_revision : 0);
    if (!swapped.ok()) {
      note_etcd_error("cannot publish " + map_key, swapped.detail);
      return std::nullopt;
    }
    if (swapped.value.applied) {
      {
        LockGuard lock(mutex_);
        ++stats_.maps_published;
      }
      // The transaction's revision is the map key's new mod_revision.
      adopt(std::move(live), static_cast<std::uint64_t>(swapped.value.revision));
      return revision;
    }
  }
  return revision;
}

void Membership::adopt(std::vector<ClusterMember> members, std::uint64_t epoch) {
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
  auto map = std::make_shared<const ClusterMap>(ClusterMap{epoch, std::move(members)});
  {
    LockGuard lock(mutex_);
    map_ = map;
    ++stats_.maps_adopted;
    stats_.highest_epoch = epoch_file_->highest();
  }
  if (options_.on_map_change) options_.on_map_change(*map);
}

}  // namespace shardlock::cluster
