// One shard's parked WATCHes. See internal/watch_registry.h.
#include "shardlock/lease/server/internal/watch_registry.h"

#include <iterator>
#include <new>
#include <string>
#include <utility>

#include "shardlock/lease/server/internal/deferred_reply.h"

namespace shardlock::lease::internal {

WatchRegistry::WatchRegistry(const Limits& limits, std::uint64_t seed, TimerWheel& wheel,
                             ClientUsage& usage, const WatchedKeys& keys, ShardCounters& counters)
    : limits_(limits),
      wheel_(wheel),
      usage_(usage),
      keys_(keys),
      counters_(counters),
      index_(16, SeededHash{seed}) {}

WatchRegistry::~WatchRegistry() {
  for (auto& [key, list] : lists_) {
    for (Watch& w : list.watches) wheel_.cancel(w);
  }
}

WatchRegistry::Park WatchRegistry::park(const ClientId& client, const Peer& peer,
                                        const Message& request, const KeyRef& key,
                                        std::uint16_t reply_credit, std::int64_t now_ms) {
  const RequestKey id{client, request.request_id};
  if (index_.contains(id)) return Park::kAlreadyParked;
  auto list_it = lists_.find(key);
  if (index_.size() >= limits_.max_watches ||
      (list_it != lists_.end() && list_it->second.watches.size() >= limits_.max_watches_per_key)) {
    return Park::kRefused;
  }
  if (const auto refusal = usage_.watch_refusal(client)) {
    return *refusal == WireError::kTenantWatchLimit ? Park::kTenantRefused : Park::kRefused;
  }
  // Everything that allocates first, undone on a throw: the registry is
  // then as it was.
  const bool added = list_it == lists_.end();
  if (added) {
    list_it = lists_.try_emplace(HashedKey{std::string(key.text), key.hash}).first;
    list_it->second.key = &list_it->first;
  }
  WatchList& list = list_it->second;
  try {
    touched_.reserve(lists_.size());
    list.watches.emplace_back();
    try {
      index_.emplace(id, &list.watches.back());
      usage_.add_watch(client);
    } catch (...) {
      index_.erase(id);
      list.watches.pop_back();
      throw;
    }
  } catch (...) {
    if (added) lists_.erase(list_it);
    throw;
  }
  Watch& w = list.watches.back();
  w.self = std::prev(list.watches.end());
  w.list = &list;
  w.client = client;
  w.request_id = request.request_id;
  w.peer = peer;
  w.since = KeyVersion{request.token, request.holders};
  w.reply_credit = reply_credit;
  w.kind = kTimerKind;
  wheel_.schedule(w, now_ms + static_cast<std::int64_t>(request.wait_ms));
  return Park::kParked;
}

void WatchRegistry::touch_list(const KeyRef& key) noexcept {
  const auto it = lists_.find(key);
  if (it == lists_.end() || it->second.touched) return;
  it->second.touched = true;
  touched_.push_back(&it->second);  // within the capacity park() reserved
}

void WatchRegistry::wake_touched(std::int64_t now_ms,
                                 std::vector<DeferredReply>& deferred) noexcept {
  // Answering never touches a list, so touched_ stays as it is while this
  // walks it; emptied lists are erased afterwards.
  for (WatchList* list : touched_) {
    const KeyVersion now_version = keys_.version(KeyRef{list->key->text, list->key->hash});
    for (auto w = list->watches.begin(); w != list->watches.end();) {
      Watch& watch = *w++;
      if (watch.since == now_version) continue;
      wheel_.cancel(watch);
      answer(watch, false, 0, now_ms, deferred);
    }
  }
  for (WatchList* list : touched_) {
    list->touched = false;
    if (list->watches.empty()) lists_.erase(lists_.find(*list->key));
  }
  touched_.clear();  // keeps the capacity touch() relies on
}

std::string_view WatchRegistry::key_of(const TimerNode& node) noexcept {
  return static_cast<const Watch&>(node).list->key->text;
}

void WatchRegistry::expire(TimerNode& node, std::int64_t now_ms,
                           std::vector<DeferredReply>& deferred) noexcept {
  answer(static_cast<Watch&>(node), false, 0, now_ms, deferred);
}

void WatchRegistry::redirect(TimerNode& node, std::uint64_t epoch,
                             std::vector<DeferredReply>& deferred) noexcept {
  answer(static_cast<Watch&>(node), true, epoch, 0, deferred);
}

void WatchRegistry::answer(Watch& w, bool redirect, std::uint64_t epoch, std::int64_t now_ms,
                           std::vector<DeferredReply>& deferred) noexcept {
  try {
    DeferredReply out = addressed_to(w);
    out.key = w.list->key->text;
    if (redirect) {
      out.type = MessageType::kRedirect;
      out.epoch = epoch;
      counters_.count(StatCounter::kRedirects);
    } else {
      Message summary;
      keys_.describe(KeyRef{w.list->key->text, w.list->key->hash},
                     watch_reply_room(w.reply_credit, out.key.size()), now_ms, out.holder_entries,
                     summary);
      out.type = MessageType::kHoldersReply;
      out.mode = summary.mode;
      out.permits = summary.permits;
      out.waiters = summary.waiters;
      out.holders = summary.holders;
      out.first_holder = summary.first_holder;
      out.holder_list_count = summary.holder_list_count;
    }
    deferred.push_back(std::move(out));
  } catch (const std::bad_alloc&) {
    counters_.count(StatCounter::kAllocationFailures);  // its retransmission is answered afresh
  }
  retire(w);
}

void WatchRegistry::retire(Watch& w) noexcept {
  WatchList& list = *w.list;
  index_.erase(RequestKey{w.client, w.request_id});
  usage_.drop_watch(w.client);
  list.watches.erase(w.self);
  if (list.watches.empty() && !list.touched) lists_.erase(lists_.find(*list.key));
}

}  // namespace shardlock::lease::internal
