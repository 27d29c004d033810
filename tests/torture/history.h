// history.h: the event history of a shardlock-torture run, as the harness
// writes it and the checker reads it.
//
// One event per line, in files of one writer each (every worker process, the
// nemesis, the resource) under the run's history directory, flushed per
// event so a paused or killed writer loses nothing it completed:
//
//   <t_ns> <kind> <field>=<value> <field>=<value> ...
//
// t_ns is CLOCK_MONOTONIC in nanoseconds: every process of the run shares
// that clock on one machine, so intervals from different files compare
// exactly. Values contain no spaces (keys are generated without them) and
// keys no commas (lists are comma-separated).
//
// Lease kinds. The acquire events (invoke, ok, fail) may carry
//   mode=shared|permit   absent for exclusive, so lines written before the
//                        kinds existed read as exclusive acquires;
//   permits=P            with mode=permit: the semaphore's limit asked for.
// A multi-key (all-or-nothing) acquire is one operation: its events carry
// keys=a,b,c in place of key= (in the order asked), and its acquire_ok
// carries tokens=t1,t2,t3 in place of token= (one per granted key, in the
// order of its keys=, which lists the keys granted) and one expiry_ns for
// all of them. Everything after the grant (hold, renew, release, lost,
// reads and writes) is per key and token, as for a single-key lease, so a
// multi-key grant of n keys becomes n ordinary holds.
//
// Tenants (--tenants N). Every client is one tenant's and asks for keys
// within its rights (its own prefix, or the shared one), except for the
// acquires that carry outside=1: a probe of a key outside its rights, which
// the server must refuse (permission_denied). outside=1 may be on any
// acquire event; lines without it are within the client's rights.
//
// Cluster mode (several shardlockd nodes, docs/cluster.md). Events about a
// node carry node=<id>: an acquire_ok the node that answered it (the node the
// client's request went to), the server_* events the node they are about.
// The harness records every bucket map etcd published as a map event: its
// epoch and, for every key of the workload, the owner that map gives it
// (owners=key-0:n1,key-1:n2,...), computed with the Router beside the
// nodes. Lines without node= (a single node) read as before. With
// replication (--replicas 2+) a map event also lists each key's backups
// (backups=key-0:n2,key-1:n3,...; several per key with --replicas 3, in
// rank order), and the nemesis records node-to-node cuts (node_cut_on/off
// node=A peer=B) and replacements (node_replaced node=A peer=A2: a new id at
// A's address, which the workers still call A).
//
// Elections (--elections). A campaigner's events carry key=<the
// election's name> and, from the grant on, token=<its term>; the value its
// campaign attached is "<client>.<op>" of its campaign_invoke, so an
// observer's report names the campaign it saw win (leader=<that value>, or
// leader=- with token=0 for no leader). A campaigner's leadership, as the
// client sees it, runs from its elected event to its last lead event, cut at
// its resign_invoke or deposed event.
//
// This header is the only thing the harness and the checker share. The
// checker shares no code with the lease client or server.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace shardlock::torture {

// Every kind of event, with the fields it carries.
enum class EventKind : std::uint8_t {
  // Workers (client = the worker's index; op = per-worker operation number).
  // key/token become keys/tokens for a multi-key acquire; [mode permits].
  kAcquireInvoke,  // client op key ttl_ms wait_ms [mode permits outside]
  kAcquireOk,      // client op key token expiry_ns [mode permits node outside]  (t = grant
                   //   received)
  kAcquireFail,    // client op key error [mode permits outside]  (error: busy, timeout,
                   //   permission_denied, ...)
  kHold,           // client key token expiry_ns     (the worker relies on the lease at t)
  kRenewInvoke,    // client op key token ttl_ms
  kRenewOk,        // client op key token expiry_ns
  kRenewFail,      // client op key token error
  kReleaseInvoke,  // client op key token            (validity ends here)
  kReleaseOk,      // client op key token
  kReleaseFail,    // client op key token error
  kLost,           // client key token error         (the on_lost callback ran; error:
                   //   the server's refusal, or no_renewal: the client's expiry passed)
  kRead,           // client key value               (a counter read from the resource)
  kWriteInvoke,    // client key token value
  // The resource (client = the writer).
  kWriteAccepted,  // client key token value
  kWriteRejected,  // client key token value highest
  kFinalCounter,   // key value                      (at the end of the run)
  // The nemesis; [node] in cluster mode.
  kServerStart,   // incarnation lock_delay_ms [node]  (t = before exec)
  kServerReady,   // incarnation [node]
  kServerKill,    // incarnation [node]             (SIGKILL sent; t = after waitpid)
  kServerPause,   // incarnation [node]
  kServerResume,  // incarnation [node]
  kClientPause,   // client
  kClientResume,  // client
  kNetFaultsOn,   // (loss/duplication/reordering/delay active)
  kNetFaultsOff,  //
  kHealed,        // (the last fault has healed; liveness is measured from here)
  // Cluster mode: the harness's view of etcd, and the nemesis's cluster
  // faults (each names the node it is about).
  kMap,           // epoch owners [backups]         (t = the harness saw it published)
  kNodeJoin,      // node                           (an extra node joins)
  kNodeLeave,     // node                           (it is stopped with SIGTERM)
  kDrainOn,       // node                           (drain/<node> put in etcd)
  kDrainOff,      // node                           (drain/<node> deleted)
  kEtcdCutOn,     // node                           (its etcd connections cut)
  kEtcdCutOff,    // node
  kClientCutOn,   // node                           (every datagram to or from it dropped)
  kClientCutOff,  // node
  // A compound fault of the cluster nemesis (several nodes, overlapping
  // steps) begins; the steps it takes are recorded as the events above.
  kFault,  // fault                                (its name, '_' for spaces)
  // Replication: every datagram between two nodes dropped, both directions.
  kNodeCutOn,   // node peer
  kNodeCutOff,  // node peer
  // A node replaced at its address under a new id (its data dir wiped, as
  // the runbook says a lost disk is): node = the name the workers know the
  // address by (its first id), peer = the new id. Grants from that address
  // carry the first name from then on.
  kNodeReplaced,  // node peer
  // Elections: campaigners (client = the campaigner's index; op as above).
  kCampaignInvoke,  // client op key ttl_ms wait_ms    (key = the election's name)
  kElected,         // client op key token             (t = campaign() returned; token =
                    //   the term, 0 when the lease was no longer valid to read it)
  kCampaignFail,    // client op key error
  kLead,            // client key token                (t taken before leading() said true)
  kResignInvoke,    // client op key token             (leadership ends here)
  kResignOk,        // client op key token
  kResignFail,      // client op key token error
  kDeposed,         // client key token error          (the on_lost callback ran; error as kLost)
  // Observers (client = the observer's index).
  kObserve,  // client key token leader            (LeaderObserver::next() reported a
             //   change: the term and value of the leader, or token=0 leader=-)
};

