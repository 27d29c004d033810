// One cluster node's driver. See cluster_node.h.
#include "cluster_node.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "epoch_file.h"
#include "shardlock/lease/server/internal/cluster_control.h"
#include "shardlock/lease/wire/epoch_token.h"
#include "shardlock/lock_guard.h"

namespace shardlock::cluster {

using std::chrono::milliseconds;
using std::chrono::nanoseconds;

namespace {

HostResult result_of(const EtcdStatus& status) {
  if (status.ok()) return {};
  return {status.error == EtcdErrc::kNotFound ? HostResult::Status::kRefused
                                              : HostResult::Status::kFailed,
          status.detail};
}

}  // namespace

// The driver's actions, on this node's LeaseServer and Membership.
class ClusterNode::Host final : public NodeHost {
 public:
  Host(lease::LeaseServer& server, Membership& membership,
       std::function<void(std::string_view)> log)
      : server_(server), control_(server), membership_(membership), log_(std::move(log)) {}

  void publish_gate(std::shared_ptr<const lease::internal::ClusterGate> gate) override {
    control_.publish_cluster_gate(std::move(gate));
  }
  std::error_code set_replica_layout(std::uint64_t epoch, const RouterSnapshot& routing,
                                     const std::vector<bool>& learners, std::uint16_t self,
                                     std::size_t replicas,
                                     const std::vector<std::string>& addresses,
                                     std::string& detail) override {
    const std::error_code ec =
        control_.set_replica_layout(epoch, routing, learners, self, replicas, addresses);
    if (ec) detail = server_.error_detail();
    return ec;
  }
  bool replica_primary_settled(const std::string& primary, std::uint32_t bucket) const override {
    return control_.replica_primary_settled(primary, bucket);
  }
  std::optional<std::size_t> take_over(const std::string& primary, std::uint32_t bucket,
                                       milliseconds hold, bool* owner_active) override {
    return control_.take_over(primary, bucket, hold, owner_active);
  }
  lease::ReplicaProgress replica_progress() const override { return control_.replica_progress(); }
  nanoseconds replica_lease_until(std::size_t bucket) const noexcept override {
    return control_.replica_lease_until(bucket);
  }
  std::vector<std::string> silent_replicas(milliseconds silence) const override {
    return control_.silent_replicas(silence);
  }
  std::size_t count_leases(const std::function<bool(std::string_view)>& pred) const override {
    return control_.count_leases(pred);
  }
  bool needs_new_epoch() const override { return control_.needs_new_epoch(); }
  nanoseconds lease_deadline_of(std::uint64_t registration) const noexcept override {
    return membership_.lease_deadline_of(registration);
  }
  bool learning() const override { return membership_.learning(); }
  HostResult caught_up() override { return result_of(membership_.caught_up()); }
  HostResult put_handoff(std::uint64_t epoch) override {
    return result_of(membership_.put_handoff(epoch));
  }
  HostResult evict(std::string_view id, std::int64_t lease) override {
    return result_of(membership_.evict(id, lease));
  }
  void request_new_epoch() override { membership_.request_new_epoch(); }
  void log(std::string_view line) override { log_(line); }

