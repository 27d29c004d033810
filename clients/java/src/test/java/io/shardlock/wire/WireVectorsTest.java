package io.shardlock.wire;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.io.InputStream;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.EnumSet;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/**
 * The Java codec against the C++ one: wire_vectors.tsv is the output of
 * tools/shardlock_wire_vectors.cc (the ctest wire_vectors_tool_test keeps it current). Each
 * vector is decoded and described field by field, the description compared with the C++
 * codec's, then encoded back and compared byte for byte. The envelope's vectors (key-id forms,
 * both suites) are opened to their plain datagram and sealed back to their bytes with their
 * nonce field, and every truncation and bit flip of them is refused; the XChaCha20-Poly1305
 * ones are skipped, saying why.
 */
class WireVectorsTest {
  record Vector(String kind, String name, byte[] bytes, String description) {}

  static byte[] authKey;
  static final List<Vector> vectors = new ArrayList<>();
  static final Set<String> CODEC_KINDS = Set.of("plain", "request", "sealed");
  // The envelope's key-id forms (envelope.h) this client seals and opens: the authenticated
  // form of the portable suite and both AES-GCM forms. Their DESCRIPTION is
  // "key_id=N plain=HEX".
  static final Map<String, Envelope.Form> ENVELOPE_KINDS = Map.of(
      "keyid", Envelope.Form.AUTHENTICATED,
      "keyid-aes", Envelope.Form.AUTHENTICATED_AES,
      "encrypted-aes", Envelope.Form.ENCRYPTED_AES);
  // The portable suite's encrypted form: XChaCha20-Poly1305 is in neither JDK 17 nor Bouncy
  // Castle 1.72, so this client cannot encrypt or open it (encryption here is AES-GCM only).
  static final String XCHACHA_KIND = "encrypted";
  static final String XCHACHA_REASON = "the \"encrypted\" vectors are XChaCha20-Poly1305 "
      + "(flags 0x0D), which neither JDK 17 nor Bouncy Castle 1.72 has: this client encrypts "
      + "with AES-256-GCM only (the \"encrypted-aes\" vectors)";
  static final List<Vector> envelopes = new ArrayList<>();
  static final List<Vector> xchacha = new ArrayList<>();
  static byte[] cipherKey;  // envelope_key(authKey).cipher_key
  static byte[] aesKey;  // envelope_key(authKey).aes_key

  @BeforeAll
  static void load() throws IOException {
    try (InputStream in = WireVectorsTest.class.getResourceAsStream("/wire_vectors.tsv")) {
      String text = new String(in.readAllBytes(), StandardCharsets.UTF_8);
      for (String line : text.split("\n")) {
        if (line.isEmpty() || line.startsWith("#")) continue;
        String[] f = line.split("\t");
        if (f[0].equals("authkey")) {
          authKey = unhex(f[1]);
        } else if (f[0].equals("cipherkey")) {
          cipherKey = unhex(f[1]);
        } else if (f[0].equals("aeskey")) {
          aesKey = unhex(f[1]);
        } else if (CODEC_KINDS.contains(f[0])) {
          vectors.add(new Vector(f[0], f[1], unhex(f[2]), f[3]));
        } else if (ENVELOPE_KINDS.containsKey(f[0])) {
          envelopes.add(new Vector(f[0], f[1], unhex(f[2]), f[3]));
        } else if (f[0].equals(XCHACHA_KIND)) {
          xchacha.add(new Vector(f[0], f[1], unhex(f[2]), f[3]));
        } else {
          throw new AssertionError("wire_vectors.tsv: a kind this test does not know: " + f[0]);
        }
      }
    }
  }

  static byte[] unhex(String s) {
    byte[] b = new byte[s.length() / 2];
    for (int i = 0; i < b.length; ++i) b[i] = (byte) Integer.parseInt(s.substring(2 * i, 2 * i + 2), 16);
    return b;
  }

  static String hex(byte[] b) {
    return AuthTest.hex(b);
  }

  static String u(long v) {
    return Long.toUnsignedString(v);
  }

