// shardlock-route: asks the Router where keys go, for operators planning a
// membership change.
//
//   shardlock-route nodes.txt < keys.txt      owner of each key on stdin
//   shardlock-route nodes.txt --random 1000000 distribution over random keys
//   shardlock-route --diff old.txt new.txt     fraction of keys that move
//
// Exit codes: 0 success, 1 an unexpected failure (out of memory, stdout
// could not be written), 2 bad input (unreadable or malformed membership
// file, unreadable stdin, bad flags).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/command_line.h"
#include "shardlock/router.h"

namespace {

using shardlock::Node;
using shardlock::Router;
using shardlock::RouterOptions;
using shardlock::RouterSnapshot;

constexpr const char* kTool = "shardlock-route";
constexpr int kFailed = 1;
// Unreadable or malformed input is a usage error too.
constexpr int kBadInput = shardlock::tools::kExitUsage;

// Reads and parses a membership file; prints "FILE:LINE: message" on error.
std::optional<std::vector<Node>> load_membership(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::cerr << "shardlock-route: " << path << ": cannot open\n";
    return std::nullopt;
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) {
    std::cerr << "shardlock-route: " << path << ": read error\n";
    return std::nullopt;
  }
  shardlock::MembershipParseResult parsed = shardlock::parse_membership(text.str());
  if (!parsed.ok()) {
    std::cerr << "shardlock-route: " << path << ":" << parsed.error_line << ": " << parsed.error
              << "\n";
    return std::nullopt;
  }
  if (parsed.nodes.empty()) {
    std::cerr << "shardlock-route: " << path << ": no nodes\n";
    return std::nullopt;
  }
  return std::move(parsed.nodes);
}

std::string random_key(std::mt19937_64& rng) {
  std::uniform_int_distribution<int> length(16, 32);
  std::uniform_int_distribution<int> letter(33, 126);
  std::string key(static_cast<std::size_t>(length(rng)), ' ');
  for (char& c : key) c = static_cast<char>(letter(rng));
  return key;
}

double percent(double part, double whole) { return whole == 0 ? 0 : 100.0 * part / whole; }

// Per-node share over `samples` random keys next to the exact key-space
// share, then peak/mean and the standard deviation of the load per unit of
// weight (so weighted nodes compare fairly).
void print_distribution(const RouterSnapshot& snapshot, std::uint64_t samples,
                        std::uint64_t key_seed) {
  std::vector<std::uint64_t> sampled(snapshot.size(), 0);
  std::mt19937_64 rng(key_seed);
  for (std::uint64_t i = 0; i < samples; ++i) ++sampled[snapshot.owner_index(random_key(rng))];
  const std::vector<std::uint64_t> exact = snapshot.bucket_counts();
  const auto buckets = static_cast<double>(snapshot.bucket_count());
  double total_weight = 0;
  for (const Node& node : snapshot.nodes()) total_weight += node.weight;

  std::printf("%-32s %6s %12s %10s %10s\n", "node", "weight", "keys", "share%", "exact%");
  for (std::size_t i = 0; i < snapshot.size(); ++i) {
    const Node& node = snapshot.nodes()[i];
    std::printf("%-32s %6u %12llu %10.4f %10.4f\n", node.id.c_str(), node.weight,
                static_cast<unsigned long long>(sampled[i]),
                percent(static_cast<double>(sampled[i]), static_cast<double>(samples)),
                percent(static_cast<double>(exact[i]), buckets));
  }
  // Load per unit weight, relative to its mean (1.0 = fair share).
  const auto summarize = [&](const std::vector<std::uint64_t>& counts, double total,
                             const char* label) {
    double peak = 0;
    double sum_squares = 0;
    for (std::size_t i = 0; i < counts.size(); ++i) {
      const double fair = total * snapshot.nodes()[i].weight / total_weight;
      const double relative = fair == 0 ? 0 : static_cast<double>(counts[i]) / fair;
      peak = std::max(peak, relative);
      sum_squares += (relative - 1) * (relative - 1);
    }
    std::printf("%s: peak/mean %.4f, stddev %.4f of the mean\n", label, peak,
                std::sqrt(sum_squares / static_cast<double>(counts.size())));
  };
  std::printf("\nnodes %zu, total weight %.0f, buckets 2^%d, random keys %llu\n", snapshot.size(),
              total_weight, snapshot.bucket_bits(), static_cast<unsigned long long>(samples));
  if (samples > 0) summarize(sampled, static_cast<double>(samples), "sampled");
  summarize(exact, buckets, "exact  ");
}