 private:
  lease::LeaseServer& server_;
  lease::internal::ClusterControl control_;  // server_'s cluster hooks
  Membership& membership_;
  std::function<void(std::string_view)> log_;
};

ClusterNode::ClusterNode(ClusterNodeOptions options, lease::LeaseServer& server)
    : options_(std::move(options)), server_(server) {
  if (!options_.log) {
    options_.log = [](std::string_view line) {
      std::fprintf(stderr, "shardlock-cluster: %.*s\n", static_cast<int>(line.size()), line.data());
    };
  }
  lock_delay_ = options_.max_ttl + options_.lease_ttl + options_.drift_margin;
}

ClusterNode::~ClusterNode() { stop(StopMode::kRevokeLease); }

std::error_code ClusterNode::start(ClusterNodeOptions options, lease::LeaseServer& server,
                                   std::unique_ptr<ClusterNode>& out, std::string& detail) {
  if (options.data_dir.empty()) {
    detail = "cluster mode needs a data dir (tokens and epochs must survive a restart)";
    return make_error_code(MembershipErrc::kInvalidOptions);
  }
  if (!valid_node_id(options.node_id)) {
    detail = "bad node id '" + options.node_id + "': 1..128 of [A-Za-z0-9._-]";
    return make_error_code(MembershipErrc::kInvalidOptions);
  }
  if (!valid_node_id(options.cluster_name)) {
    detail = "bad cluster name '" + options.cluster_name + "': 1..128 of [A-Za-z0-9._-]";
    return make_error_code(MembershipErrc::kInvalidOptions);
  }
  // The highest epoch an earlier run of this node saw, before this run adopts
  // any map: that run may have granted in every epoch up to it.
  std::uint64_t previous_highest = 0;
  {
    std::unique_ptr<EpochFile> file;
    if (const std::error_code ec = EpochFile::open(options.data_dir, file, detail)) {
      return ec;
    }
    previous_highest = file->highest();
  }
  std::unique_ptr<ClusterNode> node(new ClusterNode(std::move(options), server));
  const ClusterNodeOptions& o = node->options_;
  // And above the epoch of every token the data dir says an earlier run may
  // have issued, in either mode (a plain node's tokens, or a cluster whose
  // epochs started over): the first publish jumps there at once rather than
  // one epoch per refused grant.
  const std::uint64_t min_grant_epoch =
      std::max(previous_highest,
               token_epoch(lease::internal::ClusterControl(server).token_floor())) +
      1;
  // The server's own lock-delay covers the leases of its previous run, which
  // a hand-off acknowledgement must not speak for before they are over.
  // At least a max TTL, whatever --lock-delay says (it may be 0).
  const nanoseconds server_recovered_at =
      server.now() + std::max<nanoseconds>(server.lock_delay(), node->options_.max_ttl);

  MembershipOptions m;
  m.endpoints = o.endpoints;
  m.tls = o.etcd_tls;
  m.credentials = o.etcd_credentials;
  m.prefix = cluster_prefix(o.cluster_name);
  m.node_id = o.node_id;
  m.advertise = o.advertise;
  m.weight = o.weight;
  m.max_ttl = o.max_ttl;
  m.replicas = static_cast<std::uint32_t>(o.replicas);
  m.join_as_learner = o.replicas > 1;
  m.min_epoch = min_grant_epoch;
  m.data_dir = o.data_dir;
  m.lease_ttl = o.lease_ttl;
  m.drift_margin = o.drift_margin;
  m.clock = [&server] { return server.now(); };
  m.log = o.log;
  ClusterNode* self = node.get();
  m.on_view = [self](const ClusterView& view) {
    LockGuard lock(self->mutex_);
    self->views_.push_back(view);
    self->wake_.notify_all();
  };
  if (const std::error_code ec = Membership::start(std::move(m), node->membership_, detail)) {
    return ec;
  }
  node->host_ = std::make_unique<Host>(server, *node->membership_, o.log);
  node->driver_ =
      std::make_unique<NodeDriver>(NodeDriverOptions{.node_id = o.node_id,
                                                     .lease_ttl = o.lease_ttl,
                                                     .drift_margin = o.drift_margin,
                                                     .max_ttl = o.max_ttl,
                                                     .retry_after = o.retry_after,
                                                     .replicas = o.replicas,
                                                     .evict_after = o.evict_after,
                                                     .min_grant_epoch = min_grant_epoch,
                                                     .server_recovered_at = server_recovered_at},
                                   *node->host_);
  node->driver_thread_ = std::thread([self] { self->run(); });
  out = std::move(node);
  return {};
}

void ClusterNode::stop(StopMode mode) {
  {
    LockGuard lock(mutex_);
    if (stopping_ && !driver_thread_.joinable()) return;
    stopping_ = true;
    wake_.notify_all();
  }
  if (driver_thread_.joinable()) driver_thread_.join();
  // Nothing more is granted here: a closed gate, which also drops every
  // reference to the membership before it goes.
  if (driver_) {
    driver_->close();
  } else {
    lease::internal::ClusterControl(server_).publish_cluster_gate(
        lease::internal::ClusterGate::closed());
  }
  if (membership_) membership_->stop(mode);
}

std::shared_ptr<const lease::internal::ClusterGate> ClusterNode::published_gate() const {
  return driver_ ? driver_->published_gate() : nullptr;
}

ClusterNodeStats ClusterNode::stats() const {
  ClusterNodeStats s;
  if (driver_) static_cast<NodeDriverStats&>(s) = driver_->stats();
  if (membership_) {
    s.membership = membership_->stats();
    s.lease_alive = membership_->lease_alive(server_.now());
  }
  return s;
}

void ClusterNode::run() {
  for (;;) {
    std::vector<ClusterView> views;
    {
      LockGuard lock(mutex_);
      wake_.wait_for(mutex_, options_.tick,
                     [&]() SHARDLOCK_REQUIRES(mutex_) { return stopping_ || !views_.empty(); });
      if (stopping_) return;
      views.swap(views_);
    }
    driver_->step(views, server_.now(), membership_->registration());
  }
}

}  // namespace shardlock::cluster
