// Reply vectors shared with the Python client: reply datagrams the C++ codec
// encoded, each with the call it answers and what the C++ client's pure
// decisions (client/reply.h) make of it; and REDIRECTs with the epochs that
// decide where they lead. clients/python/tests/test_reply_vectors.py checks
// the Python client's classification against the same file, so the two
// clients cannot drift apart on which reply completes, rides through or is
// followed (as router_vectors.json pins their routing).
//
// The file must be exactly what this test writes. To regenerate after an
// intended change:
//   SHARDLOCK_REGENERATE_GOLDEN=1 build/<preset>/tests/reply_vectors_test
#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "client/reply.h"

namespace shardlock::lease::internal {
namespace {

using namespace std::chrono_literals;

const char* const kVectorsPath =
    SHARDLOCK_TEST_DATA_DIR "/../../clients/python/tests/reply_vectors.json";
constexpr std::uint64_t kRequestId = 0x1122334455667788;
constexpr LeaseClock::time_point kNow{1000s};

std::string hex(std::span<const std::uint8_t> bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  for (const std::uint8_t b : bytes) {
    out += kDigits[b >> 4];
    out += kDigits[b & 0xF];
  }
  return out;
}

// Keys and names here are printable ASCII without quotes or backslashes.
std::string json_string(std::string_view text) { return "\"" + std::string(text) + "\""; }

std::vector<std::uint8_t> encoded(Message m) {
  m.request_id = kRequestId;
  Datagram d;
  d.request_id = kRequestId;
  d.client_id = {.lo = 0x0102030405060708, .hi = 0x1112131415161718};
  (void)d.push(m);
  std::vector<std::uint8_t> out(kMaxDatagramSize);
  std::size_t written = 0;
  EXPECT_EQ(encode(d, out, written), ProtocolError::kOk) << to_string(m.type);
  out.resize(written);
  return out;
}

std::string_view verdict_name(ReplyVerdict v) {
  switch (v) {
    case ReplyVerdict::kIgnore:
      return "ignore";
    case ReplyVerdict::kMalformed:
      return "malformed";
    case ReplyVerdict::kRedirect:
      return "redirect";
    case ReplyVerdict::kRideThrough:
      return "ride_through";
    case ReplyVerdict::kComplete:
      return "complete";
  }
  return "?";
}

std::string_view step_name(RedirectStep s) {
  switch (s) {
    case RedirectStep::kGiveUp:
      return "give_up";
    case RedirectStep::kAskAgainSoon:
      return "ask_again_soon";
    case RedirectStep::kAwaitNewerMap:
      return "await_newer_map";
    case RedirectStep::kGoToOwner:
      return "go_to_owner";
  }
  return "?";
}

// The error of a completed call: "ok", or LeaseErrc's name in snake case.
std::string error_name(std::error_code e) {
  if (!e) return "ok";
  std::string name;
  for (const char c : to_string(static_cast<LeaseErrc>(e.value()))) {
    name += c == ' ' || c == '-' ? '_' : c;
  }
  return name;
}

// The fields a completed call's result carries, when not their default.
std::string result_fields(const CallResult& r) {
  std::vector<std::string> fields;
  const auto number = [&](const char* name, std::uint64_t value) {
    if (value != 0) fields.push_back(json_string(name) + ": " + std::to_string(value));
  };
  number("token", r.token);
  number("ttl_ms", r.ttl_ms);
  number("retry_after_ms", r.retry_after_ms);
  if (r.reply == MessageType::kError)
    number("wire_error", static_cast<std::uint16_t>(r.wire_error));
  number("held", r.held ? 1 : 0);
  number("waiters", r.waiters);
  number("mode", static_cast<std::uint8_t>(r.mode));
  number("holders", r.holders);
  number("permits", r.permits);
  number("busy_index", r.busy_index);
  number("epoch", r.epoch);
  number("member_count", r.member_count);
  number("first_member", r.first_member);
  number("first_holder", r.first_holder);
  if (!r.tokens.empty()) {
    std::string list;
    for (const std::uint64_t t : r.tokens) list += (list.empty() ? "" : ", ") + std::to_string(t);
    fields.push_back("\"tokens\": [" + list + "]");
  }
  if (!r.members.empty()) {
    std::string list;
    for (const MapMember& m : r.members) {
      list += (list.empty() ? "[" : ", [") + json_string(m.id) + ", " + json_string(m.address) +
              ", " + std::to_string(m.weight) + "]";
    }
    fields.push_back("\"members\": [" + list + "]");
  }
  if (!r.holder_list.empty()) {
    std::string list;
    for (const HolderInfo& h : r.holder_list) {
      list += (list.empty() ? "[" : ", [") + json_string(to_hex(h.owner)) + ", " +
              std::to_string(h.token) + ", " + std::to_string(h.ttl_left.count()) + ", " +
              (h.pending ? "true" : "false") + ", " + json_string(h.value) + "]";
    }
    fields.push_back("\"holder_list\": [" + list + "]");
  }
  std::string out;
  for (const std::string& f : fields) out += (out.empty() ? "" : ", ") + f;
  return "{" + out + "}";
}

struct ReplyCase {
  const char* name;
  MessageType call;
  const char* key;
  std::optional<std::chrono::milliseconds> wait_left;  // nullopt: the call does not wait
  Message reply;
  std::uint8_t key_count = 0;  // ACQUIRE_MANY
};

std::vector<ReplyCase> reply_cases(const std::vector<std::uint8_t>& holders,
                                   const std::vector<std::uint8_t>& members,
                                   std::span<const std::uint8_t> tokens) {
  using T = MessageType;
  constexpr std::uint64_t kToken = 0x0000000500000007;
  return {
      {"granted",
       T::kAcquire,
       "k",
       {},
       {.type = T::kGranted, .key = "k", .token = kToken, .ttl_ms = 30000}},
      {"granted for another key",
       T::kAcquire,
       "k",
       {},
       {.type = T::kGranted, .key = "j", .token = 1, .ttl_ms = 1}},
      {"busy", T::kAcquire, "k", {}, {.type = T::kBusy, .key = "k", .ttl_ms = 1200}},
      {"timeout of a wait", T::kAcquire, "k", 500ms, {.type = T::kTimeout, .key = "k"}},
      {"recovering without a wait",
       T::kAcquire,
       "k",
       {},
       {.type = T::kRecovering, .key = "", .retry_after_ms = 250}},
      {"recovering within the wait",
       T::kAcquire,
       "k",
       500ms,
       {.type = T::kRecovering, .key = "", .retry_after_ms = 250}},
      {"recovering with the margin left",
       T::kAcquire,
       "k",
       10ms,
       {.type = T::kRecovering, .key = "", .retry_after_ms = 250}},
      {"recovering past the margin",
       T::kAcquire,
       "k",
       11ms,
       {.type = T::kRecovering, .key = "", .retry_after_ms = 3000}},
      {"shared granted",
       T::kAcquireShared,
       "k",
       {},
       {.type = T::kGranted, .key = "k", .token = kToken, .ttl_ms = 500}},
      {"permit rides through",
       T::kAcquirePermit,
       "k",
       2000ms,
       {.type = T::kRecovering, .key = "", .retry_after_ms = 5000}},
      {"error",
       T::kAcquire,
       "k",
       {},
       {.type = T::kError, .key = "", .error = WireError::kWaitOutOfRange}},
      {"redirect", T::kAcquire, "k", {}, {.type = T::kRedirect, .key = "", .epoch = 9}},
      {"a reply of another request",
       T::kAcquire,
       "k",
       {},
       {.type = T::kRenewed, .key = "k", .ttl_ms = 1}},
      {"renewed", T::kRenew, "k", {}, {.type = T::kRenewed, .key = "k", .ttl_ms = 30000}},
      {"renew not owner", T::kRenew, "k", {}, {.type = T::kNotOwner, .key = ""}},
      {"renew expired", T::kRenew, "k", {}, {.type = T::kExpired, .key = ""}},
      {"renew redirected", T::kRenew, "k", {}, {.type = T::kRedirect, .key = "", .epoch = 4}},
      {"renew recovering",
       T::kRenew,
       "k",
       {},
       {.type = T::kRecovering, .key = "", .retry_after_ms = 100}},
      {"released", T::kRelease, "k", {}, {.type = T::kReleased, .key = ""}},
      {"release never redirected",
       T::kRelease,
       "k",
       {},
       {.type = T::kRedirect, .key = "", .epoch = 4}},
      {"release recovering",
       T::kRelease,
       "k",
       {},
       {.type = T::kRecovering, .key = "", .retry_after_ms = 100}},
      {"query reply",
       T::kQuery,
       "k",
       {},
       {.type = T::kQueryReply,
        .key = "k",
        .token = kToken,
        .ttl_ms = 900,
        .held = true,
        .waiters = 2,
        .mode = LeaseMode::kShared,
        .permits = 0,
        .holders = 3}},
      {"query reply for another key", T::kQuery, "k", {}, {.type = T::kQueryReply, .key = "kk"}},
      {"query recovering",
       T::kQuery,
       "k",
       {},
       {.type = T::kRecovering, .key = "", .retry_after_ms = 40}},
      {"holders",
       T::kQueryHolders,
       "k",
       {},
       {.type = T::kHoldersReply,
        .key = "k",
        .waiters = 1,
        .mode = LeaseMode::kPermit,
        .permits = 4,
        .holders = 2,
        .holder_list_count = 2,
        .holder_list = holders}},
      {"watch answered",
       T::kWatch,
       "k",
       30000ms,
       {.type = T::kHoldersReply, .key = "k", .holders = 0}},
      {"watch rides through",
       T::kWatch,
       "k",
       30000ms,
       {.type = T::kRecovering, .key = "", .retry_after_ms = 200}},
      {"watch redirected", T::kWatch, "k", 30000ms, {.type = T::kRedirect, .key = "", .epoch = 12}},
      {"map reply",
       T::kMap,
       "",
       {},
       {.type = T::kMapReply,
        .key = "",
        .epoch = 7,
        .first_member = 0,
        .member_count = 2,
        .member_list_count = 2,
        .member_list = members}},
      {"map recovering",
       T::kMap,
       "",
       {},
       {.type = T::kRecovering, .key = "", .retry_after_ms = 30}},
      {"map answered granted",
       T::kMap,
       "",
       {},
       {.type = T::kGranted, .key = "k", .token = 1, .ttl_ms = 1}},
      {"acquire many granted",
       T::kAcquireMany,
       "",
       {},
       {.type = T::kGrantedMany, .key = "", .ttl_ms = 800, .tokens_le = tokens},
       2},
      {"acquire many short of tokens",
       T::kAcquireMany,
       "",
       {},
       {.type = T::kGrantedMany, .key = "", .ttl_ms = 800, .tokens_le = tokens.first(8)},
       2},
      {"acquire many busy",
       T::kAcquireMany,
       "",
       {},
       {.type = T::kBusyMany, .key = "", .ttl_ms = 70, .index = 1},
       2},
      {"acquire many busy past its keys",
       T::kAcquireMany,
       "",
       {},
       {.type = T::kBusyMany, .key = "", .ttl_ms = 70, .index = 2},
       2},
      {"acquire many timeout", T::kAcquireMany, "", 100ms, {.type = T::kTimeout, .key = ""}, 2},
  };
}

std::string reply_line(const ReplyCase& c) {
  CallShape call{.type = c.call, .key = c.key, .key_count = c.key_count};
  if (c.wait_left) call.wait_end = kNow + *c.wait_left;
  const ReplyDecision d = decide_reply(call, c.reply, kNow);
  std::string line =
      "{\"name\": " + json_string(c.name) + ", \"call\": " + json_string(to_string(c.call)) +
      ", \"key\": " + json_string(c.key) +
      ", \"wait_left_ms\": " + (c.wait_left ? std::to_string(c.wait_left->count()) : "null") +
      ", \"reply\": " + json_string(hex(encoded(c.reply))) +
      ", \"verdict\": " + json_string(verdict_name(d.verdict));
  if (d.verdict == ReplyVerdict::kRideThrough) {
    line += ", \"latest_retry_ms\": " +
            std::to_string(
                std::chrono::duration_cast<std::chrono::milliseconds>(d.latest_retry).count());
  }
  if (d.verdict == ReplyVerdict::kComplete) {
    const CallResult r = result_of(c.reply);
    line +=
        ", \"error\": " + json_string(error_name(r.error)) + ", \"result\": " + result_fields(r);
  }
  return line + "}";
}

struct RedirectCase {
  const char* name;
  std::uint64_t node_epoch;
  std::optional<std::uint64_t> call_epoch;
  std::optional<std::uint64_t> map_epoch;
  unsigned redirects;
};

const RedirectCase kRedirectCases[] = {
    {"not in cluster mode", 3, std::nullopt, std::nullopt, 0},
    {"a node behind our map", 4, 5, 5, 0},
    {"a node behind, at the hop limit", 4, 5, 5, kMaxRedirects},
    {"a node with a newer map", 6, 5, 5, 0},
    {"the same map, another owner", 5, 5, 5, 0},
    {"the last hop allowed", 5, 5, 5, kMaxRedirects - 1},
    {"one hop too many", 6, 5, 5, kMaxRedirects},
    // The map was refreshed while the call was out (C++ only: see the
    // Python test for why).
    {"routed under an older map", 5, 4, 5, 0},
    {"a node behind a call routed under an older map", 3, 4, 5, 0},
    {"a newer map than a refreshed one", 7, 4, 5, 0},
};

std::string optional_number(std::optional<std::uint64_t> v) {
  return v ? std::to_string(*v) : "null";
}

std::string redirect_line(const RedirectCase& c) {
  unsigned redirects = c.redirects;
  const RedirectStep step = next_redirect_step(c.node_epoch, c.call_epoch, c.map_epoch, redirects);
  return "{\"name\": " + json_string(c.name) + ", \"reply\": " +
         json_string(
             hex(encoded({.type = MessageType::kRedirect, .key = "", .epoch = c.node_epoch}))) +
         ", \"node_epoch\": " + std::to_string(c.node_epoch) +
         ", \"call_epoch\": " + optional_number(c.call_epoch) +
         ", \"map_epoch\": " + optional_number(c.map_epoch) +
         ", \"redirects\": " + std::to_string(c.redirects) +
         ", \"step\": " + json_string(step_name(step)) +
         ", \"redirects_after\": " + std::to_string(redirects) + "}";
}

std::string vectors() {
  std::vector<std::uint8_t> holders;
  EXPECT_TRUE(append_holder_entry({.owner = {.lo = 0x10, .hi = 0x20},
                                   .token = 77,
                                   .ttl_left_ms = 4000,
                                   .flags = 0,
                                   .value = ""},
                                  holders));
  EXPECT_TRUE(append_holder_entry({.owner = {.lo = 0x11, .hi = 0x21},
                                   .token = 78,
                                   .ttl_left_ms = 3999,
                                   .flags = kHolderFlagPending,
                                   .value = "host-a:pid-9"},
                                  holders));
  std::vector<std::uint8_t> members;
  const std::array<MemberEntry, 2> entries{
      MemberEntry{.id = "n1", .address = "10.0.0.1:7420", .weight = 1},
      MemberEntry{.id = "n2", .address = "10.0.0.2:7420", .weight = 3}};
  EXPECT_TRUE(encode_member_list(entries, members));
  const std::array<std::uint8_t, 16> tokens{0x21, 0, 0, 0, 5, 0, 0, 0, 0x22, 0, 0, 0, 5, 0, 0, 0};

  std::ostringstream out;
  out << "{\"generated_by\": \"tests/lease/client/reply_vectors_test.cc\", "
         "\"last_try_margin_ms\": "
      << kLastTryMargin.count() << ", \"max_redirects\": " << kMaxRedirects
      << ", \"request_id\": " << kRequestId << ",\n\"replies\": [\n";
  const std::vector<ReplyCase> cases = reply_cases(holders, members, tokens);
  for (std::size_t i = 0; i < cases.size(); ++i) {
    out << reply_line(cases[i]) << (i + 1 < cases.size() ? ",\n" : "\n");
  }
  out << "],\n\"redirects\": [\n";
  for (std::size_t i = 0; i < std::size(kRedirectCases); ++i) {
    out << redirect_line(kRedirectCases[i]) << (i + 1 < std::size(kRedirectCases) ? ",\n" : "\n");
  }
  out << "]}\n";
  return out.str();
}

TEST(ReplyVectorsTest, TheSharedFileIsWhatTheDecisionsSayNow) {
  const std::string now = vectors();
  if (std::getenv("SHARDLOCK_REGENERATE_GOLDEN") != nullptr) {
    std::ofstream(kVectorsPath) << now;
    GTEST_SKIP() << "regenerated " << kVectorsPath;
  }
  std::ifstream in(kVectorsPath);
  ASSERT_TRUE(in) << "missing " << kVectorsPath;
  std::stringstream file;
  file << in.rdbuf();
  EXPECT_EQ(file.str(), now) << kVectorsPath
                             << " is stale; regenerate it (see the top of this file)";
}

}  // namespace
}  // namespace shardlock::lease::internal
