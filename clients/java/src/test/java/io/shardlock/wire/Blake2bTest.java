package io.shardlock.wire;

import static org.junit.jupiter.api.Assertions.assertEquals;

import org.junit.jupiter.api.Test;

class Blake2bTest {
  static String hex(byte[] b) {
    StringBuilder s = new StringBuilder();
    for (byte x : b) s.append(String.format("%02x", x));
    return s.toString();
  }

  static byte[] range(int from, int to) {
    byte[] b = new byte[to - from];
    for (int i = 0; i < b.length; ++i) b[i] = (byte) (from + i);
    return b;
  }

  @Test
  void rfc7693AppendixA() {
    byte[] abc = {'a', 'b', 'c'};
    assertEquals("ba80a53f981c4d0d6a2797b69f12f6e94c212f14685ac4b74b12bb6fdbffa2d17d87c5392aab79"
        + "2dc252d5de4533cc9518d38aa8dbf1925ab92386edd4009923",
        hex(Blake2b.hash(abc, 0, 3, new byte[0], 64)));
  }

  @Test
  void keyedEmptyMessage() {
    // The BLAKE2 reference's keyed known-answer test, message of length 0.
    assertEquals("10ebb67700b1868efb4417987acf4690ae9d972fb7a590c2f02871799aaa4786b5e996e8f0f4eb"
        + "981fc214b005f42d2ff4233499391653df7aefcbc13fc51568",
        hex(Blake2b.hash(new byte[0], 0, 0, range(0, 64), 64)));
  }

  @Test
  void datagramTagsAcrossBlockBoundaries() {
    // Python's hashlib.blake2b(data, key=a0..bf, digest_size=16), data[i] = i * 7 + 3.
    String[][] expected = {
      {"0", "760d807ebe7df044de19fe31a929a88a"}, {"1", "aef111073a4986b2239923532377298d"},
      {"3", "2d013787445bff29717556bdf6061994"}, {"127", "49fdc5826060113e1af6bca5c51fea8b"},
      {"128", "fd5594dca8e92b7a6a43b39bd2e5d988"}, {"129", "7e988fc2a56f7ee56d2229b6f6d7447b"},
      {"255", "4cce448d4f48dfe4335221e8d31c319c"}, {"256", "918e498b5cc022f07025e1de0800419b"},
      {"257", "dc75868b2b9a06f15da11970a15d300d"}, {"1000", "90365574398e2690abca8363f140fae7"},
    };
    byte[] key = range(0xa0, 0xc0);
    for (String[] row : expected) {
      int n = Integer.parseInt(row[0]);
      byte[] data = new byte[n + 5];  // an offset, to check it is honoured
      for (int i = 0; i < n; ++i) data[5 + i] = (byte) (i * 7 + 3);
      assertEquals(row[1], hex(Blake2b.hash(data, 5, n, key, 16)), "length " + n);
    }
  }
}
