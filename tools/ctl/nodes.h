// nodes.h: what stats, ping and top share: a STATS reply's gauges as JSON,
// and the report of a node that did not answer. Not API.
#pragma once

#include <string>
#include <system_error>

#include "ctl/output.h"
#include "shardlock/lease/client/client.h"

namespace shardlock::ctl {

// The gauges of a STATS reply beside its counters, under their JSON names;
// from a server that predates them, version null and no others.
void put_gauges(Json& j, const lease::ServerStatsReply& s);

// Why a call to `node` failed, diagnosed: on stderr for people, in `j` for
// JSON. Returns its exit status.
int node_failure(lease::LeaseClient& client, const std::string& node, milliseconds timeout,
                 bool have_key, std::error_code error, const Output& out, Json& j);

}  // namespace shardlock::ctl
