// checker.h: judges a shardlock-torture history (see history.h).
//
// The checker is independent of the system it judges: it includes nothing
// from include/shardlock/ and links only the standard library, so a bug in
// the lease client or server cannot hide itself by also living here.
//
// Properties, per key (a correct system produces no violation). A holder's
// validity interval runs from its grant received to its last known expiry
// (the grant's, a renewal's or a hold's, as last recorded), cut at its
// release invocation or loss. Only holders of different clients conflict. A
// client is one history (one thread of a worker): it takes a key at a time,
// so its own intervals never meet. Threads that share one LeaseClient
// (--threads-per-client) are clients of their own, so the checker judges
// them against each other exactly as separate processes.
//   overlap          no exclusive holder's interval overlaps another client's
//                    holder's (exclusive, shared or permit) on the same key.
//                    Shared holders may overlap each other, and permit
//                    holders each other (permit_limit judges those); a shared
//                    and a permit holder never overlap (a key in use is a
//                    lock or a semaphore, never both);
//   permit_limit     at no instant do more permit holders' intervals overlap
//                    on a key than the smallest limit (permits=) any of them
//                    was granted under. Every grant counts, two of one client
//                    included: each is a permit of its own;
//   all_or_nothing   a multi-key grant covers exactly the keys its acquire
//                    asked for (as a set), with one token per key. Tokens
//                    are per key, so two keys of one grant may carry the same
//                    number; that each key's token is fresh on that key is
//                    duplicate_token's and token_order's business. Each key
//                    of the grant is then an ordinary holder in every other
//                    property. (A failed multi-key acquire that left some
//                    keys held is invisible to a client's history; it shows
//                    as waits and busy answers, not here.);
//   token_order      a grant received before another grant's acquire was
//                    invoked has a smaller token, whatever the two grants'
//                    kinds: every grant on a key (shared and permit ones
//                    too) takes a new token from one rising counter, so a
//                    shared holder's token also orders it after every grant
//                    it followed. Concurrent shared holders may be granted
//                    in any order;
//   duplicate_token  one token of a key is never granted to two different
//                    clients, whatever the kinds;
//   fencing          accepted writes carry non-decreasing tokens (only
//                    exclusive holders write; shared ones only read);
//   lost_increment   accepted values count 1, 2, 3, ... and the final counter
//                    equals the number of accepted writes;
//   lock_delay       no grant (of any kind) invoked after a server start is
//                    received within that start's lock delay;
//   liveness         after the last fault heals, every client still active
//                    gets a grant (of any kind) within the liveness bound;
//   key_liveness     after the last fault heals, every key some client asks
//                    for within the liveness bound is granted (to anyone, of
//                    any kind) at least once before the history ends: a key
//                    the system stopped serving is caught even while its
//                    clients keep being served other keys;
//   wait             an acquire with a wait (not a try) that fails
//                    "recovering" or "unreachable" does so no sooner than
//                    its wait (less 50 ms): clients ride through a
//                    lock-delay and a failover while their wait lasts;
//   denied           (tenants) no acquire, renewal, release or campaign within
//                    the client's rights (no outside=1) is answered
//                    permission_denied: the server refused a tenant a key its
//                    prefixes allow (a reload that lost a tenant or a right,
//                    a shared prefix matched wrongly);
//   isolation        (tenants) no acquire outside the client's rights
//                    (outside=1, a probe of another tenant's key) is granted.
//                    Such a grant is a holder like any other for the other
//                    properties; a probe answered otherwise than
//                    permission_denied (unreachable under loss, say) is fine.
//                    Probes ask for no grant, so key_liveness ignores them;
//   owner            (cluster mode: grants that name their node, and map
//                    events) every grant was answered by the node that the
//                    map of its token's epoch (token >> 32) gives the key
//                    to, and that epoch is a published map's. The nodes'
//                    own starts bind lock_delay: a node's restart delays only
//                    the grants it answers. With replicas >= 2 lock_delay is
//                    not judged (a takeover of a complete bucket grants at
//                    once); overlap judges what it protects.
//   kept             (replicated clusters, replicas >= 2) a lease whose
//                    client stayed connected is not reported lost because
//                    one node failed. A loss (a lost event, or a release
//                    refused expired or not_owner while the client's own
//                    expiry was still ahead) is a violation when all of
//                    these hold:
//                    * a node fault (a kill -9 until the restart is ready,
//                      a pause until the resume, a node-to-node cut until
//                      it heals) began before the loss, and the lease was
//                      granted before it began (for a cut, before it
//                      healed: a node cut off from a peer still answers);
//                    * no other disturbance did in that window: no second
//                      node fault (both replicas of a bucket may be hit),
//                      no start of a node but the killed one's restart, no
//                      etcd or client partition, drain, join or leave, no
//                      pause of the client's own worker;
//                    * no map from the grant to the loss (+1 s, a node may
//                      act on a map before the harness records it) gave
//                      the key to a node outside its replicas in the map
//                      before (a hand-off, which replication does not
//                      carry; a takeover by a backup does);
//                    * the server refused a renewal (a new primary without
//                      the grant), or, when the client's own expiry passed
//                      (no_renewal), the client had replica_timeout_ms +
//                      failover_slack_ms from the fault (or the grant, if
//                      later) to renew at the new primary.
//
// Elections (history.h, "Elections"), per name. A campaigner's leadership
// interval, as its client sees it, runs from its elected event (campaign()
// returned) to its last lead event (leading() said true), cut at its
// resign_invoke or deposed event: never past the moment the client stopped
// believing it led. A campaign is named by its client and op, and an
// observer's report names the campaign it saw lead by the value that
// campaign attached. For liveness and key_liveness an election is a grant
// (of its name), and so is an observer's report (to the observer).
//   one_leader       no two leadership intervals of a name overlap (touching
//                    ones, one ending where the next begins, do not);
//   term_order       a later election has a larger term: one whose campaign
//                    was invoked after another's was won (elected recorded),
//                    or whose leadership interval began after another's
//                    ended, has the larger term (so no term is won twice);
//   observer_order   each observer reports a name's leaders with strictly
//                    rising terms: never a leader whose term is older than,
//                    or the same as, one it already reported (a report of no
//                    leader may come between any two; skipping leaders is
//                    fine: an observer that was away sees the newest);
//   observed_leader  every leader an observer reports was granted: its value
//                    names a campaign of that name invoked before the report,
//                    and the reported term is the one that campaign won, or,
//                    when its campaign() never returned the win (a timeout
//                    whose grant came too late, a run that ended), a term no
//                    other campaign won.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "history.h"

