// A raw UDP peer for the lease server tests: it speaks the codec directly
// (no LeaseClient), so tests control padding, batching and retransmission,
// and it checks the anti-amplification bound on every reply it receives.
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <random>
#include <vector>

#include "shardlock/lease/wire/protocol.h"

namespace shardlock::lease::test_support {

class UdpTestPeer {
 public:
  explicit UdpTestPeer(std::uint16_t port, std::uint64_t seed = std::random_device{}()) {
    std::mt19937_64 rng(seed);
    id_ = {rng(), rng()};
    next_request_id_ = rng() >> 16;
    fd_ = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  }
  ~UdpTestPeer() { ::close(fd_); }
  UdpTestPeer(const UdpTestPeer&) = delete;
  UdpTestPeer& operator=(const UdpTestPeer&) = delete;

  [[nodiscard]] const ClientId& id() const { return id_; }
  void set_id(const ClientId& id) { id_ = id; }
  std::uint64_t next_id() { return ++next_request_id_; }

  // Sends raw bytes; remembers the size as the bound for the next replies.
  void send_raw(const std::vector<std::uint8_t>& bytes) {
    last_sent_ = bytes.size();
    ASSERT_EQ(::send(fd_, bytes.data(), bytes.size(), 0), static_cast<ssize_t>(bytes.size()));
  }

  // Encodes (padded for its replies unless `pad` is false) and sends.
  std::vector<std::uint8_t> send(Datagram d, bool pad = true, std::size_t pad_to = 0) {
    d.client_id = id_;
    std::vector<std::uint8_t> buf(kMaxDatagramSize);
    std::size_t n = 0;
    const ProtocolError e = encode(d, buf, n, std::max(pad ? max_reply_size(d) : 0, pad_to));
    EXPECT_EQ(e, ProtocolError::kOk);
    buf.resize(n);
    send_raw(buf);
    return buf;
  }

  // Receives one datagram into `storage` and decodes it into `out`. False on
  // timeout. Checks the reply is no larger than the largest request sent.
  bool receive(Datagram& out, std::vector<std::uint8_t>& storage,
               std::chrono::milliseconds timeout = std::chrono::milliseconds{5000}) {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(timeout.count())) <= 0) return false;
    storage.resize(2048);
    const ssize_t n = ::recv(fd_, storage.data(), storage.size(), 0);
    if (n <= 0) return false;
    storage.resize(static_cast<std::size_t>(n));
    EXPECT_LE(storage.size(), max_sent_ == 0 ? last_sent_ : std::max(max_sent_, last_sent_))
        << "reply larger than its request";
    EXPECT_EQ(decode(storage, out), ProtocolError::kOk);
    if (check_client_id_) {
      EXPECT_EQ(out.client_id, id_);
    }
    return true;
  }

  // One request, waits for the reply with its request id. Replies to other
  // request ids that arrive first are skipped. Fails the test on timeout.
  Message call(Message m, std::chrono::milliseconds timeout = std::chrono::milliseconds{5000}) {
    if (m.request_id == 0) m.request_id = next_id();
    Datagram d;
    (void)d.push(m);
    d.request_id = m.request_id;
    const auto sent = send(d);
    max_sent_ = std::max(max_sent_, sent.size());
    return wait_for(m.request_id, timeout);
  }

  Message wait_for(std::uint64_t request_id,
                   std::chrono::milliseconds timeout = std::chrono::milliseconds{5000}) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0 || !receive(reply_, storage_, left)) {
        ADD_FAILURE() << "no reply to request " << request_id;
        Message none;
        none.type = MessageType::kBatch;
        return none;
      }
      for (const Message& r : reply_.items()) {
        if (r.request_id == request_id) {
          Message copy = r;
          key_copy_ = std::string(r.key);
          copy.key = key_copy_;
          return copy;
        }
      }
    }
  }

  // True if nothing arrives within `window`.
  bool quiet(std::chrono::milliseconds window) {
    pollfd p{fd_, POLLIN, 0};
    return ::poll(&p, 1, static_cast<int>(window.count())) == 0;
  }

  Message acquire(std::string_view key, std::uint32_t ttl_ms, std::uint32_t wait_ms = 0) {
    Message m;
    m.type = MessageType::kAcquire;
    m.key = key;
    m.ttl_ms = ttl_ms;
    m.wait_ms = wait_ms;
    return call(m, std::chrono::milliseconds{wait_ms + 5000});
  }
  Message renew(std::string_view key, std::uint64_t token, std::uint32_t ttl_ms) {
    Message m;
    m.type = MessageType::kRenew;
    m.key = key;
    m.token = token;
    m.ttl_ms = ttl_ms;
    return call(m);
  }
  Message release(std::string_view key, std::uint64_t token) {
    Message m;
    m.type = MessageType::kRelease;
    m.key = key;
    m.token = token;
    return call(m);
  }
  Message query(std::string_view key) {
    Message m;
    m.type = MessageType::kQuery;
    m.key = key;
    return call(m);
  }

  void allow_replies_up_to(std::size_t bytes) { max_sent_ = std::max(max_sent_, bytes); }
  // Replies to corrupted requests echo whatever client id the corruption left.
  void check_client_id(bool on) { check_client_id_ = on; }

 private:
  int fd_ = -1;
  ClientId id_;
  std::uint64_t next_request_id_ = 0;
  std::size_t last_sent_ = 0;
  std::size_t max_sent_ = 0;
  bool check_client_id_ = true;
  Datagram reply_;
  std::vector<std::uint8_t> storage_;
  std::string key_copy_;
};

}  // namespace shardlock::lease::test_support
