// tenant_gate.h: the server's side of tenants (tenants.h) and sealed
// datagrams (envelope.h): which tenant a datagram is from, what it may do,
// and how its answers are sealed. Not API.
//
// The dispatcher opens every client datagram here before decoding it, and
// seals every answer here, the late ones (a waiter's grant, a watch's
// wake-up) too: the form, key id and key an answer needs travel with its
// Peer (PeerSeal), which the shards keep for every parked request anyway.
//
//   TenantGate gate(TenantTable::single(key));      // --auth-key
//   TenantGate::Reader reader(gate);                // one per I/O thread
//   auto opened = reader.open(bytes, scratch);      // nullopt: drop, count
//   ... decode(opened->plain), check reader.rights(*opened->tenant, key) ...
//   std::size_t n = reader.seal(opened->seal, buffer, length);
//
// Owners are scoped to their tenant when the table comes from a tenant file
// (scoped()): the top 32 bits of every owner id a datagram names are forced
// to its tenant's key id, so no tenant can name, and so renew, release or
// inherit, another tenant's lease however it learned the owner id (a
// QUERY_HOLDERS on a shared prefix shows them). Clients of a tenant choose
// their ids that way themselves, so the server changes nothing they send.
// The single legacy key scopes nothing: it is one tenant.
//
// Reload: replace() swaps in a new table; each Reader picks it up at its
// next datagram (one relaxed load of a generation counter on the request
// path, a mutex only when it changed). Answers to requests admitted under
// the old table are sealed under whatever the new one holds for their key
// id; a tenant that is gone gets no answer.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "shardlock/lease/server/server_types.h"
#include "shardlock/lease/tenants.h"
#include "shardlock/lease/wire/envelope.h"
#include "shardlock/lease/wire/internal/peer.h"
#include "shardlock/lease/wire/protocol.h"
#include "shardlock/lock_guard.h"
#include "shardlock/mutex.h"

namespace shardlock::lease::internal {

// A tenant table with every key made ready for the envelope (EnvelopeKey:
// derived once per load, not per datagram).
// One tenant's counts (TenantGate::stats()); kept across reloads while the
// tenant's name stays in the file.
struct TenantCounters {
  std::atomic<std::uint64_t> requests{0};           // requests admitted
  std::atomic<std::uint64_t> permission_denied{0};  // of them, answered ERROR permission_denied
};

struct TenantKeys {
  struct Entry {
    const Tenant* tenant = nullptr;
    EnvelopeKey key;
    std::optional<EnvelopeKey> next_key;
    std::shared_ptr<TenantCounters> counters;
  };
  TenantTable table;
  std::vector<Entry> entries;  // in table.tenants() order (by key id)
  bool scoped = false;         // a tenant file: owners carry their tenant's key id

  // `previous`: the table this one replaces, whose tenants' counters the
  // tenants of the same name carry on.
  TenantKeys(TenantTable t, bool scope, const TenantKeys* previous = nullptr);
  [[nodiscard]] const Entry* find(std::uint32_t key_id) const noexcept;
};

class TenantGate {
 public:
  // `scoped`: owners are scoped to tenants (a tenant file); false for
  // TenantTable::single() (--auth-key).
  TenantGate(TenantTable table, bool scoped);

  // Swaps in `table` (a SIGHUP's reload); readers see it from their next
  // datagram on. Thread-safe.
  void replace(TenantTable table, bool scoped);
  // The table now in force.
  [[nodiscard]] std::shared_ptr<const TenantKeys> current() const;
  // Each tenant of the table in force and its counts, by key id.
  [[nodiscard]] std::vector<TenantStats> stats() const;

  // One I/O thread's view: the table it last picked up.
  class Reader {
   public:
    explicit Reader(const TenantGate& gate) : gate_(gate), keys_(gate.current()) {}

    struct Opened {
      std::span<const std::uint8_t> plain;  // the datagram decode() reads
      const Tenant* tenant = nullptr;
      TenantCounters* counters = nullptr;  // the tenant's
      PeerSeal seal;                       // how its answers are sealed
    };
    // `datagram` opened under its key id's tenant key (current, else next),
    // into `scratch` (kMaxDatagramSize bytes); nullopt when it is not sealed,
    // names no tenant of the table, is not encrypted for a tenant that must
    // encrypt, or does not verify (an AES form on a host without AES-NI
    // never does: aes_gcm_available()).
    [[nodiscard]] std::optional<Opened> open(std::span<const std::uint8_t> datagram,
                                             std::span<std::uint8_t> scratch) noexcept;
    // Seals buffer[0, length) as `seal` says; 0 when its tenant is gone or
    // the trailer does not fit.
    [[nodiscard]] std::size_t seal(const PeerSeal& seal, std::span<std::uint8_t> buffer,
                                   std::size_t length) noexcept;
    // Forces the tenant's key id into owner's top 32 bits when owners are
    // scoped; `owner` unchanged otherwise.
    [[nodiscard]] ClientId scope(const Tenant& tenant, ClientId owner) const noexcept;
    [[nodiscard]] bool scoped() const noexcept { return keys_->scoped; }

   private:
    void refresh() noexcept;

    const TenantGate& gate_;
    std::shared_ptr<const TenantKeys> keys_;
    std::uint64_t generation_ = 0;
  };

 private:
  mutable Mutex mu_;
  std::shared_ptr<const TenantKeys> keys_ SHARDLOCK_GUARDED_BY(mu_);
  std::atomic<std::uint64_t> generation_{0};
};

// The bytes sealing as `seal` says adds; the largest for an unsealed peer.
[[nodiscard]] constexpr std::size_t seal_overhead(const PeerSeal& seal) noexcept {
  return seal.mode == 0 ? kMaxEnvelopeOverhead
                        : envelope_overhead(static_cast<EnvelopeMode>(seal.mode - 1));
}

// The right a request of `type` needs on its key (kNone: any tenant may
// send it, as MAP, which every cluster client needs to find the owners).
// STATS and HOT_KEYS need kAdmin, checked on the empty key.
[[nodiscard]] Rights right_needed(MessageType type) noexcept;
// Whether `tenant` may send `m`: the right it needs on its key, on every key
// of an ACQUIRE_MANY, on "" for STATS and HOT_KEYS.
[[nodiscard]] bool permitted(const Tenant& tenant, const Message& m) noexcept;

}  // namespace shardlock::lease::internal
