// See etcd_client.h: the errors (EtcdErrc, its category, the mapping from
// gRPC's status codes) and prefix_range_end(). connect() and the KV and
// Lease calls are in etcd_kv_lease.cc, the Watch stream in etcd_watch.cc.
#include "etcd_client.h"

#include <grpcpp/grpcpp.h>

#include <string>

namespace shardlock::cluster {
namespace {

class EtcdCategory final : public std::error_category {
 public:
  const char* name() const noexcept override { return "shardlock.etcd"; }
  std::string message(int e) const override {
    return std::string(to_string(static_cast<EtcdErrc>(e)));
  }
};

}  // namespace

std::string_view to_string(EtcdErrc e) noexcept {
  switch (e) {
    case EtcdErrc::kOk:
      return "ok";
    case EtcdErrc::kBadEndpoint:
      return "bad etcd endpoint";
    case EtcdErrc::kUnavailable:
      return "etcd unavailable";
    case EtcdErrc::kDeadlineExceeded:
      return "etcd call deadline exceeded";
    case EtcdErrc::kCancelled:
      return "etcd call cancelled";
    case EtcdErrc::kNotFound:
      return "not found in etcd";
    case EtcdErrc::kInvalidArgument:
      return "etcd refused the request as invalid";
    case EtcdErrc::kFailedPrecondition:
      return "etcd failed precondition";
    case EtcdErrc::kCompacted:
      return "etcd revision compacted";
    case EtcdErrc::kPermissionDenied:
      return "etcd permission denied";
    case EtcdErrc::kResourceExhausted:
      return "etcd resource exhausted";
    case EtcdErrc::kLeaseExpired:
      return "etcd lease expired";
    case EtcdErrc::kProtocol:
      return "unexpected answer from etcd";
    case EtcdErrc::kServerError:
      return "etcd server error";
    case EtcdErrc::kTlsConfig:
      return "bad etcd TLS file";
    case EtcdErrc::kCertificateExpired:
      return "etcd client certificate expired or not yet valid";
    case EtcdErrc::kAuthenticationFailed:
      return "etcd authentication failed";
  }
  return "unknown etcd error";
}

const std::error_category& etcd_category() noexcept {
  static const EtcdCategory category;
  return category;
}

EtcdErrc errc_from_grpc_status(int grpc_status_code) noexcept {
  switch (static_cast<grpc::StatusCode>(grpc_status_code)) {
    case grpc::StatusCode::OK:
      return EtcdErrc::kOk;
    case grpc::StatusCode::UNAVAILABLE:
      return EtcdErrc::kUnavailable;
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return EtcdErrc::kDeadlineExceeded;
    case grpc::StatusCode::CANCELLED:
      return EtcdErrc::kCancelled;
    case grpc::StatusCode::NOT_FOUND:
      return EtcdErrc::kNotFound;
    case grpc::StatusCode::INVALID_ARGUMENT:
      return EtcdErrc::kInvalidArgument;
    case grpc::StatusCode::FAILED_PRECONDITION:
      return EtcdErrc::kFailedPrecondition;
    case grpc::StatusCode::OUT_OF_RANGE:
      return EtcdErrc::kCompacted;
    case grpc::StatusCode::PERMISSION_DENIED:
    case grpc::StatusCode::UNAUTHENTICATED:
      return EtcdErrc::kPermissionDenied;
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return EtcdErrc::kResourceExhausted;
    default:
      return EtcdErrc::kServerError;
  }
}

std::string prefix_range_end(std::string_view prefix) {
  std::string end(prefix);
  while (!end.empty()) {
    auto& last = reinterpret_cast<unsigned char&>(end.back());
    if (last < 0xff) {
      ++last;
      return end;
    }
    end.pop_back();
  }
  end.push_back('\0');  // etcd's "to the end of the key space"
  return end;
}

}  // namespace shardlock::cluster
