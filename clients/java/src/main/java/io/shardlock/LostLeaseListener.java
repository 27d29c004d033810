package io.shardlock;

/**
 * Told once when a {@link FencedLock} hold is lost while its thread still holds it: the code
 * under the lock may have run without mutual exclusion. Runs on the client's event thread; it
 * must not block for long.
 */
@FunctionalInterface
public interface LostLeaseListener {
  /**
   * @param lock the lock whose hold was lost
   * @param holder the thread that held it
   * @param fence the hold's fencing token
   * @param reason why, with {@link LeaseLostException#reason()}
   */
  void leaseLost(FencedLock lock, Thread holder, long fence, LeaseLostException reason);
}
