// libFuzzer target for the lease codec and its sealed envelope: any bytes
// must decode to a datagram or an error, and open as a sealed datagram or be
// refused, without reading outside the input; whatever decodes must
// re-encode, decode again to the same messages, respect the
// anti-amplification bound, and, sealed in each envelope form (the AES-GCM
// ones where the CPU has AES-NI), open to itself and be refused with any
// one bit flipped.
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <vector>

#include "shardlock/lease/wire/envelope.h"
#include "shardlock/lease/wire/protocol.h"

using shardlock::lease::Datagram;
using shardlock::lease::EnvelopeMode;
using shardlock::lease::ProtocolError;

namespace {

namespace lease = shardlock::lease;

const lease::EnvelopeKey& fuzz_key() {
  static const lease::EnvelopeKey key = lease::envelope_key(lease::AuthKey{1, 2, 3, 4});
  return key;
}

bool same(std::span<const std::uint8_t> a, std::span<const std::uint8_t> b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end());
}

// Any bytes as a sealed datagram: a header flag byte and a trailer of any
// shape. Both ways of opening agree, and what opens (only what peek_key_id()
// reads) has its envelope bits cleared.
void open_as_envelope(std::span<const std::uint8_t> in) {
  static std::array<std::uint8_t, lease::kMaxDatagramSize + lease::kMaxEnvelopeOverhead + 64> out;
  const auto id = lease::peek_key_id(in);
  const auto opened = lease::open_with(in, fuzz_key(), out);
  std::vector<std::uint8_t> copy(in.begin(), in.end());
  const auto opened_here = lease::open_in_place(copy, fuzz_key());
  if (!same(opened, opened_here)) std::abort();
  if (!opened.empty() &&
      (!id || (opened[lease::kHeaderFlagsOffset] &
               (lease::kFlagKeyId | lease::kFlagEncrypted | lease::kFlagAes)) != 0)) {
    std::abort();
  }
}

// A datagram that decodes, sealed in each form under a key id taken from its
// request id, opens to itself (marked authenticated), and is refused with
// one bit flipped where its own bytes say.
void seal_and_open(std::span<const std::uint8_t> in) {
  std::vector<std::uint8_t> expected(in.begin(), in.end());
  expected[lease::kHeaderFlagsOffset] |= lease::kFlagAuthenticated;
  const std::uint32_t request_key_id =
      static_cast<std::uint32_t>(in[8]) | static_cast<std::uint32_t>(in[9]) << 8 |
      static_cast<std::uint32_t>(in[10]) << 16 | static_cast<std::uint32_t>(in[11]) << 24;
  static std::array<std::uint8_t, lease::kMaxDatagramSize + lease::kMaxEnvelopeOverhead> out;
  for (const EnvelopeMode mode :
       {EnvelopeMode::kLegacy, EnvelopeMode::kAuthenticated, EnvelopeMode::kEncrypted,
        EnvelopeMode::kAuthenticatedAes, EnvelopeMode::kEncryptedAes}) {
    // The AES forms only where this CPU has AES-NI (elsewhere seal_for()
    // refuses them, as envelope_test checks).
    if (lease::envelope_uses_aes(mode) && !lease::aes_gcm_available()) continue;
    const std::uint32_t key_id = mode == EnvelopeMode::kLegacy ? 0 : request_key_id;
    std::vector<std::uint8_t> sealed(in.size() + lease::envelope_overhead(mode));
    std::copy(in.begin(), in.end(), sealed.begin());
    if (lease::seal_for(sealed, in.size(), key_id, fuzz_key(), mode) != sealed.size()) std::abort();
    if (lease::peek_key_id(sealed) != lease::EnvelopeKeyId{key_id, mode}) std::abort();
    if (!same(lease::open_with(sealed, fuzz_key(), out), expected)) std::abort();
    const std::size_t at = (std::size_t{in.back()} * 131 + in.size()) % sealed.size();
    sealed[at] ^= static_cast<std::uint8_t>(1U << (in[in.size() / 2] % 8));
    if (!lease::open_with(sealed, fuzz_key(), out).empty()) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  // Copy so the decoder sees a buffer whose end ASan guards exactly.
  std::vector<std::uint8_t> in(data, data + size);
  open_as_envelope(in);
  static Datagram first;
  if (shardlock::lease::decode(in, first) != ProtocolError::kOk) return 0;
  seal_and_open(in);

  // A STATS_REPLY may carry another number of counters than this version
  // knows (an older or newer server); an encoder writes exactly this
  // version's, so such a datagram does not re-encode.
  bool has_stats_reply = false;
  for (const auto& m : first.items()) {
    has_stats_reply |= m.type == shardlock::lease::MessageType::kStatsReply;
  }
  std::vector<std::uint8_t> out(shardlock::lease::kMaxDatagramSize);
  std::size_t written = 0;
  const ProtocolError encoded = shardlock::lease::encode(first, out, written);
  if (has_stats_reply && encoded != ProtocolError::kOk) return 0;
  if (encoded != ProtocolError::kOk) std::abort();
  if (written > size && !has_stats_reply) std::abort();  // padding dropped: never grows
  out.resize(written);

  static Datagram second;
  if (shardlock::lease::decode(out, second) != ProtocolError::kOk) std::abort();
  if (second.count != first.count || second.batch != first.batch || second.epoch != first.epoch) {
    std::abort();
  }
  for (std::size_t i = 0; i < first.count; ++i) {
    const auto& a = first.messages[i];
    const auto& b = second.messages[i];
    if (a.type != b.type || a.request_id != b.request_id || a.key != b.key || a.token != b.token ||
        a.ttl_ms != b.ttl_ms || a.epoch != b.epoch || a.member_list_count != b.member_list_count ||
        a.member_list.size() != b.member_list.size() || a.first_holder != b.first_holder ||
        a.value != b.value || a.owner != b.owner || a.holder_list_count != b.holder_list_count ||
        a.holder_list.size() != b.holder_list.size() || a.window_ms != b.window_ms ||
        a.hot_key_count != b.hot_key_count || a.hot_key_list.size() != b.hot_key_list.size()) {
      std::abort();
    }
    // A decoded holder list walks entry by entry to its count, each within
    // the bounds decode() checked.
    std::size_t holders = 0;
    for (const auto& h : shardlock::lease::HolderList(a)) {
      if (h.value.size() > shardlock::lease::kMaxHolderValueLength) std::abort();
      ++holders;
    }
    if (holders != a.holder_list_count) std::abort();
    // A decoded hot-key list likewise: every key in bounds, no error above
    // its count.
    std::size_t hot_keys = 0;
    for (const auto& k : shardlock::lease::HotKeyList(a)) {
      if (k.key.empty() || k.key.size() > shardlock::lease::kMaxKeyLength || k.error > k.requests) {
        std::abort();
      }
      ++hot_keys;
    }
    if (hot_keys != a.hot_key_count) std::abort();
  }
  if (shardlock::lease::max_reply_size(first) < shardlock::lease::kHeaderSize) std::abort();
  return 0;
}
