// Must FAIL to compile under -Wthread-safety -Werror: writes guarded data
// without holding its lock. Proves the annotations are live, not decorative.
#include "shardlock/spin_lock.h"

namespace {
struct Account {
  shardlock::SpinLock lock;
  long balance SHARDLOCK_GUARDED_BY(lock) = 0;
  void deposit(long amount) { balance += amount; }  // no lock: rejected
};
}  // namespace

int main() {
  Account a;
  a.deposit(1);
  return 0;
}
