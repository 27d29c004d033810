// The cluster's values, their encodings and routing over a map. The design
// note is in include/shardlock/cluster/cluster_map.h and docs/cluster.md.
#include "shardlock/cluster/cluster_map.h"

#include <algorithm>
#include <charconv>
#include <span>
#include <utility>

#include "shardlock/lease/wire/protocol.h"

namespace shardlock::cluster {
namespace {

constexpr std::string_view kMapVersionLineV1 = "shardlock-map v1";
constexpr std::string_view kMapVersionPrefixV2 = "shardlock-map v2 epoch=";
// Starts a learner's line; not a node id character.
constexpr char kLearnerMark = '+';
// The wire's bounds (MAP_REPLY members): what membership accepts is what a
// node can serve to clients.
constexpr std::size_t kMaxNodeIdBytes = lease::kMaxMemberIdLength;
constexpr std::size_t kMaxAddressBytes = lease::kMaxMemberAddressLength;
// --cluster's schemes: plaintext, then TLS.
constexpr std::string_view kPlaintextSchemes[] = {"etcd://", "http://"};
constexpr std::string_view kTlsSchemes[] = {"etcds://", "https://"};
// The lease client routes with the same count (src/lease/client_routing.h).
constexpr int kClusterBucketBits = 16;

template <typename Unsigned>
bool parse_decimal(std::string_view text, Unsigned& out) noexcept {
  if (text.empty()) return false;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  return ec == std::errc{} && end == text.data() + text.size();
}

bool valid_weight(std::uint32_t weight) noexcept {
  return weight >= 1 && weight <= RouterSnapshot::kMaxWeight;
}

// Splits on `separator`; empty fields are kept (and then rejected).
std::vector<std::string_view> split(std::string_view text, char separator) {
  std::vector<std::string_view> fields;
  std::size_t start = 0;
  for (;;) {
    const std::size_t end = text.find(separator, start);
    if (end == std::string_view::npos) {
      fields.push_back(text.substr(start));
      return fields;
    }
    fields.push_back(text.substr(start, end - start));
    start = end + 1;
  }
}

}  // namespace

// ---------------------------------------------------------------------------
// Names
// ---------------------------------------------------------------------------

bool valid_node_id(std::string_view id) noexcept {
  if (id.empty() || id.size() > kMaxNodeIdBytes) return false;
  return std::all_of(id.begin(), id.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == '-';
  });
}

bool valid_member_address(std::string_view address) noexcept {
  if (address.empty() || address.size() > kMaxAddressBytes) return false;
  for (const char c : address) {
    if (c <= ' ' || c == 0x7f) return false;
  }
  const std::size_t colon = address.rfind(':');
  if (colon == std::string_view::npos || colon == 0) return false;
  std::uint32_t port = 0;
  return parse_decimal(address.substr(colon + 1), port) && port >= 1 && port <= 65535;
}

std::string cluster_prefix(std::string_view cluster_name) {
  if (!valid_node_id(cluster_name)) return {};
  return "/shardlock/" + std::string(cluster_name) + "/";
}

std::optional<EtcdUrl> parse_etcd_url(std::string_view url) {
  // Strips one of `schemes` off `text`; false when it starts with none.
  const auto strip = [](std::string_view& text, const auto& schemes) {
    for (const std::string_view scheme : schemes) {
      if (text.starts_with(scheme)) {
        text.remove_prefix(scheme.size());
        return true;
      }
    }
    return false;
  };
  EtcdUrl parsed;
  if (!strip(url, kPlaintextSchemes)) {
    if (!strip(url, kTlsSchemes)) return std::nullopt;
    parsed.tls = true;
  }
  for (std::string_view endpoint : split(url, ',')) {
    if (!parsed.endpoints.empty()) {
      // A repeated scheme of the same kind; the other kind's is refused.
      strip(endpoint, parsed.tls ? kTlsSchemes : kPlaintextSchemes);
    }
    if (!valid_member_address(endpoint) || endpoint.find("//") != std::string_view::npos) {
      return std::nullopt;
    }
    if (!parsed.endpoints.empty()) parsed.endpoints += ',';
    parsed.endpoints += endpoint;
  }
  return parsed;
}

// ---------------------------------------------------------------------------
// Encodings
// ---------------------------------------------------------------------------

