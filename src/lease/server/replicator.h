// Replicator: one node's replication streams (docs/cluster.md, "Replication"),
// between the shards' journals and the node-to-node datagrams. No sockets:
// datagrams come in through on_datagram() and go out through the caller's
// list, as with the Dispatcher. Private to src/lease/server/.
//
//   * Layout (set_layout(), from the cluster layer at each map;
//     replicator_layout.cc): the peers, which of them back up each bucket
//     this node is primary of, and which of them this node backs up. A stream to a peer that stays
//     a backup is kept; one to a new backup starts (its first entries must be the snapshots of the
//     buckets it backs up: snapshot()).
//   * route(): the shards' journal entries, each to the streams of its
//     bucket's backups, in the order given.
//   * Held answers: a reply datagram that carries a grant or a release is
//     held (hold()) until every stream has acknowledged every entry it had
//     when the reply was held, then comes out of poll() or on_datagram().
//   * Addressing: every datagram names its sender and receiver by node id
//     and process (replication::Addressing); one is taken only by the
//     stream of the node it names, from the address the layout gives that
//     node, and only when it is for this node's process. A primary learns
//     each backup's process from its acks; a backup refuses a REPLICATE for
//     another process (or none yet), and its refusal names its own, to which
//     the primary then addresses the stream.
//   * The primary lease of a bucket (lease_until()) is the earliest of its
//     backups' streams' leases; it reads atomics, so a shard's gate calls it
//     under the shard's lock without taking the replicator's.
//   * As a backup: REPLICATE datagrams from a peer go to that peer's
//     BackupStream, which answers them; takeover() hands out what a bucket's
//     stream replicated once its promise has run out.
//
// Threading: every method may be called from any thread; one Mutex guards
// the streams (taken after a shard's lock, never before one).
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "server/io_loop.h"
#include "shardlock/internal/thread_annotations.h"
#include "shardlock/lease/server/internal/replication.h"
#include "shardlock/lease/server/server_types.h"
#include "shardlock/lease/wire/auth.h"
#include "shardlock/lock_guard.h"
#include "shardlock/mutex.h"
#include "shardlock/router.h"

namespace shardlock::lease::internal {

struct ReplicaPeer {
  std::string id;  // the node's id in the map
  Peer address;    // its lease port: node-to-node datagrams share it
};

// One map's replica layout, as this node sees it.
struct ReplicaLayout {
  std::uint64_t epoch = 0;  // the map's
  // This node's id in the map: node-to-node datagrams name it
  // (replication::Addressing), and one for another id is refused.
  std::string self_id;
  std::vector<ReplicaPeer> peers;
  // For each bucket: the indices into `peers` of its backups when this node
  // is its primary; empty otherwise.
  std::vector<std::vector<std::uint16_t>> backups;
  // For each bucket: the index into `peers` of its primary when this node is
  // one of its backups; kNone otherwise.
  static constexpr std::uint16_t kNone = 0xFFFF;
  std::vector<std::uint16_t> backing;
  // For each bucket: whether this node is its primary (with backups or,
  // the last one left, without). A departed primary's stream is kept for
  // the buckets this node owns until they are taken over. Empty: unknown,
  // every bucket counts as owned.
  std::vector<bool> owned;
};

struct ReplicatorOptions {
  replication::StreamTiming timing;
  std::optional<AuthKey> auth_key;
  // From this time on (the server's clock) this node's process has been up
  // for its lock-delay: its streams say so (kFlagPrimarySettled), and a
  // backup may then take over from it without waiting to have seen its
  // registration a lock-delay ago.
  std::int64_t settled_at_ns = 0;
  // This process among the node's runs (replication::Addressing): any
  // non-zero value a restart changes (the server uses its start on the wall
  // clock); 0 draws one at random. Only compared for equality, so a wall
  // clock stepped back does no harm. Every REPLICATE to this node must name
  // it, and every ack to it too.
  std::uint64_t incarnation = 0;
  // Answers from the backup (docs/cluster.md): a held answer that waits on
  // one backup alone rides in the REPLICATE that carries what it waits for,
  // and that backup sends it to the client once applied (replication::Relay).
  // Off: the primary sends it when the acknowledgement comes, a hop later.
  bool relay_replies = false;
  // Acks ride in REPLICATEs (replication::kFlagCarriesAck): an ack is owed
  // until the next poll(), and goes in the REPLICATE that poll sends to the
  // same peer, or alone when there is none. Off: sent at once, alone.
  bool carry_acks = false;
};

// The layout of `routing` for the node at index `self` with `replicas`
// owners per bucket (RouterSnapshot::replica_set(): the primary, then its
// backups, the nodes flagged in `learners` backing up but never primary).
// `addresses[i]` is node i's lease port; the peers are every other node, in
// the routing's order.
[[nodiscard]] ReplicaLayout replica_layout(std::uint64_t epoch, const RouterSnapshot& routing,
                                           const std::vector<bool>& learners, std::uint16_t self,
                                           std::size_t replicas,
                                           const std::vector<Peer>& addresses);

class Replicator {
 public:
  Replicator(const ReplicatorOptions& options, std::int64_t now_ns);
  ~Replicator();
  Replicator(const Replicator&) = delete;
  Replicator& operator=(const Replicator&) = delete;

