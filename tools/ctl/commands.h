// commands.h: shardlockctl's commands, as etcdctl lays out its own: each
// tools/ctl/<command>.cc adds one subcommand (or a small family) to the
// app with its flags, help and callback. main() (tools/shardlockctl.cc)
// adds them in the order --help lists them. Not API.
#pragma once

#include <CLI/CLI.hpp>

#include "ctl/session.h"

namespace shardlock::ctl {

void add_acquire_command(CLI::App& app, Session& session);  // acquire.cc
void add_renew_command(CLI::App& app, Session& session);    // lease_calls.cc
void add_release_command(CLI::App& app, Session& session);  // lease_calls.cc
void add_query_command(CLI::App& app, Session& session);    // lease_calls.cc
void add_keygen_command(CLI::App& app, Session& session);   // keygen.cc
void add_stats_command(CLI::App& app, Session& session);    // nodes.cc
void add_top_command(CLI::App& app, Session& session);      // top.cc
void add_ping_command(CLI::App& app, Session& session);     // nodes.cc
void add_run_command(CLI::App& app, Session& session);      // run.cc
void add_elect_command(CLI::App& app, Session& session);    // run.cc
void add_leader_command(CLI::App& app, Session& session);   // election.cc
void add_observe_command(CLI::App& app, Session& session);  // election.cc
void add_members_command(CLI::App& app, Session& session);  // cluster.cc
void add_drain_command(CLI::App& app, Session& session);    // cluster.cc

}  // namespace shardlock::ctl
