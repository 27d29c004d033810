// Compiled with -Wthread-safety -Werror by the clang preset: correct use of
// every lock's annotations must be accepted.
#include "shardlock/instrumented.h"
#include "shardlock/lock_guard.h"
#include "shardlock/mutex.h"
#include "shardlock/recursive.h"
#include "shardlock/rw_spin_lock.h"
#include "shardlock/seq_lock.h"
#include "shardlock/spin_lock.h"
#include "shardlock/ticket_lock.h"

namespace {

template <class L>
struct Account {
  L lock;
  long balance SHARDLOCK_GUARDED_BY(lock) = 0;

  void deposit(long amount) SHARDLOCK_EXCLUDES(lock) {
    lock.lock();
    balance += amount;
    lock.unlock();
  }
  bool try_deposit(long amount) SHARDLOCK_EXCLUDES(lock) {
    if (!lock.try_lock()) return false;
    balance += amount;
    lock.unlock();
    return true;
  }
  long read_locked() const SHARDLOCK_REQUIRES(lock) { return balance; }
  void withdraw(long amount) SHARDLOCK_EXCLUDES(lock) {
    shardlock::LockGuard guard(lock);
    balance -= amount;
  }
};

struct Shared {
  shardlock::RwSpinLock lock;
  long value SHARDLOCK_GUARDED_BY(lock) = 0;
  long read() SHARDLOCK_EXCLUDES(lock) {
    lock.lock_shared();
    const long v = value;
    lock.unlock_shared();
    return v;
  }
  long read_guarded() SHARDLOCK_EXCLUDES(lock) {
    shardlock::SharedLockGuard guard(lock);
    return value;
  }
};

}  // namespace

int main() {
  Account<shardlock::SpinLock> a;
  Account<shardlock::TicketLock> b;
  Account<shardlock::Mutex> c;
  Account<shardlock::SeqLock> d;
  Account<shardlock::Recursive<shardlock::Mutex>> e;
  Account<shardlock::Instrumented<shardlock::SpinLock>> f;
  a.deposit(1);
  b.deposit(1);
  c.deposit(1);
  d.deposit(1);
  e.deposit(1);
  f.deposit(1);
  (void)a.try_deposit(1);
  a.withdraw(1);
  c.withdraw(1);
  Shared s;
  return static_cast<int>(s.read() + s.read_guarded());
}
