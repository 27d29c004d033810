// duration.h: parse and print the durations the lease tools take on their
// command lines ("500ms", "1.5s", "30", "2m", "1h", "1m30s", "0").
//
// Shared by shardlockd, shardlockctl and shardlock-bench so every tool reads
// durations the same way, and by LeaseServer's messages. Nothing crosses the
// wire with it, so it sits beside the lease layer's rooms, not in wire/.
// Pure functions; no allocation except to_string.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <string_view>

namespace shardlock::lease {

// Parses one or more <number><unit> parts, unit one of ms, s, m, h (for
// example "1m30s", "1.5s", "500ms"), or one bare number, which is seconds
// ("30", "0.25", "0"), as sleep(1) reads it. A number may have a fraction
// ("1.5h") as long as the part is whole milliseconds. Returns nullopt for
// anything else: empty text, an unknown unit, a unit missing after the
// first part ("1m30"), a sign, part of a millisecond ("1.5ms"), or a total
// above ~292 million years (overflow).
[[nodiscard]] std::optional<std::chrono::milliseconds> parse_duration(
    std::string_view text) noexcept;

// The shortest exact spelling parse_duration() reads back: "0", "500ms",
// "30s", "2m", "1h", "1m30s", "1s500ms".
[[nodiscard]] std::string to_string(std::chrono::milliseconds d);

}  // namespace shardlock::lease
