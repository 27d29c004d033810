// shardlockctl keygen: a new random auth key for shardlockd --auth-key.
#include "ctl/commands.h"
#include "shardlock/lease/wire/auth.h"

namespace shardlock::ctl {

void add_keygen_command(CLI::App& app, Session& session) {
  CLI::App* sub = app.add_subcommand(
      "keygen", "Print a new random auth key (64 hex digits) for shardlockd --auth-key");
  on_parsed(*sub, session, /*short_w=*/true, [&session] {
    const std::string generated = lease::format_auth_key(lease::generate_auth_key());
    print_result(session.out, Json{{"auth_key", generated}}, generated + "\n");
    return kExitOk;
  });
}

}  // namespace shardlock::ctl
