// The shard's side of WATCH (protocol.h, "Watches"): answering one at once,
// parking it with the watch registry (watch_registry.h), and the view of the
// lease table the registry reads. See internal/shard.h.
#include <iterator>
#include <vector>

#include "shardlock/lease/server/internal/shard.h"

namespace shardlock::lease::internal {

KeyVersion Shard::version_of(const KeyState* state) noexcept {
  if (state == nullptr || state->holders.empty()) return {};
  return {state->holders.back().token, static_cast<std::uint32_t>(state->holders.size())};
}

KeyVersion Shard::WatchedTable::version(const KeyRef& key) const noexcept {
  const auto it = shard_.keys_.find(key);
  return version_of(it == shard_.keys_.end() ? nullptr : &it->second);
}

void Shard::WatchedTable::describe(const KeyRef& key, std::size_t room, std::int64_t now_ms,
                                   std::vector<std::uint8_t>& entries, Message& summary) const {
  const auto it = shard_.keys_.find(key);
  list_newest(it == shard_.keys_.end() ? nullptr : &it->second, room, now_ms, entries, summary);
}

void Shard::list_newest(const KeyState* state, std::size_t room, std::int64_t now_ms,
                        std::vector<std::uint8_t>& entries, Message& reply) {
  reply.type = MessageType::kHoldersReply;
  reply.first_holder = 0;
  reply.holder_list_count = 0;
  if (state == nullptr) return;
  reply.mode = key_mode(*state);
  reply.permits = state->permits;
  reply.waiters = static_cast<std::uint32_t>(state->waiters.size());
  reply.holders = static_cast<std::uint32_t>(state->holders.size());
  const auto entry_of = [now_ms](const Holder& h) {
    return HolderEntry{.owner = h.owner,
                       .token = h.token,
                       .ttl_left_ms = ttl_left(h, now_ms),
                       .flags = h.pending ? kHolderFlagPending : std::uint8_t{0},
                       .value = h.value};
  };
  // Back from the newest while the entries fit, then out oldest first.
  auto first = state->holders.end();
  std::size_t bytes = 0;
  std::uint8_t listed = 0;
  while (first != state->holders.begin() && listed < 0xFF) {
    const std::size_t size = holder_entry_size(entry_of(*std::prev(first)));
    if (bytes + size > room) break;
    bytes += size;
    ++listed;
    --first;
  }
  reply.first_holder = reply.holders - listed;
  for (auto it = first; it != state->holders.end(); ++it) {
    if (!append_holder_entry(entry_of(*it), entries)) break;  // a value the codec refuses
    ++reply.holder_list_count;
  }
}

void Shard::watch(const RequestContext& ctx, const KeyState* state, ShardReply& out,
                  HolderPage* page) {
  const Message& request = ctx.request;
  Message& reply = out.message();
  if (request.wait_ms == 0 || !(version_of(state) == KeyVersion{request.token, request.holders})) {
    if (page == nullptr) {
      std::vector<std::uint8_t> none;  // no room: stays empty, allocates nothing
      list_newest(state, 0, ctx.now_ms, none, reply);
    } else {
      page->entries.clear();
      list_newest(state, page->room, ctx.now_ms, page->entries, reply);
      reply.holder_list = page->entries;
    }
    return;
  }
  switch (watches_.park(ctx.client, ctx.peer, request, ctx.key, ctx.reply_credit, ctx.now_ms)) {
    case WatchRegistry::Park::kParked:
      out.park();
      return;
    case WatchRegistry::Park::kAlreadyParked:
      count(StatCounter::kRetransmits);
      out.park();
      return;
    case WatchRegistry::Park::kRefused:
      out.refuse();
      return;
    case WatchRegistry::Park::kTenantRefused:
      out.refuse(WireError::kTenantWatchLimit);
      return;
  }
}

}  // namespace shardlock::lease::internal
