// watch_log.h: what a test's EtcdWatch delivered, collected for the test
// thread (etcd_client_test, etcd_tls_test).
//
//   WatchLog log;
//   auto watch = client.watch_prefix(prefix, 0, log.callback());
//   ... poll_until([&] { return log.events().size() >= 2; }) ...
#pragma once

#include <mutex>
#include <string>
#include <vector>

#include "etcd_client.h"

namespace shardlock::cluster {

class WatchLog {
 public:
  WatchCallback callback() {
    return [this](const WatchUpdate& update) {
      std::lock_guard lock(mutex_);
      if (update.error) {
        errors_.push_back(update.detail);
        return;
      }
      for (const WatchEvent& event : update.events) events_.push_back(event);
    };
  }
  std::vector<WatchEvent> events() const {
    std::lock_guard lock(mutex_);
    return events_;
  }
  std::vector<std::string> errors() const {
    std::lock_guard lock(mutex_);
    return errors_;
  }

 private:
  mutable std::mutex mutex_;
  std::vector<WatchEvent> events_;
  std::vector<std::string> errors_;
};

}  // namespace shardlock::cluster
