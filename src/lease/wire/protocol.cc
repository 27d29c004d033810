// The lease wire codec. See protocol.h for the format.
//
// Reader and Writer are bounds-checked cursors: every read tests the remaining
// length first and latches an error instead of reading past the span, so a
// body is read field after field with one check at the end. The fields of
// each body come from kMessageBodies (protocol.h), the reply bound from
// kRequestReplies. What is off that path lives beside it: the names and the
// error category in protocol_names.cc, the list accessors, the key-list walk
// and its builder in protocol_lists.cc.
#include "shardlock/lease/wire/protocol.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <numeric>
#include <type_traits>
#include <utility>

namespace shardlock::lease {
namespace {

class Reader {
 public:
  explicit Reader(std::span<const std::uint8_t> in) noexcept : in_(in) {}

  [[nodiscard]] bool ok() const noexcept { return ok_; }
  [[nodiscard]] std::size_t remaining() const noexcept { return in_.size() - pos_; }
  [[nodiscard]] std::size_t position() const noexcept { return pos_; }

  std::uint64_t uint(std::size_t bytes) noexcept {
    if (!ok_ || remaining() < bytes) {
      ok_ = false;
      return 0;
    }
    std::uint64_t v = 0;
    for (std::size_t i = 0; i < bytes; ++i) v |= std::uint64_t{in_[pos_ + i]} << (8 * i);
    pos_ += bytes;
    return v;
  }
  std::uint8_t u8() noexcept { return static_cast<std::uint8_t>(uint(1)); }
  std::uint16_t u16() noexcept { return static_cast<std::uint16_t>(uint(2)); }
  std::uint32_t u32() noexcept { return static_cast<std::uint32_t>(uint(4)); }
  std::uint64_t u64() noexcept { return uint(8); }

  std::span<const std::uint8_t> bytes(std::size_t n) noexcept {
    if (!ok_ || remaining() < n) {
      ok_ = false;
      return {};
    }
    auto s = in_.subspan(pos_, n);
    pos_ += n;
    return s;
  }
  // The bytes read since position `from`.
  [[nodiscard]] std::span<const std::uint8_t> since(std::size_t from) const noexcept {
    return in_.subspan(from, pos_ - from);
  }
  std::string_view key() noexcept {
    const std::size_t n = u16();
    auto s = bytes(n);
    return {reinterpret_cast<const char*>(s.data()), s.size()};
  }

 private:
  std::span<const std::uint8_t> in_;
  std::size_t pos_ = 0;
  bool ok_ = true;
};

class Writer {
 public:
  explicit Writer(std::span<std::uint8_t> out) noexcept : out_(out) {}

  [[nodiscard]] bool ok() const noexcept { return ok_; }
  [[nodiscard]] std::size_t position() const noexcept { return pos_; }

  void uint(std::uint64_t v, std::size_t bytes) noexcept {
    if (!ok_ || out_.size() - pos_ < bytes) {
      ok_ = false;
      return;
    }
    for (std::size_t i = 0; i < bytes; ++i)
      out_[pos_ + i] = static_cast<std::uint8_t>(v >> (8 * i));
    pos_ += bytes;
  }
  void u8(std::uint8_t v) noexcept { uint(v, 1); }
  void u16(std::uint16_t v) noexcept { uint(v, 2); }
  void u32(std::uint32_t v) noexcept { uint(v, 4); }
  void u64(std::uint64_t v) noexcept { uint(v, 8); }
  void bytes(const void* p, std::size_t n) noexcept {
    if (!ok_ || out_.size() - pos_ < n) {
      ok_ = false;
      return;
    }
    if (n != 0) std::memcpy(out_.data() + pos_, p, n);
    pos_ += n;
  }
  void key(std::string_view k) noexcept {
    u16(static_cast<std::uint16_t>(k.size()));
    bytes(k.data(), k.size());
  }
  // Overwrites a u16 written earlier (a batch item's body_length).
  void patch_u16(std::size_t at, std::uint16_t v) noexcept {
    out_[at] = static_cast<std::uint8_t>(v);
    out_[at + 1] = static_cast<std::uint8_t>(v >> 8);
  }