// How an acquire holds its key(s).
enum class AcquireMode : std::uint8_t {
  kExclusive,  // one holder, the only one that writes
  kShared,     // any number of shared holders, which only read
  kPermit,     // one of at most `permits` holders (a counting semaphore)
};
// "exclusive", "shared", "permit".
[[nodiscard]] std::string_view to_string(AcquireMode mode) noexcept;
[[nodiscard]] std::optional<AcquireMode> parse_acquire_mode(std::string_view name) noexcept;

// "acquire_invoke", "acquire_ok", ... (the kinds' names on the wire).
[[nodiscard]] std::string_view to_string(EventKind kind) noexcept;
[[nodiscard]] std::optional<EventKind> parse_event_kind(std::string_view name) noexcept;

struct Event {
  std::int64_t t_ns = 0;
  EventKind kind = EventKind::kAcquireInvoke;
  std::int64_t client = -1;  // worker index; -1 when not applicable
  std::int64_t op = -1;      // per-worker operation number
  std::string key;
  std::uint64_t token = 0;
  std::int64_t expiry_ns = 0;  // the client's own expiry, on CLOCK_MONOTONIC
  std::int64_t ttl_ms = 0;
  std::int64_t wait_ms = 0;
  std::int64_t value = 0;                      // counter value read / written / final
  std::uint64_t highest = 0;                   // kWriteRejected: the token that fenced it out
  std::int64_t incarnation = 0;                // server events
  std::int64_t lock_delay_ms = 0;              // kServerStart
  std::string error;                           // *Fail, kLost
  AcquireMode mode = AcquireMode::kExclusive;  // acquire events
  std::int64_t permits = 0;                    // acquire events with mode kPermit
  // Acquire events: the key (or one of the keys) is outside the client's
  // tenant's rights, so the acquire must be refused (a probe).
  bool outside = false;
  // A multi-key acquire (acquire events): the keys, non-empty, and `key` is
  // unused; its acquire_ok's tokens, one per key of `keys`.
  std::vector<std::string> keys;
  std::vector<std::uint64_t> tokens;
  // Cluster mode: the node an event is about (empty: none, a single node).
  std::string node;
  // kMap: the map's epoch (its etcd revision) and each workload key's owner
  // in it, as (key, node id).
  std::uint64_t epoch = 0;
  std::vector<std::pair<std::string, std::string>> owners;
  // kMap with --replicas 2+: each workload key's backups in that map, as
  // (key, node id), in rank order (the first is the one a failover promotes).
  std::vector<std::pair<std::string, std::string>> backups;
  // kNodeCutOn/Off: the other node of the cut (node is the first).
  std::string peer;
  // kFault: the fault's name, words joined by '_' ("stalled_double_drain").
  std::string fault;
  // kObserve: the value of the leader reported ("<client>.<op>" of its
  // campaign), "-" for none.
  std::string leader;

  [[nodiscard]] bool multi_key() const noexcept { return !keys.empty(); }
};

// The line for `e` (no newline): only the fields its kind carries.
[[nodiscard]] std::string format_event(const Event& e);
// Parses one line; nullopt (and `error` says why) for a malformed line.
[[nodiscard]] std::optional<Event> parse_event(std::string_view line, std::string* error = nullptr);

// Every event of every *.log file in `dir`, sorted by t_ns (stable). Returns
// false, with `error` set, when a file cannot be read or a line does not
// parse (a torn last line of a killed writer is skipped, not an error).
[[nodiscard]] bool read_history(const std::string& dir, std::vector<Event>& out,
                                std::string& error);

}  // namespace shardlock::torture
