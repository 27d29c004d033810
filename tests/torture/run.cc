// See run.h.
#include "run.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "checker.h"
#include "history.h"
#include "recorder.h"
#include "resource.h"
#include "server_process.h"
#include "support/etcd.h"
#include "support/process.h"
#include "system.h"
#include "tenancy.h"

namespace shardlock::torture {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using test_support::ChildProcess;
using test_support::EtcdProcess;
using test_support::self_executable;

TenantPlan tenant_plan(const TortureOptions& o) { return TenantPlan{o.tenants, o.encrypt}; }
// Where the tenant file and the tenants' key files are.
fs::path tenant_dir(const fs::path& scratch) { return scratch / "tenants"; }

// One shardlockd behind one UdpProxy.
class SingleServer final : public SystemUnderTest {
 public:
  SingleServer(const TortureOptions& o, const fs::path& scratch, const Recorder& nemesis)
      : options_(o),
        tenant_dir_(tenant_dir(scratch)),
        server_(config(o, scratch), (scratch / "shardlockd.log").string(), nemesis) {}

  bool start(std::string& error) override {
    if (!server_.start(error)) return false;
    if (!proxy_.start(server_.port(), options_.seed)) {
      error = "proxy: " + proxy_.error();
      return false;
    }
    return true;
  }
  std::vector<std::string> worker_arguments() const override {
    return {"--server", "127.0.0.1:" + std::to_string(proxy_.port())};
  }
  void set_network_faults(const ProxyFaults& faults) override { proxy_.set_faults(faults); }
  ProxyCounters counters() const override { return proxy_.counters(); }
  // The faults fit in the plan's trailing slot (the schedule predates this).
  std::int64_t longest_fault_ms() const override { return 0; }
  std::int64_t liveness_bound_ms() const override { return default_liveness_bound_ms(options_); }
  bool inject(Fault fault, std::mt19937_64& random, std::string& error) override {
    switch (fault) {
      case Fault::kKill:
        server_.kill();
        return server_.start(error);
      case Fault::kServerPause:
        server_.pause(pause_for());
        return true;
      case Fault::kTenantReload: {
        // A lost lease or a reload that did not take is the system's
        // failure, not the nemesis's: the run goes on and fails at the end.
        const std::string failure =
            reload_keeping_a_lease(server_, tenant_plan(options_), tenant_dir_, random,
                                   options_.max_ttl_ms, options_.max_wait_ms);
        if (!failure.empty()) reload_failures_ += failure + "\n";
        return true;
      }
      default:
        error = std::string(fault_name(fault)) + " needs cluster mode";
        return false;
    }
  }
  void stop() override {
    proxy_.stop();
    server_.stop();
  }
  std::string crashes() override {
    server_.note_if_dead();
    return server_.crashes() + reload_failures_;
  }

 private:
  static ServerConfig config(const TortureOptions& o, const fs::path& scratch) {
    ServerConfig c;
    c.shardlockd = o.shardlockd;
    // The lock-delay a safe server must keep (the history records this one);
    // the daemon's own is 0 in the unsafe mode.
    c.lock_delay_ms = o.max_ttl_ms;
    c.arguments = {
        "--max-ttl",    std::to_string(o.max_ttl_ms) + "ms",
        "--max-wait",   std::to_string(o.max_wait_ms) + "ms",
        "--lock-delay", std::to_string(o.unsafe_no_lock_delay ? 0 : c.lock_delay_ms) + "ms",
        "--shards",     "8"};
    if (!o.unsafe_no_data_dir) {
      c.arguments.push_back("--data-dir");
      c.arguments.push_back((scratch / "data").string());
    }
    if (o.tenants > 0) {
      c.arguments.insert(c.arguments.end(),
                         {"--tenants", tenant_file(tenant_dir(scratch)).string()});
    }
    return c;
  }
  std::chrono::milliseconds pause_for() const {
    return std::chrono::milliseconds(options_.max_ttl_ms * 3 / 2);
  }

