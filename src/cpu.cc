#include "shardlock/internal/cpu.h"

#include <fstream>
#include <string>

namespace shardlock::internal {
namespace {

// The value of the first "key : value" line of /proc/cpuinfo whose key is
// exactly `key`, or "".
std::string cpuinfo_field(const std::string& key) {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    const auto key_end = line.find_last_not_of(" \t", colon - 1);
    if (key_end == std::string::npos || line.compare(0, key_end + 1, key) != 0 ||
        key_end + 1 != key.size()) {
      continue;
    }
    const auto start = line.find_first_not_of(" \t", colon + 1);
    return start == std::string::npos ? std::string() : line.substr(start);
  }
  return {};
}

}  // namespace

std::string cpu_model_name() {
  std::string name = cpuinfo_field("model name");
  if (name.empty()) return "unknown CPU";
  // Hypervisors often shorten the name ("AMD EPYC"); family and model still
  // tell the generations apart (Zen 4 is family 25 model 17).
  const std::string family = cpuinfo_field("cpu family");
  const std::string model = cpuinfo_field("model");
  if (!family.empty() && !model.empty()) name += " (family " + family + " model " + model + ")";
  return name;
}

}  // namespace shardlock::internal