  // Adopts a map's layout. Returns the (peer, bucket) pairs, peer an index
  // into layout.peers, that the peer did not back up through its current
  // stream before (a new backup, a bucket new to it, a stream started over):
  // the caller must snapshot() each before it answers a grant in that
  // bucket. As a backup, a bucket this node no longer backs up for a
  // primary is forgotten (so it is never taken over from a stale copy), and
  // a primary it no longer backs up at all gets no more leases from it.
  //
  // Every reply held so far is dropped, never sent: the backups it waited
  // for may no longer back its bucket up, and this node may no longer be
  // its primary. The client retransmits; the shard answers the
  // retransmission from its dedup cache only while the key's bucket may
  // still be granted here, and that answer is held again behind the
  // streams as they are then (snapshots to new backups included).
  std::vector<std::pair<std::uint16_t, std::uint32_t>> set_layout(ReplicaLayout layout,
                                                                  std::int64_t now_ns);

  // Starts anew every stream whose backup can no longer follow it (it
  // restarted and lost what it had acknowledged), or every stream after
  // start_over(). Returns the (peer, bucket) pairs to snapshot(), as
  // set_layout() does; until then the primary holds no lease from that
  // backup. Held replies are dropped, as by set_layout().
  std::vector<std::pair<std::uint16_t, std::uint32_t>> restart_streams();
  // Held replies dropped by layout changes and stream restarts.
  [[nodiscard]] std::uint64_t dropped_replies() const noexcept {
    return dropped_.load(std::memory_order_relaxed);
  }
  // Whether restart_streams() has streams to start anew.
  [[nodiscard]] bool restart_pending() const;
  // A journal entry was lost (no memory): every stream starts over at the
  // next restart_streams(), and no lease is held until then.
  void start_over();

  // A snapshot of `bucket` to the stream of `peer` (an index into the
  // layout's peers), in three steps: the reset, the holders (in as many
  // parts as the caller likes), the caught-up mark. Journal entries routed
  // between the steps stay in order with them, so a caller that appends
  // each shard's holders under that shard's lock, after draining its
  // journal, sends a snapshot that no grant can slip past
  // (Dispatcher::replicate_bucket()).
  void begin_snapshot(std::uint16_t peer, std::uint32_t bucket);
  void append_snapshot(std::uint16_t peer, std::span<const replication::Entry> holders);
  // `owner_active`: this node has the bucket active (Entry::owner_active).
  void end_snapshot(std::uint16_t peer, std::uint32_t bucket, bool owner_active = false);
  // Appends each journal entry to the streams of its bucket's backups.
  void route(std::span<const replication::Entry> entries);
  // The same, moving each entry to the last of its streams (what is left in
  // `entries` is unspecified).
  void route_moved(std::vector<replication::Entry>& entries);
  // This node activated `buckets` (its gate grants them now): a
  // kBucketActivated mark to each one's backups in the current layout, after
  // everything routed so far. The caller routes the shards' journals first,
  // so the mark follows every holder installed before the activation
  // (Dispatcher::publish_gate()).
  void activated(std::span<const std::uint32_t> buckets);

