// Address parsing and formatting shared by the lease server and client.
#include "wire/udp.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/udp.h>

#include <cstring>

namespace shardlock::lease::internal {

bool split_host_port(std::string_view text, std::string& host, std::uint16_t& port) {
  std::string_view h;
  std::string_view p;
  if (!text.empty() && text.front() == '[') {
    const std::size_t close = text.find(']');
    if (close == std::string_view::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      return false;
    }
    h = text.substr(1, close - 1);
    p = text.substr(close + 2);
  } else {
    const std::size_t colon = text.rfind(':');
    if (colon == std::string_view::npos) return false;
    h = text.substr(0, colon);
    p = text.substr(colon + 1);
  }
  if (h.empty() || p.empty() || p.size() > 5) return false;
  unsigned value = 0;
  for (const char c : p) {
    if (c < '0' || c > '9') return false;
    value = value * 10 + static_cast<unsigned>(c - '0');
  }
  if (value > 65535) return false;
  host = std::string(h);
  port = static_cast<std::uint16_t>(value);
  return true;
}

bool resolve_udp_address(std::string_view text, bool passive, bool allow_port_zero,
                         sockaddr_storage& out, socklen_t& length, std::string& detail) {
  std::string host;
  std::uint16_t port = 0;
  if (!split_host_port(text, host, port)) {
    detail = "address must be HOST:PORT or [IPV6]:PORT with a port of 0..65535, got \"" +
             std::string(text) + "\"";
    return false;
  }
  if (port == 0 && !allow_port_zero) {
    detail = "port 0 is not a server's port in \"" + std::string(text) + "\"";
    return false;
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (const int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &found); rc != 0) {
    detail = "cannot resolve \"" + std::string(text) + "\": " + ::gai_strerror(rc);
    return false;
  }
  std::memcpy(&out, found->ai_addr, found->ai_addrlen);
  length = found->ai_addrlen;
  ::freeaddrinfo(found);
  return true;
}

std::string format_address(const sockaddr_storage& address) {
  char host[INET6_ADDRSTRLEN] = {};
  if (address.ss_family == AF_INET6) {
    const auto& a = reinterpret_cast<const sockaddr_in6&>(address);
    ::inet_ntop(AF_INET6, &a.sin6_addr, host, sizeof host);
    return "[" + std::string(host) + "]:" + std::to_string(ntohs(a.sin6_port));
  }
  const auto& a = reinterpret_cast<const sockaddr_in&>(address);
  ::inet_ntop(AF_INET, &a.sin_addr, host, sizeof host);
  return std::string(host) + ":" + std::to_string(ntohs(a.sin_port));
}

std::uint16_t port_of(const sockaddr_storage& address) noexcept {
  return ntohs(address.ss_family == AF_INET6
                   ? reinterpret_cast<const sockaddr_in6&>(address).sin6_port
                   : reinterpret_cast<const sockaddr_in&>(address).sin_port);
}

bool same_address(const sockaddr_storage& a, const sockaddr_storage& b) noexcept {
  if (a.ss_family != b.ss_family) return false;
  if (a.ss_family == AF_INET6) {
    const auto& x = reinterpret_cast<const sockaddr_in6&>(a);
    const auto& y = reinterpret_cast<const sockaddr_in6&>(b);
    return x.sin6_port == y.sin6_port && x.sin6_scope_id == y.sin6_scope_id &&
           std::memcmp(&x.sin6_addr, &y.sin6_addr, sizeof x.sin6_addr) == 0;
  }
  const auto& x = reinterpret_cast<const sockaddr_in&>(a);
  const auto& y = reinterpret_cast<const sockaddr_in&>(b);
  return x.sin_port == y.sin_port && x.sin_addr.s_addr == y.sin_addr.s_addr;
}

bool segmentation_supported(int fd) noexcept {
  int size = 0;
  socklen_t length = sizeof size;
  return ::getsockopt(fd, IPPROTO_UDP, UDP_SEGMENT, &size, &length) == 0;
}

void set_segment_size(msghdr& header, SegmentControl& control,
                      std::uint16_t segment_size) noexcept {
  header.msg_control = control.bytes.data();
  header.msg_controllen = control.bytes.size();
  cmsghdr* c = CMSG_FIRSTHDR(&header);
  c->cmsg_level = IPPROTO_UDP;
  c->cmsg_type = UDP_SEGMENT;
  c->cmsg_len = CMSG_LEN(sizeof segment_size);
  std::memcpy(CMSG_DATA(c), &segment_size, sizeof segment_size);
}

}  // namespace shardlock::lease::internal
