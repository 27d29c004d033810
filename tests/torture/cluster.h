// cluster.h: the system under test of shardlock-torture's cluster mode
// (run.h, docs/cluster.md "Torture: cluster mode").
//
//   * A real single-member etcd (tests/support/etcd.h) on loopback.
//   * N shardlockd nodes (ids n1..nN), each with its own data dir and UDP
//     port, all in one cluster (--cluster-name torture-<pid>), with short
//     timings: --etcd-lease-ttl 2 s and the run's max TTL.
//   * In front of each node a UdpProxy, whose address the node advertises
//     (--advertise), so the map sends every client through it and its
//     loss, duplication, reordering and delay.
//   * Between each node and etcd a TcpProxy (tcp_proxy.h), which a
//     partition cuts.
//   * A watch on the map key: every published map is recorded (a map event)
//     with its epoch and each workload key's owner in it, computed with the
//     cluster's Router options, for the checker's owner property.
//   * One extra node (n<N+1>) when the plan has joins: it joins and later
//     leaves with SIGTERM.
//
// The nemesis picks its victims among n1..nN with the run's seeded random
// stream. Every fault heals before inject() returns. Besides the faults
// longer than the etcd lease, it injects shorter ones and overlapping ones
// (run.h's short_pauses ... slow_watches): pauses and etcd partitions within
// the lease, maybe while a map moves; a node stalled (stopped, or its etcd
// answers held back in its TcpProxy) across two back-to-back drains; two
// drains back to back; a join during a drain; a kill -9 during a hand-off; a
// rolling restart raising --max-ttl; and a node's etcd answers delayed
// while maps move.
#pragma once

#include <filesystem>
#include <memory>

#include "recorder.h"
#include "run.h"
#include "system.h"

namespace shardlock::torture {

[[nodiscard]] std::unique_ptr<SystemUnderTest> make_cluster(const TortureOptions& options,
                                                            const std::filesystem::path& scratch,
                                                            const Recorder& nemesis);

}  // namespace shardlock::torture
