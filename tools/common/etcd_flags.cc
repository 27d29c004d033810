// See etcd_flags.h.
#include "common/etcd_flags.h"

#include <sys/stat.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>

#include "shardlock/cluster/cluster_map.h"

namespace shardlock::tools {

namespace {

// Whether every endpoint of "HOST:PORT[,...]" is on this host.
bool all_loopback(std::string_view endpoints) {
  while (!endpoints.empty()) {
    const std::size_t comma = endpoints.find(',');
    const std::string_view endpoint = endpoints.substr(0, comma);
    const std::string_view host = endpoint.substr(0, endpoint.rfind(':'));
    if (!host.starts_with("127.") && host != "[::1]" && host != "localhost") return false;
    if (comma == std::string_view::npos) break;
    endpoints.remove_prefix(comma + 1);
  }
  return true;
}

// A warning when others may read `path`, which `flag` names.
std::optional<std::string> readable_by_others(std::string_view flag, const std::string& path,
                                              std::string_view what) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || (st.st_mode & 0077) == 0) return std::nullopt;
  std::array<char, 8> mode{};
  std::snprintf(mode.data(), mode.size(), "%04o", static_cast<unsigned>(st.st_mode & 07777));
  return std::string(flag) + " " + path + " is accessible by other users (mode " + mode.data() +
         "): whoever reads it " + std::string(what) +
         ". chmod 600 it, or pass it to the service with LoadCredential=";
}

// Whether `path` can be opened for reading; false with `error` naming the
// flag and errno's reason.
bool readable(std::string_view flag, const std::string& path, std::string& error) {
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (file == nullptr) {
    error = std::string(flag) + " " + path + ": " + std::strerror(errno);
    return false;
  }
  std::fclose(file);
  return true;
}

// The first line of `path` (without its line end), or the error, naming the flag.
bool read_password(const std::string& path, std::string& password, std::string& error) {
  if (!readable("--etcd-password-file", path, error)) return false;
  std::ifstream in(path, std::ios::binary);
  std::getline(in, password);
  if (!password.empty() && password.back() == '\r') password.pop_back();
  if (in.bad()) {
    error = "--etcd-password-file " + path + ": read error";
    return false;
  }
  if (password.empty()) {
    error = "--etcd-password-file " + path + ": its first line (the password) is empty";
    return false;
  }
  return true;
}

// --etcd-user and its password into `out`; false with out.error set.
bool resolve_credentials(const EtcdFlags& flags, const std::string& password_path,
                         EtcdConnection& out) {
  if (flags.user.empty()) {
    if (!flags.password_file.empty()) {
      out.error = "--etcd-password-file needs --etcd-user";
      return false;
    }
    return true;
  }
  if (const std::size_t colon = flags.user.find(':'); colon != std::string::npos) {
    // etcdctl's --user NAME:PASSWORD: the password would be in `ps` for
    // every user to read. Never echo it.
    out.error = "--etcd-user '" + flags.user.substr(0, colon) +
                ":...': a password on the command line is visible to every user in ps; put it "
                "in a file only this user can read and give --etcd-password-file FILE (or set " +
                kEtcdPasswordEnv + ")";
    return false;
  }
  cluster::EtcdCredentials credentials{.user = flags.user, .password = {}};
  if (!flags.password_file.empty()) {
    if (!read_password(password_path, credentials.password, out.error)) return false;
    if (auto warning = readable_by_others("--etcd-password-file", password_path,
                                          "can act as etcd user '" + flags.user + "'")) {
      out.warnings.push_back(std::move(*warning));
    }
  } else if (const char* env = std::getenv(kEtcdPasswordEnv); env != nullptr && *env != '\0') {
    credentials.password = env;
  } else {
    out.error = "--etcd-user " + flags.user + " needs its password: --etcd-password-file FILE " +
                "(its first line) or " + kEtcdPasswordEnv;
    return false;
  }
  if (!out.tls && !all_loopback(out.endpoints)) {
    out.warnings.push_back("--etcd-user " + flags.user + " over plaintext (" + out.endpoints +
                           "): the password and etcd's token cross the network unencrypted; "
                           "use etcds:// (or https://)");
  }
  out.credentials = std::move(credentials);
  return true;
}

}  // namespace