 private:
  std::span<std::uint8_t> out_;
  std::size_t pos_ = 0;
  bool ok_ = true;
};

// ---- Body codecs, derived from kMessageBodies --------------------------------
//
// FieldCodec<F> is one field's codec: fits() (the value fits its length
// prefix), variable_size() (bytes beyond body_field_size(F)), write() and
// read() (false for a value the format forbids; a short input only latches
// the Reader). Each row of kMessageBodies becomes straight-line code that
// calls them in order, so the walk costs what the hand-written lists did.

template <BodyField F>
struct FieldCodec;

template <BodyField F>
struct FixedField {
  static constexpr bool fits(const Message&) noexcept { return true; }
  static constexpr std::size_t variable_size(const Message&) noexcept { return 0; }
};

// An unsigned integer field of body_field_size(F) bytes stored in `Member`.
template <BodyField F, auto Member>
struct UintField : FixedField<F> {
  static constexpr std::size_t kWidth = body_field_size(F);
  static void write(Writer& w, const Message& m) noexcept { w.uint(m.*Member, kWidth); }
  static bool read(Reader& r, Message& m) noexcept {
    using Value = std::remove_cvref_t<decltype(m.*Member)>;
    static_assert(sizeof(Value) == kWidth);
    m.*Member = static_cast<Value>(r.uint(kWidth));
    return true;
  }
};

template <>
struct FieldCodec<BodyField::kToken> : UintField<BodyField::kToken, &Message::token> {};
template <>
struct FieldCodec<BodyField::kTtl> : UintField<BodyField::kTtl, &Message::ttl_ms> {};
template <>
struct FieldCodec<BodyField::kWait> : UintField<BodyField::kWait, &Message::wait_ms> {};
template <>
struct FieldCodec<BodyField::kRetryAfter>
    : UintField<BodyField::kRetryAfter, &Message::retry_after_ms> {};
template <>
struct FieldCodec<BodyField::kWaiters> : UintField<BodyField::kWaiters, &Message::waiters> {};
template <>
struct FieldCodec<BodyField::kFirstShard>
    : UintField<BodyField::kFirstShard, &Message::first_shard> {};
template <>
struct FieldCodec<BodyField::kShardCount>
    : UintField<BodyField::kShardCount, &Message::shard_count> {};

template <>
struct FieldCodec<BodyField::kPermits> : UintField<BodyField::kPermits, &Message::permits> {};
template <>
struct FieldCodec<BodyField::kHolders> : UintField<BodyField::kHolders, &Message::holders> {};
template <>
struct FieldCodec<BodyField::kIndex> : UintField<BodyField::kIndex, &Message::index> {};
template <>
struct FieldCodec<BodyField::kEpoch> : UintField<BodyField::kEpoch, &Message::epoch> {};
template <>
struct FieldCodec<BodyField::kFirstMember>
    : UintField<BodyField::kFirstMember, &Message::first_member> {};
template <>
struct FieldCodec<BodyField::kMemberCount>
    : UintField<BodyField::kMemberCount, &Message::member_count> {};
template <>
struct FieldCodec<BodyField::kFirstHolder>
    : UintField<BodyField::kFirstHolder, &Message::first_holder> {};
template <>
struct FieldCodec<BodyField::kWindow> : UintField<BodyField::kWindow, &Message::window_ms> {};

template <>
struct FieldCodec<BodyField::kMode> : FixedField<BodyField::kMode> {
  static_assert(body_field_size(BodyField::kMode) == sizeof(LeaseMode));
  static void write(Writer& w, const Message& m) noexcept {
    w.u8(static_cast<std::uint8_t>(m.mode));
  }
  static bool read(Reader& r, Message& m) noexcept {
    const std::uint8_t mode = r.u8();
    m.mode = static_cast<LeaseMode>(mode);
    return mode <= static_cast<std::uint8_t>(LeaseMode::kPermit);
  }
};

// A list field: u8 count, then `count` entries, which stay a view (KeyList,
// MemberList, HolderList walk them). ReadEntry reads one entry and says
// whether decode() accepts it; every entry is read before judging, so a short
// list is kTruncated even after a bad entry.
template <BodyField F, std::uint8_t Message::*Count, std::span<const std::uint8_t> Message::*List,
          bool (*ReadEntry)(Reader&) noexcept>
struct EntryListField {
  static_assert(body_field_size(F) == 1);  // u8 count
  static bool fits(const Message& /*m*/) noexcept { return true; }
  static std::size_t variable_size(const Message& m) noexcept { return (m.*List).size(); }
  static void write(Writer& w, const Message& m) noexcept {
    w.u8(m.*Count);
    w.bytes((m.*List).data(), (m.*List).size());
  }
  static bool read(Reader& r, Message& m) noexcept {
    m.*Count = r.u8();
    const std::size_t from = r.position();
    bool valid = true;
    for (std::size_t i = 0; i < m.*Count && r.ok(); ++i) valid = ReadEntry(r) && valid;
    if (r.ok()) m.*List = r.since(from);
    return valid;
  }
};

// A key: u16 length + bytes, any length.
bool read_key_entry(Reader& r) noexcept {
  (void)r.key();
  return true;
}

// Whether a member-list entry holds what decode() accepts.
constexpr bool valid_member(std::size_t id_length, std::size_t address_length,
                            std::uint32_t weight) noexcept {
  return id_length >= 1 && id_length <= kMaxMemberIdLength && address_length >= 1 &&
         address_length <= kMaxMemberAddressLength && weight >= 1;
}

// A member: u16 length + id, u16 length + address, u32 weight.
bool read_member_entry(Reader& r) noexcept {
  const std::size_t id_length = r.key().size();
  const std::size_t address_length = r.key().size();
  const std::uint32_t weight = r.u32();
  return valid_member(id_length, address_length, weight);
}

// Whether a holder-list entry holds what decode() accepts.
constexpr bool valid_holder(std::uint8_t flags, std::size_t value_length) noexcept {
  return (flags & ~kHolderFlagPending) == 0 && value_length <= kMaxHolderValueLength;
}

// A holder: u128 owner, u64 token, u32 ttl_left_ms, u8 flags, u16 length +
// value.
bool read_holder_entry(Reader& r) noexcept {
  (void)r.bytes(16 + 8 + 4);
  const std::uint8_t flags = r.u8();
  return valid_holder(flags, r.key().size());
}

// Whether a hot-key-list entry holds what decode() accepts.
constexpr bool valid_hot_key(std::size_t key_length, std::uint32_t requests,
                             std::uint32_t error) noexcept {
  return key_length >= kMinKeyLength && key_length <= kMaxKeyLength && error <= requests;
}

// A hot key: u16 length + key, u32 requests, error, busy, holders, waiters.
bool read_hot_key_entry(Reader& r) noexcept {
  const std::size_t key_length = r.key().size();
  const std::uint32_t requests = r.u32();
  const std::uint32_t error = r.u32();
  (void)r.bytes(3 * sizeof(std::uint32_t));  // busy, holders, waiters
  return valid_hot_key(key_length, requests, error);
}

template <>
struct FieldCodec<BodyField::kKeyList>
    : EntryListField<BodyField::kKeyList, &Message::key_count, &Message::key_list, read_key_entry> {
};
template <>
struct FieldCodec<BodyField::kMemberList>
    : EntryListField<BodyField::kMemberList, &Message::member_list_count, &Message::member_list,
                     read_member_entry> {};
template <>
struct FieldCodec<BodyField::kHolderList>
    : EntryListField<BodyField::kHolderList, &Message::holder_list_count, &Message::holder_list,
                     read_holder_entry> {};
template <>
struct FieldCodec<BodyField::kHotKeyList>
    : EntryListField<BodyField::kHotKeyList, &Message::hot_key_count, &Message::hot_key_list,
                     read_hot_key_entry> {};

template <>
struct FieldCodec<BodyField::kTokenList> {
  static_assert(body_field_size(BodyField::kTokenList) == 1);  // u8 count
  static bool fits(const Message& m) noexcept {
    return m.tokens_le.size() % 8 == 0 && m.tokens_le.size() / 8 <= 0xFF;
  }
  static std::size_t variable_size(const Message& m) noexcept { return m.tokens_le.size(); }
  static void write(Writer& w, const Message& m) noexcept {
    w.u8(static_cast<std::uint8_t>(m.tokens_le.size() / 8));
    w.bytes(m.tokens_le.data(), m.tokens_le.size());
  }
  static bool read(Reader& r, Message& m) noexcept {
    const std::size_t tokens = r.u8();
    m.tokens_le = r.bytes(tokens * 8);
    return true;
  }
};

template <>
struct FieldCodec<BodyField::kErrorCode> : FixedField<BodyField::kErrorCode> {
  static_assert(body_field_size(BodyField::kErrorCode) == sizeof(WireError));
  static void write(Writer& w, const Message& m) noexcept {
    w.u16(static_cast<std::uint16_t>(m.error));
  }
  static bool read(Reader& r, Message& m) noexcept {
    m.error = static_cast<WireError>(r.u16());  // unknown codes are the reader's to judge
    return true;
  }
};

template <>
struct FieldCodec<BodyField::kHeld> : FixedField<BodyField::kHeld> {
  static_assert(body_field_size(BodyField::kHeld) == 1);
  static void write(Writer& w, const Message& m) noexcept { w.u8(m.held ? 1 : 0); }
  static bool read(Reader& r, Message& m) noexcept {
    const std::uint8_t held = r.u8();
    m.held = held == 1;
    return held <= 1;
  }
};

template <>
struct FieldCodec<BodyField::kKey> {
  static_assert(body_field_size(BodyField::kKey) == 2);  // u16 length
  static bool fits(const Message& m) noexcept { return m.key.size() <= 0xFFFF; }
  static std::size_t variable_size(const Message& m) noexcept { return m.key.size(); }
  static void write(Writer& w, const Message& m) noexcept { w.key(m.key); }
  static bool read(Reader& r, Message& m) noexcept {
    m.key = r.key();
    return true;
  }
};

// Encoders write every counter this version knows (fits() insists, so the
// table's fixed size is the bytes written); decoders keep a view of however
// many came, and counter_at() reads missing ones as 0.
template <>
struct FieldCodec<BodyField::kCounters> : FixedField<BodyField::kCounters> {
  static_assert(body_field_size(BodyField::kCounters) == 1 + 8 * kStatCounterCount);
  static bool fits(const Message& m) noexcept {
    return m.counters_le.size() == 8 * kStatCounterCount;
  }
  static void write(Writer& w, const Message& m) noexcept {
    w.u8(static_cast<std::uint8_t>(kStatCounterCount));
    w.bytes(m.counters_le.data(), m.counters_le.size());
  }
  static bool read(Reader& r, Message& m) noexcept {
    const std::size_t n = r.u8();
    m.counters_le = r.bytes(n * 8);
    return true;
  }
};

template <>
struct FieldCodec<BodyField::kShardTokens> {
  static_assert(body_field_size(BodyField::kShardTokens) == 2);  // u16 count
  static bool fits(const Message& m) noexcept {
    return m.shard_tokens_le.size() % 8 == 0 && m.shard_tokens_le.size() / 8 <= 0xFFFF;
  }
  static std::size_t variable_size(const Message& m) noexcept { return m.shard_tokens_le.size(); }
  static void write(Writer& w, const Message& m) noexcept {
    w.u16(static_cast<std::uint16_t>(m.shard_tokens_le.size() / 8));
    w.bytes(m.shard_tokens_le.data(), m.shard_tokens_le.size());
  }
  static bool read(Reader& r, Message& m) noexcept {
    const std::size_t tokens = r.u16();
    m.shard_tokens_le = r.bytes(tokens * 8);
    return true;
  }
};

// Calls fn(FieldCodec<F>{}) for each field F of row `Row`, in wire order.
template <std::size_t Row, class Fn>
void for_each_field(Fn&& fn) noexcept {
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    (fn(FieldCodec<kMessageBodies[Row].fields[I]>{}), ...);
  }
  (std::make_index_sequence<kMessageBodies[Row].field_count>{});
}

// Body size of `m` (of row `Row`), or SIZE_MAX when it cannot be encoded.
template <std::size_t Row>
std::size_t row_body_size(const Message& m) noexcept {
  bool fits = true;
  std::size_t n = kMessageBodies[Row].fixed_size();
  for_each_field<Row>([&](auto codec) {
    fits = fits && codec.fits(m);
    n += codec.variable_size(m);
  });
  return fits ? n : SIZE_MAX;
}

template <std::size_t Row>
void row_write_body(Writer& w, const Message& m) noexcept {
  for_each_field<Row>([&](auto codec) { codec.write(w, m); });
}

// Reads every field, then judges: a short input is kTruncated even where a
// field read before the end was also invalid.
template <std::size_t Row>
ProtocolError row_read_body(Reader& r, Message& m) noexcept {
  bool valid = true;
  for_each_field<Row>([&](auto codec) {
    if (!codec.read(r, m)) valid = false;
  });
  if (!r.ok()) return ProtocolError::kTruncated;
  return valid ? ProtocolError::kOk : ProtocolError::kBadField;
}

// Calls fn(std::integral_constant<std::size_t, row>{}) for a row of
// kMessageBodies known only at run time: a binary search the compiler
// inlines, so each row's straight-line code is inlined too.
template <std::size_t Lo = 0, std::size_t Hi = kMessageBodies.size(), class Fn>
decltype(auto) with_row(std::size_t row, Fn&& fn) noexcept {
  if constexpr (Hi - Lo == 1) {
    return fn(std::integral_constant<std::size_t, Lo>{});
  } else {
    constexpr std::size_t kMid = Lo + (Hi - Lo) / 2;
    if (row < kMid) return with_row<Lo, kMid>(row, std::forward<Fn>(fn));
    return with_row<kMid, Hi>(row, std::forward<Fn>(fn));
  }
}

static_assert(
    [] {
      for (const MessageBody& body : kMessageBodies) {
        if (is_request(body.type) == is_reply(body.type)) return false;
      }
      return true;
    }(),
    "every row of kMessageBodies is a request or a reply, never both");

// What the codec needs of each type byte, computed from the two tables.
struct TypeFacts {
  static constexpr std::uint8_t kNoRow = 0xFF;
  std::uint8_t row = kNoRow;   // in kMessageBodies; kNoRow: no message has this type
  ReplyBodyBound reply_bound;  // max_reply_body_bound(type)
};

constexpr auto kTypeFacts = [] {
  std::array<TypeFacts, 256> facts{};
  for (std::size_t t = 0; t < facts.size(); ++t) {
    facts[t].reply_bound = max_reply_body_bound(static_cast<MessageType>(t));
  }
  for (std::size_t row = 0; row < kMessageBodies.size(); ++row) {
    facts[static_cast<std::uint8_t>(kMessageBodies[row].type)].row = static_cast<std::uint8_t>(row);
  }
  return facts;
}();

const TypeFacts& facts_of(MessageType type) noexcept {
  return kTypeFacts[static_cast<std::uint8_t>(type)];
}

bool known_type(std::uint8_t t) noexcept { return kTypeFacts[t].row != TypeFacts::kNoRow; }

// Body size of `m`, or SIZE_MAX when it cannot be encoded.
std::size_t body_size(const Message& m) noexcept {
  const std::size_t row = facts_of(m.type).row;
  if (row == TypeFacts::kNoRow) return SIZE_MAX;
  return with_row(row, [&m](auto r) { return row_body_size<r()>(m); });
}

// The largest reply body for request `m` (STATS counted without tokens).
std::size_t max_reply_body(const Message& m) noexcept {
  return facts_of(m.type).reply_bound(m.key.size(), m.key_count);
}

// Precondition: m.type is known (encoded_size() accepted it).
void write_body(Writer& w, const Message& m) noexcept {
  with_row(facts_of(m.type).row, [&](auto r) { row_write_body<r()>(w, m); });
}

// Reads the body of `m.type` (already set, and known). Returns kOk or the
// error.
ProtocolError read_body(Reader& r, Message& m) noexcept {
  return with_row(facts_of(m.type).row, [&](auto row) { return row_read_body<row()>(r, m); });
}

bool all_zero(std::span<const std::uint8_t> s) noexcept {
  return std::all_of(s.begin(), s.end(), [](std::uint8_t b) { return b == 0; });
}

bool framed_as_batch(const Datagram& d) noexcept {
  return d.batch || d.count > 1 ||
         (d.count == 1 && (d.messages[0].owner.has_value() || !d.messages[0].value.empty()));
}

// Whether `type` may carry a holder value (kItemFlagValue).
constexpr bool takes_value(MessageType type) noexcept {
  return type == MessageType::kAcquire || type == MessageType::kAcquireShared ||
         type == MessageType::kAcquirePermit;
}

// The bytes of a batch item's header and optional fields, or SIZE_MAX for
// a value the format forbids.
std::size_t item_prefix_size(const Message& m) noexcept {
  std::size_t n = kBatchItemHeaderSize + (m.owner ? kBatchItemOwnerSize : 0);
  if (m.value.empty()) return n;
  if (!takes_value(m.type) || m.value.size() > kMaxHolderValueLength) return SIZE_MAX;
  return n + 2 + m.value.size();
}

}  // namespace