// The exact fraction of the key space whose owner differs, plus, for
// reference, the minimum any consistent hash must move.
void print_diff(const RouterSnapshot& before, const RouterSnapshot& after) {
  std::vector<std::uint32_t> after_index_of_before(before.size(), 0xFFFFFFFF);
  for (std::size_t i = 0, j = 0; i < before.size(); ++i) {
    while (j < after.size() && after.nodes()[j].id < before.nodes()[i].id) ++j;
    if (j < after.size() && after.nodes()[j].id == before.nodes()[i].id) {
      after_index_of_before[i] = static_cast<std::uint32_t>(j);
    }
  }
  std::uint64_t moved = 0;
  for (std::size_t b = 0; b < before.bucket_count(); ++b) {
    if (after_index_of_before[before.table()[b]] != after.table()[b]) ++moved;
  }
  // Minimum movement: the share each node loses, summed.
  double before_weight = 0;
  double after_weight = 0;
  for (const Node& node : before.nodes()) before_weight += node.weight;
  for (const Node& node : after.nodes()) after_weight += node.weight;
  double ideal = 0;
  for (std::size_t i = 0; i < before.size(); ++i) {
    const double was = before.nodes()[i].weight / before_weight;
    const std::uint32_t j = after_index_of_before[i];
    const double now = j == 0xFFFFFFFF ? 0 : after.nodes()[j].weight / after_weight;
    ideal += std::max(0.0, was - now);
  }
  const double fraction = static_cast<double>(moved) / static_cast<double>(before.bucket_count());
  std::printf("moved %.6f of the key space (%.4f%%, exact over 2^%d buckets)\n", fraction,
              100 * fraction, before.bucket_bits());
  std::printf("minimum for this change %.6f (%.4f%%)\n", ideal, 100 * ideal);
}

int run(int argc, char** argv) {
  CLI::App app{
      "Shows which node owns a key under shardlock's consistent-hash Router.\n"
      "Membership files hold one \"node [weight]\" per line (weight 1..1024, default 1);\n"
      "blank lines and text after '#' are ignored."};
  shardlock::tools::add_version_flag(app, kTool);
  app.footer(
      "Exit codes: 0 success; 1 an unexpected failure, or stdout could not be written; 2 bad "
      "input (unreadable or malformed membership file, unreadable stdin, bad flags).");
  std::string membership_path;
  std::vector<std::string> diff_paths;
  std::uint64_t random_keys = 0;
  std::uint64_t key_seed = 1;
  std::size_t replicas = 1;
  RouterOptions options;
  app.add_option("membership", membership_path, "membership file")->check(CLI::ExistingFile);
  app.add_option("--random", random_keys,
                 "print the distribution over this many random keys instead of reading stdin");
  app.add_option("--key-seed", key_seed, "PRNG seed for --random keys")->capture_default_str();
  app.add_option("--diff", diff_paths, "OLD NEW: fraction of keys that move between two files")
      ->expected(2)
      ->check(CLI::ExistingFile);
  app.add_option("--replicas", replicas, "print this many owners per key, best first")
      ->check(CLI::Range(1, 16))
      ->capture_default_str();
  app.add_option("--seed", options.seed, "router seed (changing it moves every key)")
      ->capture_default_str();
  app.add_option("--bucket-bits", options.bucket_bits, "log2 of the bucket count")
      ->check(CLI::Range(shardlock::kMinBucketBits, shardlock::kMaxBucketBits))
      ->capture_default_str();
  if (const auto status = shardlock::tools::parse_command_line(app, argc, argv, kTool)) {
    return *status;
  }

  if (!diff_paths.empty()) {
    if (!membership_path.empty()) {
      std::cerr << "shardlock-route: --diff takes OLD and NEW; give no other membership file\n";
      return kBadInput;
    }
    const auto old_nodes = load_membership(diff_paths[0]);
    const auto new_nodes = load_membership(diff_paths[1]);
    if (!old_nodes || !new_nodes) return kBadInput;
    const Router before(*old_nodes, options);
    const Router after(*new_nodes, options);
    print_diff(*before.snapshot(), *after.snapshot());
    return 0;
  }
  if (membership_path.empty()) {
    std::cerr << "shardlock-route: a membership file is required (see --help)\n";
    return kBadInput;
  }
  const auto nodes = load_membership(membership_path);
  if (!nodes) return kBadInput;
  const Router router(*nodes, options);
  const auto snapshot = router.snapshot();
  if (random_keys > 0) {
    print_distribution(*snapshot, random_keys, key_seed);
    return 0;
  }
  for (std::string key; std::getline(std::cin, key);) {
    if (!key.empty() && key.back() == '\r') key.pop_back();
    std::cout << key << '\t';
    const std::vector<shardlock::NodeId> owners = snapshot->owners(key, replicas);
    for (std::size_t i = 0; i < owners.size(); ++i) std::cout << (i ? "," : "") << owners[i];
    std::cout << '\n';
  }
  // getline stops at a read error as at the end: only the stream tells them
  // apart, and a cut-off key list must not look like a complete answer.
  if (std::cin.bad() || std::ferror(stdin) != 0) {
    std::cerr << "shardlock-route: cannot read the keys on stdin\n";
    return kBadInput;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return shardlock::tools::run_main(kTool, kFailed, run, argc, argv);
}