  /** The same words as describe() in tools/shardlock_wire_vectors.cc. */
  static String describe(Datagram d) {
    StringBuilder s = new StringBuilder("header flags=" + d.flags + " batch=" + (d.batch ? 1 : 0)
        + " rid=" + u(d.requestId) + " lo=" + u(d.clientLo) + " hi=" + u(d.clientHi));
    if (d.hasEpoch) s.append(" epoch=").append(u(d.epoch));
    for (Message m : d.messages) {
      s.append(" | ").append(m.type.name()).append(" rid=").append(u(m.requestId));
      if (m.hasOwner) s.append(" owner=").append(u(m.ownerLo)).append(':').append(u(m.ownerHi));
      if (m.value.length > 0) s.append(" value=").append(hex(m.value));
      for (BodyField f : m.type.fields) s.append(' ').append(f.vectorName).append('=').append(value(f, m));
    }
    return s.toString();
  }

  static String value(BodyField f, Message m) {
    switch (f) {
      case KEY: return hex(m.key);
      case TOKEN: return u(m.token);
      case TTL: return u(m.ttlMs);
      case WAIT: return u(m.waitMs);
      case RETRY_AFTER: return u(m.retryAfterMs);
      case ERROR_CODE: return Integer.toString(m.error);
      case HELD: return m.held ? "1" : "0";
      case WAITERS: return u(m.waiters);
      case FIRST_SHARD: return u(m.firstShard);
      case SHARD_COUNT: return u(m.shardCount);
      case COUNTERS: return hex(m.counters);
      case SHARD_TOKENS: return hex(m.shardTokens);
      case MODE: return Integer.toString(m.mode);
      case PERMITS: return u(m.permits);
      case HOLDERS: return u(m.holders);
      case INDEX: return Integer.toString(m.index);
      case KEY_LIST: return m.keyCount + ":" + hex(m.keyList);
      case TOKEN_LIST: return hex(m.tokenList);
      case EPOCH: return u(m.epoch);
      case FIRST_MEMBER: return u(m.firstMember);
      case MEMBER_COUNT: return u(m.memberCount);
      case MEMBER_LIST: return m.memberListCount + ":" + hex(m.memberList);
      case FIRST_HOLDER: return u(m.firstHolder);
      case HOLDER_LIST: return m.holderListCount + ":" + hex(m.holderList);
      case WINDOW: return u(m.windowMs);
      case HOT_KEY_LIST: return m.hotKeyCount + ":" + hex(m.hotKeyList);
      default: throw new AssertionError(f);
    }
  }

  static byte[] opened(Vector v) {
    if (!v.kind().equals("sealed")) return v.bytes();
    int n = Auth.open(v.bytes(), v.bytes().length, authKey);
    assertTrue(n > 0, v.name() + ": the C++ seal does not open");
    return Arrays.copyOf(v.bytes(), n);
  }

  static boolean isRequest(Datagram d) {
    return d.messages.get(0).type.isRequest();
  }

  @Test
  void everyVectorDecodesToTheCppDescriptionAndEncodesBack() {
    assertTrue(vectors.size() > 60, "vectors loaded: " + vectors.size());
    for (Vector v : vectors) {
      byte[] bytes = opened(v);
      DecodeResult r = Codec.decode(bytes);
      assertEquals(ProtocolError.OK, r.error, v.kind() + " " + v.name());
      assertEquals(v.description(), describe(r.datagram), v.kind() + " " + v.name());
      Datagram d = r.datagram;
      d.flags &= ~Protocol.FLAG_AUTHENTICATED;
      byte[] again;
      switch (v.kind()) {
        case "plain": again = Codec.encode(d); break;
        case "request": again = Codec.encodeRequest(d); break;
        default: {
          byte[] inner = isRequest(d) ? Codec.encodeRequest(d) : Codec.encode(d);
          again = Auth.seal(inner, authKey);
          Envelope legacy = new Envelope(authKey, 0, Envelope.Form.LEGACY);
          assertEquals(hex(again), hex(legacy.seal(inner)), v.name());
          assertEquals(hex(bytes), hex(legacy.open(v.bytes(), v.bytes().length)), v.name());
        }
      }
      assertEquals(hex(v.bytes()), hex(again), v.kind() + " " + v.name());
    }
  }