std::string_view to_string(MemberState state) noexcept {
  switch (state) {
    case MemberState::kDraining:
      return "draining";
    case MemberState::kJoining:
      return "joining";
    case MemberState::kActive:
      break;
  }
  return "active";
}

std::string encode_member(const MemberRecord& record) {
  std::string text = "address=" + record.address + " weight=" + std::to_string(record.weight) +
                     " state=" + std::string(to_string(record.state));
  if (record.max_ttl_ms != 0) text += " max_ttl_ms=" + std::to_string(record.max_ttl_ms);
  if (record.replicas != 0) text += " replicas=" + std::to_string(record.replicas);
  return text;
}

std::optional<MemberRecord> decode_member(std::string_view text) {
  MemberRecord record;
  bool have_address = false;
  bool have_weight = false;
  bool have_state = false;
  for (const std::string_view field : split(text, ' ')) {
    const std::size_t equals = field.find('=');
    if (equals == std::string_view::npos) return std::nullopt;
    const std::string_view name = field.substr(0, equals);
    const std::string_view value = field.substr(equals + 1);
    if (name == "address") {
      if (!valid_member_address(value)) return std::nullopt;
      record.address = std::string(value);
      have_address = true;
    } else if (name == "weight") {
      if (!parse_decimal(value, record.weight) || !valid_weight(record.weight)) return std::nullopt;
      have_weight = true;
    } else if (name == "state") {
      if (value == "active") {
        record.state = MemberState::kActive;
      } else if (value == "draining") {
        record.state = MemberState::kDraining;
      } else if (value == "joining") {
        record.state = MemberState::kJoining;
      } else {
        return std::nullopt;
      }
      have_state = true;
    } else if (name == "max_ttl_ms") {
      if (!parse_decimal(value, record.max_ttl_ms)) return std::nullopt;
    } else if (name == "replicas") {
      if (!parse_decimal(value, record.replicas) || record.replicas == 0) return std::nullopt;
    }
  }
  if (!have_address || !have_weight || !have_state) return std::nullopt;
  return record;
}

std::string encode_map(const ClusterMap& map) {
  std::string text(kMapVersionPrefixV2);
  text += std::to_string(map.epoch);
  text += '\n';
  auto line = [&text](const ClusterMember& member, bool learner) {
    if (learner) text += kLearnerMark;
    text += member.id;
    text += ' ';
    text += member.address;
    text += ' ';
    text += std::to_string(member.weight);
    if (member.lease != 0) text += " lease=" + std::to_string(member.lease);
    text += '\n';
  };
  for (const ClusterMember& member : map.members) line(member, false);
  for (const ClusterMember& learner : map.learners) line(learner, true);
  return text;
}

std::optional<ClusterMap> decode_map(std::string_view text, std::uint64_t mod_revision) {
  if (!text.ends_with('\n')) return std::nullopt;
  std::vector<std::string_view> lines = split(text.substr(0, text.size() - 1), '\n');
  ClusterMap map;
  if (lines.front() == kMapVersionLineV1) {
    map.epoch = mod_revision;
  } else if (!lines.front().starts_with(kMapVersionPrefixV2) ||
             !parse_decimal(lines.front().substr(kMapVersionPrefixV2.size()), map.epoch) ||
             map.epoch == 0) {
    return std::nullopt;
  }
  map.members.reserve(lines.size() - 1);
  for (std::size_t i = 1; i < lines.size(); ++i) {
    std::string_view line = lines[i];
    const bool learner = line.starts_with(kLearnerMark);
    if (learner) line.remove_prefix(1);
    const std::vector<std::string_view> fields = split(line, ' ');
    if (fields.size() < 3 || fields.size() > 4 || !valid_node_id(fields[0]) ||
        !valid_member_address(fields[1])) {
      return std::nullopt;
    }
    ClusterMember member{std::string(fields[0]), std::string(fields[1]), 0};
    if (!parse_decimal(fields[2], member.weight) || !valid_weight(member.weight))
      return std::nullopt;
    if (fields.size() == 4) {
      constexpr std::string_view kLease = "lease=";
      if (!fields[3].starts_with(kLease) ||
          !parse_decimal(fields[3].substr(kLease.size()), member.lease) || member.lease <= 0) {
        return std::nullopt;
      }
    }
    // Members, then learners, each in id order.
    std::vector<ClusterMember>& list = learner ? map.learners : map.members;
    if (!learner && !map.learners.empty()) return std::nullopt;
    if (!list.empty() && !(list.back().id < member.id)) return std::nullopt;
    list.push_back(std::move(member));
  }
  for (const ClusterMember& learner : map.learners) {
    const auto at =
        std::lower_bound(map.members.begin(), map.members.end(), learner.id,
                         [](const ClusterMember& m, const std::string& id) { return m.id < id; });
    if (at != map.members.end() && at->id == learner.id) return std::nullopt;
  }
  return map;
}

