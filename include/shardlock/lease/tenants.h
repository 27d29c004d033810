// tenants.h: who may use a lease server with which key, on which key
// prefixes, and within which bounds: the tenant model, and the text file
// that declares it.
//
// A shared lock cell serves many services. Each one is a tenant: a name, a
// short key id that every datagram names on the wire, the 32-byte key its
// datagrams are sealed under (and, while the key is rotated, the next one),
// whether its traffic is encrypted, the key prefixes it may use with which
// rights, and its own bounds on leases, waiters and watches. This header is
// the model only: pure values and a parser, no socket, no clock, no lock.
// The server looks a datagram's tenant up by key id, verifies the datagram
// under that tenant's keys, and checks rights_for() before the shard sees
// the request.
//
//   auto loaded = shardlock::lease::load_tenant_file("/etc/shardlock/tenants");
//   if (!loaded.ok()) { std::cerr << loaded.message() << "\n"; return 2; }
//   const shardlock::lease::TenantTable& table = *loaded.table;
//   const Tenant* tenant = table.find(key_id);      // nullptr: drop, count
//   if (!contains(rights_for(*tenant, key), Rights::kAcquire)) ...  // ERROR permission_denied
//
// A TenantTable is immutable once built, so any number of threads may read
// one at once; a reload builds a new table and swaps it in whole. The legacy
// single `--auth-key` is TenantTable::single(key): one tenant with every
// right on every key.
//
// Tenant file
// -----------
// One directive a line. Blank lines are ignored, and so is everything from a
// `#` that starts a word (outside quotes) to the end of the line. Words are
// separated by spaces or tabs; lines end in LF or CRLF.
//
//   tenant NAME id=N (key=HEX64 | key-file=PATH) [next=HEX64 | next-file=PATH]
//          [encrypt=yes|no] [max-leases=N] [max-waiters=N] [max-watches=N]
//   allow NAME "PREFIX" RIGHTS
//
//   # billing may lock and watch its own keys; ops may do anything anywhere.
//   tenant billing id=1 key-file=billing.key next-file=billing.next encrypt=yes max-leases=5000
//   tenant ops     id=2 key-file=/etc/shardlock/ops.key
//   allow billing "billing/" acquire,query
//   allow billing "shared/\xff" query
//   allow ops     ""          all
//
// Formally (strings in quotes are bytes; ws is one or more spaces or tabs;
// a control byte is 0x00-0x1f or 0x7f):
//
//   file      = { line } ;
//   line      = [ws] ( directive [ws [comment]] | [comment] ) ( LF | CR LF | end of text ) ;
//   comment   = "#" { any byte but LF } ;
//   directive = tenant | allow ;
//   tenant    = "tenant" ws NAME { ws option } ;
//   option    = OPTION "=" value ;
//   value     = bare | quoted ;
//   allow     = "allow" ws NAME ws quoted ws rights ;
//   rights    = right { "," right } ;
//   right     = "acquire" | "query" | "admin" | "all" ;
//   NAME      = 1 to 64 of A-Z a-z 0-9 _ . - ;
//   bare      = 1 or more bytes, none a space, tab, control byte or '"' ;
//   quoted    = '"' { byte | escape } '"' ;  (byte: any but '"', '\' and control
//                                             bytes; ws or the line end follows)
//   escape    = '\\' | '\"' | '\n' | '\r' | '\t' | '\x' HEX HEX ;
//
// The options of a tenant line, in any order, each at most once:
//   id=N              required; 0 to 4294967295, unique across the file. The
//                     wire names the tenant by it.
//   key=HEX64         the current key, 64 hex digits; or key-file=PATH, a key
//   key-file=PATH     file as `shardlockctl keygen` writes it. Exactly one is
//                     required. A relative PATH is relative to the tenant
//                     file's directory.
//   next=HEX64        the next key during a rotation, accepted beside the
//   next-file=PATH    current one. At most one of the two.
//   encrypt=yes|no    whether the tenant's datagrams are encrypted (default no).
//   max-leases=N      bounds on the tenant's leases held, ACQUIREs queued and
//   max-waiters=N     WATCHes parked, all keys together; 0 to 4294967295,
//   max-watches=N     0 (the default) for no bound beyond the server's own.
// Every key (current or next) must belong to one tenant only, must differ
// from that tenant's other key, and must not be all zeros.
//
// An allow line grants RIGHTS on every key that starts with PREFIX, bytewise:
// "" matches every key, "a/" matches "a/" and "a/b" but not "a". The tenant
// must be declared on a line above it. A tenant's rights on a key are the
// union over all its allow lines whose prefix the key starts with; a tenant
// without any allow line may authenticate but use no key. PREFIX is always
// quoted, so an empty prefix, spaces and bytes that are not UTF-8 (\xNN) can
// be written, and is at most kMaxKeyLength bytes (a longer one would match
// no key). Rights:
//   acquire   ACQUIRE, ACQUIRE_SHARED, ACQUIRE_PERMIT, ACQUIRE_MANY (every
//             key of the set), and RENEW and RELEASE of the tenant's leases
//   query     QUERY, QUERY_HOLDERS and WATCH
//   admin     STATS, HOT_KEYS, drain and metrics. These act on the whole
//             cell, not on a key, so admin is granted on "" only (the server
//             checks rights_for(tenant, "")); on any other prefix it is an
//             error rather than a right that silently does nothing.
//   all       the three above (so on "" only, too)
//
// A file that declares no tenant is an error too: swapped in on a reload, a
// truncated file would otherwise refuse every client.
//
// Errors name the first bad line, the 1-based byte column of the offending
// word or value (or of the line's end, for something missing), and the
// cause. They never quote a key, and quote another word only when it is
// short, printable ASCII: error messages end up in logs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "shardlock/lease/wire/auth.h"

