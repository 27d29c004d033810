package io.shardlock.wire;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.GeneralSecurityException;
import java.security.MessageDigest;
import java.security.SecureRandom;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.Map;
import javax.crypto.AEADBadTagException;
import javax.crypto.Cipher;
import javax.crypto.spec.GCMParameterSpec;
import javax.crypto.spec.SecretKeySpec;
import org.bouncycastle.crypto.digests.Blake2bDigest;

/**
 * Sealing client datagrams for a tenant (include/shardlock/lease/wire/envelope.h), in the forms
 * this client has: the legacy tag (flags 0x01, no key id: {@code shardlockd --auth-key}), the
 * authenticated form (0x05: a key id and the same keyed-BLAKE2b tag over all before it), and the
 * AES-256-GCM forms, authenticated (0x15, GMAC) and encrypted (0x1D). Not the portable encrypted
 * form (0x0D): XChaCha20-Poly1305 is in neither JDK 17 nor Bouncy Castle 1.72.
 *
 * <pre>
 *   form               flags  bytes (integers little-endian, n: the plain datagram's length)
 *   legacy             0x01   [datagram n][tag 16]
 *   authenticated      0x05   [datagram n][u32 key_id][tag 16]
 *   authenticated-AES  0x15   [datagram n][u32 key_id][prefix 16][counter 8][tag 16]
 *   encrypted-AES      0x1D   [bytes 0..5][ciphertext n-6][u32 key_id][prefix 16][counter 8][tag 16]
 * </pre>
 *
 * <p>The AES forms seal under a key per sender stream: keyed BLAKE2b-256 of the stream's random
 * 16-byte prefix under {@link #aesKey}'s subkey of the tenant's key, with the stream's counter
 * and 4 zero bytes as GCM's 12-byte nonce. authenticated-AES has no plaintext and every byte
 * before the tag as associated data; encrypted-AES encrypts bytes 6.. (type onwards) with bytes
 * 0..5 and the key id as associated data. Each thread seals in a stream of its own per
 * Envelope, counting from 0 under a prefix drawn from SecureRandom, and starts a new one every
 * 2^24 seals (envelope.cc's kAesStreamSeals), so no (GCM key, nonce) pair repeats: one stream's
 * counter only grows, two streams' prefixes are 128 independent random bits. Opening derives a
 * stream's key once and keeps it in a small cache (the streams a server seals replies in are
 * few: one per I/O thread), filled only by datagrams whose tag verified.
 *
 * <p>An Envelope opens only datagrams in its own form and under its own key id (a server
 * answers in its request's form). Thread-safe. Like {@link Codec}, opening never throws on
 * untrusted input: anything that does not verify is null.
 */
public final class Envelope {
  /** How a datagram is sealed (envelope.h's EnvelopeMode); its flags byte says which. */
  public enum Form {
    LEGACY(Protocol.FLAG_AUTHENTICATED, Protocol.AUTH_TAG_SIZE),
    AUTHENTICATED(Protocol.FLAG_AUTHENTICATED | Protocol.FLAG_KEY_ID,
        Protocol.KEY_ID_SIZE + Protocol.AUTH_TAG_SIZE),
    /** XChaCha20-Poly1305: read by {@link #peek}, never sealed or opened here. */
    ENCRYPTED(Protocol.FLAG_AUTHENTICATED | Protocol.FLAG_KEY_ID | Protocol.FLAG_ENCRYPTED,
        Protocol.MAX_ENVELOPE_OVERHEAD),
    AUTHENTICATED_AES(Protocol.FLAG_AUTHENTICATED | Protocol.FLAG_KEY_ID | Protocol.FLAG_AES,
        Protocol.MAX_ENVELOPE_OVERHEAD),
    ENCRYPTED_AES(Protocol.FLAG_AUTHENTICATED | Protocol.FLAG_KEY_ID | Protocol.FLAG_ENCRYPTED
        | Protocol.FLAG_AES, Protocol.MAX_ENVELOPE_OVERHEAD);

    /** The flag bits it sets. */
    public final int flags;
    /** The bytes it adds to a datagram. */
    public final int overhead;

    Form(int flags, int overhead) {
      this.flags = flags;
      this.overhead = overhead;
    }

    public boolean aes() {
      return (flags & Protocol.FLAG_AES) != 0;
    }

    public boolean encrypts() {
      return (flags & Protocol.FLAG_ENCRYPTED) != 0;
    }
  }