  // Holds `reply` until the streams to the backups of `buckets` (the
  // buckets of what it grants or releases, in the current layout) have
  // acknowledged what they have now; every stream when `buckets` is empty,
  // or names a bucket with no backup in the layout (the caller does not
  // know, or the layout moved on: wait for everything, as is always safe).
  // Returns false (and does not take it) when nothing it waits for is
  // outstanding: send it at once. A backup that is slow or cut off then
  // holds back only the answers for the buckets it backs up.
  //
  // `relayable`: the reply may be relayed (ReplicatorOptions::relay_replies).
  // Not for an answer to a retransmission: its first answer may have been
  // relayed and lost, or the client may only hear its primary's address
  // (a NAT between them), so the primary sends it itself.
  bool hold(OutDatagram& reply, std::span<const std::uint32_t> buckets = {},
            bool relayable = false);

  // A node-to-node datagram (by its magic): applies it, answers it, and
  // moves the replies it releases to `out`. False when `bytes` is not one
  // (the caller decodes it as a client request).
  bool on_datagram(std::span<const std::uint8_t> bytes, const Peer& from, std::int64_t now_ns,
                   std::vector<OutDatagram>& out);
  // What is due now: stream datagrams (new entries, retransmissions,
  // heartbeats) and released replies.
  void poll(std::int64_t now_ns, std::vector<OutDatagram>& out);

  // The end of this node's primary lease for `bucket` (the earliest of its
  // backups'); long past for a bucket without backups in the current layout
  // (see replicator.cc). Takes a short lock to read the layout.
  [[nodiscard]] std::chrono::nanoseconds lease_until(std::size_t bucket) const noexcept;

  // As a backup: how many of the buckets this node backs up in the current
  // layout are caught up, how many of those on a primary that grants them,
  // and how many it backs up. A learner is promoted once every bucket is
  // caught up on an active primary (docs/cluster.md, "Repair").
  [[nodiscard]] ReplicaProgress progress() const;

  // As a backup of `primary` (a peer id): whether the stream that has
  // `bucket` said its primary was settled (kFlagPrimarySettled) or had
  // `bucket` active (Entry::owner_active): either way its snapshot and
  // stream hold every lease of `bucket` its earlier runs may have granted.
  [[nodiscard]] bool primary_settled(const std::string& primary, std::uint32_t bucket) const;

  // As a backup of `primary` (a peer id): whether `bucket` was caught up
  // and the promise to the primary has run out (it stopped promising when
  // the layout dropped it), and if so, `bucket`'s replicated holders.
  // `owner_active`, when given: whether the bucket's snapshot said the
  // primary had it active (Entry::owner_active).
  [[nodiscard]] bool takeover(const std::string& primary, std::uint32_t bucket, std::int64_t now_ns,
                              std::vector<std::pair<std::string, replication::ReplicaHolder>>& out,
                              bool* owner_active = nullptr);

  // The peers of the current layout (backups and primaries of this node)
  // heard from since they entered it, and not for `silence_ns` now: no
  // acknowledgement from a backup, no datagram from a primary. A peer never
  // heard from is not named: it may be slower to adopt the map (its etcd
  // lease, not a suspicion, speaks for it if it is dead).
  //
  // Silence counts only up to the last time every I/O loop of this node ran
  // (loop_ran()): a node whose own loops stalled (CPU starvation, a pause)
  // has not read what its peers sent meanwhile, so it suspects nobody for
  // that time. Until loop_ran() is first called, up to `now_ns`.
  [[nodiscard]] std::vector<std::string> silent_peers(std::int64_t now_ns,
                                                      std::int64_t silence_ns) const;
  // Every I/O loop of this node has drained its socket and ticked since
  // `now_ns` (the dispatcher's oldest worker tick).
  void loop_ran(std::int64_t now_ns);

