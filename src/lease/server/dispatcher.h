// Dispatcher: the step between the I/O loops and the shards. No sockets.
//
// For each received datagram, in order:
//   1. authentication (when a key is set): a datagram that fails is counted
//      in auth_failures and dropped;
//   2. decoding: a malformed one is counted and dropped; one of another
//      protocol version gets ERROR(unsupported version) in ours;
//   3. the anti-amplification check: a request not padded for its answers
//      gets ERROR(request too small) items, and no reply is ever larger than
//      the datagram that asked for it (larger ones are withheld, counted);
//   4. for each item: STATS is answered here from every shard's counters,
//      and HOT_KEYS from every shard's sketch (the busiest keys first, as
//      many as the request's padding pays for);
//      QUERY_HOLDERS goes to its key's shard with the request's padding as
//      the room for holder entries (one page per datagram, as for STATS);
//      ACQUIRE_MANY is taken here across the shards of its keys (below);
//      anything else goes to the shard its key hashes to, under that shard's
//      lock, with the key hashed once for the whole path;
//   5. the reply datagram, then any answers the items triggered for queued
//      waiters (FIFO hand-off), are appended to the caller's list.
// tick() drives the timers of the shards a worker owns (s % workers).
//
// ACQUIRE_MANY: MultiDriver (multi_driver.h) decides it across its shards;
// this sends its answers.
//
// Threading: any number of I/O threads call handle() and tick() at once,
// each with its own worker index; a shard's state is only touched under its
// lock. Not API: LeaseServer's building block, and testable without it.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "server/io_loop.h"
#include "server/multi_driver.h"
#include "server/replicator.h"
#include "server/shard_slot.h"
#include "server/tenant_gate.h"
#include "shardlock/internal/thread_annotations.h"
#include "shardlock/lease/server/internal/grant_log.h"
#include "shardlock/lease/server/internal/latency_histogram.h"
#include "shardlock/lease/server/internal/server_clock.h"
#include "shardlock/lease/server/internal/shard.h"
#include "shardlock/lease/server/server_types.h"
#include "shardlock/lease/wire/auth.h"
#include "shardlock/lease/wire/internal/peer.h"
#include "shardlock/lease/wire/protocol.h"
#include "shardlock/mutex.h"

namespace shardlock::lease::internal {

struct DispatcherOptions {
  // Opens and checks every client datagram, and seals every answer, when
  // set: the tenants (tenant_gate.h; --auth-key is a table of one). Shared
  // with LeaseServer, which swaps tables in on a reload. Null: no sealing.
  std::shared_ptr<TenantGate> tenants;
  // The server's clock (whole milliseconds are what shards see); empty:
  // CLOCK_BOOTTIME (server_clock.h).
  std::function<std::chrono::nanoseconds()> clock;
  // One line per call.
  std::function<void(std::string_view)> log;
  // Seed of the one hash a key gets (hash_key()): picks its shard from the
  // high bits, indexes the shard's table with the rest. The shards must have
  // been built with ShardLimits::hash_seed equal to it.
  std::uint64_t key_seed = 0;
  // I/O threads: one scratch space each.
  unsigned workers = 1;
  // Replication (docs/cluster.md, "Replication"; server/replicator.h), not
  // owned: node-to-node datagrams go to it, every shard's journal is moved
  // into it under the shard's lock, a reply datagram that carries a grant
  // or a release is held in it until the backups have it, and tick() sends
  // what it has due. Null: no replication.
  Replicator* replicator = nullptr;
  // Not owned: every shard records its lease events in it, and inherit()
  // its takeovers (grant_log.h). Null: no grant log.
  GrantLog* grant_log = nullptr;
};

class Dispatcher {
 public:
  Dispatcher(DispatcherOptions options, std::vector<std::unique_ptr<Shard>> shards);
  ~Dispatcher();
  Dispatcher(const Dispatcher&) = delete;
  Dispatcher& operator=(const Dispatcher&) = delete;

  // Decides one datagram from `peer` and appends what goes out to `replies`.
  // Never throws: without memory the datagram is given up and counted (the
  // shards stay consistent; see Shard::handle). Call with a worker index
  // below options.workers that no other thread is using.
  void handle(unsigned worker, std::span<const std::uint8_t> bytes, const Peer& peer,
              std::vector<OutDatagram>& replies) noexcept;

  // Fires due timers of the shards this worker owns; appends the answers.
  void tick(unsigned worker, std::vector<OutDatagram>& replies) noexcept;
  // After one received batch: sends the replication entries it produced.
  void end_batch(std::vector<OutDatagram>& replies) noexcept;

  // A datagram dropped before decoding (larger than any valid one).
  void count_oversized() noexcept { count(counters_.malformed); }
  // A reply datagram that never left: no send slot, a full socket buffer
  // (EAGAIN, ENOBUFS) or a failed send completion.
  void count_send_drop() noexcept { count(counters_.send_drops); }