  /** What {@link #peek} reads off a sealed datagram: the key id it names, and its form. */
  public record Claim(int keyId, Form form) {}

  static final int PREFIX_SIZE = 16;
  static final int GCM_NONCE_SIZE = 12;
  static final int GCM_TAG_BITS = 128;
  // Magic, version and flags stay readable; encryption starts at the type byte.
  static final int CIPHER_OFFSET = Protocol.HEADER_FLAGS_OFFSET + 1;
  static final long AES_STREAM_SEALS = 1L << 24;
  static final int OPENED_STREAMS = 64;
  private static final int ENVELOPE_BITS =
      Protocol.FLAG_KEY_ID | Protocol.FLAG_ENCRYPTED | Protocol.FLAG_AES;
  // envelope_key()'s crypto_kdf subkeys: id 1 under an 8-byte context each.
  static final String CIPHER_KEY_CONTEXT = "SLKaead1";
  static final String AES_KEY_CONTEXT = "SLKaesg1";
  private static final SecureRandom RANDOM = new SecureRandom();

  private final byte[] key;
  private final int keyId;
  private final Form form;
  private final byte[] aesRoot;  // the AES forms': aesKey(key); null otherwise
  private final byte[] keyIdBytes;
  // This Envelope's stream in each thread that seals (AES forms).
  private final ThreadLocal<SealStream> streams = new ThreadLocal<>();
  // Each opening thread's GCM cipher, re-initialised per datagram (cheap: AES's key schedule is
  // kept while the key stays the same).
  private final ThreadLocal<Cipher> openers = new ThreadLocal<>();
  // Opened streams' keys by prefix, least recently used first; guarded by itself. Keyed by the
  // prefix alone: an Envelope has one key, so this is the (key, prefix) cache of envelope.cc.
  private final Map<ByteBuffer, SecretKeySpec> opened =
      new LinkedHashMap<>(OPENED_STREAMS * 2, 0.75f, true) {
        private static final long serialVersionUID = 1L;

        @Override
        protected boolean removeEldestEntry(Map.Entry<ByteBuffer, SecretKeySpec> eldest) {
          return size() > OPENED_STREAMS;
        }
      };

  /** One thread's sealing stream: a random prefix, its key, and the next seal's counter. */
  private static final class SealStream {
    final byte[] prefix = new byte[PREFIX_SIZE];
    final SecretKeySpec key;
    final Cipher cipher;
    long counter;

    SealStream(byte[] root) {
      RANDOM.nextBytes(prefix);
      key = streamKey(root, prefix, 0);
      cipher = gcm();
    }
  }

  /**
   * An envelope for the 32-byte {@code key} named {@code keyId} (unsigned: ids above 2^31 - 1
   * are their two's complement, {@code Integer.parseUnsignedInt("4275878552")}), sealing in
   * {@code form}. IllegalArgumentException for a key that is not 32 bytes, LEGACY with a key id
   * but 0, or ENCRYPTED (this client cannot encrypt with XChaCha20-Poly1305; ENCRYPTED_AES is
   * its encryption).
   */
  public Envelope(byte[] key, int keyId, Form form) {
    if (key.length != Protocol.AUTH_KEY_SIZE) {
      throw new IllegalArgumentException("a key is 32 bytes, not " + key.length);
    }
    if (form == Form.LEGACY && keyId != 0) {
      throw new IllegalArgumentException("the legacy form names no key id (it is key id 0)");
    }
    if (form == Form.ENCRYPTED) {
      throw new IllegalArgumentException("the portable cipher encrypts with XChaCha20-Poly1305, "
          + "which neither JDK 17 nor Bouncy Castle 1.72 has: encrypt with AES-256-GCM "
          + "(Form.ENCRYPTED_AES)");
    }
    this.key = key.clone();
    this.keyId = keyId;
    this.form = form;
    this.aesRoot = form.aes() ? aesKey(key) : null;
    this.keyIdBytes = new byte[Protocol.KEY_ID_SIZE];
    storeU32(keyIdBytes, 0, keyId);
  }

  public Form form() {
    return form;
  }

  /** The key id it seals under (unsigned). */
  public int keyId() {
    return keyId;
  }

  /** The bytes a seal adds. */
  public int overhead() {
    return form.overhead;
  }

  // ---- key derivations ------------------------------------------------------------------------

