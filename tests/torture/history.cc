// The history's text form. See history.h.
#include "history.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <utility>

namespace shardlock::torture {
namespace {

// Which fields each kind carries, in line order.
enum Field : std::uint32_t {
  kClient = 1 << 0,
  kOp = 1 << 1,
  kKey = 1 << 2,
  kToken = 1 << 3,
  kExpiry = 1 << 4,
  kTtl = 1 << 5,
  kWait = 1 << 6,
  kValue = 1 << 7,
  kHighest = 1 << 8,
  kIncarnation = 1 << 9,
  kLockDelay = 1 << 10,
  kError = 1 << 11,
  kMode = 1 << 12,
  kPermits = 1 << 13,
  kKeys = 1 << 14,    // replaces kKey in a multi-key acquire
  kTokens = 1 << 15,  // replaces kToken in a multi-key acquire_ok
  kNode = 1 << 16,
  kEpoch = 1 << 17,
  kOwners = 1 << 18,
  kFaultName = 1 << 19,
  kBackups = 1 << 20,
  kPeer = 1 << 21,
  kLeader = 1 << 22,
  kOutside = 1 << 23,
};

// What an acquire event may add: its mode, a key list in place of its key,
// and that it asks outside its tenant's rights.
constexpr std::uint32_t kAcquireExtras = kMode | kPermits | kKeys | kOutside;

struct KindInfo {
  EventKind kind;
  std::string_view name;
  std::uint32_t fields;
  std::uint32_t optional = 0;
};

constexpr std::array<KindInfo, 48> kKinds = {{
    {EventKind::kAcquireInvoke, "acquire_invoke", kClient | kOp | kKey | kTtl | kWait,
     kAcquireExtras},
    {EventKind::kAcquireOk, "acquire_ok", kClient | kOp | kKey | kToken | kExpiry,
     kAcquireExtras | kNode},
    {EventKind::kAcquireFail, "acquire_fail", kClient | kOp | kKey | kError, kAcquireExtras},
    {EventKind::kHold, "hold", kClient | kKey | kToken | kExpiry},
    {EventKind::kRenewInvoke, "renew_invoke", kClient | kOp | kKey | kToken | kTtl},
    {EventKind::kRenewOk, "renew_ok", kClient | kOp | kKey | kToken | kExpiry},
    {EventKind::kRenewFail, "renew_fail", kClient | kOp | kKey | kToken | kError},
    {EventKind::kReleaseInvoke, "release_invoke", kClient | kOp | kKey | kToken},
    {EventKind::kReleaseOk, "release_ok", kClient | kOp | kKey | kToken},
    {EventKind::kReleaseFail, "release_fail", kClient | kOp | kKey | kToken | kError},
    {EventKind::kLost, "lost", kClient | kKey | kToken | kError},
    {EventKind::kRead, "read", kClient | kKey | kValue},
    {EventKind::kWriteInvoke, "write_invoke", kClient | kKey | kToken | kValue},
    {EventKind::kWriteAccepted, "write_accepted", kClient | kKey | kToken | kValue},
    {EventKind::kWriteRejected, "write_rejected", kClient | kKey | kToken | kValue | kHighest},
    {EventKind::kFinalCounter, "final_counter", kKey | kValue},
    {EventKind::kServerStart, "server_start", kIncarnation | kLockDelay, kNode},
    {EventKind::kServerReady, "server_ready", kIncarnation, kNode},
    {EventKind::kServerKill, "server_kill", kIncarnation, kNode},
    {EventKind::kServerPause, "server_pause", kIncarnation, kNode},
    {EventKind::kServerResume, "server_resume", kIncarnation, kNode},
    {EventKind::kClientPause, "client_pause", kClient},
    {EventKind::kClientResume, "client_resume", kClient},
    {EventKind::kNetFaultsOn, "net_faults_on", 0},
    {EventKind::kNetFaultsOff, "net_faults_off", 0},
    {EventKind::kHealed, "healed", 0},
    {EventKind::kMap, "map", kEpoch | kOwners, kBackups},
    {EventKind::kNodeJoin, "node_join", kNode},
    {EventKind::kNodeLeave, "node_leave", kNode},
    {EventKind::kDrainOn, "drain_on", kNode},
    {EventKind::kDrainOff, "drain_off", kNode},
    {EventKind::kEtcdCutOn, "etcd_cut_on", kNode},
    {EventKind::kEtcdCutOff, "etcd_cut_off", kNode},
    {EventKind::kClientCutOn, "client_cut_on", kNode},
    {EventKind::kClientCutOff, "client_cut_off", kNode},
    {EventKind::kFault, "fault", kFaultName},
    {EventKind::kNodeCutOn, "node_cut_on", kNode | kPeer},
    {EventKind::kNodeCutOff, "node_cut_off", kNode | kPeer},
    {EventKind::kNodeReplaced, "node_replaced", kNode | kPeer},
    {EventKind::kCampaignInvoke, "campaign_invoke", kClient | kOp | kKey | kTtl | kWait},
    {EventKind::kElected, "elected", kClient | kOp | kKey | kToken},
    {EventKind::kCampaignFail, "campaign_fail", kClient | kOp | kKey | kError},
    {EventKind::kLead, "lead", kClient | kKey | kToken},
    {EventKind::kResignInvoke, "resign_invoke", kClient | kOp | kKey | kToken},
    {EventKind::kResignOk, "resign_ok", kClient | kOp | kKey | kToken},
    {EventKind::kResignFail, "resign_fail", kClient | kOp | kKey | kToken | kError},
    {EventKind::kDeposed, "deposed", kClient | kKey | kToken | kError},
    {EventKind::kObserve, "observe", kClient | kKey | kToken | kLeader},
}};

const KindInfo& info(EventKind kind) noexcept { return kKinds[static_cast<std::size_t>(kind)]; }

template <typename Int>
bool parse_int(std::string_view text, Int& out) noexcept {
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  return ec == std::errc() && end == text.data() + text.size();
}

template <typename Item, typename Text>
std::string join(const std::vector<Item>& items, Text text) {
  std::string out;
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += ',';
    out += text(items[i]);
  }
  return out;
}

// "a,b,c" -> {a, b, c}; "" -> {}.
std::vector<std::string_view> split_list(std::string_view text) {
  std::vector<std::string_view> items;
  if (text.empty()) return items;
  std::size_t start = 0;
  while (true) {
    const std::size_t comma = std::min(text.find(',', start), text.size());
    items.push_back(text.substr(start, comma - start));
    if (comma == text.size()) return items;
    start = comma + 1;
  }
}

// "a:x,b:y" -> {(a, x), (b, y)}; false when an item has no ':'.
bool parse_pairs(std::string_view text, std::vector<std::pair<std::string, std::string>>& out) {
  out.clear();
  bool ok = true;
  for (const std::string_view item : split_list(text)) {
    const std::size_t colon = item.find(':');
    ok = ok && colon != std::string_view::npos;
    if (colon != std::string_view::npos)
      out.emplace_back(item.substr(0, colon), item.substr(colon + 1));
  }
  return ok;
}

}  // namespace