namespace shardlock::lease {

// What a tenant may do on a key: a bit set.
enum class Rights : std::uint8_t {
  kNone = 0,
  kAcquire = 1U << 0,     // exclusive, shared and permit leases, and renewing and releasing them
  kQueryWatch = 1U << 1,  // QUERY, QUERY_HOLDERS, WATCH
  kAdmin = 1U << 2,       // STATS, HOT_KEYS, drain, metrics; only on the empty prefix
  kAll = kAcquire | kQueryWatch | kAdmin,
};

[[nodiscard]] constexpr Rights operator|(Rights a, Rights b) noexcept {
  return static_cast<Rights>(static_cast<std::uint8_t>(a) | static_cast<std::uint8_t>(b));
}
[[nodiscard]] constexpr Rights operator&(Rights a, Rights b) noexcept {
  return static_cast<Rights>(static_cast<std::uint8_t>(a) & static_cast<std::uint8_t>(b));
}
constexpr Rights& operator|=(Rights& a, Rights b) noexcept { return a = a | b; }
// Whether `have` includes every right in `wanted` (kNone: always).
[[nodiscard]] constexpr bool contains(Rights have, Rights wanted) noexcept {
  return (have & wanted) == wanted;
}
// The rights as the tenant file spells them, "acquire,query,admin" in that
// order; "none" for kNone. Bits outside kAll are not printed.
[[nodiscard]] std::string to_string(Rights rights);

// Rights on every key that starts with `prefix` (bytes, not necessarily UTF-8).
struct PrefixRule {
  std::string prefix;
  Rights rights = Rights::kNone;
  friend bool operator==(const PrefixRule&, const PrefixRule&) = default;
};

// Per-tenant bounds over all of the tenant's keys; 0 means no bound beyond
// the server's own.
struct TenantLimits {
  std::uint32_t max_leases = 0;   // leases held
  std::uint32_t max_waiters = 0;  // ACQUIREs queued
  std::uint32_t max_watches = 0;  // WATCHes parked
  friend bool operator==(const TenantLimits&, const TenantLimits&) = default;
};

struct Tenant {
  static constexpr std::size_t kMaxNameLength = 64;

