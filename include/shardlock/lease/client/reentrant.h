// reentrant.h: ReentrantLeases and ReentrantLease, reentrant exclusive
// leases over a LeaseClient, as Redisson's RLock, Curator's
// InterProcessMutex and Hazelcast's FencedLock offer them: a second acquire
// of a key by the thread that already holds it returns the same grant (same
// fencing token) and counts one more hold, and only the last release lets
// the key go.
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
// Who the owner is (ReentrancyScope):
//   * kThread, the default (Redisson's rule): the acquiring thread. The same
//     thread re-enters; another thread of the process is a contender like
//     another process: its acquire waits at the server, in FIFO order,
//     until the last hold is released (or is refused with no wait). A
//     handle may be released from any thread, but the hold stays the
//     acquiring thread's: a handle handed to another thread that then
//     acquires the key again waits for the grant it holds itself, until
//     its wait runs out.
//   * kClient: every thread that acquires through this object shares its
//     holds (what this class did before this release). That is what code that hands
//     work between threads under one lock may want, and it is the wrong
//     tool when
//       - the holders are threads that must exclude each other: the second
//         thread is let in at once;
//       - a holder must not be let in until another holder is done with the
//         resource (the two do not trust each other's progress): a
//         reentrant acquire never waits for the other;
//       - the holders need fencing tokens that tell them apart: every hold
//         carries the same token, so a resource that checks tokens cannot
//         order two holds of one grant, nor reject a late write from the
//         first.
// Each grant is its own owner (LeaseOptions::owner), so two ReentrantLeases
// over one LeaseClient, or a plain LeaseClient::acquire() of a key held
// here, exclude each other as two processes do.
//
// Design. A mutex-guarded map from (thread, key) to the shared hold of one
// grant: a Lease and its hold count (kClient uses one thread id for all).
// The first acquire of a slot inserts the hold as "acquiring" and sends
// ACQUIRE without the map's lock; other acquires of the slot meanwhile (only
// kClient has them: one thread has one acquire at a time) wait, bounded by
// their own wait, for it to settle, then join it or, if it failed, try
// themselves. A hold whose Lease is no longer valid() (lost, or past its
// client-side expiry) is not joined: the next acquire takes a new grant with
// a new token, and the handles of the old one stay invalid. Each hold has
// its own mutex, so a handle's calls never wait for another key.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>

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

// Who shares a reentrant grant (reentrant.h, "Who the owner is").
enum class ReentrancyScope : std::uint8_t {
  kThread,  // the thread that acquired it: another thread waits (default)
  kClient,  // every thread using the ReentrantLeases object
};

// Reentrant exclusive leases over one LeaseClient, per thread by default.
// Thread-safe. Must not outlive `client`; handles may (they become inert
// with the client's Leases).
class ReentrantLeases {
 public:
  explicit ReentrantLeases(LeaseClient& client, ReentrancyScope scope = ReentrancyScope::kThread);
  ReentrantLeases(const ReentrantLeases&) = delete;
  ReentrantLeases& operator=(const ReentrantLeases&) = delete;
  ~ReentrantLeases();

  // An exclusive hold of `key`. If the calling thread (kClient: this
  // object) holds a valid grant of `key`, returns a handle of that grant
  // (same token, reentered true, hold count up by one) without a round
  // trip: `ttl`, `wait` and `lease_options` are then ignored (the grant
  // keeps the TTL, watchdog and on_lost it was granted with; renew() a
  // handle for more time). Otherwise acquires as LeaseClient::acquire(), as
  // a fresh owner (blocking up to wait + request_timeout, the same errors;
  // under kThread a grant another thread holds is waited for like any
  // holder's) and the grant's on_lost fires once for all its holds.
  //
  // kClient only: while another thread's acquire of the key is in flight,
  // this one waits for it up to `wait` and then joins its grant, or, if it
  // failed, tries itself with the wait left; a wait that runs out first is
  // kTimeout (kBusy with no wait).
  [[nodiscard]] ReentrantAcquireResult acquire(std::string_view key, std::chrono::milliseconds ttl,
                                               std::chrono::milliseconds wait,
                                               LeaseOptions lease_options = {});
  [[nodiscard]] ReentrantAcquireResult try_acquire(std::string_view key,
                                                   std::chrono::milliseconds ttl,
                                                   LeaseOptions lease_options = {}) {
    return acquire(key, ttl, std::chrono::milliseconds{0}, std::move(lease_options));
  }
  // How many handles hold the calling thread's (kClient: this object's)
  // current grant of `key` (0: none, or an acquire of it is still in
  // flight). A lost grant still counts its handles until they are dropped.
  [[nodiscard]] std::size_t hold_count(std::string_view key) const;
  [[nodiscard]] ReentrancyScope scope() const noexcept { return scope_; }

 private:
  // The table's thread for the calling thread under scope_.
  [[nodiscard]] std::thread::id holder_thread() const noexcept;

  LeaseClient& client_;
  const ReentrancyScope scope_;
  std::shared_ptr<internal::ReentrantTable> table_;
};

}  // namespace shardlock::lease