std::size_t parse_entry(std::span<const std::uint8_t> in, MemberEntry& out) noexcept {
  Reader r(in);
  const std::string_view id = r.key();
  const std::string_view address = r.key();
  const std::uint32_t weight = r.u32();
  if (!r.ok()) return 0;
  out = {id, address, weight};
  return r.position();
}

std::size_t parse_entry(std::span<const std::uint8_t> in, HolderEntry& out) noexcept {
  Reader r(in);
  HolderEntry h;
  h.owner.lo = r.u64();
  h.owner.hi = r.u64();
  h.token = r.u64();
  h.ttl_left_ms = r.u32();
  h.flags = r.u8();
  h.value = r.key();
  if (!r.ok()) return 0;
  out = h;
  return r.position();
}

std::size_t parse_entry(std::span<const std::uint8_t> in, HotKeyEntry& out) noexcept {
  Reader r(in);
  HotKeyEntry h;
  h.key = r.key();
  h.requests = r.u32();
  h.error = r.u32();
  h.busy = r.u32();
  h.holders = r.u32();
  h.waiters = r.u32();
  if (!r.ok()) return 0;
  out = h;
  return r.position();
}

bool append_hot_key_entry(const HotKeyEntry& entry, std::vector<std::uint8_t>& out) {
  if (!valid_hot_key(entry.key.size(), entry.requests, entry.error)) return false;
  const std::size_t at = out.size();
  out.resize(at + hot_key_entry_size(entry));
  Writer w(std::span<std::uint8_t>(out).subspan(at));
  w.key(entry.key);
  w.u32(entry.requests);
  w.u32(entry.error);
  w.u32(entry.busy);
  w.u32(entry.holders);
  w.u32(entry.waiters);
  return w.ok();
}