  const TortureOptions& options_;
  const fs::path tenant_dir_;
  ServerUnderTest server_;
  UdpProxy proxy_;
  std::string reload_failures_;  // one line per failed tenant reload
};

}  // namespace

const char* fault_name(Fault f) noexcept {
  switch (f) {
    case Fault::kKill:
      return "kill -9";
    case Fault::kServerPause:
      return "server pause";
    case Fault::kClientPause:
      return "client pause";
    case Fault::kJoin:
      return "node join";
    case Fault::kDrain:
      return "node drain";
    case Fault::kEtcdPartition:
      return "etcd partition";
    case Fault::kClientPartition:
      return "client partition";
    case Fault::kShortPause:
      return "short node pause";
    case Fault::kShortEtcdPartition:
      return "short etcd partition";
    case Fault::kStalledDoubleDrain:
      return "stalled double drain";
    case Fault::kDoubleDrain:
      return "double drain";
    case Fault::kJoinDuringDrain:
      return "join during drain";
    case Fault::kKillDuringHandoff:
      return "kill during hand-off";
    case Fault::kRollingRestart:
      return "rolling restart";
    case Fault::kSlowWatch:
      return "slowed map watch";
    case Fault::kNodePartition:
      return "node partition";
    case Fault::kKillMidReplication:
      return "kill mid replication";
    case Fault::kOneWayNodeCut:
      return "one-way node cut";
    case Fault::kSlowEtcdLink:
      return "one-way node cut with a slow etcd link";
    case Fault::kReplaceNode:
      return "node replaced under a new id";
    case Fault::kTenantReload:
      return "tenant reload";
  }
  return "?";
}

std::int64_t default_liveness_bound_ms(const TortureOptions& o) {
  if (o.cluster_nodes > 0) return 6LL * o.max_ttl_ms + 3000LL * o.etcd_lease_ttl_s + 4000;
  return o.max_ttl_ms + 4LL * o.max_ttl_ms + 2000;
}

CheckOptions check_options(const TortureOptions& o, std::int64_t liveness_bound_ms) {
  CheckOptions c;
  c.liveness_bound_ms = liveness_bound_ms;
  c.replicas = o.cluster_nodes > 0 ? o.replicas : 1;
  c.replica_timeout_ms = o.replica_timeout_ms;
  // A node's lock-delay (max TTL + etcd TTL + 0.5 s: a backup does not take
  // over from a primary younger than that, counted from its registration)
  // and a second for a restarted or evicted node to register again.
  c.settle_ms = o.max_ttl_ms + 1000LL * o.etcd_lease_ttl_s + 1500;
  c.clients_per_worker = o.clients_per_worker;
  c.kept_excuses_rejoins = !o.strict_kept;
  return c;
}