  [[nodiscard]] std::size_t held() const;
  // Streams this node follows as a backup: of primaries in the layout, and
  // of departed or retiring ones kept for their takeovers.
  [[nodiscard]] std::size_t primary_streams() const;
  [[nodiscard]] std::uint64_t rejected_datagrams() const noexcept {
    return rejected_.load(std::memory_order_relaxed);
  }
  // As backup: REPLICATEs refused because they named another process of
  // this node, or none (each answered, so the primary learns this one). A
  // few per primary at start-up; more is a replay of an older run's stream.
  [[nodiscard]] std::uint64_t refused_for_another_process() const noexcept {
    return refused_process_.load(std::memory_order_relaxed);
  }
  // ReplicatorOptions::incarnation, or the one drawn for 0.
  [[nodiscard]] std::uint64_t incarnation() const noexcept { return options_.incarnation; }
  // Of those, the ones not sealed with the cluster key (unsealed, another
  // key, a bad tag): STATS counts them in auth_failures.
  [[nodiscard]] std::uint64_t auth_failures() const noexcept {
    return auth_failures_.load(std::memory_order_relaxed);
  }
  // Held answers handed to a backup to send (as primary), and answers sent
  // for a primary (as backup).
  [[nodiscard]] std::uint64_t replies_relayed() const noexcept {
    return relayed_.load(std::memory_order_relaxed);
  }
  [[nodiscard]] std::uint64_t relays_sent() const noexcept {
    return relays_sent_.load(std::memory_order_relaxed);
  }
  // As backup: acks not sent because a later one of the same stream
  // answered for them (kFlagAckLater).
  [[nodiscard]] std::uint64_t acks_spared() const noexcept {
    return acks_spared_.load(std::memory_order_relaxed);
  }
  // As backup: acks sent inside a REPLICATE to the same peer
  // (ReplicatorOptions::carry_acks).
  [[nodiscard]] std::uint64_t acks_carried() const noexcept {
    return acks_carried_.load(std::memory_order_relaxed);
  }

 private:
  struct ToBackup {
    ToBackup(std::string peer_id, const Peer& peer_address, std::uint64_t stream_id,
             const replication::StreamTiming& timing, const replication::Addressing& addressing)
        : peer(std::move(peer_id)),
          address(peer_address),
          stream(stream_id, timing, addressing),
          lease_until(std::make_shared<std::atomic<std::int64_t>>(
              std::numeric_limits<std::int64_t>::min())) {}
    std::string peer;
    std::uint64_t tag = replication::node_tag(peer);
    Peer address;
    replication::PrimaryStream stream;
    // Whether the backup process the stream is addressed to has
    // acknowledged it (attach_relays()).
    bool answered = false;
    // The stream's lease end, copied on each ack for lock-free readers.
    std::shared_ptr<std::atomic<std::int64_t>> lease_until;
    std::set<std::uint32_t> covered;  // buckets this stream carries (snapshot sent)
  };
  struct FromPrimary {
    FromPrimary(std::uint64_t primary_tag, const Peer& primary_address,
                const replication::StreamTiming& timing, std::int64_t now_ns,
                std::vector<std::uint32_t> backed, std::uint64_t layout_epoch,
                std::uint64_t after_stream = 0, std::uint64_t lease_from_epoch = 0)
        : tag(primary_tag),
          address(primary_address),
          stream(timing, now_ns, after_stream, lease_from_epoch),
          buckets(std::move(backed)) {
      stream.carry(buckets, layout_epoch);
    }
    std::uint64_t tag;  // replication::node_tag() of the primary's id
    Peer address;
    replication::BackupStream stream;
    std::vector<std::uint32_t>
        buckets;  // backed up for this primary in the current layout, ascending
    // Of those, the ones takeover() handed out (a departed primary's stream
    // goes once none is left to take over: set_layout()). Mutable: the
    // takeover's bookkeeping, beside a replica it only reads.
    mutable std::set<std::uint32_t> taken;
    // The ack owed for REPLICATEs flagged kFlagAckLater or, with
    // carry_acks, for any: the newest one's, sent by poll() in a REPLICATE
    // to the primary or, at `owed_due_ns` at the latest, alone (flush_ack()).
    std::optional<replication::Ack> owed_ack;
    std::int64_t owed_due_ns = 0;
  };
  struct Layout {
    // For each bucket, the lease ends of its backups' streams.
    std::vector<std::vector<std::shared_ptr<std::atomic<std::int64_t>>>> leases;
  };

