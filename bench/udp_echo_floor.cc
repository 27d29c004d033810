// udp-echo-floor: the round trip of a bare UDP echo on loopback, the floor
// under any request/reply service on this host (make bench-redis prints it
// next to shardlock and Redis).
//
//   udp-echo-floor --mode blocking  --duration 3 --json
//   udp-echo-floor --mode busy-poll --duration 3 --json
//
// One echo thread and one client thread in this process, one datagram of
// --size bytes in flight. blocking: both sleep in recv() until the datagram
// lands (two wake-ups per round trip). busy-poll: both poll their socket
// without sleeping, yielding the core between empty polls, as shardlock's
// busy-poll does. Prints p50/p99 of the round trip in microseconds.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

// A UDP socket on 127.0.0.1, kernel-chosen port; -1 on failure.
int loopback_socket(sockaddr_in& address) {
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  address = {};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof address;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// One datagram into `buffer`: blocking, or polled without sleeping until it
// comes, `stop` is set or `give_up` passes. Returns its size, or -1 when
// stopped, timed out or failed.
ssize_t receive(int fd, bool busy_poll, std::vector<char>& buffer, sockaddr_in* from,
                const std::atomic<bool>& stop, Clock::time_point give_up) {
  for (;;) {
    socklen_t length = sizeof(sockaddr_in);
    const ssize_t n = ::recvfrom(fd, buffer.data(), buffer.size(), busy_poll ? MSG_DONTWAIT : 0,
                                 reinterpret_cast<sockaddr*>(from), from ? &length : nullptr);
    if (n >= 0) return n;
    if (errno != EAGAIN && errno != EINTR) return -1;
    // Relaxed: a stop request; join() orders the rest.
    if (stop.load(std::memory_order_relaxed) || Clock::now() >= give_up) return -1;
    if (busy_poll) ::sched_yield();
  }
}

double percentile_us(std::vector<std::uint64_t>& ns, double q) {
  if (ns.empty()) return 0;
  const auto k = static_cast<std::size_t>(q * static_cast<double>(ns.size() - 1));
  std::nth_element(ns.begin(), ns.begin() + static_cast<std::ptrdiff_t>(k), ns.end());
  return static_cast<double>(ns[k]) / 1000.0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"The round trip of a bare UDP echo on loopback (the floor under a UDP service)"};
  std::string mode = "blocking";
  double seconds = 3;
  std::size_t size = 64;
  bool json = false;
  app.add_option("--mode", mode, "blocking (sleep in recv) or busy-poll (poll without sleeping)")
      ->capture_default_str()
      ->check(CLI::IsMember({"blocking", "busy-poll"}));
  app.add_option("--duration", seconds, "seconds to run")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 600.0));
  app.add_option("--size", size, "datagram bytes")
      ->capture_default_str()
      ->check(CLI::Range(1, 1400));
  app.add_flag("--json", json, "one JSON object on stdout");
  CLI11_PARSE(app, argc, argv);
  const bool busy = mode == "busy-poll";

  sockaddr_in echo_address{};
  sockaddr_in client_address{};
  const int echo_fd = loopback_socket(echo_address);
  const int client_fd = loopback_socket(client_address);
  if (echo_fd < 0 || client_fd < 0) {
    std::fprintf(stderr, "udp-echo-floor: cannot bind 127.0.0.1: %s\n", std::strerror(errno));
    return 1;
  }
  if (::connect(client_fd, reinterpret_cast<sockaddr*>(&echo_address), sizeof echo_address) != 0) {
    std::fprintf(stderr, "udp-echo-floor: connect: %s\n", std::strerror(errno));
    return 1;
  }
  // Blocking mode: a receive timeout lets the echo thread notice stop.
  const timeval tick{0, 100'000};
  (void)::setsockopt(echo_fd, SOL_SOCKET, SO_RCVTIMEO, &tick, sizeof tick);
  (void)::setsockopt(client_fd, SOL_SOCKET, SO_RCVTIMEO, &tick, sizeof tick);

  std::atomic<bool> stop{false};
  std::thread echo([&] {
    std::vector<char> buffer(2048);
    for (;;) {
      sockaddr_in from{};
      const ssize_t n = receive(echo_fd, busy, buffer, &from, stop, Clock::time_point::max());
      if (n < 0) return;
      (void)::sendto(echo_fd, buffer.data(), static_cast<std::size_t>(n), 0,
                     reinterpret_cast<sockaddr*>(&from), sizeof from);
    }
  });

  std::vector<char> payload(size, 'x');
  std::vector<char> buffer(2048);
  std::vector<std::uint64_t> samples;
  samples.reserve(1 << 20);
  std::uint64_t lost = 0;
  const auto end = Clock::now() + std::chrono::duration<double>(seconds);
  while (Clock::now() < end) {
    const auto sent = Clock::now();
    if (::send(client_fd, payload.data(), payload.size(), 0) < 0) break;
    if (receive(client_fd, busy, buffer, nullptr, stop, sent + std::chrono::milliseconds(100)) <
        0) {
      ++lost;  // no echo within 100 ms: a lost datagram
      continue;
    }
    samples.push_back(static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - sent).count()));
  }
  stop.store(true, std::memory_order_relaxed);
  echo.join();
  ::close(echo_fd);
  ::close(client_fd);

  const std::size_t count = samples.size();
  const double p50 = percentile_us(samples, 0.50);
  const double p99 = percentile_us(samples, 0.99);
  if (json) {
    std::printf(
        "{\"mode\":\"%s\",\"size\":%zu,\"round_trips\":%zu,\"lost\":%llu,"
        "\"latency_us\":{\"p50\":%.1f,\"p99\":%.1f}}\n",
        mode.c_str(), size, count, static_cast<unsigned long long>(lost), p50, p99);
  } else {
    std::printf("udp echo (%s, %zu bytes): %zu round trips, p50 %.1f us, p99 %.1f us\n",
                mode.c_str(), size, count, p50, p99);
  }
  return count > 0 ? 0 : 1;
}