bool append_holder_entry(const HolderEntry& holder, std::vector<std::uint8_t>& out) {
  if (!valid_holder(holder.flags, holder.value.size())) return false;
  const std::size_t at = out.size();
  out.resize(at + holder_entry_size(holder));
  Writer w(std::span<std::uint8_t>(out).subspan(at));
  w.u64(holder.owner.lo);
  w.u64(holder.owner.hi);
  w.u64(holder.token);
  w.u32(holder.ttl_left_ms);
  w.u8(holder.flags);
  w.key(holder.value);
  return w.ok();
}

bool encode_member_list(std::span<const MemberEntry> members, std::vector<std::uint8_t>& out) {
  out.clear();
  if (members.size() > 0xFF) return false;
  for (const MemberEntry& m : members) {
    if (!valid_member(m.id.size(), m.address.size(), m.weight)) return false;
  }
  out.resize(std::accumulate(
      members.begin(), members.end(), std::size_t{0},
      [](std::size_t n, const MemberEntry& m) { return n + member_entry_size(m); }));
  Writer w(out);
  for (const MemberEntry& m : members) {
    w.key(m.id);
    w.key(m.address);
    w.u32(m.weight);
  }
  return w.ok();
}

ProtocolError decode(std::span<const std::uint8_t> in, Datagram& out) noexcept {
  if (in.size() > kMaxDatagramSize) return ProtocolError::kTooLarge;
  Reader r(in);
  const std::uint32_t magic = r.u32();
  if (!r.ok()) return ProtocolError::kTruncated;
  if (magic != kMagic) return ProtocolError::kBadMagic;
  out.version = r.u8();
  out.flags = r.u8();
  const std::uint8_t type = r.u8();
  const std::uint8_t count = r.u8();
  out.request_id = r.u64();
  out.client_id.lo = r.u64();
  out.client_id.hi = r.u64();
  if (!r.ok()) return ProtocolError::kTruncated;
  out.count = 0;
  out.epoch.reset();
  if (out.version != kProtocolVersion) return ProtocolError::kUnsupportedVersion;
  // kFlagKeyId, kFlagEncrypted and kFlagAes are refused too: they describe a sealed
  // envelope's trailer, and opening it (envelope.h) clears them.
  if ((out.flags & ~(kFlagAuthenticated | kFlagEpoch)) != 0) return ProtocolError::kBadFlags;
  if ((out.flags & kFlagEpoch) != 0) {
    out.epoch = r.u64();
    if (!r.ok()) return ProtocolError::kTruncated;
  }

  if (type != static_cast<std::uint8_t>(MessageType::kBatch)) {
    if (!known_type(type)) return ProtocolError::kBadType;
    if (count != 1) return ProtocolError::kBadCount;
    out.batch = false;
    Message& m = out.messages[0];
    m = Message{};
    m.type = static_cast<MessageType>(type);
    m.request_id = out.request_id;
    if (const ProtocolError e = read_body(r, m); e != ProtocolError::kOk) return e;
    out.count = 1;
  } else {
    if (count == 0 || count > kMaxBatch) return ProtocolError::kBadCount;
    out.batch = true;
    for (std::size_t i = 0; i < count; ++i) {
      const std::uint8_t item_type = r.u8();
      const std::uint8_t item_flags = r.u8();
      const std::uint16_t length = r.u16();
      const std::uint64_t request_id = r.u64();
      if (!r.ok()) return ProtocolError::kTruncated;
      if ((item_flags & ~(kItemFlagOwner | kItemFlagValue)) != 0) return ProtocolError::kBadFlags;
      std::optional<ClientId> owner;
      if ((item_flags & kItemFlagOwner) != 0) {
        owner.emplace();
        owner->lo = r.u64();
        owner->hi = r.u64();
        if (!r.ok()) return ProtocolError::kTruncated;
      }
      std::string_view value;
      if ((item_flags & kItemFlagValue) != 0) {
        value = r.key();
        if (!r.ok()) return ProtocolError::kTruncated;
      }
      if (!known_type(item_type)) return ProtocolError::kBadType;
      if ((item_flags & kItemFlagValue) != 0 &&
          (!takes_value(static_cast<MessageType>(item_type)) || value.empty() ||
           value.size() > kMaxHolderValueLength)) {
        return ProtocolError::kBadField;
      }
      // Parse the body from exactly `length` bytes so a lying length cannot
      // make the item reach into its neighbour.
      Reader body(r.bytes(length));
      if (!r.ok()) return ProtocolError::kTruncated;
      Message& m = out.messages[i];
      m = Message{};
      m.type = static_cast<MessageType>(item_type);
      m.request_id = request_id;
      m.owner = owner;
      m.value = value;
      if (const ProtocolError e = read_body(body, m); e != ProtocolError::kOk) {
        return e == ProtocolError::kTruncated ? ProtocolError::kBadLength : e;
      }
      if (body.remaining() != 0) return ProtocolError::kBadLength;
      out.count = static_cast<std::uint8_t>(i + 1);
    }
  }
  if (!all_zero(in.subspan(r.position()))) return ProtocolError::kNonZeroPadding;
  return ProtocolError::kOk;
}

