// resource.h: the fenced resource of a torture run — a per-key counter that
// accepts reads and writes only through shardlock::lease::FencingValidator.
//
// Workers connect over an abstract AF_UNIX stream socket and send one line
// per request:
//   R <key> <token> <client>          -> "OK <value>" or "NO <highest>"
//   W <key> <token> <value> <client>  -> "OK" or "NO <highest>"
// Reads are fenced too: a read with token t raises the key's fence to t, so
// a holder that read before a pause cannot then write over a newer holder's
// read-modify-write (fencing only the write cannot protect that). Each
// request is decided under one lock, so the resource is linearizable.
// Every write decision and refused read goes to the resource's history file.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "recorder.h"
#include "shardlock/lease/fencing.h"

namespace shardlock::torture {

class FencedResource {
 public:
  FencedResource() = default;
  ~FencedResource();
  FencedResource(const FencedResource&) = delete;
  FencedResource& operator=(const FencedResource&) = delete;

  // Listens on the abstract socket `name` and records to `history_path`.
  [[nodiscard]] bool start(const std::string& name, const std::string& history_path);
  // Stops serving and records each key's final counter.
  void stop();
  [[nodiscard]] const std::string& error() const noexcept { return error_; }

  // The decision itself (also used by tests).
  std::string handle(const std::string& request);

 private:
  void serve(int fd);

  std::mutex mutex_;
  shardlock::lease::FencingValidator fence_;
  std::map<std::string, std::int64_t> counters_;
  Recorder recorder_;
  int listen_fd_ = -1;
  std::atomic<bool> stopping_{false};
  std::thread acceptor_;
  std::mutex connections_mutex_;
  std::vector<int> connection_fds_;
  std::vector<std::thread> connections_;
  std::string error_;
};

// A worker's connection to the resource.
class ResourceConnection {
 public:
  ResourceConnection() = default;
  ~ResourceConnection();
  ResourceConnection(const ResourceConnection&) = delete;
  ResourceConnection& operator=(const ResourceConnection&) = delete;

  [[nodiscard]] bool connect(const std::string& name);
  // One request line, one reply line (no newlines); empty on failure.
  std::string call(const std::string& request);

 private:
  int fd_ = -1;
  std::string buffered_;
};

}  // namespace shardlock::torture