int run_torture(const TortureOptions& o, ClusterFactory make_cluster) {
  const auto fail = [](const std::string& why) {
    std::fprintf(stderr, "shardlock-torture: %s\n", why.c_str());
    return 3;
  };
  // The run's scratch directory: data dir, logs, and the history unless kept.
  std::string scratch_template = (fs::temp_directory_path() / "shardlock-torture-XXXXXX").string();
  if (::mkdtemp(scratch_template.data()) == nullptr) {
    return fail(std::string("mkdtemp: ") + std::strerror(errno));
  }
  const fs::path scratch = scratch_template;
  struct RemoveOnExit {
    fs::path path;
    ~RemoveOnExit() {
      std::error_code ec;
      fs::remove_all(path, ec);
    }
  } cleanup{scratch};
  const fs::path history_dir =
      o.history_dir.empty() ? scratch / "history" : fs::path(o.history_dir);
  std::error_code ec;
  fs::create_directories(history_dir, ec);
  fs::create_directories(scratch / "data", ec);
  if (ec) return fail("cannot create " + history_dir.string() + ": " + ec.message());
  for (const auto& entry : fs::directory_iterator(history_dir, ec)) {
    if (entry.path().extension() == ".log") fs::remove(entry.path(), ec);
  }

  Recorder nemesis;
  if (!nemesis.open((history_dir / "nemesis.log").string())) {
    return fail("cannot create the nemesis history: " + std::string(std::strerror(errno)));
  }
  FencedResource resource;
  const std::string resource_name = "shardlock-torture-" + std::to_string(::getpid());
  if (!resource.start(resource_name, (history_dir / "resource.log").string())) {
    return fail(resource.error());
  }
  if (o.tenants > 0) {
    std::string why;
    if (!write_tenant_files(tenant_plan(o), tenant_dir(scratch), why)) return fail(why);
  }
  std::unique_ptr<SystemUnderTest> system;
  if (o.cluster_nodes > 0) {
    if (make_cluster == nullptr) {
      return fail("this build has no cluster mode (the cluster layer needs grpc++)");
    }
    if (!EtcdProcess::available()) {
      std::fprintf(stderr, "shardlock-torture: cluster mode skipped: %s\n",
                   EtcdProcess::kMissingMessage);
      return kExitSkipped;
    }
    system = make_cluster(o, scratch, nemesis);
  } else {
    system = std::make_unique<SingleServer>(o, scratch, nemesis);
  }
  std::string error;
  if (!system->start(error)) {
    cleanup.path.clear();  // keep the logs the error points to
    return fail(error + " (logs in " + scratch.string() + ")");
  }

  const std::chrono::milliseconds pause_for(o.max_ttl_ms * 3 / 2);
  const std::int64_t liveness_bound_ms =
      o.liveness_bound_ms > 0 ? o.liveness_bound_ms : system->liveness_bound_ms();
  const std::int64_t start_ns = monotonic_ns();
  const std::int64_t faults_end_ns = start_ns + o.fault_seconds * 1'000'000'000LL;
  // After the heal: long enough to judge liveness, plus a margin, plus the
  // longest fault, by which the last one may overrun the fault phase and
  // so delay the heal.
  const std::int64_t end_ns =
      faults_end_ns + (liveness_bound_ms + 1000 + system->longest_fault_ms()) * 1'000'000;

  // Workers: this binary again, in worker mode.
  const std::string self = self_executable();
  std::vector<ChildProcess> workers(static_cast<std::size_t>(o.workers));
  for (int w = 0; w < o.workers; ++w) {
    std::vector<std::string> argv = {self,
                                     "worker",
                                     "--index",
                                     std::to_string(w),
                                     "--clients",
                                     std::to_string(o.clients_per_worker),
                                     "--threads-per-client",
                                     std::to_string(o.threads_per_client),
                                     "--slow-retransmit-groups",
                                     std::to_string(o.slow_retransmit_groups),
                                     "--resource",
                                     resource_name,
                                     "--history",
                                     history_dir.string(),
                                     "--seed",
                                     std::to_string(o.seed + static_cast<std::uint64_t>(w)),
                                     "--end-ns",
                                     std::to_string(end_ns),
                                     "--keys",
                                     std::to_string(o.keys),
                                     "--ttl-ms",
                                     std::to_string(o.max_ttl_ms),
                                     "--max-wait-ms",
                                     std::to_string(o.max_wait_ms),
                                     "--stall-per-million",
                                     std::to_string(o.stall_per_million),
                                     "--read-fraction",
                                     std::to_string(o.read_fraction),
                                     "--permit-fraction",
                                     std::to_string(o.permit_fraction),
                                     "--multi-fraction",
                                     std::to_string(o.multi_fraction),
                                     "--permits",
                                     std::to_string(o.permits),
                                     "--permit-keys",
                                     std::to_string(o.permit_keys),
                                     "--elections",
                                     std::to_string(o.elections),
                                     "--campaigners",
                                     std::to_string(o.campaigners),
                                     "--observers",
                                     std::to_string(o.observers),
                                     "--workers",
                                     std::to_string(o.workers),
                                     "--election-base",
                                     std::to_string(o.workers * o.clients_per_worker)};
    const std::vector<std::string> target = system->worker_arguments();
    argv.insert(argv.end(), target.begin(), target.end());
    if (o.tenants > 0) {
      argv.insert(argv.end(), {"--tenants", std::to_string(o.tenants), "--tenant-dir",
                               tenant_dir(scratch).string()});
      if (o.encrypt) argv.emplace_back("--encrypt");
    }
    if (!workers[static_cast<std::size_t>(w)].start(
            argv, false, (scratch / ("worker-" + std::to_string(w) + ".err")).string())) {
      return fail("cannot start a worker: " + workers[static_cast<std::size_t>(w)].error());
    }
  }

  // The nemesis: network faults for the whole fault phase, and the discrete
  // faults at seeded times spread over it.
  std::mt19937_64 random(o.seed);
  std::vector<Fault> plan;
  plan.insert(plan.end(), static_cast<std::size_t>(o.kills), Fault::kKill);
  plan.insert(plan.end(), static_cast<std::size_t>(o.server_pauses), Fault::kServerPause);
  plan.insert(plan.end(), static_cast<std::size_t>(o.client_pauses), Fault::kClientPause);
  plan.insert(plan.end(), static_cast<std::size_t>(o.joins), Fault::kJoin);
  plan.insert(plan.end(), static_cast<std::size_t>(o.drains), Fault::kDrain);
  plan.insert(plan.end(), static_cast<std::size_t>(o.etcd_partitions), Fault::kEtcdPartition);
  plan.insert(plan.end(), static_cast<std::size_t>(o.client_partitions), Fault::kClientPartition);
  plan.insert(plan.end(), static_cast<std::size_t>(o.short_pauses), Fault::kShortPause);
  plan.insert(plan.end(), static_cast<std::size_t>(o.short_etcd_partitions),
              Fault::kShortEtcdPartition);
  plan.insert(plan.end(), static_cast<std::size_t>(o.stalled_double_drains),
              Fault::kStalledDoubleDrain);
  plan.insert(plan.end(), static_cast<std::size_t>(o.double_drains), Fault::kDoubleDrain);
  plan.insert(plan.end(), static_cast<std::size_t>(o.joins_during_drains), Fault::kJoinDuringDrain);
  plan.insert(plan.end(), static_cast<std::size_t>(o.kills_during_handoffs),
              Fault::kKillDuringHandoff);
  plan.insert(plan.end(), static_cast<std::size_t>(o.rolling_restarts), Fault::kRollingRestart);
  plan.insert(plan.end(), static_cast<std::size_t>(o.slow_watches), Fault::kSlowWatch);
  plan.insert(plan.end(), static_cast<std::size_t>(o.node_partitions), Fault::kNodePartition);
  plan.insert(plan.end(), static_cast<std::size_t>(o.kills_mid_replication),
              Fault::kKillMidReplication);
  plan.insert(plan.end(), static_cast<std::size_t>(o.one_way_node_cuts), Fault::kOneWayNodeCut);
  plan.insert(plan.end(), static_cast<std::size_t>(o.slow_etcd_links), Fault::kSlowEtcdLink);
  plan.insert(plan.end(), static_cast<std::size_t>(o.node_replacements), Fault::kReplaceNode);
  plan.insert(plan.end(), static_cast<std::size_t>(o.tenant_reloads), Fault::kTenantReload);
  std::shuffle(plan.begin(), plan.end(), random);
  if (o.network.any()) {
    system->set_network_faults(o.network);
    Event e;
    e.kind = EventKind::kNetFaultsOn;
    nemesis.record(e);
  }
  const auto progress = [&](const char* doing) {
    if (!o.progress) return;
    const ProxyCounters c = system->counters();
    std::fprintf(
        stderr,
        "\r[%5.1fs] %-28s datagrams %llu forwarded, %llu dropped, %llu duplicated, "
        "%llu reordered, %llu delayed   ",
        static_cast<double>(monotonic_ns() - start_ns) / 1e9, doing,
        static_cast<unsigned long long>(c.forwarded), static_cast<unsigned long long>(c.dropped),
        static_cast<unsigned long long>(c.duplicated), static_cast<unsigned long long>(c.reordered),
        static_cast<unsigned long long>(c.delayed));
  };
  const auto sleep_until = [&](std::int64_t when_ns, const char* doing) {
    while (monotonic_ns() < when_ns) {
      progress(doing);
      std::this_thread::sleep_for(std::chrono::nanoseconds(
          std::min<std::int64_t>(when_ns - monotonic_ns(), 1'000'000'000)));
    }
  };
  // Every fault starts early enough to heal before the faults end.
  const std::int64_t plan_end_ns = std::max(start_ns + (faults_end_ns - start_ns) / 2,
                                            faults_end_ns - system->longest_fault_ms() * 1'000'000);
  const std::int64_t slot_ns =
      (plan_end_ns - start_ns) / static_cast<std::int64_t>(plan.size() + 1);
  std::size_t skipped = 0;
  for (std::size_t i = 0; i < plan.size(); ++i) {
    // Faults run one after another, and together may take longer than the
    // fault phase. One that would start after it is left out: the heal then
    // comes at most one fault's length late, which the run's end allows
    // for, so liveness is still judged over its whole bound.
    if (monotonic_ns() >= faults_end_ns) {
      skipped = plan.size() - i;
      break;
    }
    // Each fault somewhere in the middle half of its slot.
    const std::int64_t slot_start = start_ns + static_cast<std::int64_t>(i) * slot_ns;
    const std::int64_t at =
        slot_start + slot_ns / 4 +
        static_cast<std::int64_t>(
            random() % static_cast<std::uint64_t>(std::max<std::int64_t>(slot_ns / 2, 1)));
    sleep_until(at, "faults");
    progress(fault_name(plan[i]));
    switch (plan[i]) {
      case Fault::kClientPause: {
        ChildProcess& victim = workers[random() % workers.size()];
        Event e;
        e.kind = EventKind::kClientPause;
        e.client = static_cast<std::int64_t>(&victim - workers.data());
        victim.signal(SIGSTOP);
        nemesis.record(e);
        std::this_thread::sleep_for(pause_for);
        victim.signal(SIGCONT);
        e.kind = EventKind::kClientResume;
        e.t_ns = 0;
        nemesis.record(e);
        break;
      }
      default:
        if (!system->inject(plan[i], random, error)) {
          cleanup.path.clear();  // keep the logs the error points to
          return fail(std::string(fault_name(plan[i])) + ": " + error + " (logs in " +
                      scratch.string() + ")");
        }
        break;
    }
  }
  sleep_until(faults_end_ns, "faults");
  if (o.network.any()) {
    system->set_network_faults(ProxyFaults{});
    Event e;
    e.kind = EventKind::kNetFaultsOff;
    nemesis.record(e);
  }
  if (skipped > 0) {
    std::fprintf(stderr,
                 "\nshardlock-torture: %zu of %zu faults left out: the ones before them took "
                 "the whole fault phase (raise --seconds; the report counts the faults run)\n",
                 skipped, plan.size());
  }
  Event healed;
  healed.kind = EventKind::kHealed;
  nemesis.record(healed);
  sleep_until(end_ns, "healed, judging liveness");

  // Workers stop at end_ns by themselves; give stragglers a request timeout
  // plus a wait to finish their last call.
  for (ChildProcess& w : workers) {
    if (!w.wait_for(std::chrono::milliseconds(o.max_wait_ms + 5000))) w.kill();
  }
  bool worker_failed = false;
  std::string crashes;
  for (std::size_t i = 0; i < workers.size(); ++i) {
    const int status = workers[i].exit_status();
    if (WIFEXITED(status) && WEXITSTATUS(status) == 3) worker_failed = true;
    if (!WIFEXITED(status) || (WEXITSTATUS(status) != 0 && WEXITSTATUS(status) != 3)) {
      crashes += "worker " + std::to_string(i) + " ended with wait status " +
                 std::to_string(status) + "; see " + scratch.string() + "/worker-" +
                 std::to_string(i) + ".err\n";
    }
  }
  crashes += system->crashes();
  system->stop();
  resource.stop();
  if (o.progress) std::fprintf(stderr, "\n");
  if (worker_failed) {
    return fail("a worker could not set up; see " + scratch.string() + "/worker-*.err");
  }

  std::vector<Event> history;
  if (!read_history(history_dir.string(), history, error)) return fail(error);
  const CheckReport report = check(history, check_options(o, liveness_bound_ms));
  const double seconds = static_cast<double>(monotonic_ns() - start_ns) / 1e9;
  const ProxyCounters c = system->counters();
  if (o.json) {
    std::printf(
        "{\"seed\":%llu,\"seconds\":%.1f,\"events\":%zu,\"datagrams\":{\"forwarded\":%llu,"
        "\"dropped\":%llu,\"duplicated\":%llu,\"reordered\":%llu,\"delayed\":%llu},"
        "\"report\":%s}\n",
        static_cast<unsigned long long>(o.seed), seconds, history.size(),
        static_cast<unsigned long long>(c.forwarded), static_cast<unsigned long long>(c.dropped),
        static_cast<unsigned long long>(c.duplicated), static_cast<unsigned long long>(c.reordered),
        static_cast<unsigned long long>(c.delayed), report.json().c_str());
  } else {
    std::printf("shardlock-torture: seed %llu, %.1f s, %zu events, %llu lease operations\n",
                static_cast<unsigned long long>(o.seed), seconds, history.size(),
                static_cast<unsigned long long>(report.lease_operations));
    std::printf(
        "datagrams: %llu forwarded, %llu dropped, %llu duplicated, %llu reordered, "
        "%llu delayed\n",
        static_cast<unsigned long long>(c.forwarded), static_cast<unsigned long long>(c.dropped),
        static_cast<unsigned long long>(c.duplicated), static_cast<unsigned long long>(c.reordered),
        static_cast<unsigned long long>(c.delayed));
    std::printf("%s", report.text().c_str());
    if (!o.history_dir.empty()) std::printf("history kept in %s\n", o.history_dir.c_str());
  }
  if (!crashes.empty()) {
    std::fprintf(stderr, "shardlock-torture: the system under test failed by itself:\n%s",
                 crashes.c_str());
    cleanup.path.clear();  // keep the logs it points to
    return 1;
  }
  // A run that judged nothing is no evidence of safety: it fails, saying why,
  // rather than printing a clean report.
  if (!report.judged_something()) {
    std::fprintf(stderr, "shardlock-torture: %s, so the run checked nothing; see %s\n",
                 report.grants() == 0 ? "no client was ever granted a lease or elected"
                                      : "the history has no healed event (liveness was not judged)",
                 (scratch / "worker-*.err").c_str());
    cleanup.path.clear();  // keep the logs it points to
    return 1;
  }
  if (o.cluster_nodes > 0 && report.maps == 0) {
    std::fprintf(stderr,
                 "shardlock-torture: no cluster map was recorded, so the owner property judged "
                 "nothing; see %s\n",
                 scratch.c_str());
    cleanup.path.clear();
    return 1;
  }
  if (!report.ok()) {
    // The servers' logs help explain a violation.
    std::fprintf(stderr, "shardlock-torture: violations; the servers' logs are kept in %s\n",
                 scratch.c_str());
    cleanup.path.clear();
    return 1;
  }
  return 0;
}

int check_history(const std::string& dir, const TortureOptions& o, std::int64_t liveness_bound_ms) {
  std::vector<Event> history;
  std::string error;
  if (!read_history(dir, history, error)) {
    std::fprintf(stderr, "shardlock-torture: %s\n", error.c_str());
    return 3;
  }
  const CheckReport report = check(history, check_options(o, liveness_bound_ms));
  std::printf("%s", o.json ? (report.json() + "\n").c_str() : report.text().c_str());
  return report.ok() ? 0 : 1;
}

}  // namespace shardlock::torture