  // set_layout()'s halves (replicator_layout.cc). The streams to backups:
  // kept, started or dropped, each bucket's lease ends in `leases`; returns
  // the (peer, bucket) pairs owed a snapshot.
  std::vector<std::pair<std::uint16_t, std::uint32_t>> layout_backups(const ReplicaLayout& layout,
                                                                      Layout& leases)
      SHARDLOCK_REQUIRES(mu_);
  // The streams from primaries: kept, retired (for the takeover of buckets
  // this node owns now) or started, for `backed` (per primary id, the
  // buckets this node backs up now; the lists are moved out).
  void layout_primaries(const ReplicaLayout& layout, std::int64_t now_ns,
                        std::unordered_map<std::string, std::vector<std::uint32_t>>& backed)
      SHARDLOCK_REQUIRES(mu_);
  // The stream (current or retiring) that lists `bucket` for `primary`.
  const FromPrimary* stream_with(const std::string& primary, std::uint32_t bucket) const
      SHARDLOCK_REQUIRES(mu_);
  void emit(std::span<const std::uint8_t> bytes, const Peer& to, std::vector<OutDatagram>& out);
  void release_held(std::vector<OutDatagram>& out) SHARDLOCK_REQUIRES(mu_);
  // The stream to the backup a datagram from `from` names as its sender.
  ToBackup* backup_at(std::uint64_t sender, const Peer& from) SHARDLOCK_REQUIRES(mu_);
  [[nodiscard]] replication::Addressing addressing_to(const std::string& peer) const
      SHARDLOCK_REQUIRES(mu_);
  replication::PrimaryStream* stream_to(std::uint16_t peer) SHARDLOCK_REQUIRES(mu_);
  // Appends a marker entry (reset, caught-up) to the stream to `peer`.
  void mark(std::uint16_t peer, replication::EntryKind kind, std::uint32_t bucket,
            bool owner_active = false);
  // A stream id: the map epoch in the high half, a count in the low, so
  // ids rise within this process. A node grants only in a fresh epoch after
  // every start (docs/cluster.md), but the first map it adopts may be one its
  // earlier run had, whose ids it repeats: the addressing (each end's
  // process) tells such streams apart.
  std::uint64_t next_stream_id(std::uint64_t epoch) noexcept SHARDLOCK_REQUIRES(mu_);

  ReplicatorOptions options_;
  std::atomic<std::uint64_t> rejected_{0};  // malformed, unauthenticated, from a stranger or to
                                            // another run of this node
  std::atomic<std::uint64_t> refused_process_{0};
  std::atomic<std::uint64_t> auth_failures_{0};  // unauthenticated
  std::atomic<std::uint64_t> relayed_{0};
  std::atomic<std::uint64_t> relays_sent_{0};
  std::atomic<std::uint64_t> acks_spared_{0};
  std::atomic<std::uint64_t> acks_carried_{0};
  // Sends `primary`'s owed ack, if any, once it is due (at once: `now_ns`
  // unset).
  void flush_ack(FromPrimary& primary, std::optional<std::int64_t> now_ns,
                 std::vector<OutDatagram>& out) SHARDLOCK_REQUIRES(mu_);
  // A REPLICATE from `from`, decoded into entries_ and relays_: applies it
  // and answers it (at once, or owed to poll()).
  void on_replicate(const replication::ReplicateHeader& header, const Peer& from,
                    std::int64_t now_ns, std::vector<OutDatagram>& out) SHARDLOCK_REQUIRES(mu_);
  // An ack from `from` (alone, or carried in a REPLICATE).
  void on_ack(const replication::Ack& ack, const Peer& from, std::int64_t now_ns,
              std::vector<OutDatagram>& out) SHARDLOCK_REQUIRES(mu_);
  // What poll() sends on `s` now.
  void poll_stream(ToBackup& s, std::int64_t now_ns, std::vector<OutDatagram>& out)
      SHARDLOCK_REQUIRES(mu_);
  // Puts the ack owed to the peer of `s`, if any, in the last of the
  // datagrams `wire` is about to send it.
  void carry_ack(const ToBackup& s, std::vector<std::vector<std::uint8_t>>& wire)
      SHARDLOCK_REQUIRES(mu_);
  // Flags the last datagram in `wire`, which carries relays, kFlagAckLater
  // when no held reply waits on `s` any more.
  void mark_ack_later(const ToBackup& s, std::vector<std::vector<std::uint8_t>>& wire) const
      SHARDLOCK_REQUIRES(mu_);
  // Hands the relayable held replies that wait on `s` alone to the last of
  // its datagrams in `wire`, as many as fit. Returns whether it took any.
  bool attach_relays(ToBackup& s, std::vector<std::vector<std::uint8_t>>& wire)
      SHARDLOCK_REQUIRES(mu_);
  // Read per grant (lease_until()), replaced per map. A lock, not a
  // std::atomic<std::shared_ptr>: libstdc++ 12 implements that with a lock
  // bit ThreadSanitizer cannot see, and reports its loads and stores as a
  // race that halts the node under the tsan preset.
  mutable Mutex layout_mu_;
  std::shared_ptr<const Layout> layout_ SHARDLOCK_GUARDED_BY(layout_mu_);
  [[nodiscard]] std::shared_ptr<const Layout> layout() const {
    shardlock::LockGuard guard(layout_mu_);
    return layout_;
  }

