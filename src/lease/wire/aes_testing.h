// A switch for tests: makes this process act as a host without AES-NI, so
// the AES envelope forms' refusal paths run where the CPU has it. Not API.
#pragma once

namespace shardlock::lease::internal {

// While `hidden`, aes_gcm_available() (envelope.h) is false: seal_for()
// refuses the AES forms, open_with() drops them, and tenant_envelope_mode()
// picks the portable suite for kAuto. Thread-safe; a test flips it between
// phases it orders itself.
void hide_aes_gcm_for_testing(bool hidden) noexcept;

}  // namespace shardlock::lease::internal