std::size_t encoded_size(const Datagram& d) noexcept {
  if (d.count == 0 || d.count > kMaxBatch) return 0;
  std::size_t n = kHeaderSize + (d.epoch ? kEpochSize : 0);
  const bool batch = framed_as_batch(d);
  for (const Message& m : d.items()) {
    const std::size_t b = body_size(m);
    if (b == SIZE_MAX || (batch && b > 0xFFFF)) return 0;
    if (batch) {
      const std::size_t prefix = item_prefix_size(m);
      if (prefix == SIZE_MAX) return 0;
      n += prefix;
    }
    n += b;
  }
  return n;
}

ProtocolError encode(const Datagram& d, std::span<std::uint8_t> out, std::size_t& written,
                     std::size_t pad_to) noexcept {
  written = 0;
  if (d.count == 0 || d.count > kMaxBatch) return ProtocolError::kBadCount;
  const std::size_t size = encoded_size(d);
  if (size == 0) return ProtocolError::kBadType;
  const std::size_t total = std::max(size, pad_to);
  if (total > kMaxDatagramSize || total > out.size()) return ProtocolError::kTooLarge;

  const bool batch = framed_as_batch(d);
  Writer w(out);
  w.u32(kMagic);
  w.u8(d.version);
  w.u8(static_cast<std::uint8_t>((d.flags & ~kFlagEpoch) | (d.epoch ? kFlagEpoch : 0)));
  w.u8(static_cast<std::uint8_t>(batch ? MessageType::kBatch : d.messages[0].type));
  w.u8(d.count);
  w.u64(batch ? d.request_id : d.messages[0].request_id);
  w.u64(d.client_id.lo);
  w.u64(d.client_id.hi);
  if (d.epoch) w.u64(*d.epoch);
  for (const Message& m : d.items()) {
    if (batch) {
      w.u8(static_cast<std::uint8_t>(m.type));
      w.u8(static_cast<std::uint8_t>((m.owner ? kItemFlagOwner : 0) |
                                     (m.value.empty() ? 0 : kItemFlagValue)));
      const std::size_t length_at = w.position();
      w.u16(0);
      w.u64(m.request_id);
      if (m.owner) {
        w.u64(m.owner->lo);
        w.u64(m.owner->hi);
      }
      if (!m.value.empty()) w.key(m.value);
      const std::size_t body_at = w.position();
      write_body(w, m);
      w.patch_u16(length_at, static_cast<std::uint16_t>(w.position() - body_at));
    } else {
      write_body(w, m);
    }
  }
  if (!w.ok() || w.position() != size) return ProtocolError::kTooLarge;
  std::fill(out.begin() + static_cast<std::ptrdiff_t>(size),
            out.begin() + static_cast<std::ptrdiff_t>(total), std::uint8_t{0});
  written = total;
  return ProtocolError::kOk;
}