  @Test
  void everyMessageTypeHasAVector() {
    Set<MessageType> seen = EnumSet.noneOf(MessageType.class);
    for (Vector v : vectors) {
      for (Message m : Codec.decode(opened(v)).datagram.messages) seen.add(m.type);
    }
    assertEquals(EnumSet.allOf(MessageType.class), seen);
  }

  @Test
  void everyTruncationIsRejected() {
    for (Vector v : vectors) {
      if (!v.kind().equals("plain")) continue;  // padded ones may lose padding and stay valid
      byte[] b = v.bytes();
      for (int n = 0; n < b.length; ++n) {
        DecodeResult r = Codec.decode(Arrays.copyOf(b, n));
        assertFalse(r.ok(), v.name() + " cut to " + n + " bytes decoded");
      }
    }
  }

  @Test
  void everyBitFlipOfASealedDatagramIsRejected() {
    for (Vector v : vectors) {
      if (!v.kind().equals("sealed")) continue;
      byte[] b = v.bytes().clone();
      for (int i = 0; i < b.length; ++i) {
        for (int bit = 0; bit < 8; ++bit) {
          b[i] ^= (byte) (1 << bit);
          assertEquals(-1, Auth.open(b, b.length, authKey), v.name() + " byte " + i + " bit " + bit);
          b[i] ^= (byte) (1 << bit);
        }
      }
      byte[] otherKey = authKey.clone();
      otherKey[0] ^= 1;
      assertEquals(-1, Auth.open(b, b.length, otherKey));
    }
  }

  @Test
  void bitFlipsNeverCrashTheDecoder() {
    // Unsealed, a flip may still be a valid datagram; it must only never throw.
    for (Vector v : vectors) {
      byte[] b = opened(v).clone();
      for (int i = 0; i < b.length; ++i) {
        for (int bit = 0; bit < 8; ++bit) {
          b[i] ^= (byte) (1 << bit);
          DecodeResult r = Codec.decode(b);
          assertNotEquals(null, r.error);
          b[i] ^= (byte) (1 << bit);
        }
      }
    }
  }

  @Test
  void headerChecks() {
    byte[] b = vectors.get(0).bytes().clone();
    b[0] ^= 1;
    assertEquals(ProtocolError.BAD_MAGIC, Codec.decode(b).error);
    b[0] ^= 1;
    b[4] = 2;
    assertEquals(ProtocolError.UNSUPPORTED_VERSION, Codec.decode(b).error);
    b[4] = 1;
    b[5] = 0x04;
    assertEquals(ProtocolError.BAD_FLAGS, Codec.decode(b).error);
    b[5] = 0;
    b[6] = 0x7F;
    assertEquals(ProtocolError.BAD_TYPE, Codec.decode(b).error);
    assertEquals(ProtocolError.TOO_LARGE, Codec.decode(new byte[Protocol.MAX_DATAGRAM_SIZE + 1]).error);
    byte[] padded = Arrays.copyOf(vectors.get(0).bytes(), vectors.get(0).bytes().length + 3);
    assertTrue(Codec.decode(padded).ok());
    padded[padded.length - 1] = 1;
    assertEquals(ProtocolError.NON_ZERO_PADDING, Codec.decode(padded).error);
  }

  @Test
  void parsesListEntries() {
    for (Vector v : vectors) {
      Message m = Codec.decode(opened(v)).datagram.messages.get(0);
      if (m.type == MessageType.MAP_REPLY) {
        List<MemberEntry> members = MemberEntry.parse(m);
        assertEquals(2, members.size());
        assertEquals("127.0.0.1:7421", members.get(0).address);
        assertEquals("[::1]:7422", members.get(1).address);
        assertEquals(3, members.get(1).weight);
      }
      if (m.type == MessageType.HOLDERS_REPLY) {
        List<HolderEntry> holders = HolderEntry.parse(m);
        assertEquals(2, holders.size());
        assertEquals(99, holders.get(0).token);
        assertArrayEquals("leader@host:80".getBytes(StandardCharsets.US_ASCII), holders.get(0).value);
        assertTrue(holders.get(1).pending());
      }
    }
  }

