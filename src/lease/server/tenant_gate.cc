// The server's tenant gate. See tenant_gate.h.
#include "server/tenant_gate.h"

#include <algorithm>
#include <utility>

namespace shardlock::lease::internal {
namespace {

constexpr std::uint8_t seal_mode_of(EnvelopeMode mode) noexcept {
  return static_cast<std::uint8_t>(1 + static_cast<std::uint8_t>(mode));
}

}  // namespace

TenantKeys::TenantKeys(TenantTable t, bool scope, const TenantKeys* previous)
    : table(std::move(t)), scoped(scope) {
  entries.reserve(table.size());
  for (const Tenant& tenant : table.tenants()) {
    Entry& e = entries.emplace_back();
    e.tenant = &tenant;
    e.key = envelope_key(tenant.key);
    if (tenant.next_key) e.next_key = envelope_key(*tenant.next_key);
    if (previous != nullptr) {
      for (const Entry& old : previous->entries) {
        if (old.tenant->name == tenant.name) e.counters = old.counters;
      }
    }
    if (!e.counters) e.counters = std::make_shared<TenantCounters>();
  }
}

const TenantKeys::Entry* TenantKeys::find(std::uint32_t key_id) const noexcept {
  const auto it =
      std::lower_bound(entries.begin(), entries.end(), key_id,
                       [](const Entry& e, std::uint32_t id) { return e.tenant->key_id < id; });
  return it != entries.end() && it->tenant->key_id == key_id ? &*it : nullptr;
}

TenantGate::TenantGate(TenantTable table, bool scoped)
    : keys_(std::make_shared<const TenantKeys>(std::move(table), scoped)) {}

void TenantGate::replace(TenantTable table, bool scoped) {
  LockGuard lock(mu_);
  keys_ = std::make_shared<const TenantKeys>(std::move(table), scoped, keys_.get());
  generation_.fetch_add(1, std::memory_order_release);
}

std::shared_ptr<const TenantKeys> TenantGate::current() const {
  LockGuard lock(mu_);
  return keys_;
}

std::vector<TenantStats> TenantGate::stats() const {
  const std::shared_ptr<const TenantKeys> keys = current();
  std::vector<TenantStats> out;
  out.reserve(keys->entries.size());
  for (const TenantKeys::Entry& e : keys->entries) {
    out.push_back(TenantStats{
        .name = e.tenant->name,
        .key_id = e.tenant->key_id,
        .requests = e.counters->requests.load(std::memory_order_relaxed),
        .permission_denied = e.counters->permission_denied.load(std::memory_order_relaxed)});
  }
  return out;
}

void TenantGate::Reader::refresh() noexcept {
  const std::uint64_t generation = gate_.generation_.load(std::memory_order_acquire);
  if (generation == generation_) return;
  // Copying a shared_ptr allocates nothing.
  keys_ = gate_.current();
  generation_ = generation;
}

std::optional<TenantGate::Reader::Opened> TenantGate::Reader::open(
    std::span<const std::uint8_t> datagram, std::span<std::uint8_t> scratch) noexcept {
  refresh();
  const std::optional<EnvelopeKeyId> id = peek_key_id(datagram);
  if (!id) return std::nullopt;
  const TenantKeys::Entry* entry = keys_->find(id->key_id);
  if (entry == nullptr) return std::nullopt;
  // A tenant that must encrypt is answered only when it did, in either
  // suite. An AES form on a host without AES-NI does not open below.
  if (entry->tenant->encrypt && !envelope_encrypts(id->mode)) return std::nullopt;
  Opened opened;
  opened.tenant = entry->tenant;
  opened.counters = entry->counters.get();
  opened.seal = PeerSeal{.key_id = id->key_id, .mode = seal_mode_of(id->mode), .next_key = 0};
  opened.plain = open_with(datagram, entry->key, scratch);
  if (opened.plain.empty() && entry->next_key) {
    // Mid-rotation: a client already on the next key.
    opened.plain = open_with(datagram, *entry->next_key, scratch);
    opened.seal.next_key = 1;
  }
  if (opened.plain.empty()) return std::nullopt;
  return opened;
}

std::size_t TenantGate::Reader::seal(const PeerSeal& seal, std::span<std::uint8_t> buffer,
                                     std::size_t length) noexcept {
  if (seal.mode == 0) return 0;
  refresh();
  const TenantKeys::Entry* entry = keys_->find(seal.key_id);
  if (entry == nullptr) return 0;
  // A key retired since the request came: its tenant's current key, which
  // the client moves to anyway.
  const EnvelopeKey& key = seal.next_key != 0 && entry->next_key ? *entry->next_key : entry->key;
  const auto mode = static_cast<EnvelopeMode>(seal.mode - 1);
  return seal_for(buffer, length, seal.key_id, key, mode);
}

ClientId TenantGate::Reader::scope(const Tenant& tenant, ClientId owner) const noexcept {
  if (!keys_->scoped) return owner;
  owner.hi = (owner.hi & 0x0000'0000'FFFF'FFFFULL) | (std::uint64_t{tenant.key_id} << 32);
  return owner;
}

Rights right_needed(MessageType type) noexcept {
  switch (type) {
    case MessageType::kAcquire:
    case MessageType::kAcquireShared:
    case MessageType::kAcquirePermit:
    case MessageType::kAcquireMany:
    case MessageType::kRenew:
    case MessageType::kRelease:
      return Rights::kAcquire;
    case MessageType::kQuery:
    case MessageType::kQueryHolders:
    case MessageType::kWatch:
      return Rights::kQueryWatch;
    case MessageType::kStats:
    case MessageType::kHotKeys:
      return Rights::kAdmin;
    default:
      return Rights::kNone;  // MAP; replies are refused later as not requests
  }
}

bool permitted(const Tenant& tenant, const Message& m) noexcept {
  const Rights needed = right_needed(m.type);
  if (needed == Rights::kNone) return true;
  if (needed == Rights::kAdmin) return contains(rights_for(tenant, ""), needed);
  if (m.type == MessageType::kAcquireMany) {
    for (const std::string_view key : KeyList(m)) {
      if (!contains(rights_for(tenant, key), needed)) return false;
    }
    return true;
  }
  return contains(rights_for(tenant, m.key), needed);
}

}  // namespace shardlock::lease::internal
