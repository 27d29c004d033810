// etcd_flags.h: the flags shardlockd and shardlockctl reach etcd with,
// named as etcdctl names them (docs/cluster.md, "etcd over TLS"):
//
//   --cluster etcds://HOST:PORT[,...]   TLS (also https://; etcd:// and http:// are plaintext)
//   --etcd-cacert FILE                  the CA certificates etcd's certificate must verify against
//   --etcd-cert FILE --etcd-key FILE    a client certificate, for etcd's --client-cert-auth
//   --etcd-user NAME                    etcd's user/password authentication, with the password
//   --etcd-password-file FILE           from FILE's first line, or from SHARDLOCK_ETCD_PASSWORD
//
// A password is never taken on the command line, where `ps` shows it to
// every user: --etcd-user NAME:PASSWORD (etcdctl's --user spelling) is
// refused. Only with the cluster layer (SHARDLOCK_HAVE_CLUSTER). Not API.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "etcd_client.h"  // src/cluster/etcd: EtcdTls, EtcdCredentials

namespace shardlock::tools {

// The environment variable a password may come from instead of a file.
inline constexpr const char* kEtcdPasswordEnv = "SHARDLOCK_ETCD_PASSWORD";

// The flags as given.
struct EtcdFlags {
  std::string cacert;
  std::string cert;
  std::string key;
  std::string user;
  std::string password_file;
};

// Adds the five flags to `app`, bound to `flags`; each needs `cluster_flag`
// (the --cluster option) when given.
void add_etcd_flags(CLI::App& app, EtcdFlags& flags, CLI::Option* cluster_flag);

// How to reach etcd: a --cluster URL and the flags, checked against each
// other, with the files read.
struct EtcdConnection {
  std::string endpoints;  // "HOST:PORT[,HOST:PORT...]"
  std::optional<cluster::EtcdTls> tls;
  std::optional<cluster::EtcdCredentials> credentials;
  // Set when the URL or a flag is wrong or a file cannot be read: the
  // usage error, naming the flag (never a password).
  std::string error;
  // What the tool should warn about (a key or password file others can
  // read; a password sent in plaintext beyond loopback).
  std::vector<std::string> warnings;
};

// Turns `url` and `flags` into an EtcdConnection. `resolve_path(flag, path)`
// says which file a flag's value names (shardlockd: a systemd credential
// for a plain name that is no readable file); null: the path itself.
[[nodiscard]] EtcdConnection resolve_etcd_flags(
    std::string_view url, const EtcdFlags& flags,
    const std::function<std::string(std::string_view flag, const std::string& path)>&
        resolve_path = nullptr);

// What to say after an etcd failure `ec` (an EtcdErrc) with `detail` when
// the tool ran with `flags`: "; check --etcd-user and ...", or empty.
[[nodiscard]] std::string etcd_flag_hint(const std::error_code& ec, std::string_view detail,
                                         const EtcdFlags& flags);

}  // namespace shardlock::tools