  // ---- the envelope (envelope.h) -------------------------------------------------------------

  /** An envelope vector's key id, plain datagram and the Envelope that sealed it. */
  record Sealed(int keyId, byte[] plain, Envelope envelope) {}

  static Sealed sealed(Vector v) {
    String[] words = v.description().split(" ");
    assertEquals(2, words.length, v.name());
    int keyId = Integer.parseUnsignedInt(words[0].substring("key_id=".length()));
    byte[] plain = unhex(words[1].substring("plain=".length()));
    return new Sealed(keyId, plain, new Envelope(authKey, keyId, ENVELOPE_KINDS.get(v.kind())));
  }

  @Test
  void envelopeKeysAreLibsodiumsKdf() {
    assertEquals(hex(cipherKey), hex(Envelope.kdf(authKey, Envelope.CIPHER_KEY_CONTEXT)));
    assertEquals(hex(aesKey), hex(Envelope.aesKey(authKey)));
  }

  @Test
  void everyEnvelopeVectorOpensAndSealsBackToItsBytes() {
    assertEquals(45, envelopes.size(), "envelope vectors loaded");
    for (Vector v : envelopes) {
      String what = v.kind() + " " + v.name();
      Sealed s = sealed(v);
      byte[] b = v.bytes();
      assertEquals(new Envelope.Claim(s.keyId(), ENVELOPE_KINDS.get(v.kind())),
          Envelope.peek(b, b.length), what);
      byte[] opened = s.envelope().open(b, b.length);
      assertEquals(hex(s.plain()), opened == null ? null : hex(opened), what);
      assertTrue(Codec.decode(opened).ok(), what);
      byte[] plain = s.plain().clone();
      plain[Protocol.HEADER_FLAGS_OFFSET] &= ~Protocol.FLAG_AUTHENTICATED;
      byte[] again;
      if (s.envelope().form().aes()) {
        int nonceAt = s.plain().length + Protocol.KEY_ID_SIZE;
        again = s.envelope().seal(plain,
            Arrays.copyOfRange(b, nonceAt, nonceAt + Protocol.ENVELOPE_NONCE_SIZE));
      } else {
        again = s.envelope().seal(plain);
      }
      assertEquals(hex(b), hex(again), what);
    }
  }

  @Test
  void everyTruncationAndBitFlipOfAnEnvelopeIsRejected() {
    for (Vector v : envelopes) {
      String what = v.kind() + " " + v.name();
      Sealed s = sealed(v);
      byte[] b = v.bytes().clone();
      for (int n = 0; n < b.length; ++n) {
        assertNull(s.envelope().open(Arrays.copyOf(b, n), n), what + " cut to " + n);
      }
      for (int i = 0; i < b.length; ++i) {
        for (int bit = 0; bit < 8; ++bit) {
          b[i] ^= (byte) (1 << bit);
          assertNull(s.envelope().open(b, b.length), what + " byte " + i + " bit " + bit);
          b[i] ^= (byte) (1 << bit);
        }
      }
      byte[] otherKey = authKey.clone();
      otherKey[31] ^= 1;
      Envelope.Form form = s.envelope().form();
      assertNull(new Envelope(otherKey, s.keyId(), form).open(b, b.length), what);
      assertNull(new Envelope(authKey, s.keyId() + 1, form).open(b, b.length), what);
      for (Envelope.Form other : ENVELOPE_KINDS.values()) {
        if (other != form) {
          assertNull(new Envelope(authKey, s.keyId(), other).open(b, b.length), what);
        }
      }
      assertNull(new Envelope(authKey, 0, Envelope.Form.LEGACY).open(b, b.length), what);
      assertNotEquals(null, s.envelope().open(b, b.length), what + " after the flips");
    }
  }

