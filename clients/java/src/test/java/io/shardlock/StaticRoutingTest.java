package io.shardlock;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.shardlock.route.Router;
import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.Set;
import java.util.TreeSet;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/** Several servers without discover: each key goes to its owner under the Router. */
@Timeout(60)
class StaticRoutingTest {
  @Test
  void eachKeyGoesToItsOwner() throws Exception {
    try (Daemon a = new Daemon("0"); Daemon b = new Daemon("0");
        ShardLockClient both = ShardLockClient.create(ShardLockConfig.builder()
            .servers(a.address + "," + b.address).build());
        ShardLockClient reversed = ShardLockClient.create(ShardLockConfig.builder()
            .servers(b.address + "," + a.address).build());
        ShardLockClient onlyA = a.client();
        ShardLockClient onlyB = b.client()) {
      Router router = new Router(List.of(
          new Router.Member(a.address.getBytes(StandardCharsets.UTF_8), 1),
          new Router.Member(b.address.getBytes(StandardCharsets.UTF_8), 1)));
      Set<String> used = new TreeSet<>();
      for (int i = 0; i < 20; ++i) {
        String key = "java/static/" + i;
        String owner = new String(router.owner(key.getBytes(StandardCharsets.UTF_8)),
            StandardCharsets.UTF_8);
        assertEquals(owner, both.addressFor(key));
        assertEquals(owner, reversed.addressFor(key), "the order servers are listed in");
        used.add(owner);
        FencedLock lock = both.getLock(key);
        assertTrue(lock.tryLock());
        ShardLockClient ownerClient = owner.equals(a.address) ? onlyA : onlyB;
        ShardLockClient other = owner.equals(a.address) ? onlyB : onlyA;
        assertFalse(ownerClient.getLock(key).tryLock(), "held at its owner");
        assertTrue(other.getLock(key).tryLock(), "not at the other server");
        other.getLock(key).unlock();
        lock.unlock();
      }
      assertEquals(2, used.size(), "20 keys use both servers");
    }
  }

  @Test
  void refusesAServerListedTwice() {
    assertThrows(IllegalArgumentException.class, () -> ShardLockClient.create(
        ShardLockConfig.builder().servers("127.0.0.1:7420,127.0.0.1:7420").build()));
  }
}