namespace shardlock::torture {

struct CheckOptions {
  std::int64_t liveness_bound_ms = 10000;
  std::size_t max_examples = 5;  // kept per violation kind
  // kept: judged only with replicas >= 2 (the nodes' --replicas).
  int replicas = 1;
  std::int64_t replica_timeout_ms = 300;  // the nodes' --replica-timeout
  // How long after a disturbance the cluster may still be unsettled: a
  // restarted node younger than the lock-delay (its backups do not take
  // over from it), a new backup not yet caught up.
  std::int64_t settle_ms = 6000;
  // Beyond the replica timeout: the map's publication and the client's
  // retries until a renewal reaches the new primary.
  std::int64_t failover_slack_ms = 1000;
  // Client pauses name a worker, whose clients are [w x n, (w + 1) x n);
  // 0: a pause disturbs every client.
  int clients_per_worker = 0;
  // kept excuses a hand-off to a node that came (back) into the map: today
  // a restarted node takes its buckets back as their primary at once, and
  // its backup hands them off, holders and all. False judges those losses
  // too (the repair this waits for: a node that comes back should be a backup
  // until it has caught up).
  bool kept_excuses_rejoins = true;
};

enum class ViolationKind : std::uint8_t {
  kOverlap,
  kTokenOrder,
  kDuplicateToken,
  kFencing,
  kLostIncrement,
  kLockDelay,
  kLiveness,
  kPermitLimit,
  kAllOrNothing,
  kOwner,
  kKeyLiveness,
  kWait,
  kKept,
  kOneLeader,
  kTermOrder,
  kObserverOrder,
  kObservedLeader,
  kDenied,
  kIsolation,
};

struct Violation {
  ViolationKind kind = ViolationKind::kOverlap;
  std::string key;     // empty for liveness (a client, not a key)
  std::string detail;  // one line, with clients, times (ns) and tokens
};

struct CheckReport {
  // Every violation counted; every kind present (zero when clean).
  std::map<ViolationKind, std::size_t> violation_counts;
  // The first max_examples of each kind, grouped by kind, in time order.
  std::vector<Violation> examples;
  // Completed operations by name ("acquire ok", "try-acquire busy", "renew ok",
  // "release ok", "lost", "read", "read refused", "write accepted", ...).
  // Acquires other than exclusive single-key ones are prefixed with their
  // kind: "shared acquire ok", "permit try-acquire busy", "multi acquire ok"
  // (exclusive multi-key), "multi shared acquire ok"; a probe outside the
  // tenant's rights comes first: "outside try-acquire permission_denied".
  // Invocations with no completion appear as "<op> unfinished".
  std::map<std::string, std::uint64_t> operations;
  // "server kill -9", "server pause", "client pause", "network faults", and
  // in cluster mode (when they happened) "node join", "node leave", "node
  // drain", "etcd partition", "client partition".
  std::map<std::string, std::uint64_t> faults;
  // Cluster mode: the maps etcd published during the run (map events).
  std::uint64_t maps = 0;
  // kept (replicas >= 2): the losses it judged, a node fault their cause
  // with nothing to excuse them but the timing rule (the rest: no node
  // fault near them, or excused).
  std::uint64_t kept_judged = 0;
  // Acquire, renew and release completions, ok or not.
  std::uint64_t lease_operations = 0;
  // Campaign and resign completions, ok or not, and observers' reports.
  std::uint64_t election_operations = 0;
  // False when the history has no healed event.
  bool liveness_checked = false;

  [[nodiscard]] bool ok() const;
  // Grants received, of every kind (the "... acquire ok" operations), and
  // elections won ("campaign elected").
  [[nodiscard]] std::uint64_t grants() const;
  // False for a history that is no evidence either way: no grant at all, or
  // no healed event (liveness not judged). A harness must not report such a
  // run as a pass.
  [[nodiscard]] bool judged_something() const { return grants() > 0 && liveness_checked; }
  [[nodiscard]] std::string text() const;  // a readable summary table
  [[nodiscard]] std::string json() const;  // one JSON object, one line
};

// "overlap", "token_order", "duplicate_token", "fencing", "lost_increment",
// "lock_delay", "liveness", "permit_limit", "all_or_nothing", "owner",
// "key_liveness", "wait", "kept", "one_leader", "term_order", "observer_order",
// "observed_leader", "denied", "isolation".
[[nodiscard]] std::string_view to_string(ViolationKind kind) noexcept;

// Judges `history` (any order; sorted by t_ns here, stable). Never throws on
// odd histories: unmatched invocations and completions are skipped.
[[nodiscard]] CheckReport check(const std::vector<Event>& history, const CheckOptions& options);

}  // namespace shardlock::torture
