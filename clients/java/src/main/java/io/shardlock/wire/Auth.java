package io.shardlock.wire;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.MessageDigest;
import java.util.Arrays;
import org.bouncycastle.crypto.digests.Blake2bDigest;

/**
 * Datagram authentication (include/shardlock/lease/wire/auth.h): server and clients share a
 * 32-byte key; a sealed datagram has {@link Protocol#FLAG_AUTHENTICATED} set and ends in a
 * 16-byte keyed-BLAKE2b tag over every byte before it, flag and padding included. The MAC is
 * Bouncy Castle's {@link Blake2bDigest} (Debian's libbcprov-java), as the C++ side uses
 * libsodium's.
 */
public final class Auth {
  private Auth() {}

  /** The key in {@code text}: 64 hex digits, surrounding whitespace ignored. */
  public static byte[] parseKey(String text) {
    String digits = text.strip();
    if (digits.length() != 2 * Protocol.AUTH_KEY_SIZE) {
      throw new IllegalArgumentException("an auth key is 64 hex digits, not " + digits.length()
          + " characters");
    }
    byte[] key = new byte[Protocol.AUTH_KEY_SIZE];
    for (int i = 0; i < key.length; ++i) {
      int hi = Character.digit(digits.charAt(2 * i), 16);
      int lo = Character.digit(digits.charAt(2 * i + 1), 16);
      if (hi < 0 || lo < 0) throw new IllegalArgumentException("an auth key is 64 hex digits");
      key[i] = (byte) (hi << 4 | lo);
    }
    return key;
  }

  /** The key in the key file at {@code path} (as `shardlockctl keygen` writes it). */
  public static byte[] loadKey(Path path) throws IOException {
    byte[] bytes = Files.readAllBytes(path);
    if (bytes.length > 256) {
      throw new IllegalArgumentException("key file " + path + " does not hold a key");
    }
    try {
      return parseKey(new String(bytes, StandardCharsets.US_ASCII));
    } catch (IllegalArgumentException e) {
      throw new IllegalArgumentException("key file " + path + " does not hold a key (64 hex "
          + "digits; make one with `shardlockctl keygen`)", e);
    }
  }

  /** {@code datagram} with FLAG_AUTHENTICATED set and its tag appended. */
  public static byte[] seal(byte[] datagram, byte[] key) {
    if (datagram.length < Protocol.HEADER_SIZE) throw new IllegalArgumentException("truncated");
    byte[] out = Arrays.copyOf(datagram, datagram.length + Protocol.AUTH_TAG_SIZE);
    out[Protocol.HEADER_FLAGS_OFFSET] |= Protocol.FLAG_AUTHENTICATED;
    byte[] tag = tag(out, 0, datagram.length, key);
    System.arraycopy(tag, 0, out, datagram.length, tag.length);
    return out;
  }

  /**
   * The length of the datagram in {@code in[0, length)} without its tag if it is sealed under
   * {@code key} (flag set, tag verified in constant time); -1 otherwise.
   */
  public static int open(byte[] in, int length, byte[] key) {
    if (length < Protocol.HEADER_SIZE + Protocol.AUTH_TAG_SIZE) return -1;
    if ((in[Protocol.HEADER_FLAGS_OFFSET] & Protocol.FLAG_AUTHENTICATED) == 0) return -1;
    int body = length - Protocol.AUTH_TAG_SIZE;
    byte[] expected = tag(in, 0, body, key);
    byte[] tag = Arrays.copyOfRange(in, body, length);
    return MessageDigest.isEqual(expected, tag) ? body : -1;
  }

  /** The 16-byte keyed-BLAKE2b tag of {@code in[offset, offset + length)} under {@code key}. */
  static byte[] tag(byte[] in, int offset, int length, byte[] key) {
    Blake2bDigest mac = new Blake2bDigest(key, Protocol.AUTH_TAG_SIZE, null, null);
    mac.update(in, offset, length);
    byte[] out = new byte[Protocol.AUTH_TAG_SIZE];
    mac.doFinal(out, 0);
    return out;
  }
}
