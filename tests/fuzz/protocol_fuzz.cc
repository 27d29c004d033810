// libFuzzer target for the lease codec: any bytes must decode to a datagram
// or an error without reading outside the input; whatever decodes must
// re-encode, decode again to the same messages, and respect the
// anti-amplification bound.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <vector>

#include "shardlock/lease/wire/protocol.h"

using shardlock::lease::Datagram;
using shardlock::lease::ProtocolError;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  // Copy so the decoder sees a buffer whose end ASan guards exactly.
  std::vector<std::uint8_t> in(data, data + size);
  static Datagram first;
  if (shardlock::lease::decode(in, first) != ProtocolError::kOk) return 0;

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