  /**
   * libsodium's crypto_kdf_derive_from_key(32, 1, context, key): keyed BLAKE2b-256 of nothing,
   * the subkey id (u64, little-endian) as salt and the 8-byte context as personalisation, each
   * zero-padded to 16 bytes.
   */
  static byte[] kdf(byte[] key, String context) {
    byte[] salt = new byte[16];
    salt[0] = 1;  // the subkey id, 1
    byte[] personal = Arrays.copyOf(context.getBytes(StandardCharsets.US_ASCII), 16);
    Blake2bDigest digest = new Blake2bDigest(key, 32, salt, personal);
    byte[] out = new byte[32];
    digest.doFinal(out, 0);
    return out;
  }

  /** The root of the AES forms' stream keys for {@code key} (EnvelopeKey::aes_key). */
  public static byte[] aesKey(byte[] key) {
    return kdf(key, AES_KEY_CONTEXT);
  }

  /** A stream's AES-256 key: keyed BLAKE2b-256 of its prefix at {@code in[at]} under root. */
  static SecretKeySpec streamKey(byte[] root, byte[] in, int at) {
    Blake2bDigest digest = new Blake2bDigest(root, 32, null, null);
    digest.update(in, at, PREFIX_SIZE);
    byte[] out = new byte[32];
    digest.doFinal(out, 0);
    SecretKeySpec spec = new SecretKeySpec(out, "AES");
    Arrays.fill(out, (byte) 0);  // the spec holds a copy
    return spec;
  }

  private static Cipher gcm() {
    try {
      return Cipher.getInstance("AES/GCM/NoPadding");
    } catch (GeneralSecurityException e) {
      throw new IllegalStateException("this JVM has no AES/GCM/NoPadding", e);
    }
  }

  /** GCM's nonce for the nonce field at {@code in[at]}: the counter, then 4 zero bytes. */
  private static GCMParameterSpec gcmNonce(byte[] in, int at) {
    byte[] n = new byte[GCM_NONCE_SIZE];
    System.arraycopy(in, at + PREFIX_SIZE, n, 0, 8);
    return new GCMParameterSpec(GCM_TAG_BITS, n);
  }

  /**
   * Whether this CPU has the instructions fast, constant-time AES-GCM needs (AES-NI and
   * PCLMULQDQ on x86, AES and PMULL on ARM, read from /proc/cpuinfo as the Python client does),
   * which HotSpot's AES-GCM intrinsics use and a C++ server needs to read the AES forms at all.
   * False where it cannot tell.
   */
  public static boolean cpuHasAes() {
    try {
      for (String line : Files.readAllLines(Path.of("/proc/cpuinfo"), StandardCharsets.UTF_8)) {
        int colon = line.indexOf(':');
        if (colon < 0) continue;
        String name = line.substring(0, colon).strip();
        java.util.Set<String> words =
            java.util.Set.of(line.substring(colon + 1).strip().split("\\s+"));
        if (name.equals("flags")) return words.contains("aes") && words.contains("pclmulqdq");
        if (name.equals("Features")) return words.contains("aes") && words.contains("pmull");
      }
    } catch (IOException | RuntimeException e) {
      // Cannot tell.
    }
    return false;
  }

  // ---- reading a claim ------------------------------------------------------------------------

  /**
   * The key id and form of the sealed client datagram in {@code in[0, length)}, read from its
   * flags and trailer; null when it is not one (not the client magic, FLAG_AUTHENTICATED clear,
   * FLAG_ENCRYPTED or FLAG_AES without FLAG_KEY_ID, too short for a header and its trailer).
   * Verifies nothing. A legacy datagram reads as key id 0.
   */
  public static Claim peek(byte[] in, int length) {
    if (length < Protocol.HEADER_SIZE || loadU32(in, 0) != Protocol.MAGIC) return null;
    int flags = in[Protocol.HEADER_FLAGS_OFFSET] & 0xFF;
    if ((flags & Protocol.FLAG_AUTHENTICATED) == 0) return null;
    Form found = null;
    for (Form f : Form.values()) {
      if ((f.flags & ENVELOPE_BITS) == (flags & ENVELOPE_BITS)) found = f;
    }
    if (found == null || length < Protocol.HEADER_SIZE + found.overhead) return null;
    int id = found == Form.LEGACY ? 0 : loadU32(in, length - found.overhead);
    return new Claim(id, found);
  }

  // ---- sealing --------------------------------------------------------------------------------

