// reentrant.h: ReentrantLeases and ReentrantLease, reentrancy keyed to an
// owner over a LeaseClient, as Redisson's RLock, Curator's
// InterProcessMutex and Hazelcast's FencedLock offer it: a second acquire of
// a key the owner already holds returns the same grant (same fencing token)
// and counts one more hold, and only the last release lets the key go.
//
//   shardlock::lease::ReentrantLeases leases(client);   // one per LeaseClient
//   auto outer = leases.acquire("orders/42", 10s, 2s, watch);
//   if (!outer) { /* outer.error, as LeaseClient::acquire() */ }
//   {
//     auto inner = leases.acquire("orders/42", 10s, 2s);  // no round trip
//     assert(inner.lease.token() == outer.lease.token());
//     assert(inner.lease.hold_count() == 2);
//   }                                      // one hold fewer; still held
//   outer.lease.release();                 // the last hold: RELEASE is sent
//
// Who the owner is. The owner is the LeaseClient's client id, not a thread:
// every thread that acquires through one ReentrantLeases shares its holds.
// That is what makes code that calls itself through a lock helper work, and
// it is also why this is the wrong tool when
//   * the holders are threads of one process that must exclude each other:
//     the second thread is let in at once. Use a Mutex or a LockTable in
//     the process (and one lease for the process), or a LeaseClient per
//     thread;
//   * a holder must not be let in until another holder is done with the
//     resource (the two do not trust each other's progress, or one might
//     still be writing): a reentrant acquire never waits for the other;
//   * the holders need fencing tokens that tell them apart: every hold
//     carries the same token, so a resource that checks tokens cannot order
//     two holds of one grant, nor reject a late write from the first.
// Two ReentrantLeases over one LeaseClient do not know each other's holds:
// each takes its own grant, and the later one supersedes the earlier (as two
// plain acquires do); so does a plain LeaseClient::acquire() of a key held
// here. Keep one per LeaseClient, and take its keys only through it.
//
// Design. A mutex-guarded map from key to the shared hold of one grant: a
// Lease and its hold count. The first acquire of a key inserts the hold as
// "acquiring" and sends ACQUIRE without the map's lock; other acquires of the
// key meanwhile wait (bounded by their own wait) for it to settle, then join
// it or, if it failed, try themselves. A hold whose Lease is no longer
// valid() (lost, or past its client-side expiry) is not joined: the next
// acquire takes a new grant with a new token, and the handles of the old
// one stay invalid. Each hold has its own mutex, so a handle's calls never
// wait for another key.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <system_error>

#include "shardlock/lease/client/client.h"

namespace shardlock::lease {

class ReentrantLeases;
namespace internal {
struct ReentrantHold;
struct ReentrantTable;
}  // namespace internal

// One hold of a reentrant grant. Move-only; empty after a move or default
// construction. Destroying a non-empty handle drops its hold as release()
// does, except that when it is the last hold the RELEASE is sent in the
// background (as destroying a Lease does). Its methods may be called from
// any thread, but a handle is one object: do not call them concurrently
// with its destruction or a move.
class ReentrantLease {
 public:
  ReentrantLease() noexcept;
  ReentrantLease(ReentrantLease&&) noexcept;
  ReentrantLease& operator=(ReentrantLease&&) noexcept;
  ReentrantLease(const ReentrantLease&) = delete;
  ReentrantLease& operator=(const ReentrantLease&) = delete;
  ~ReentrantLease();

  [[nodiscard]] bool empty() const noexcept { return hold_ == nullptr; }
  // True while the grant is held: as Lease::valid(). Every handle of one
  // grant answers alike; once the grant is lost, all of them are false for
  // good. Never blocks for long.
  [[nodiscard]] bool valid() const noexcept;
  // How many handles hold this grant now (this one included); 0 when
  // empty. Another thread may change it at any moment.
  [[nodiscard]] std::size_t hold_count() const noexcept;
  // The grant: key, token (the same for every hold), expiry, ttl, owner. An
  // empty Lease for an empty handle. Its const methods only; valid until
  // this handle is released or destroyed.
  [[nodiscard]] const Lease& lease() const noexcept;
  [[nodiscard]] const std::string& key() const noexcept { return lease().key(); }
  [[nodiscard]] std::uint64_t token() const noexcept { return lease().token(); }

