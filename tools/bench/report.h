// report.h: how shardlock-bench shows a finished run: a table for people,
// or one JSON object (--json) for scripts. Not API.
#pragma once

#include "bench/config.h"
#include "bench/results.h"

namespace shardlock::bench {

// One JSON object on stdout, made with nlohmann-json: valid whatever the
// target's name or the first error holds (bytes that are not UTF-8 become
// U+FFFD).
void print_json(const Config& config, const Result& r);

// The table on stdout: the run's set-up, throughput, counts, error kinds and
// latency percentiles.
void print_table(const Config& config, const Result& r);

}  // namespace shardlock::bench