std::string_view to_string(EventKind kind) noexcept { return info(kind).name; }

std::string_view to_string(AcquireMode mode) noexcept {
  switch (mode) {
    case AcquireMode::kExclusive:
      return "exclusive";
    case AcquireMode::kShared:
      return "shared";
    case AcquireMode::kPermit:
      return "permit";
  }
  return "unknown";
}

std::optional<AcquireMode> parse_acquire_mode(std::string_view name) noexcept {
  for (const AcquireMode mode :
       {AcquireMode::kExclusive, AcquireMode::kShared, AcquireMode::kPermit}) {
    if (to_string(mode) == name) return mode;
  }
  return std::nullopt;
}

std::optional<EventKind> parse_event_kind(std::string_view name) noexcept {
  for (const KindInfo& k : kKinds) {
    if (k.name == name) return k.kind;
  }
  return std::nullopt;
}

std::string format_event(const Event& e) {
  const KindInfo& k = info(e.kind);
  const bool multi = (k.optional & kKeys) != 0 && e.multi_key();
  const std::uint32_t f = k.fields;
  std::string line = std::to_string(e.t_ns);
  line += ' ';
  line += to_string(e.kind);
  const auto add = [&](std::string_view name, const std::string& value) {
    line += ' ';
    line += name;
    line += '=';
    line += value;
  };
  if (f & kClient) add("client", std::to_string(e.client));
  if (f & kOp) add("op", std::to_string(e.op));
  if (f & kKey) {
    if (multi) {
      add("keys", join(e.keys, [](const std::string& key) -> const std::string& { return key; }));
    } else {
      add("key", e.key);
    }
  }
  if (f & kToken) {
    if (multi) {
      add("tokens", join(e.tokens, [](std::uint64_t t) { return std::to_string(t); }));
    } else {
      add("token", std::to_string(e.token));
    }
  }
  if (f & kExpiry) add("expiry_ns", std::to_string(e.expiry_ns));
  if (f & kTtl) add("ttl_ms", std::to_string(e.ttl_ms));
  if (f & kWait) add("wait_ms", std::to_string(e.wait_ms));
  if (f & kValue) add("value", std::to_string(e.value));
  if (f & kHighest) add("highest", std::to_string(e.highest));
  if (f & kIncarnation) add("incarnation", std::to_string(e.incarnation));
  if (f & kLockDelay) add("lock_delay_ms", std::to_string(e.lock_delay_ms));
  if (f & kError) add("error", e.error.empty() ? "-" : e.error);
  if (k.optional & kMode) {
    if (e.mode != AcquireMode::kExclusive) add("mode", std::string(to_string(e.mode)));
    if (e.mode == AcquireMode::kPermit || e.permits != 0) add("permits", std::to_string(e.permits));
  }
  if ((k.optional & kOutside) && e.outside) add("outside", "1");
  if ((f & kNode) || ((k.optional & kNode) && !e.node.empty())) {
    add("node", e.node.empty() ? "-" : e.node);
  }
  if (f & kEpoch) add("epoch", std::to_string(e.epoch));
  if (f & kFaultName) add("fault", e.fault.empty() ? "-" : e.fault);
  if (f & kPeer) add("peer", e.peer.empty() ? "-" : e.peer);
  if (f & kLeader) add("leader", e.leader.empty() ? "-" : e.leader);
  const auto pairs = [](const std::vector<std::pair<std::string, std::string>>& list) {
    return join(list, [](const std::pair<std::string, std::string>& pair) {
      return pair.first + ":" + pair.second;
    });
  };
  if (f & kOwners) add("owners", pairs(e.owners));
  if ((k.optional & kBackups) && !e.backups.empty()) add("backups", pairs(e.backups));
  return line;
}