  // Every counter, shards' and this dispatcher's, and each shard's last token.
  [[nodiscard]] ServerStats stats() const;
  [[nodiscard]] std::size_t shard_count() const noexcept { return shards_.size(); }
  // The shard `key` goes to.
  [[nodiscard]] std::size_t shard_of(std::string_view key) const noexcept;

  // ---- Replication ----
  // Sends the replicator's stream to `peer` (Replicator::set_layout()'s
  // index) a snapshot of `bucket`: the reset, then each shard's holders of
  // it appended under that shard's lock after its journal is drained, then
  // the caught-up mark. No grant can slip past it: one made before a
  // shard's part is in the stream before it, one made after, after it.
  void replicate_bucket(std::uint16_t peer, std::uint32_t bucket) {
    replicate_buckets({{peer, bucket}});
  }
  // The same for many (peer, bucket) pairs at once, in one pass over the
  // shards (a new backup may take over tens of thousands of buckets).
  void replicate_buckets(const std::vector<std::pair<std::uint16_t, std::uint32_t>>& pairs);
  // Installs holders taken over from a primary (Shard::inherit), each on its
  // key's shard, to expire at `expiry_ms`; returns how many it installed.
  // Nullopt when a key could not admit one of them (this node still has a
  // holder of its own there, from when it owned the bucket before: it
  // expires on its own): the takeover failed closed and must not activate
  // the bucket, since that holder's client may hold the key now. The
  // holders that could be installed stay; a later call, once the local
  // holder is gone, finds them there. Under a gate that marks their
  // buckets replicated, they are journaled to this node's own backups,
  // after the snapshots set_layout() asked for.
  [[nodiscard]] std::optional<std::size_t> inherit(
      const std::vector<std::pair<std::string, replication::ReplicaHolder>>& holders,
      std::int64_t expiry_ms);

  // ---- Cluster mode (cluster_gate.h) ----
  // Hands `gate` to every shard, each under its lock, and answers MAP from
  // it. Returns once every shard has it: a grant decided after this sees it.
  // With replication, the buckets it activates are marked so to their
  // backups (Replicator::activated()), after the shards' journals.
  void publish_gate(std::shared_ptr<const ClusterGate> gate);
  // Leases on keys `pred` is true for, over every shard (each under its
  // lock); for a hand-off. O(keys held).
  [[nodiscard]] std::size_t count_leases(
      const std::function<bool(std::string_view key)>& pred) const;
  // Whether some shard ran out of token counter in the current epoch.
  [[nodiscard]] bool needs_new_epoch() const;