std::size_t max_immediate_reply_size(const Datagram& request) noexcept {
  const bool batch = framed_as_batch(request);
  std::size_t n = kHeaderSize;
  for (const Message& m : request.items()) {
    n += max_reply_body(m) + (batch ? kBatchItemHeaderSize : 0);
  }
  return n;
}

std::size_t max_reply_size(const Datagram& request) noexcept {
  if (!framed_as_batch(request)) return max_immediate_reply_size(request);
  // A waiting ACQUIRE's later answer is a datagram of its own: a header
  // instead of an item header (deferred_reply_credit() hands out the extra).
  std::size_t n = max_immediate_reply_size(request);
  for (const Message& m : request.items()) {
    if (may_answer_later(m)) n += kHeaderSize - kBatchItemHeaderSize;
  }
  return n;
}

std::size_t deferred_reply_credit(const Datagram& request, std::size_t request_size,
                                  std::size_t item) noexcept {
  if (item >= request.count || !may_answer_later(request.messages[item])) return 0;
  if (!framed_as_batch(request)) return request_size;  // queued: no immediate reply at all
  const std::size_t bound = max_immediate_reply_size(request);
  if (request_size < bound) return 0;
  std::size_t waiting = 0;
  for (const Message& m : request.items()) waiting += may_answer_later(m) ? 1 : 0;
  // Its own share of the immediate bound (unused when it is queued), plus an
  // equal share of the padding beyond that bound.
  return kBatchItemHeaderSize + max_reply_body(request.messages[item]) +
         (request_size - bound) / waiting;
}

ProtocolError encode_request(const Datagram& d, std::span<std::uint8_t> out,
                             std::size_t& written) noexcept {
  return encode(d, out, written, max_reply_size(d));
}

}  // namespace shardlock::lease
