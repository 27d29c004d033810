package io.shardlock;

/** How a lease holds its key. */
public enum LeaseMode {
  /** The only holder (a lock, a write lock). */
  EXCLUSIVE,
  /** Held alongside other shared holders, never with an exclusive one (a read lock). */
  SHARED,
  /** One of at most N holders (a semaphore's permit). */
  PERMIT,
}
