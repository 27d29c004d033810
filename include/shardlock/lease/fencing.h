// fencing.h: FencingValidator, the resource side of fencing tokens.
//
// It runs in the protected resource, not in the lease service, so it sits
// beside the lease layer's rooms rather than in wire/.
//
// A lease can end without its holder knowing (a GC pause, a stalled VM, a
// partition): the server hands the key to someone else while the old holder
// still believes it may write. Leases alone cannot prevent that late write
// (Kleppmann, "How to do distributed locking", 2016). The resource can: every
// write carries the lease's fencing token, and the resource refuses any token
// lower than the highest it has accepted for that key.
//
//   shardlock::lease::FencingValidator fence;
//   if (!fence.check_and_advance(key, request.token)) return Status::kStaleToken;
//   store.write(key, request.value);   // still under the caller's own ordering
//
// Tokens are strictly increasing per server shard, and a key always lives on
// one shard, so for one key a newer lease always carries a larger token.
//
// Design
//   * Built on LockTable<Mutex>: the key's stripe lock guards that stripe's
//     map of key -> highest accepted token. Memory grows with the number of
//     distinct keys seen (forget() drops one).
//   * check_and_advance is linearizable per key: two concurrent calls for a
//     key are ordered by the stripe lock, and the later one sees the
//     earlier's token.
//   * An equal token is accepted: it is the same holder writing again.
//   * In-memory only: after a restart of the resource process every key
//     starts afresh. Persist highest() next to the data if the resource must
//     stay fenced across its own restarts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

#include "shardlock/lease/wire/internal/string_key.h"
#include "shardlock/lock_table.h"
#include "shardlock/mutex.h"

namespace shardlock::lease {

class FencingValidator {
 public:
  // `stripes`: lock stripes (0 = LockTable's default for this machine).
  explicit FencingValidator(std::size_t stripes = 0);
  ~FencingValidator();
  FencingValidator(const FencingValidator&) = delete;
  FencingValidator& operator=(const FencingValidator&) = delete;

  // Accepts (returns true, and remembers `token` as the key's highest) iff
  // `token` >= the highest token accepted for `key` so far, or `key` is new.
  // Returns false, changing nothing, for a lower (stale) token. Thread-safe;
  // blocks only on the key's stripe lock.
  [[nodiscard]] bool check_and_advance(std::string_view key, std::uint64_t token);

  // The highest token accepted for `key`, if any. Thread-safe.
  [[nodiscard]] std::optional<std::uint64_t> highest(std::string_view key) const;

  // Forgets `key` (its next token is accepted whatever it is). Thread-safe.
  void forget(std::string_view key);

 private:
  // Guarded by the LockTable stripe of the same index (the analysis cannot
  // express a lock chosen by hash at run time).
  struct alignas(64) StripeTokens {
    std::unordered_map<std::string, std::uint64_t, internal::StringKeyHash,
                       internal::StringKeyEqual>
        highest;
  };

  mutable LockTable<Mutex> table_;
  std::unique_ptr<StripeTokens[]> stripes_;
};

}  // namespace shardlock::lease
