// ReplicationJournal: one shard's replication entries (replication.h) not
// yet handed to the streams, in the order its holders changed.
//
// Under a gate that marks a key's bucket replicated, every holder the shard
// adds (a grant, a hand-off, a part of an ACQUIRE_MANY, a takeover) or drops
// (released, expired, abandoned) is recorded here; the caller moves the
// entries into the replication streams under the shard's lock
// (Shard::take_journal()), so entries of one key reach the backups in order.
// An entry that cannot be allocated is not dropped silently: the journal is
// marked lost and the caller starts the node's streams over from snapshots.
//
// Not API: Shard's building block. Not thread-safe (the shard lock guards
// it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "shardlock/lease/server/internal/cluster_gate.h"
#include "shardlock/lease/server/internal/replication.h"
#include "shardlock/lease/wire/protocol.h"

namespace shardlock::lease::internal {

// The fields of a holder that an entry carries, viewed from the shard's
// holder record (valid for the call it is passed to).
struct JournaledHolder {
  std::string_view key;
  ClientId owner;
  std::uint64_t token = 0;
  std::uint64_t request_id = 0;  // of the granting ACQUIRE
  LeaseMode mode = LeaseMode::kExclusive;
  std::uint32_t permits = 0;  // the key's semaphore limit; 0 for a lock key
  std::string_view value;
};

class ReplicationJournal {
 public:
  // Whether `gate` replicates any bucket, so a holder change may need an
  // entry: the request path's one test when nothing is replicated.
  [[nodiscard]] static bool replicates(const ClusterGate* gate) noexcept {
    return gate != nullptr && !gate->replicated.empty() && gate->routing != nullptr;
  }

  // Records `kind` (kGrant: added, with `ttl_ms`; kRelease: dropped) for
  // `holder` when `gate` replicates its key's bucket. Never throws: false
  // when the entry could not be allocated (lost() is then set; the caller
  // counts the failure). Precondition: replicates(&gate).
  [[nodiscard]] bool record(const ClusterGate& gate, replication::EntryKind kind,
                            const JournaledHolder& holder, std::uint32_t ttl_ms) noexcept;

  // The entry of `holder` in `bucket`: kGrant carries the grant's fields,
  // kRelease only who and which token. May throw std::bad_alloc.
  [[nodiscard]] static replication::Entry entry(replication::EntryKind kind, std::size_t bucket,
                                                const JournaledHolder& holder,
                                                std::uint32_t ttl_ms);

  // Moves the entries recorded since the last call to the back of `out`,
  // or, when lost(), drops them (the caller resends snapshots); clears
  // lost(). May throw std::bad_alloc growing `out`.
  void take(std::vector<replication::Entry>& out);
  // An entry could not be recorded since the last take().
  [[nodiscard]] bool lost() const noexcept { return lost_; }
  // Something for take(): entries, or a loss to report.
  [[nodiscard]] bool pending() const noexcept { return lost_ || !entries_.empty(); }

 private:
  std::vector<replication::Entry> entries_;
  bool lost_ = false;
};

}  // namespace shardlock::lease::internal
