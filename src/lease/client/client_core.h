// ClientCore: what one LeaseClient shares with its Leases (the setup, the
// call engine, the watchdog and the drift margin). Private to src/lease/.
//
// Threading: start() runs once, before any other thread uses the core, and
// is the only writer of setup, error_detail and margin; afterwards they are
// read-only, and the engine's and the watchdog's own rules apply. shutdown()
// runs once, from ~LeaseClient, on neither of the client's threads.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <system_error>
#include <utility>

#include "client/call_engine.h"
#include "client/watchdog.h"
#include "shardlock/lease/client/client.h"

namespace shardlock::lease::internal {

struct ClientCore {
  explicit ClientCore(LeaseClientOptions options) { setup.options = std::move(options); }

  // Resolves the nodes, picks the client id and first request id, opens the
  // socket and starts the I/O thread. On error error_detail says why.
  std::error_code start();
  // start()'s step: setup.id, from options.client_id or random, with a
  // tenant's key id in its top 32 bits.
  std::error_code choose_identity();
  // Stops both threads; what is outstanding completes with kNotStarted.
  void shutdown();
  // The sync wrapper: submits `call` and blocks the calling thread until it
  // completes. Not from the I/O thread.
  CallResult call_sync(std::unique_ptr<Call> call);
  // A fresh owner for one lease handle (handle_owner() of the client id and
  // the next handle count), never the client id itself. Any thread.
  ClientId next_owner() noexcept;

  ClientSetup setup;
  std::string error_detail;
  DriftMargin margin;
  CallEngine engine{setup};
  Watchdog watchdog{engine};
  // Handles made so far (next_owner()); relaxed: only its uniqueness
  // matters, which the atomic increment gives on its own. 32 bits wrap
  // after 2^32 acquires, harmlessly: a holder's second acquire is a
  // contender like another's, and its token still tells its grants apart.
  std::atomic<std::uint32_t> handles{0};
};

// Marks `state` released (returning whether it was still held or lost, so a
// RELEASE is worth sending), then waits for a lost callback that is running,
// unless this is the callback's own thread (core's watchdog).
bool close_lease(ClientCore& core, LeaseState& state);

// One RELEASE of the lease's own token, not waited for. The token is this
// Lease's alone (the server re-grants with a new token), so it can free no
// other grant.
void send_release(ClientCore& core, LeaseState& state) noexcept;

}  // namespace shardlock::lease::internal