  std::string name;                 // 1..kMaxNameLength of A-Z a-z 0-9 _ . -; unique in a table
  std::uint32_t key_id = 0;         // unique in a table; how a datagram names its tenant
  AuthKey key{};                    // the current key
  std::optional<AuthKey> next_key;  // during a rotation: accepted beside `key`
  bool encrypt = false;             // datagrams encrypted, not only authenticated
  std::vector<PrefixRule> rules;    // in a table: one rule per prefix, sorted by prefix
  TenantLimits limits;
  // For tests and tools: compares keys in variable time, so never use it
  // to check a key a peer sent.
  friend bool operator==(const Tenant&, const Tenant&) = default;
};

// The union of the rights of every rule of `tenant` whose prefix `key`
// starts with (an empty prefix matches every key, a key equal to a prefix
// matches it, a key shorter than a prefix does not). O(rules), no allocation.
[[nodiscard]] inline Rights rights_for(const Tenant& tenant, std::string_view key) noexcept {
  Rights rights = Rights::kNone;
  for (const PrefixRule& rule : tenant.rules) {
    if (key.starts_with(rule.prefix)) rights |= rule.rights;
  }
  return rights;
}

struct TenantTableResult;

// An immutable set of tenants, looked up by key id on the request path.
// Every method is const and safe to call from any number of threads at
// once. Pointers it returns stay valid as long as the table is neither
// destroyed nor assigned to.
class TenantTable {
 public:
  // The empty table: find() answers nullptr for every key id.
  TenantTable() = default;

  // The legacy shared key as a table of one: tenant "default", key id 0,
  // `key`, no encryption, no bounds, every right on every key ("" all).
  [[nodiscard]] static TenantTable single(const AuthKey& key);

  // Checks `tenants` as the file parser does (names, unique key ids and
  // keys, no all-zero key, prefixes at most kMaxKeyLength bytes, no rule
  // without rights, admin on "" only) and builds the table: one rule per
  // prefix (rules with the same prefix merged), sorted. An error names the
  // tenant; its line and column are 0.
  [[nodiscard]] static TenantTableResult build(std::vector<Tenant> tenants);

  // The tenant with `key_id`, or nullptr. O(log n) over a dense sorted
  // array of ids; no allocation.
  [[nodiscard]] const Tenant* find(std::uint32_t key_id) const noexcept;
  // The tenant called `name`, or nullptr. O(log n); not for the request path.
  [[nodiscard]] const Tenant* find_by_name(std::string_view name) const noexcept;

  // Every tenant, sorted by key id.
  [[nodiscard]] std::span<const Tenant> tenants() const noexcept { return tenants_; }
  [[nodiscard]] std::size_t size() const noexcept { return tenants_.size(); }
  [[nodiscard]] bool empty() const noexcept { return tenants_.empty(); }

 private:
  // Takes tenants that pass build()'s checks.
  explicit TenantTable(std::vector<Tenant> tenants);

  std::vector<Tenant> tenants_;         // sorted by key_id
  std::vector<std::uint32_t> key_ids_;  // key_ids_[i] == tenants_[i].key_id
  std::vector<std::uint32_t> by_name_;  // indices into tenants_, sorted by name
};

// A table, or why there is none.
struct TenantTableResult {
  std::optional<TenantTable> table;  // engaged exactly when ok()
  std::string file;                  // the path load_tenant_file() read; empty otherwise
  std::size_t line = 0;              // 1-based line of the error; 0 when not tied to a line
  std::size_t column = 0;            // 1-based byte column of the error; 0 likewise
  std::string error;                 // the cause; empty on success

  [[nodiscard]] bool ok() const noexcept { return error.empty(); }
  // "FILE:LINE:COLUMN: cause"; without a line "FILE: cause"; without a
  // file "line LINE, column COLUMN: cause", or the cause alone.
  [[nodiscard]] std::string message() const;
};

// Reads a key file named by key-file= or next-file=. The default reads the
// file (load_auth_key); tests and the fuzzer pass one that touches no disk.
using KeyFileReader = std::function<AuthKeyFile(const std::string& path)>;

// Parses a tenant file's text (format above). Relative key-file= and
// next-file= paths are taken relative to `base_dir` (the current directory
// when empty) and read through `read_key_file`. Stops at the first error.
// Never throws on bad input and never reads outside `text`.
[[nodiscard]] TenantTableResult parse_tenant_file(
    std::string_view text, std::string_view base_dir,
    const KeyFileReader& read_key_file = load_auth_key);

// Reads the tenant file at `path` (at most kMaxTenantFileSize bytes) and
// parses it with its directory as the base for key files. An unreadable or
// oversized file is an error without a line; `file` is `path` either way.
inline constexpr std::size_t kMaxTenantFileSize = std::size_t{16} << 20;
[[nodiscard]] TenantTableResult load_tenant_file(const std::string& path);

}  // namespace shardlock::lease