 private:
  // Scratch space of one I/O thread, reused for every datagram.
  struct Worker {
    Datagram request;
    Datagram reply;
    // The tenant table this thread reads (null without sealing), the opened
    // datagram, and the tenant of the one being decided.
    std::optional<TenantGate::Reader> tenants;
    std::array<std::uint8_t, kMaxDatagramSize> opened{};
    const Tenant* tenant = nullptr;
    TenantCounters* tenant_counters = nullptr;
    std::vector<DeferredReply> deferred;
    std::vector<std::uint8_t> stats_tokens;
    std::array<std::uint8_t, 8 * kStatCounterCount> stats_counters{};
    // GRANTED_MANY tokens of each item of the reply being built, and of a
    // deferred one.
    std::array<std::array<std::uint8_t, 8 * kMaxKeysPerRequest>, kMaxBatch> many_tokens{};
    std::array<std::uint8_t, 8 * kMaxKeysPerRequest> deferred_tokens{};
    std::vector<std::uint8_t> map_members;  // MAP_REPLY entries
    HolderPage holder_page;                 // HOLDERS_REPLY entries
    // The buckets of the GRANTED and RELEASED items of the reply being
    // built, for the replicator's hold; not known when an item's bucket is
    // not (an ACQUIRE_MANY's, or before the first map).
    std::vector<std::uint32_t> reply_buckets;
    bool reply_buckets_known = true;
    // No item of the reply answers a retransmission, nor an ACQUIRE_MANY:
    // a backup may send it (Replicator::hold()).
    bool reply_relayable = true;
    std::vector<HotKeyCount> hot_keys;  // every shard's, for HOT_KEYS_REPLY
    std::vector<std::uint8_t> hot_key_entries;
    // handle()'s time per datagram; written by this worker's thread only.
    AtomicLatencyHistogram latency;
    // When this worker last ticked (after draining its socket), for the
    // replicator's silence: written by this worker, read by worker 0.
    std::atomic<std::int64_t> ticked_ns{0};
  };
  static void count(std::atomic<std::uint64_t>& c) noexcept { DispatchCounters::count(c); }
  // `arrived`: the clock when handle() took the datagram (one reading serves
  // both the shards' time and the latency histogram).
  void decide(Worker& w, std::span<const std::uint8_t> bytes, const Peer& peer,
              std::chrono::nanoseconds arrived, std::vector<OutDatagram>& replies);
  // Steps 1 to 3 of handle(): authentication, decoding into w.request (and
  // w.reply's header), the anti-amplification check against `bound`, the
  // largest immediate reply. False when the datagram was dropped or
  // answered whole; `bytes` becomes the opened one.
  bool admit(Worker& w, std::span<const std::uint8_t>& bytes, Peer& peer,
             std::vector<OutDatagram>& replies, std::size_t& bound);
  // Forces w.tenant's key id into every owner of w.request when the
  // tenants' owners are scoped (TenantGate::Reader::scope()).
  static void scope_owners(Worker& w) noexcept;
  // Item `item` (`m`) of w.request, one key's request, on its shard: false
  // when it waits (queued) and `reply` is not an answer yet. `slack` is the
  // padding left for a page, `paged` whether a holder page was given.
  bool decide_key(Worker& w, const Message& m, std::size_t item, std::size_t datagram_size,
                  const Peer& peer, std::int64_t now, std::size_t& slack, bool& paged,
                  Message& reply);
  // Answers every item of a request that is too small for its answers.
  void refuse_unpadded(Worker& w, std::size_t budget, const Peer& peer,
                       std::vector<OutDatagram>& replies);
  // With replication, a reply that grants or releases waits for the
  // backups of `buckets` (those of its items; empty: of every bucket);
  // `relayable`: a backup may send it (Replicator::hold()).
  void send_reply(Worker& w, std::size_t budget, const Peer& peer,
                  std::vector<OutDatagram>& replies, std::span<const std::uint32_t> buckets = {},
                  bool relayable = false);
  void send_deferred(Worker& w, std::vector<OutDatagram>& replies) noexcept;
  void fill_stats(Worker& w, const Message& request, std::size_t slack, Message& reply);
  // MAP_REPLY: the gate's map, as many members from request.first_member as
  // `slack` bytes allow.
  void fill_map(Worker& w, const Message& request, std::size_t slack, Message& reply);
  // Adds `shard`'s counters and gauges (leases, keys, waiters) to
  // `counters`; under the shard's lock.
  static void add_shard_values(const Shard& shard,
                               std::array<std::uint64_t, kStatCounterCount>& counters) noexcept;
  // Adds this dispatcher's counters and sets the server-wide gauges (uptime,
  // lock-delay left, version).
  void add_own_values(std::array<std::uint64_t, kStatCounterCount>& counters) const noexcept;
  // HOT_KEYS_REPLY: every shard's busiest keys, the busiest first, as many
  // as `slack` bytes allow.
  void fill_hot_keys(Worker& w, std::size_t slack, std::int64_t now, Message& reply);
  [[nodiscard]] std::int64_t now_ms() const;

  // Sends the answer to `d.multi` once its step has one (MultiDriver::resume()).
  void continue_many(Worker& w, const DeferredReply& d, std::vector<OutDatagram>& replies);

  DispatcherOptions options_;
  ServerClock clock_;  // options_.clock, or CLOCK_BOOTTIME without a call through it
  ShardSlots shards_;
  std::vector<std::unique_ptr<Worker>> workers_;
  DispatchCounters counters_;  // counted outside any shard
  // When inherit() last logged a failed takeover (the caller retries it on
  // every tick until it succeeds: logged once a second at most). Relaxed:
  // only the cluster thread calls inherit(), and a lost update costs one line.
  std::atomic<std::int64_t> takeover_refusal_logged_ms_{std::numeric_limits<std::int64_t>::min()};
  static constexpr std::uint32_t kBehindRetryMs = 20;
  // Shard 0's limits (TTL, wait, lock-delay): the same in every shard.
  ShardLimits limits_;
  // When the shards were made (LeaseServer makes them all at one now_ms):
  // STATS' uptime and the hot-key halvings count from it.
  std::int64_t started_ms_;
  // The gate MAP answers from (the shards have their own copies).
  mutable Mutex gate_mu_;
  std::shared_ptr<const ClusterGate> gate_ SHARDLOCK_GUARDED_BY(gate_mu_);
  // gate_->epoch, 0 without a gate: a request carrying a newer epoch meets
  // a node that has not seen that map yet. Relaxed: a hint, read per datagram;
  // the grant decisions themselves read the shards' gates under their locks.
  std::atomic<std::uint64_t> gate_epoch_{0};

  // ACQUIRE_MANY; after the members it refers to (Env).
  MultiDriver many_;
};

}  // namespace shardlock::lease::internal