  mutable Mutex mu_;
  std::uint32_t streams_started_ SHARDLOCK_GUARDED_BY(mu_) = 0;
  // When each peer (by id) was last heard from, for silent_peers(); nullopt
  // while it has not been since it entered the layout.
  std::unordered_map<std::string, std::optional<std::int64_t>> heard_ SHARDLOCK_GUARDED_BY(mu_);
  std::optional<std::int64_t> loops_ran_ns_ SHARDLOCK_GUARDED_BY(mu_);  // loop_ran()
  bool start_over_ SHARDLOCK_GUARDED_BY(mu_) = false;
  ReplicaLayout current_ SHARDLOCK_GUARDED_BY(mu_);
  std::uint64_t self_tag_ SHARDLOCK_GUARDED_BY(mu_) = 0;  // node_tag(current_.self_id)
  std::unordered_map<std::string, std::unique_ptr<ToBackup>> to_ SHARDLOCK_GUARDED_BY(mu_);
  // to_'s streams by index into current_.peers (nullptr: not a backup), for
  // route(), which runs for every journal entry.
  std::vector<ToBackup*> to_by_peer_ SHARDLOCK_GUARDED_BY(mu_);
  std::unordered_map<std::string, std::unique_ptr<FromPrimary>> from_ SHARDLOCK_GUARDED_BY(mu_);
  // Streams from live primaries that stopped being promised because this
  // node now owns some of their buckets (a learner promoted): kept, by
  // primary id, for takeover() of those buckets only (`buckets`).
  std::vector<std::pair<std::string, std::unique_ptr<FromPrimary>>> retiring_
      SHARDLOCK_GUARDED_BY(mu_);
  // The primaries (ids) this node took a bucket over from in this run: a
  // new stream from one of them lends leases only from the map it is made
  // in (set_layout), since on an older map that primary may still count the
  // bucket as its own.
  std::unordered_set<std::string> taken_over_from_ SHARDLOCK_GUARDED_BY(mu_);
  // The largest stream id this run has followed from each primary (by
  // node_tag()), kept when its FromPrimary goes: a stream from it made
  // afresh refuses those ids and every smaller one (set_layout()). One entry
  // per primary ever followed.
  std::unordered_map<std::uint64_t, std::uint64_t> followed_ SHARDLOCK_GUARDED_BY(mu_);
  // The process each backup (by node_tag()) last named in a refusal of a
  // stream to it: every stream started from then on is addressed to it
  // (addressing_to()). One entry per backup ever heard from.
  std::unordered_map<std::uint64_t, std::uint64_t> backup_incarnations_ SHARDLOCK_GUARDED_BY(mu_);
  replication::HeldReplies<OutDatagram> held_ SHARDLOCK_GUARDED_BY(mu_);
  // The stream ids held_'s needs refer to, by index.
  std::vector<std::uint64_t> held_streams_ SHARDLOCK_GUARDED_BY(mu_);
  std::atomic<std::uint64_t> dropped_{0};
  void drop_held() SHARDLOCK_REQUIRES(mu_);
  [[nodiscard]] std::vector<replication::HeldReplies<OutDatagram>::Need> needs_now(
      std::span<const std::uint32_t> buckets) SHARDLOCK_REQUIRES(mu_);
  void add_need(ToBackup& s, std::vector<replication::HeldReplies<OutDatagram>::Need>& needs)
      SHARDLOCK_REQUIRES(mu_);
  std::int64_t created_ns_;
  std::vector<std::uint8_t> scratch_ SHARDLOCK_GUARDED_BY(mu_);
  std::vector<std::vector<std::uint8_t>> wire_ SHARDLOCK_GUARDED_BY(mu_);  // poll_stream()'s
  std::vector<ToBackup*> hold_streams_ SHARDLOCK_GUARDED_BY(mu_);          // needs_now()'s
  std::vector<replication::Entry> entries_ SHARDLOCK_GUARDED_BY(mu_);
  std::vector<replication::Relay> relays_ SHARDLOCK_GUARDED_BY(mu_);
};

}  // namespace shardlock::lease::internal
