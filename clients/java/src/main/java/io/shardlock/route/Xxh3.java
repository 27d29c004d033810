package io.shardlock.route;

/**
 * XXH3-64 with a seed (xxHash 0.8's XXH3_64bits_withSeed), the hash the router is built on: a
 * straight port of the scalar code in xxhash.h, checked against that library's output
 * (Xxh3Test) and through the router's golden vectors.
 */
public final class Xxh3 {
  private Xxh3() {}

  private static final long PRIME32_1 = 0x9E3779B1L;
  private static final long PRIME32_2 = 0x85EBCA77L;
  private static final long PRIME32_3 = 0xC2B2AE3DL;
  private static final long PRIME64_1 = 0x9E3779B185EBCA87L;
  private static final long PRIME64_2 = 0xC2B2AE3D27D4EB4FL;
  private static final long PRIME64_3 = 0x165667B19E3779F9L;
  private static final long PRIME64_4 = 0x85EBCA77C2B2AE63L;
  private static final long PRIME64_5 = 0x27D4EB2F165667C5L;
  private static final int SECRET_SIZE_MIN = 136;
  private static final int STRIPE_LEN = 64;
  private static final int SECRET_CONSUME_RATE = 8;

  private static final byte[] K_SECRET = bytes(
      0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c,
      0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f,
      0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21,
      0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c,
      0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3,
      0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8,
      0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d,
      0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64,
      0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb,
      0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e,
      0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce,
      0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e);

  private static byte[] bytes(int... values) {
    byte[] b = new byte[values.length];
    for (int i = 0; i < b.length; ++i) b[i] = (byte) values[i];
    return b;
  }

  private static long read64(byte[] b, int at) {
    long v = 0;
    for (int i = 0; i < 8; ++i) v |= (b[at + i] & 0xFFL) << (8 * i);
    return v;
  }

  private static long read32(byte[] b, int at) {
    long v = 0;
    for (int i = 0; i < 4; ++i) v |= (b[at + i] & 0xFFL) << (8 * i);
    return v;
  }

  private static long mul128Fold64(long a, long b) {
    long high = Math.multiplyHigh(a, b) + ((a >> 63) & b) + ((b >> 63) & a);  // unsigned
    return a * b ^ high;
  }

  private static long xxh64Avalanche(long h) {
    h ^= h >>> 33;
    h *= PRIME64_2;
    h ^= h >>> 29;
    h *= PRIME64_3;
    h ^= h >>> 32;
    return h;
  }

  private static long avalanche(long h) {
    h ^= h >>> 37;
    h *= 0x165667919E3779F9L;
    h ^= h >>> 32;
    return h;
  }

  private static long rrmxmx(long h, long len) {
    h ^= Long.rotateLeft(h, 49) ^ Long.rotateLeft(h, 24);
    h *= 0x9FB21C651E98DF25L;
    h ^= (h >>> 35) + len;
    h *= 0x9FB21C651E98DF25L;
    return h ^ (h >>> 28);
  }

  private static long mix16(byte[] in, int at, byte[] secret, int s, long seed) {
    long lo = read64(in, at);
    long hi = read64(in, at + 8);
    return mul128Fold64(lo ^ (read64(secret, s) + seed), hi ^ (read64(secret, s + 8) - seed));
  }

