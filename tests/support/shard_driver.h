// shard_driver.h: one in-process Shard (shard.h) driven as LeaseServer
// drives it, with no socket and no clock: the test holds the time and moves
// it, hands the shard requests, and reads the reply and the answers decided
// later (hand-offs, timeouts, woken WATCHes). The state-machine suites share
// it rather than each keeping a shard, a clock, a request-id counter and a
// deferred list of its own.
//
//   test_support::ShardDriver driver(/*now_ms=*/1000);
//   Message m;
//   m.type = MessageType::kAcquire;
//   m.key = "k";
//   m.ttl_ms = 500;
//   const auto granted = driver.send(kAlice, m);       // request id 101
//   driver.advance_to(driver.now() + 600);             // the lease expires
//   for (const DeferredReply& d : driver.take_deferred()) ...
//
// A fixture derives from it beside ::testing::Test and reaches now_, shard_
// and deferred_ directly, for the Shard calls the driver does not wrap
// (probe(), take(), abandon(), set_gate(), ...):
//
//   class ShardTest : public ::testing::Test, public test_support::ShardDriver {};
//   TEST_F(ShardTest, X) { now_ += 300; shard_->abandon(m, part, now_, deferred_); }
//
// make_shards() builds the shards a Dispatcher takes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "shardlock/lease/server/internal/shard.h"

namespace shardlock::test_support {

class ShardDriver {
 public:
  using ClientId = lease::ClientId;
  using DeferredReply = lease::internal::DeferredReply;
  using HolderPage = lease::internal::HolderPage;
  using Message = lease::Message;
  using Shard = lease::internal::Shard;
  using ShardLimits = lease::internal::ShardLimits;
  using ShardTokens = lease::internal::ShardTokens;
  using StatCounter = lease::StatCounter;

  // What send() got back: whether the shard answered now (false: queued or
  // parked, its answer comes through the deferred list), and the answer.
  struct Result {
    bool answered = false;
    Message reply;
  };

  // Shard 0 with `limits` and in-memory tokens, made at `now_ms`. Requests
  // sent without an id are numbered from `last_request_id` + 1 up.
  explicit ShardDriver(std::int64_t now_ms = 1'000'000, const ShardLimits& limits = {},
                       std::uint64_t last_request_id = 100)
      : now_(now_ms), next_id_(last_request_id) {
    make_shard(limits);
  }

  // Replaces the shard by a new one made now with `limits` and `tokens`, as
  // a restart does (every lease forgotten; the tokens carry on where
  // `tokens` says). The deferred list and the request ids carry on.
  void make_shard(const ShardLimits& limits, ShardTokens tokens = ShardTokens{}) {
    shard_.reset();  // the old shard goes first, as a restarted server's does
    shard_ = std::make_unique<Shard>(0, limits, tokens, now_);
  }

  // Hands `request` from `client` to the shard now (Shard::handle(): its
  // reply credit and holder page), numbered if its request id is 0. The
  // reply's key views request.key's bytes. Answers it triggers for others
  // are appended to the deferred list.
  Result send(const ClientId& client, Message request,
              std::uint16_t reply_credit = lease::kMaxDatagramSize, HolderPage* page = nullptr) {
    if (request.request_id == 0) request.request_id = ++next_id_;
    Result r;
    r.answered = shard_->handle(client, lease::internal::Peer{}, request, now_, r.reply, deferred_,
                                reply_credit, page);
    return r;
  }

  // Moves the time to `now_ms` and fires what is due by then
  // (Shard::advance()), into the deferred list.
  void advance_to(std::int64_t now_ms) {
    now_ = now_ms;
    shard_->advance(now_, deferred_);
  }

  // The answers decided since the last call, oldest first; the list is
  // empty afterwards.
  std::vector<DeferredReply> take_deferred() { return std::exchange(deferred_, {}); }

  // The shard's count of `c`.
  [[nodiscard]] std::uint64_t counter(StatCounter c) const {
    return shard_->counters()[static_cast<std::size_t>(c)];
  }

  // The time the next call happens at, in milliseconds.
  [[nodiscard]] std::int64_t now() const noexcept { return now_; }
  // The shard, for the calls the driver does not wrap (set_grant_log(), ...).
  [[nodiscard]] Shard& shard() noexcept { return *shard_; }

 protected:
  std::int64_t now_;  // the time every call happens at, in milliseconds
  std::vector<DeferredReply> deferred_;
  std::unique_ptr<Shard> shard_;

 private:
  std::uint64_t next_id_;  // the last request id send() gave
};

// `count` shards with `limits`, made at `now_ms`, for a Dispatcher.
inline std::vector<std::unique_ptr<lease::internal::Shard>> make_shards(
    std::uint32_t count, const lease::internal::ShardLimits& limits, std::int64_t now_ms) {
  std::vector<std::unique_ptr<lease::internal::Shard>> shards;
  for (std::uint32_t i = 0; i < count; ++i) {
    shards.push_back(std::make_unique<lease::internal::Shard>(
        i, limits, lease::internal::ShardTokens{}, now_ms));
  }
  return shards;
}

}  // namespace shardlock::test_support