void add_etcd_flags(CLI::App& app, EtcdFlags& flags, CLI::Option* cluster_flag) {
  app.add_option("--etcd-cacert", flags.cacert,
                 "with an etcds:// (or https://) --cluster: the CA certificates (PEM) etcd's "
                 "certificate must verify against, as etcdctl --cacert; default: the system's")
      ->needs(cluster_flag);
  app.add_option("--etcd-cert", flags.cert,
                 "with etcds://: this client's certificate (PEM), for an etcd with "
                 "--client-cert-auth, as etcdctl --cert; needs --etcd-key. etcd takes its CN as "
                 "the user when no --etcd-user is given")
      ->needs(cluster_flag);
  app.add_option("--etcd-key", flags.key,
                 "the private key (PEM, unencrypted) of --etcd-cert, as etcdctl --key")
      ->needs(cluster_flag);
  app.add_option("--etcd-user", flags.user,
                 "authenticate to etcd as this user (etcd's user/password auth; etcdctl --user "
                 "without the :PASSWORD, which ps would show): the password comes from "
                 "--etcd-password-file or $" +
                     std::string(kEtcdPasswordEnv))
      ->needs(cluster_flag);
  app.add_option("--etcd-password-file", flags.password_file,
                 "file whose first line is --etcd-user's password (chmod 600)")
      ->needs(cluster_flag);
}

EtcdConnection resolve_etcd_flags(
    std::string_view url, const EtcdFlags& flags,
    const std::function<std::string(std::string_view flag, const std::string& path)>&
        resolve_path) {
  EtcdConnection out;
  const std::optional<cluster::EtcdUrl> parsed = cluster::parse_etcd_url(url);
  if (!parsed) {
    out.error = "--cluster: '" + std::string(url) +
                "' is not etcd://HOST:PORT[,HOST:PORT...] (plaintext; also http://) or "
                "etcds://HOST:PORT[,...] (TLS; also https://)";
    return out;
  }
  out.endpoints = parsed->endpoints;
  const auto path_of = [&resolve_path](std::string_view flag, const std::string& path) {
    return resolve_path && !path.empty() ? resolve_path(flag, path) : path;
  };
  if (!parsed->tls) {
    for (const auto& [flag, value] : {std::pair{"--etcd-cacert", &flags.cacert},
                                      std::pair{"--etcd-cert", &flags.cert},
                                      std::pair{"--etcd-key", &flags.key}}) {
      if (!value->empty()) {
        out.error = std::string(flag) + " needs TLS: give --cluster as etcds://HOST:PORT (or " +
                    "https://), not '" + std::string(url) + "'";
        return out;
      }
    }
  } else {
    if (flags.cert.empty() != flags.key.empty()) {
      out.error = flags.cert.empty() ? "--etcd-key needs --etcd-cert (its certificate)"
                                     : "--etcd-cert needs --etcd-key (its private key)";
      return out;
    }
    const std::string ca_path = path_of("--etcd-cacert", flags.cacert);
    const std::string cert_path = path_of("--etcd-cert", flags.cert);
    const std::string key_path = path_of("--etcd-key", flags.key);
    for (const auto& [flag, path] : {std::pair{"--etcd-cacert", &ca_path},
                                     std::pair{"--etcd-cert", &cert_path},
                                     std::pair{"--etcd-key", &key_path}}) {
      if (!path->empty() && !readable(flag, *path, out.error)) return out;
    }
    auto read = cluster::read_etcd_tls_files(ca_path, cert_path, key_path);
    if (!read.ok()) {
      out.error = "etcd TLS (--etcd-cacert, --etcd-cert, --etcd-key): " + read.detail;
      return out;
    }
    if (!key_path.empty()) {
      if (auto warning =
              readable_by_others("--etcd-key", key_path, "can pose as this client to etcd")) {
        out.warnings.push_back(std::move(*warning));
      }
    }
    out.tls = std::move(read.value);
  }
  if (!resolve_credentials(flags, path_of("--etcd-password-file", flags.password_file), out)) {
    return out;
  }
  return out;
}

std::string etcd_flag_hint(const std::error_code& ec, std::string_view detail,
                           const EtcdFlags& flags) {
  using cluster::EtcdErrc;
  if (ec == EtcdErrc::kAuthenticationFailed) {
    return "; check --etcd-user and the password in --etcd-password-file (or " +
           std::string(kEtcdPasswordEnv) + ")";
  }
  if (ec == EtcdErrc::kCertificateExpired) return "; renew --etcd-cert";
  // Without a token etcd takes the user from the client certificate's CN,
  // and without one it has no user at all.
  if (flags.user.empty() && (ec == EtcdErrc::kPermissionDenied ||
                             detail.find("user name is empty") != std::string_view::npos)) {
    return flags.cert.empty()
               ? "; etcd has authentication enabled: give --etcd-user and --etcd-password-file, "
                 "or a client certificate (--etcd-cert) whose CN is an etcd user"
               : "; without --etcd-user, etcd takes the user from the CN of the --etcd-cert "
                 "certificate: give --etcd-user and --etcd-password-file, or a certificate whose "
                 "CN is an etcd user with read and write permission on the cluster's prefix";
  }
  if (ec == EtcdErrc::kPermissionDenied) {
    return "; the etcd user needs read and write permission on the cluster's prefix (etcdctl "
           "role grant-permission ROLE readwrite /shardlock/NAME/ --prefix)";
  }
  return {};
}

}  // namespace shardlock::tools