  /** XXH3_64bits_withSeed(data, seed). */
  public static long hash(byte[] in, long seed) {
    int len = in.length;
    byte[] secret = K_SECRET;
    if (len <= 16) {
      if (len > 8) {
        long bitflip1 = (read64(secret, 24) ^ read64(secret, 32)) + seed;
        long bitflip2 = (read64(secret, 40) ^ read64(secret, 48)) - seed;
        long lo = read64(in, 0) ^ bitflip1;
        long hi = read64(in, len - 8) ^ bitflip2;
        long acc = len + Long.reverseBytes(lo) + hi + mul128Fold64(lo, hi);
        return avalanche(acc);
      }
      if (len >= 4) {
        long s = seed ^ ((long) Integer.reverseBytes((int) seed) & 0xFFFFFFFFL) << 32;
        long input1 = read32(in, 0);
        long input2 = read32(in, len - 4);
        long bitflip = (read64(secret, 8) ^ read64(secret, 16)) - s;
        long input64 = input2 + (input1 << 32);
        return rrmxmx(input64 ^ bitflip, len);
      }
      if (len > 0) {
        long c1 = in[0] & 0xFF;
        long c2 = in[len >> 1] & 0xFF;
        long c3 = in[len - 1] & 0xFF;
        long combined = (c1 << 16) | (c2 << 24) | c3 | ((long) len << 8);
        long bitflip = (read32(secret, 0) ^ read32(secret, 4)) + seed;
        return xxh64Avalanche(combined ^ bitflip);
      }
      return xxh64Avalanche(seed ^ (read64(secret, 56) ^ read64(secret, 64)));
    }
    if (len <= 128) {
      long acc = len * PRIME64_1;
      if (len > 32) {
        if (len > 64) {
          if (len > 96) {
            acc += mix16(in, 48, secret, 96, seed);
            acc += mix16(in, len - 64, secret, 112, seed);
          }
          acc += mix16(in, 32, secret, 64, seed);
          acc += mix16(in, len - 48, secret, 80, seed);
        }
        acc += mix16(in, 16, secret, 32, seed);
        acc += mix16(in, len - 32, secret, 48, seed);
      }
      acc += mix16(in, 0, secret, 0, seed);
      acc += mix16(in, len - 16, secret, 16, seed);
      return avalanche(acc);
    }
    if (len <= 240) {
      long acc = len * PRIME64_1;
      int rounds = len / 16;
      for (int i = 0; i < 8; ++i) acc += mix16(in, 16 * i, secret, 16 * i, seed);
      acc = avalanche(acc);
      for (int i = 8; i < rounds; ++i) acc += mix16(in, 16 * i, secret, 16 * (i - 8) + 3, seed);
      acc += mix16(in, len - 16, secret, SECRET_SIZE_MIN - 17, seed);
      return avalanche(acc);
    }
    return hashLong(in, seed == 0 ? K_SECRET : customSecret(seed));
  }

  private static byte[] customSecret(long seed) {
    byte[] s = new byte[K_SECRET.length];
    for (int i = 0; i < K_SECRET.length / 16; ++i) {
      long lo = read64(K_SECRET, 16 * i) + seed;
      long hi = read64(K_SECRET, 16 * i + 8) - seed;
      for (int b = 0; b < 8; ++b) {
        s[16 * i + b] = (byte) (lo >>> (8 * b));
        s[16 * i + 8 + b] = (byte) (hi >>> (8 * b));
      }
    }
    return s;
  }

  private static void accumulate512(long[] acc, byte[] in, int at, byte[] secret, int s) {
    for (int i = 0; i < 8; ++i) {
      long data = read64(in, at + 8 * i);
      long key = data ^ read64(secret, s + 8 * i);
      acc[i ^ 1] += data;
      acc[i] += (key & 0xFFFFFFFFL) * (key >>> 32);
    }
  }

  private static void scramble(long[] acc, byte[] secret, int s) {
    for (int i = 0; i < 8; ++i) {
      long a = acc[i];
      a ^= a >>> 47;
      a ^= read64(secret, s + 8 * i);
      a *= PRIME32_1;
      acc[i] = a;
    }
  }

  private static long hashLong(byte[] in, byte[] secret) {
    int len = in.length;
    long[] acc = {PRIME32_3, PRIME64_1, PRIME64_2, PRIME64_3, PRIME64_4, PRIME32_2, PRIME64_5,
        PRIME32_1};
    int stripesPerBlock = (secret.length - STRIPE_LEN) / SECRET_CONSUME_RATE;
    int blockLen = STRIPE_LEN * stripesPerBlock;
    int blocks = (len - 1) / blockLen;
    for (int n = 0; n < blocks; ++n) {
      for (int s = 0; s < stripesPerBlock; ++s) {
        accumulate512(acc, in, n * blockLen + s * STRIPE_LEN, secret, s * SECRET_CONSUME_RATE);
      }
      scramble(acc, secret, secret.length - STRIPE_LEN);
    }
    int stripes = ((len - 1) - blockLen * blocks) / STRIPE_LEN;
    for (int s = 0; s < stripes; ++s) {
      accumulate512(acc, in, blocks * blockLen + s * STRIPE_LEN, secret, s * SECRET_CONSUME_RATE);
    }
    accumulate512(acc, in, len - STRIPE_LEN, secret, secret.length - STRIPE_LEN - 7);
    long result = len * PRIME64_1;
    for (int i = 0; i < 4; ++i) {
      result += mul128Fold64(acc[2 * i] ^ read64(secret, 11 + 16 * i),
          acc[2 * i + 1] ^ read64(secret, 11 + 16 * i + 8));
    }
    return avalanche(result);
  }
}