std::optional<Event> parse_event(std::string_view line, std::string* error) {
  const auto fail = [&](std::string why) -> std::optional<Event> {
    if (error != nullptr) *error = std::move(why);
    return std::nullopt;
  };
  std::vector<std::string_view> words;
  std::size_t start = 0;
  while (start < line.size()) {
    const std::size_t space = std::min(line.find(' ', start), line.size());
    if (space > start) words.push_back(line.substr(start, space - start));
    start = space + 1;
  }
  if (words.size() < 2) return fail("fewer than two words");
  Event e;
  if (!parse_int(words[0], e.t_ns)) return fail("bad time '" + std::string(words[0]) + "'");
  const std::optional<EventKind> kind = parse_event_kind(words[1]);
  if (!kind) return fail("unknown kind '" + std::string(words[1]) + "'");
  e.kind = *kind;
  std::uint32_t seen = 0;
  for (std::size_t i = 2; i < words.size(); ++i) {
    const std::size_t eq = words[i].find('=');
    if (eq == std::string_view::npos) return fail("field without '='");
    const std::string_view name = words[i].substr(0, eq);
    const std::string_view value = words[i].substr(eq + 1);
    bool ok = true;
    if (name == "client") {
      ok = parse_int(value, e.client), seen |= kClient;
    } else if (name == "op") {
      ok = parse_int(value, e.op), seen |= kOp;
    } else if (name == "key") {
      e.key = std::string(value), seen |= kKey;
    } else if (name == "token") {
      ok = parse_int(value, e.token), seen |= kToken;
    } else if (name == "expiry_ns") {
      ok = parse_int(value, e.expiry_ns), seen |= kExpiry;
    } else if (name == "ttl_ms") {
      ok = parse_int(value, e.ttl_ms), seen |= kTtl;
    } else if (name == "wait_ms") {
      ok = parse_int(value, e.wait_ms), seen |= kWait;
    } else if (name == "value") {
      ok = parse_int(value, e.value), seen |= kValue;
    } else if (name == "fault") {
      e.fault = std::string(value), seen |= kFaultName;
    } else if (name == "highest") {
      ok = parse_int(value, e.highest), seen |= kHighest;
    } else if (name == "incarnation") {
      ok = parse_int(value, e.incarnation), seen |= kIncarnation;
    } else if (name == "lock_delay_ms") {
      ok = parse_int(value, e.lock_delay_ms), seen |= kLockDelay;
    } else if (name == "error") {
      e.error = std::string(value), seen |= kError;
    } else if (name == "mode") {
      const std::optional<AcquireMode> mode = parse_acquire_mode(value);
      ok = mode.has_value(), seen |= kMode;
      if (ok) e.mode = *mode;
    } else if (name == "permits") {
      ok = parse_int(value, e.permits), seen |= kPermits;
    } else if (name == "keys") {
      e.keys.clear();
      for (const std::string_view key : split_list(value)) e.keys.emplace_back(key);
      ok = !e.keys.empty(), seen |= kKeys;
    } else if (name == "tokens") {
      e.tokens.clear();
      for (const std::string_view token : split_list(value)) {
        e.tokens.push_back(0);
        ok = ok && parse_int(token, e.tokens.back());
      }
      seen |= kTokens;
    } else if (name == "node") {
      e.node = std::string(value), seen |= kNode;
    } else if (name == "epoch") {
      ok = parse_int(value, e.epoch), seen |= kEpoch;
    } else if (name == "owners") {
      ok = parse_pairs(value, e.owners), seen |= kOwners;
    } else if (name == "backups") {
      ok = parse_pairs(value, e.backups), seen |= kBackups;
    } else if (name == "peer") {
      e.peer = std::string(value), seen |= kPeer;
    } else if (name == "leader") {
      e.leader = std::string(value), seen |= kLeader;
    } else if (name == "outside") {
      ok = value == "1", seen |= kOutside;
      e.outside = ok;
    } else {
      return fail("unknown field '" + std::string(name) + "'");
    }
    if (!ok) return fail("bad value for '" + std::string(name) + "'");
  }
  const KindInfo& k = info(e.kind);
  std::uint32_t required = k.fields;
  if (seen & kKeys) {
    if (!(k.optional & kKeys)) return fail("keys= on " + std::string(words[1]));
    required = (required & ~kKey) | kKeys;
    if (required & kToken) required = (required & ~kToken) | kTokens;
  }
  const std::uint32_t allowed =
      required | (k.optional & (kMode | kPermits | kNode | kBackups | kOutside));
  if ((seen & required) != required) return fail("missing fields for " + std::string(words[1]));
  if (seen & ~allowed) return fail("unexpected fields for " + std::string(words[1]));
  return e;
}

bool read_history(const std::string& dir, std::vector<Event>& out, std::string& error) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::vector<fs::path> files;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, ec)) {
    if (entry.path().extension() == ".log") files.push_back(entry.path());
  }
  if (ec) {
    error = "cannot list " + dir + ": " + ec.message();
    return false;
  }
  std::sort(files.begin(), files.end());
  for (const fs::path& path : files) {
    std::ifstream in(path);
    if (!in) {
      error = "cannot read " + path.string();
      return false;
    }
    std::string line;
    std::size_t number = 0;
    while (std::getline(in, line)) {
      ++number;
      if (line.empty()) continue;
      std::string why;
      std::optional<Event> e = parse_event(line, &why);
      if (!e) {
        if (in.peek() == std::char_traits<char>::eof()) break;  // a torn last line
        error = path.string() + ":" + std::to_string(number) + ": " + why;
        return false;
      }
      out.push_back(std::move(*e));
    }
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const Event& a, const Event& b) { return a.t_ns < b.t_ns; });
  return true;
}

}  // namespace shardlock::torture