  /**
   * {@code plain}, a client datagram, sealed: the form's flags set, bytes 6.. encrypted by
   * ENCRYPTED_AES, the trailer appended. The AES forms take the next counter of this thread's
   * stream. IllegalArgumentException when {@code plain} is shorter than a header, is not a client
   * datagram, or has an envelope flag (FLAG_KEY_ID, FLAG_ENCRYPTED, FLAG_AES) set already.
   */
  public byte[] seal(byte[] plain) {
    check(plain);
    if (!form.aes()) return sealTagged(plain);
    SealStream stream = streams.get();
    if (stream == null || stream.counter == AES_STREAM_SEALS) {
      stream = new SealStream(aesRoot);
      streams.set(stream);
    }
    byte[] nonce = Arrays.copyOf(stream.prefix, Protocol.ENVELOPE_NONCE_SIZE);
    storeU64(nonce, PREFIX_SIZE, stream.counter++);
    return sealAes(plain, nonce, stream.key, stream.cipher);
  }

  /**
   * An AES form's seal of {@code plain} with the nonce field {@code nonce} (prefix, then
   * counter): for the wire vectors, which fix it. Never reuse a nonce field to send.
   */
  byte[] seal(byte[] plain, byte[] nonce) {
    check(plain);
    if (!form.aes() || nonce.length != Protocol.ENVELOPE_NONCE_SIZE) {
      throw new IllegalArgumentException("a nonce field is an AES form's, 24 bytes");
    }
    return sealAes(plain, nonce, streamKey(aesRoot, nonce, 0), gcm());
  }

  private static void check(byte[] plain) {
    if (plain.length < Protocol.HEADER_SIZE || loadU32(plain, 0) != Protocol.MAGIC
        || (plain[Protocol.HEADER_FLAGS_OFFSET] & ENVELOPE_BITS) != 0) {
      throw new IllegalArgumentException("not a plain client datagram");
    }
  }

  /** The BLAKE2b forms: flags, key id (AUTHENTICATED), then the tag over all before it. */
  private byte[] sealTagged(byte[] plain) {
    int n = plain.length;
    byte[] out = Arrays.copyOf(plain, n + form.overhead);
    out[Protocol.HEADER_FLAGS_OFFSET] |= (byte) form.flags;
    int tagAt = n;
    if (form == Form.AUTHENTICATED) {
      System.arraycopy(keyIdBytes, 0, out, n, Protocol.KEY_ID_SIZE);
      tagAt += Protocol.KEY_ID_SIZE;
    }
    System.arraycopy(Auth.tag(out, 0, tagAt, key), 0, out, tagAt, Protocol.AUTH_TAG_SIZE);
    return out;
  }

  private byte[] sealAes(byte[] plain, byte[] nonce, SecretKeySpec streamKey, Cipher cipher) {
    int n = plain.length;
    byte[] out = Arrays.copyOf(plain, n + form.overhead);
    out[Protocol.HEADER_FLAGS_OFFSET] |= (byte) form.flags;
    int nonceAt = n + Protocol.KEY_ID_SIZE;
    int tagAt = nonceAt + Protocol.ENVELOPE_NONCE_SIZE;
    System.arraycopy(keyIdBytes, 0, out, n, Protocol.KEY_ID_SIZE);
    System.arraycopy(nonce, 0, out, nonceAt, Protocol.ENVELOPE_NONCE_SIZE);
    try {
      cipher.init(Cipher.ENCRYPT_MODE, streamKey, gcmNonce(nonce, 0));
      if (form == Form.AUTHENTICATED_AES) {
        cipher.updateAAD(out, 0, tagAt);
        cipher.doFinal(out, tagAt, 0, out, tagAt);  // no plaintext: the output is the tag
      } else {
        cipher.updateAAD(associatedData(out, n));
        // Ciphertext over bytes 6..n-1 and the tag after it; then the tag moves past the
        // key id and nonce field, which are written again over where it was.
        byte[] sealed = cipher.doFinal(plain, CIPHER_OFFSET, n - CIPHER_OFFSET);
        System.arraycopy(sealed, 0, out, CIPHER_OFFSET, n - CIPHER_OFFSET);
        System.arraycopy(sealed, n - CIPHER_OFFSET, out, tagAt, Protocol.AUTH_TAG_SIZE);
      }
    } catch (GeneralSecurityException e) {
      // A 32-byte AES key and a fresh 12-byte nonce are always accepted.
      throw new IllegalStateException("AES-GCM refused to seal", e);
    }
    return out;
  }

