// See etcd_client.h: TLS towards etcd and etcd's user/password
// authentication. read_etcd_tls_files() and the client certificate's dates
// (OpenSSL's libcrypto, which gRPC's TLS runs on too), the channel
// credentials, the auth token (EtcdClient::Impl::current_token), and what
// a failing connection says about itself (connection_failure()).
//
// The dates are checked here, before any connection, because etcd answers
// an expired client certificate by closing the connection after the TLS 1.3
// handshake: all gRPC can report then is "Endpoint read failed".
#include <openssl/bio.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/objects.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <memory>
#include <string>
#include <string_view>

#include "etcd_call.h"
#include "etcd_client.h"
#include "shardlock/lock_guard.h"

namespace shardlock::cluster {

namespace pb = etcd_call::pb;
using etcd_call::set_error;

namespace {

struct BioFree {
  void operator()(BIO* bio) const noexcept { BIO_free(bio); }
};
struct X509Free {
  void operator()(X509* cert) const noexcept { X509_free(cert); }
};
struct KeyFree {
  void operator()(EVP_PKEY* key) const noexcept { EVP_PKEY_free(key); }
};
using Bio = std::unique_ptr<BIO, BioFree>;
using Certificate = std::unique_ptr<X509, X509Free>;
using PrivateKey = std::unique_ptr<EVP_PKEY, KeyFree>;

// Initialises OpenSSL without its exit-time cleanup, before this file or
// gRPC's TLS first use it (the first initialisation's options stand).
// gRPC's threads run TLS handshakes until the process is gone; cleaned up
// at exit under them, OpenSSL would have a handshaker thread allocate its
// per-thread state again after the cleanup, which nothing then frees (the
// sanitizer builds report it as a leak). A daemon's memory goes with the
// process anyway.
void init_openssl() {
  static const bool initialised = OPENSSL_init_crypto(OPENSSL_INIT_NO_ATEXIT, nullptr) == 1;
  (void)initialised;
}

// OpenSSL's passphrase callback: none. The default one would prompt on the
// terminal for an encrypted key.
int no_passphrase(char* /*buffer*/, int /*size*/, int /*rwflag*/, void* /*user*/) { return 0; }

Bio memory_bio(const std::string& pem) {
  return Bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

// The first certificate in `pem`, or null.
Certificate first_certificate(const std::string& pem) {
  const Bio bio = memory_bio(pem);
  if (!bio) return nullptr;
  Certificate cert(PEM_read_bio_X509(bio.get(), nullptr, no_passphrase, nullptr));
  ERR_clear_error();  // a failed parse leaves its reasons queued; nobody reads them
  return cert;
}

// The whole file, or false with `error` saying why (errno's words).
bool read_whole_file(const std::string& path, std::string& out, std::string& error) {
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (file == nullptr) {
    error = std::strerror(errno);
    return false;
  }
  std::array<char, 4096> chunk{};
  std::size_t n = 0;
  while ((n = std::fread(chunk.data(), 1, chunk.size(), file)) > 0) out.append(chunk.data(), n);
  const bool failed = std::ferror(file) != 0;
  std::fclose(file);
  if (failed) error = "read error";
  return !failed;
}

// "2020-01-02T00:00:00Z" for an ASN.1 time.
std::string utc_text(const ASN1_TIME* time) {
  std::tm tm{};
  if (time == nullptr || ASN1_TIME_to_tm(time, &tm) != 1) return "an unreadable date";
  std::array<char, 32> text{};
  std::strftime(text.data(), text.size(), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return text.data();
}

// The certificate's subject CN, or empty.
std::string common_name(X509* cert) {
  std::array<char, 256> name{};
  const int length = X509_NAME_get_text_by_NID(X509_get_subject_name(cert), NID_commonName,
                                               name.data(), static_cast<int>(name.size()));
  return length > 0 ? std::string(name.data(), static_cast<std::size_t>(length)) : std::string();
}

// What `message` (gRPC's last connection error) means for an etcd
// reached with or without TLS; empty when it says nothing known.
std::string_view connection_hint(std::string_view message, bool tls) {
  const auto says = [message](std::string_view what) {
    return message.find(what) != std::string_view::npos;
  };
  if (says("certificate verify failed")) {
    return "etcd's certificate does not verify against the CA certificates given: not the CA "
           "that signed it, an expired certificate, or one not issued for this host name";
  }
  if (tls && (says("wrong version number") || says("packet length too long") ||
              says("record layer failure"))) {
    return "etcd does not speak TLS on this port: use etcd:// (or http://)";
  }
  if (tls && (says("Endpoint read failed") || says("Socket closed") || says("Connection reset"))) {
    return "etcd closed the connection after the TLS handshake, which it does when it refuses "
           "the client certificate: not signed by a CA in its --trusted-ca-file, expired, or "
           "missing where etcd runs with --client-cert-auth";
  }
  if (!tls && (says("Socket closed") || says("Endpoint read failed") || says("Connection reset"))) {
    return "if etcd serves TLS on this port, use etcds:// (or https://)";
  }
  return {};
}

}  // namespace

EtcdResult<EtcdTls> read_etcd_tls_files(const std::string& ca_file, const std::string& cert_file,
                                        const std::string& key_file) {
  init_openssl();
  EtcdResult<EtcdTls> result;
  if (cert_file.empty() != key_file.empty()) {
    set_error(result, EtcdErrc::kTlsConfig,
              cert_file.empty() ? "a client key (" + key_file + ") without its certificate"
                                : "a client certificate (" + cert_file + ") without its key");
    return result;
  }
  const auto read = [&result](const std::string& path, const char* what, std::string& out) {
    std::string error;
    if (read_whole_file(path, out, error)) return true;
    set_error(result, EtcdErrc::kTlsConfig,
              "cannot read the " + std::string(what) + " " + path + ": " + error);
    return false;
  };
  EtcdTls& tls = result.value;
  if (!ca_file.empty()) {
    if (!read(ca_file, "CA file", tls.ca_pem)) return result;
    if (!first_certificate(tls.ca_pem)) {
      set_error(
          result, EtcdErrc::kTlsConfig,
          "the CA file " + ca_file + " holds no PEM certificate (-----BEGIN CERTIFICATE-----)");
      return result;
    }
  }
  if (cert_file.empty()) return result;
  if (!read(cert_file, "client certificate", tls.cert_pem)) return result;
  if (!read(key_file, "client key", tls.key_pem)) return result;
  tls.cert_source = cert_file;
  const Certificate cert = first_certificate(tls.cert_pem);
  if (!cert) {
    set_error(result, EtcdErrc::kTlsConfig,
              "the client certificate " + cert_file +
                  " holds no PEM certificate (-----BEGIN CERTIFICATE-----)");
    return result;
  }
  const Bio key_bio = memory_bio(tls.key_pem);
  const PrivateKey key(
      key_bio ? PEM_read_bio_PrivateKey(key_bio.get(), nullptr, no_passphrase, nullptr) : nullptr);
  ERR_clear_error();
  if (!key) {
    set_error(result, EtcdErrc::kTlsConfig,
              "the client key " + key_file +
                  " holds no unencrypted PEM private key (an encrypted one cannot be used: "
                  "gRPC takes no passphrase; `openssl pkey -in KEY -out KEY.plain` decrypts it)");
    return result;
  }
  if (X509_check_private_key(cert.get(), key.get()) != 1) {
    ERR_clear_error();
    set_error(result, EtcdErrc::kTlsConfig,
              "the client key " + key_file + " does not belong to the certificate " + cert_file);
    return result;
  }
  return result;
}

namespace etcd_call {

EtcdStatus check_client_certificate(const EtcdTls& tls) {
  init_openssl();
  EtcdStatus result;
  if (tls.cert_pem.empty()) return result;
  const Certificate cert = first_certificate(tls.cert_pem);
  if (!cert) {
    set_error(result, EtcdErrc::kTlsConfig, "the client certificate holds no PEM certificate");
    return result;
  }
  const std::string source = tls.cert_source.empty() ? "" : " in " + tls.cert_source;
  const std::string name = common_name(cert.get());
  const std::string who = name.empty() ? "" : " (CN=" + name + ")";
  const ASN1_TIME* not_after = X509_get0_notAfter(cert.get());
  const ASN1_TIME* not_before = X509_get0_notBefore(cert.get());
  if (X509_cmp_current_time(not_after) <= 0) {
    set_error(result, EtcdErrc::kCertificateExpired,
              "the client certificate" + source + who + " expired at " + utc_text(not_after) +
                  ": etcd would refuse it");
  } else if (X509_cmp_current_time(not_before) >= 0) {
    set_error(result, EtcdErrc::kCertificateExpired,
              "the client certificate" + source + who + " is not valid before " +
                  utc_text(not_before) + ": etcd would refuse it (is this host's clock right?)");
  }
  return result;
}

std::shared_ptr<grpc::ChannelCredentials> channel_credentials(const EtcdClientOptions& options) {
  if (!options.tls) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = options.tls->ca_pem;
  ssl.pem_cert_chain = options.tls->cert_pem;
  ssl.pem_private_key = options.tls->key_pem;
  return grpc::SslCredentials(ssl);
}

std::string connection_failure(const Endpoint& endpoint) {
  const grpc_connectivity_state state = endpoint.channel->GetState(false);
  if (state == GRPC_CHANNEL_READY || state == GRPC_CHANNEL_SHUTDOWN) return {};
  // Fail-fast (not wait_for_ready): a failing channel answers it at once
  // with its last error and sends nothing; one that is connecting again
  // (between two attempts after a backoff) answers when the attempt fails,
  // within a loopback or LAN handshake. Should the channel connect instead,
  // this is a count-only read of one key, which changes nothing.
  grpc::ClientContext context;
  context.set_deadline(deadline_after(std::chrono::milliseconds(250)));
  pb::RangeRequest request;
  request.set_key(std::string(1, '\0'));
  request.set_count_only(true);
  pb::RangeResponse response;
  const grpc::Status status = endpoint.kv->Range(&context, request, &response);
  if (status.error_code() != grpc::StatusCode::UNAVAILABLE) return {};
  std::string failure = status.error_message();
  const std::string_view hint = connection_hint(failure, endpoint.tls);
  if (!hint.empty()) failure += "; " + std::string(hint);
  return failure;
}

bool token_refused(const grpc::Status& status) {
  const std::string& message = status.error_message();
  const auto says = [&message](std::string_view what) {
    return message.find(what) != std::string::npos;
  };
  switch (status.error_code()) {
    case grpc::StatusCode::UNAUTHENTICATED:
      return says("invalid auth token");
    case grpc::StatusCode::INVALID_ARGUMENT:
      return says("revision of auth store is old") || says("user name is empty");
    default:
      return false;
  }
}

}  // namespace etcd_call

EtcdResult<std::string> EtcdClient::Impl::current_token(const Endpoint& target,
                                                        gpr_timespec deadline) {
  EtcdResult<std::string> result;
  LockGuard lock(token_mutex);
  if (auth_token) {
    result.value = *auth_token;
    return result;
  }
  pb::AuthenticateRequest request;
  request.set_name(options.credentials->user);
  request.set_password(options.credentials->password);
  pb::AuthenticateResponse response;
  grpc::ClientContext context;
  context.set_deadline(deadline);
  context.set_wait_for_ready(true);  // see unary()
  const grpc::Status status = target.auth->Authenticate(&context, request, &response);
  const std::string as_user = "authenticating as user '" + options.credentials->user + "'";
  if (status.ok()) {
    auth_token = response.token();
    result.value = *auth_token;
  } else if (status.error_code() == grpc::StatusCode::FAILED_PRECONDITION &&
             status.error_message().find("authentication is not enabled") != std::string::npos) {
    auth_token.emplace();  // etcd checks no token: send none (until one is asked for)
  } else if (status.error_code() == grpc::StatusCode::INVALID_ARGUMENT &&
             status.error_message().find("authentication failed") != std::string::npos) {
    set_error(result, EtcdErrc::kAuthenticationFailed,
              "etcd " + target.target + ": " + as_user + ": " + status.error_message());
  } else {
    etcd_call::set_status_error(result, target, status);
    result.detail += " (" + as_user + ")";
  }
  return result;
}

void EtcdClient::Impl::drop_token(const std::string& stale) {
  LockGuard lock(token_mutex);
  if (auth_token && *auth_token == stale) auth_token.reset();
}

}  // namespace shardlock::cluster