  // Renews the grant, for every hold (Lease::renew()). Blocks up to
  // request_timeout. kLeaseInactive when empty, released or lost.
  std::error_code renew(std::chrono::milliseconds ttl = std::chrono::milliseconds{0});
  // Drops this hold; the handle is empty afterwards. When it was the last
  // hold, releases the grant and blocks like Lease::release(), returning its
  // answer (for a lost grant, the server's refusal: it no longer has it);
  // otherwise returns at once, success, and the key stays held.
  // kLeaseInactive when empty.
  std::error_code release();

 private:
  friend class ReentrantLeases;
  ReentrantLease(std::shared_ptr<internal::ReentrantTable> table,
                 std::shared_ptr<internal::ReentrantHold> hold) noexcept;
  // Drops the hold; the last one's Lease is handed back to the caller to
  // release (empty otherwise).
  Lease drop_hold() noexcept;

  std::shared_ptr<internal::ReentrantTable> table_;  // to forget the key at the last release
  std::shared_ptr<internal::ReentrantHold> hold_;
};

// The outcome of ReentrantLeases::acquire(): a handle, or why not.
struct ReentrantAcquireResult {
  std::error_code error;  // empty exactly when `lease` holds the key
  ReentrantLease lease;
  bool reentered = false;  // joined a grant this owner already held
  // As AcquireResult's, from the ACQUIRE that failed.
  std::uint32_t holder_ttl_left_ms = 0;
  std::uint32_t retry_after_ms = 0;
  WireError wire_error = WireError::kInternal;
  explicit operator bool() const noexcept { return !error; }
};

// Reentrant exclusive leases of one owner: the LeaseClient's client id.
// Thread-safe. Must not outlive `client`; handles may (they become inert
// with the client's Leases).
class ReentrantLeases {
 public:
  explicit ReentrantLeases(LeaseClient& client);
  ReentrantLeases(const ReentrantLeases&) = delete;
  ReentrantLeases& operator=(const ReentrantLeases&) = delete;
  ~ReentrantLeases();

  // An exclusive hold of `key`. If this object holds a valid grant of `key`,
  // returns a handle of that grant (same token, reentered true, hold count
  // up by one) without a round trip: `ttl`, `wait` and `lease_options` are
  // then ignored (the grant keeps the TTL, watchdog and on_lost it was
  // granted with; renew() a handle for more time). Otherwise acquires as
  // LeaseClient::acquire() (blocking up to wait + request_timeout, the same
  // errors) and the grant's on_lost fires once for all its holds.
  //
  // While another thread's acquire of the key is in flight, this one waits
  // for it up to `wait` and then joins its grant, or, if it failed, tries
  // itself with the wait left; a wait that runs out first is kTimeout
  // (kBusy with no wait).
  [[nodiscard]] ReentrantAcquireResult acquire(std::string_view key, std::chrono::milliseconds ttl,
                                               std::chrono::milliseconds wait,
                                               LeaseOptions lease_options = {});
  [[nodiscard]] ReentrantAcquireResult try_acquire(std::string_view key,
                                                   std::chrono::milliseconds ttl,
                                                   LeaseOptions lease_options = {}) {
    return acquire(key, ttl, std::chrono::milliseconds{0}, std::move(lease_options));
  }
  // How many handles hold this object's current grant of `key` (0: none, or
  // an acquire of it is still in flight). A lost grant still counts its
  // handles until they are dropped.
  [[nodiscard]] std::size_t hold_count(std::string_view key) const;

 private:
  LeaseClient& client_;
  std::shared_ptr<internal::ReentrantTable> table_;
};

}  // namespace shardlock::lease