  /** The AEAD's associated data: bytes 0..5 (magic, version, flags), then the key id. */
  private static byte[] associatedData(byte[] in, int keyIdAt) {
    byte[] ad = new byte[CIPHER_OFFSET + Protocol.KEY_ID_SIZE];
    System.arraycopy(in, 0, ad, 0, CIPHER_OFFSET);
    System.arraycopy(in, keyIdAt, ad, CIPHER_OFFSET, Protocol.KEY_ID_SIZE);
    return ad;
  }

  // ---- opening --------------------------------------------------------------------------------

  /**
   * The plain datagram in {@code in[0, length)} if it is sealed in this envelope's form, under
   * its key id and key (tags compared in constant time; AES-GCM verifies before it returns any
   * plaintext), with FLAG_KEY_ID, FLAG_ENCRYPTED and FLAG_AES cleared and FLAG_AUTHENTICATED
   * kept, as {@link Auth#open} leaves it; null otherwise.
   */
  public byte[] open(byte[] in, int length) {
    Claim claim = peek(in, length);
    if (claim == null || claim.form() != form || claim.keyId() != keyId) return null;
    int n = length - form.overhead;
    byte[] out;
    if (!form.aes()) {
      int tagAt = length - Protocol.AUTH_TAG_SIZE;
      byte[] tag = Arrays.copyOfRange(in, tagAt, length);
      if (!MessageDigest.isEqual(Auth.tag(in, 0, tagAt, key), tag)) return null;
      out = Arrays.copyOf(in, n);
    } else {
      out = openAes(in, n);
      if (out == null) return null;
    }
    out[Protocol.HEADER_FLAGS_OFFSET] &= (byte) ~ENVELOPE_BITS;
    return out;
  }

  private byte[] openAes(byte[] in, int n) {
    int nonceAt = n + Protocol.KEY_ID_SIZE;
    int tagAt = nonceAt + Protocol.ENVELOPE_NONCE_SIZE;
    ByteBuffer prefix = ByteBuffer.wrap(Arrays.copyOfRange(in, nonceAt, nonceAt + PREFIX_SIZE));
    SecretKeySpec streamKey;
    synchronized (opened) {
      streamKey = opened.get(prefix);
    }
    boolean cached = streamKey != null;
    if (!cached) streamKey = streamKey(aesRoot, in, nonceAt);
    Cipher cipher = openers.get();
    if (cipher == null) {
      cipher = gcm();
      openers.set(cipher);
    }
    byte[] out;
    try {
      cipher.init(Cipher.DECRYPT_MODE, streamKey, gcmNonce(in, nonceAt));
      if (form == Form.AUTHENTICATED_AES) {
        cipher.updateAAD(in, 0, tagAt);
        cipher.doFinal(in, tagAt, Protocol.AUTH_TAG_SIZE);
        out = Arrays.copyOf(in, n);
      } else {
        cipher.updateAAD(associatedData(in, n));
        byte[] sealed = new byte[n - CIPHER_OFFSET + Protocol.AUTH_TAG_SIZE];
        System.arraycopy(in, CIPHER_OFFSET, sealed, 0, n - CIPHER_OFFSET);
        System.arraycopy(in, tagAt, sealed, n - CIPHER_OFFSET, Protocol.AUTH_TAG_SIZE);
        byte[] text = cipher.doFinal(sealed);
        out = new byte[n];
        System.arraycopy(in, 0, out, 0, CIPHER_OFFSET);
        System.arraycopy(text, 0, out, CIPHER_OFFSET, text.length);
      }
    } catch (AEADBadTagException e) {
      return null;
    } catch (GeneralSecurityException e) {
      return null;  // cannot happen for a 32-byte key and a 12-byte nonce; refused all the same
    }
    if (!cached) {
      // Only a datagram that verified files its stream: a forgery costs a derivation and never
      // evicts a real stream.
      synchronized (opened) {
        opened.put(prefix, streamKey);
      }
    }
    return out;
  }

  /** The streams whose keys are cached for opening (tests). */
  int openedStreams() {
    synchronized (opened) {
      return opened.size();
    }
  }

  static int loadU32(byte[] in, int at) {
    return (in[at] & 0xFF) | (in[at + 1] & 0xFF) << 8 | (in[at + 2] & 0xFF) << 16
        | (in[at + 3] & 0xFF) << 24;
  }

  static void storeU32(byte[] out, int at, int v) {
    for (int i = 0; i < 4; ++i) out[at + i] = (byte) (v >>> (8 * i));
  }

  static void storeU64(byte[] out, int at, long v) {
    for (int i = 0; i < 8; ++i) out[at + i] = (byte) (v >>> (8 * i));
  }
}
