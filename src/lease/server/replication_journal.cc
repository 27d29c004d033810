// One shard's replication journal. See internal/replication_journal.h.
#include "shardlock/lease/server/internal/replication_journal.h"

#include <new>
#include <string>
#include <utility>

namespace shardlock::lease::internal {

replication::Entry ReplicationJournal::entry(replication::EntryKind kind, std::size_t bucket,
                                             const JournaledHolder& holder, std::uint32_t ttl_ms) {
  replication::Entry e;
  e.kind = kind;
  e.bucket = static_cast<std::uint32_t>(bucket);
  e.key = std::string(holder.key);
  e.owner = holder.owner;
  e.token = holder.token;
  if (kind == replication::EntryKind::kGrant) {
    e.request_id = holder.request_id;
    e.mode = holder.mode;
    e.permits = holder.permits;
    e.ttl_ms = ttl_ms;
    e.value = std::string(holder.value);
  }
  return e;
}

bool ReplicationJournal::record(const ClusterGate& gate, replication::EntryKind kind,
                                const JournaledHolder& holder, std::uint32_t ttl_ms) noexcept {
  const std::size_t bucket = gate.bucket_of(holder.key);
  if (!gate.replicated_bucket(bucket)) return true;
  try {
    entries_.push_back(entry(kind, bucket, holder, ttl_ms));
  } catch (const std::bad_alloc&) {
    lost_ = true;  // take()'s caller starts the streams over from snapshots
    return false;
  }
  return true;
}

void ReplicationJournal::take(std::vector<replication::Entry>& out) {
  if (!lost_) {
    for (replication::Entry& e : entries_) out.push_back(std::move(e));
  }
  entries_.clear();
  lost_ = false;
}

}  // namespace shardlock::lease::internal