std::optional<std::vector<ClusterMember>> decode_map_members(std::string_view text) {
  std::optional<ClusterMap> map = decode_map(text, 1);
  if (!map) return std::nullopt;
  return std::move(map->members);
}

// ---------------------------------------------------------------------------
// Routing
// ---------------------------------------------------------------------------

RouterOptions cluster_router_options() noexcept {
  RouterOptions options;
  options.seed = kDefaultRouterSeed;
  options.bucket_bits = kClusterBucketBits;
  return options;
}

RouterStatus ClusterRouting::build(const ClusterMap& map, const RouterOptions& options,
                                   std::unique_ptr<ClusterRouting>& out) {
  std::unique_ptr<ClusterRouting> routing(new ClusterRouting());
  routing->map_ = map;
  // The Router keeps its nodes sorted by id; so must the map, for table
  // indices to be member indices.
  std::sort(routing->map_.members.begin(), routing->map_.members.end(),
            [](const ClusterMember& a, const ClusterMember& b) { return a.id < b.id; });
  std::vector<Node> nodes;
  nodes.reserve(routing->map_.members.size());
  for (const ClusterMember& member : routing->map_.members) {
    nodes.push_back(Node{member.id, member.weight});
  }
  Router router(options);
  if (const RouterStatus status = router.assign(nodes); status != RouterStatus::kOk) {
    return status;
  }
  routing->snapshot_ = router.snapshot();  // outlives the Router
  out = std::move(routing);
  return RouterStatus::kOk;
}

const ClusterMember* ClusterRouting::owner_of_bucket(std::size_t bucket) const noexcept {
  const std::span<const std::uint16_t> table = snapshot_->table();
  if (bucket >= table.size()) return nullptr;
  const std::uint16_t index = table[bucket];
  if (index == RouterSnapshot::kNoOwner || index >= map_.members.size()) return nullptr;
  return &map_.members[index];
}

RouterStatus ReplicaRouting::build(const ClusterMap& map, const RouterOptions& options,
                                   std::unique_ptr<ReplicaRouting>& out) {
  std::unique_ptr<ReplicaRouting> routing(new ReplicaRouting());
  std::vector<std::pair<ClusterMember, bool>> all;
  for (const ClusterMember& member : map.members) all.emplace_back(member, false);
  for (const ClusterMember& learner : map.learners) all.emplace_back(learner, true);
  // The Router keeps its nodes sorted by id.
  std::sort(all.begin(), all.end(),
            [](const auto& a, const auto& b) { return a.first.id < b.first.id; });
  std::vector<Node> nodes;
  for (auto& [member, learner] : all) {
    nodes.push_back(Node{member.id, member.weight});
    routing->nodes_.push_back(std::move(member));
    routing->learners_.push_back(learner);
  }
  Router router(options);
  if (const RouterStatus status = router.assign(nodes); status != RouterStatus::kOk) {
    return status;
  }
  routing->snapshot_ = router.snapshot();
  out = std::move(routing);
  return RouterStatus::kOk;
}

std::vector<std::size_t> ClusterRouting::buckets_per_member() const {
  std::vector<std::size_t> counts(map_.members.size(), 0);
  for (const std::uint16_t index : snapshot_->table()) {
    if (index != RouterSnapshot::kNoOwner && index < counts.size()) ++counts[index];
  }
  return counts;
}

bool has_backups(const ClusterMap& map, std::size_t replicas) noexcept {
  return replicas > 1 && map.members.size() + map.learners.size() > 1;
}

}  // namespace shardlock::cluster
