package io.shardlock.wire;

import static org.junit.jupiter.api.Assertions.assertEquals;

import org.junit.jupiter.api.Test;

/**
 * The datagram MAC (Bouncy Castle's keyed BLAKE2b, 16-byte tag) against Python's hashlib at
 * lengths on both sides of BLAKE2b's 128-byte blocks; WireVectorsTest checks seal and open
 * against the C++ codec's sealed datagrams.
 */
class AuthTest {
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
      assertEquals(row[1], hex(Auth.tag(data, 5, n, key)), "length " + n);
    }
  }
}
