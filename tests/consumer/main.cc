// Built against an installed shardlock through find_package(shardlock).
#include <mutex>

#include "shardlock/spin_lock.h"

int main() {
  shardlock::SpinLock lock;
  int value = 0;
  {
    std::scoped_lock guard(lock);
    ++value;
  }
  return (value == 1 && !lock.is_locked()) ? 0 : 1;
}
