// See worker.h.
#include "worker.h"

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "recorder.h"
#include "resource.h"
#include "shardlock/lease/client.h"
#include "shardlock/workload/zipf.h"

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
using lease::LeaseOptions;

// The client-side expiry of `lease` on the history's clock. Lease::expiry()
// runs on CLOCK_BOOTTIME, which differs from CLOCK_MONOTONIC by a constant
// while nothing suspends; read both now and carry the distance over.
std::int64_t expiry_on_monotonic(const Lease& lease) {
  const auto left = lease.expiry() - LeaseClock::now();
  return monotonic_ns() + std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
}

std::string error_name(const std::error_code& ec) {
  std::string name = ec.category() == lease::lease_category()
                         ? std::string(lease::to_string(static_cast<LeaseErrc>(ec.value())))
                         : ec.message();
  for (char& c : name) {
    if (c == ' ') c = '_';
  }
  return name.empty() ? "-" : name;
}

// One lease client's loop.
int run_client(const WorkerOptions& o, int client) {
  Recorder history;
  if (!history.open(o.history_dir + "/client-" + std::to_string(client) + ".log")) {
    std::fprintf(stderr, "worker: cannot create history: %s\n", std::strerror(errno));
    return 3;
  }
  ResourceConnection resource;
  if (!resource.connect(o.resource)) {
    std::fprintf(stderr, "worker: cannot reach the resource\n");
    return 3;
  }
  LeaseClientOptions options;
  options.nodes = {o.server};
  options.request_timeout = std::chrono::milliseconds(o.request_timeout_ms);
  options.initial_retransmit = std::chrono::milliseconds(o.initial_retransmit_ms);
  options.max_retransmit = std::chrono::milliseconds(std::max(o.initial_retransmit_ms, 100));
  LeaseClient lease_client(options);
  if (const std::error_code ec = lease_client.start()) {
    std::fprintf(stderr, "worker: %s\n", lease_client.error_detail().c_str());
    return 3;
  }
  workload::SplitMix64 random(o.seed * 1000003 + static_cast<std::uint64_t>(client));
  std::int64_t op = 0;
  const auto base = [&](EventKind kind, const std::string& key_name) {
    Event e;
    e.kind = kind;
    e.client = client;
    e.key = key_name;
    return e;
  };
  while (monotonic_ns() < o.end_ns) {
    const std::string key_name = "key-" + std::to_string(random.uniform(o.keys));
    // A quarter try-acquire, the rest wait in the key's FIFO queue.
    const bool try_only = random.uniform(4) == 0;
    const int wait_ms = try_only ? 0 : static_cast<int>(1 + random.uniform(o.max_wait_ms));
    const int ttl_ms = o.ttl_ms / 2 + static_cast<int>(random.uniform(o.ttl_ms / 2 + 1));
    Event invoke = base(EventKind::kAcquireInvoke, key_name);
    invoke.op = ++op;
    invoke.ttl_ms = ttl_ms;
    invoke.wait_ms = wait_ms;
    history.record(invoke);
    LeaseOptions watch;
    watch.watchdog = true;
    watch.on_lost = [&history, client](const LeaseLost& lost) {
      Event e;
      e.kind = EventKind::kLost;
      e.client = client;
      e.key = lost.key;
      e.token = lost.token;
      e.error = error_name(lost.reason);
      history.record(e);
    };
    AcquireResult got = lease_client.acquire(key_name, std::chrono::milliseconds(ttl_ms),
                                             std::chrono::milliseconds(wait_ms), watch);
    if (!got) {
      Event fail = base(EventKind::kAcquireFail, key_name);
      fail.op = invoke.op;
      fail.error = error_name(got.error);
      history.record(fail);
      if (got.error == LeaseErrc::kBusy) std::this_thread::sleep_for(1ms);
      if (got.error == LeaseErrc::kRecovering) {
        std::this_thread::sleep_for(
            std::chrono::milliseconds(std::min<std::uint32_t>(got.retry_after_ms, 100) + 1));
      }
      continue;
    }
    Lease& lease = got.lease;
    const std::uint64_t token = lease.token();
    Event ok = base(EventKind::kAcquireOk, key_name);
    ok.op = invoke.op;
    ok.token = token;
    ok.expiry_ns = expiry_on_monotonic(lease);
    history.record(ok);

    if (random.uniform(4) == 0) {
      Event renew = base(EventKind::kRenewInvoke, key_name);
      renew.op = ++op;
      renew.token = token;
      renew.ttl_ms = ttl_ms;
      history.record(renew);
      const std::error_code ec = lease.renew(std::chrono::milliseconds(ttl_ms));
      Event done = base(ec ? EventKind::kRenewFail : EventKind::kRenewOk, key_name);
      done.op = renew.op;
      done.token = token;
      if (ec) {
        done.error = error_name(ec);
      } else {
        done.expiry_ns = expiry_on_monotonic(lease);
      }
      history.record(done);
    }

    // Read-modify-write, relying on the lease only while it is valid.
    if (lease.valid()) {
      Event hold = base(EventKind::kHold, key_name);
      hold.token = token;
      hold.expiry_ns = expiry_on_monotonic(lease);
      history.record(hold);
      const std::string read = resource.call("R " + key_name + " " + std::to_string(token) + " " +
                                             std::to_string(client));
      if (read.rfind("OK ", 0) == 0) {
        const std::int64_t value = std::stoll(read.substr(3));
        Event r = base(EventKind::kRead, key_name);
        r.value = value;
        history.record(r);
        if (lease.valid()) {
          hold.t_ns = 0;
          hold.expiry_ns = expiry_on_monotonic(lease);
          history.record(hold);
          if (static_cast<int>(random.uniform(1'000'000)) < o.stall_per_million) {
            std::this_thread::sleep_for(std::chrono::milliseconds(o.ttl_ms * 3 / 2));
          }
          Event w = base(EventKind::kWriteInvoke, key_name);
          w.token = token;
          w.value = value + 1;
          history.record(w);
          (void)resource.call("W " + key_name + " " + std::to_string(token) + " " +
                              std::to_string(value + 1) + " " + std::to_string(client));
        }
      }
    }

    Event release = base(EventKind::kReleaseInvoke, key_name);
    release.op = ++op;
    release.token = token;
    history.record(release);
    const std::error_code ec = lease.release();
    Event done = base(ec ? EventKind::kReleaseFail : EventKind::kReleaseOk, key_name);
    done.op = release.op;
    done.token = token;
    if (ec) done.error = error_name(ec);
    history.record(done);
  }
  return 0;
}

}  // namespace

int run_worker(const WorkerOptions& o) {
  std::vector<int> status(static_cast<std::size_t>(o.clients), 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < o.clients; ++t) {
    threads.emplace_back(
        [&, t] { status[static_cast<std::size_t>(t)] = run_client(o, o.index * o.clients + t); });
  }
  for (std::thread& t : threads) t.join();
  for (const int s : status) {
    if (s != 0) return s;
  }
  return 0;
}

}  // namespace shardlock::torture