  @Test
  void portableEncryptedVectorsAreSkipped() {
    assertEquals(15, xchacha.size(), "XChaCha20-Poly1305 vectors loaded");
    for (Vector v : xchacha) {
      byte[] b = v.bytes();
      assertEquals(Envelope.Form.ENCRYPTED, Envelope.peek(b, b.length).form(), v.name());
    }
    assertThrows(IllegalArgumentException.class,
        () -> new Envelope(authKey, 7, Envelope.Form.ENCRYPTED));
    Assumptions.abort(XCHACHA_REASON);
  }

  @Test
  void aesStreamsArePerThreadAndNeverRepeatANonce() throws InterruptedException {
    Vector acquire = envelopes.stream().filter(v -> v.kind().equals("encrypted-aes")).findFirst()
        .orElseThrow();
    byte[] plain = sealed(acquire).plain().clone();
    plain[Protocol.HEADER_FLAGS_OFFSET] &= ~Protocol.FLAG_AUTHENTICATED;
    Envelope envelope = new Envelope(authKey, 7, Envelope.Form.ENCRYPTED_AES);
    Envelope receiver = new Envelope(authKey, 7, Envelope.Form.ENCRYPTED_AES);
    int threads = 8;
    int seals = 200;
    Set<String> nonces = ConcurrentHashMap.newKeySet();
    Map<String, Set<Long>> countersByPrefix = new ConcurrentHashMap<>();
    List<Thread> started = new ArrayList<>();
    List<Throwable> failures = java.util.Collections.synchronizedList(new ArrayList<>());
    for (int t = 0; t < threads; ++t) {
      Thread thread = new Thread(() -> {
        try {
          for (int i = 0; i < seals; ++i) {
            byte[] b = envelope.seal(plain);
            int at = plain.length + Protocol.KEY_ID_SIZE;
            String prefix = hex(Arrays.copyOfRange(b, at, at + 16));
            long counter = java.nio.ByteBuffer.wrap(b, at + 16, 8)
                .order(java.nio.ByteOrder.LITTLE_ENDIAN).getLong();
            nonces.add(prefix + ":" + counter);
            countersByPrefix.computeIfAbsent(prefix, p -> new HashSet<>()).add(counter);
            byte[] opened = receiver.open(b, b.length);
            if (opened == null || !Arrays.equals(Arrays.copyOf(opened, plain.length),
                withAuthenticatedFlag(plain))) {
              throw new AssertionError("a seal did not open to its datagram");
            }
          }
        } catch (Throwable e) {
          failures.add(e);
        }
      });
      started.add(thread);
      thread.start();
    }
    for (Thread t : started) t.join();
    assertEquals(List.of(), failures);
    assertEquals(threads * seals, nonces.size(), "nonce fields sealed twice");
    assertEquals(threads, countersByPrefix.size(), "one stream per thread");
    for (Set<Long> counters : countersByPrefix.values()) {
      assertEquals(seals, counters.size());
      assertTrue(counters.contains(0L) && counters.contains((long) seals - 1));
    }
    assertEquals(threads, receiver.openedStreams(), "each stream's key derived and kept once");
  }

  @Test
  void onlyVerifiedDatagramsFileTheirStream() {
    Vector v = envelopes.stream().filter(e -> e.kind().equals("keyid-aes")).findFirst()
        .orElseThrow();
    Envelope receiver = sealed(v).envelope();
    byte[] forged = v.bytes().clone();
    forged[forged.length - 1] ^= 1;
    assertNull(receiver.open(forged, forged.length));
    assertEquals(0, receiver.openedStreams());
    assertNotEquals(null, receiver.open(v.bytes(), v.bytes().length));
    assertEquals(1, receiver.openedStreams());
    assertNotEquals(null, receiver.open(v.bytes(), v.bytes().length));  // from the cache
    assertEquals(1, receiver.openedStreams());
  }

  static byte[] withAuthenticatedFlag(byte[] plain) {
    byte[] b = plain.clone();
    b[Protocol.HEADER_FLAGS_OFFSET] |= Protocol.FLAG_AUTHENTICATED;
    return b;
  }
}
