// The lease codec's list fields: the accessors of Message's raw lists, the
// key-list walk, and building and parsing member, holder and hot-key
// entries. See protocol.h for the format.
#include <numeric>
#include <string_view>
#include <vector>

#include "shardlock/lease/wire/protocol.h"
#include "wire/cursor.h"

namespace shardlock::lease {

using internal::load_u64_le;
using internal::Reader;
using internal::valid_holder;
using internal::valid_hot_key;
using internal::valid_member;
using internal::Writer;

std::uint64_t Message::shard_token(std::size_t i) const noexcept {
  return load_u64_le(shard_tokens_le, i);
}

std::uint64_t Message::counter_at(std::size_t i) const noexcept {
  return i < counters_le.size() / 8 ? load_u64_le(counters_le, i) : 0;
}

std::uint64_t Message::listed_token(std::size_t i) const noexcept {
  return load_u64_le(tokens_le, i);
}

KeyList::iterator::iterator(std::span<const std::uint8_t> rest, std::size_t left) noexcept
    : rest_(rest), left_(left) {
  load();
}

void KeyList::iterator::load() noexcept {
  if (left_ == 0) return;
  if (rest_.size() < 2) {
    left_ = 0;  // malformed: stop
    return;
  }
  const std::size_t n = rest_[0] | (std::size_t{rest_[1]} << 8);
  if (rest_.size() - 2 < n) {
    left_ = 0;
    return;
  }
  current_ = {reinterpret_cast<const char*>(rest_.data() + 2), n};
}

KeyList::iterator& KeyList::iterator::operator++() noexcept {
  if (left_ == 0) return *this;
  rest_ = rest_.subspan(2 + current_.size());
  --left_;
  load();
  return *this;
}

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

bool encode_key_list(std::span<const std::string_view> keys, std::vector<std::uint8_t>& out) {
  out.clear();
  if (keys.size() > 0xFF) return false;
  for (const std::string_view k : keys) {
    if (k.size() > 0xFFFF) return false;
    out.push_back(static_cast<std::uint8_t>(k.size()));
    out.push_back(static_cast<std::uint8_t>(k.size() >> 8));
    out.insert(out.end(), k.begin(), k.end());
  }
  return true;
}

}  // namespace shardlock::lease
