// The one libsodium start-up that auth.cc and envelope.cc share. Not API.
#pragma once

namespace shardlock::lease::internal {

// Runs sodium_init() once, before a caller's first call into libsodium.
// Thread-safe; aborts when the system cannot provide randomness at all.
void ensure_sodium() noexcept;

}  // namespace shardlock::lease::internal
