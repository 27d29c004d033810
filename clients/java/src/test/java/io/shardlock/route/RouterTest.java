package io.shardlock.route;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.Test;

/**
 * The Java router against the C++ Router's owners: clients/python/tests/router_vectors.json,
 * which make_router_vectors.py generates with tools/shardlock_route.cc (the Python client checks
 * the same file).
 */
class RouterTest {
  @Test
  void xxh3MatchesTheLibrary() {
    // xxhash.xxh3_64_intdigest(bytes((i * 13 + 5) & 0xff for i in range(n)), seed=...).
    String[][] expected = {
      {"0", "67b2383ef0cb101e", "2d06800538d394c2"}, {"1", "90896c553f9adfd5", "929e358d27ae3ee2"},
      {"2", "729b71d6d9eaa6c0", "f6180424e562ac8e"}, {"3", "cb3491a2c278a6a8", "40ade90e919dc9cc"},
      {"4", "69fdb560ababa8e3", "16203e01d3f346ca"}, {"7", "4e9f73c3c1e2126e", "a3d6608948891f04"},
      {"8", "f1880e43619ce962", "4991510bc2ae2e28"}, {"9", "2483c8a8ca7e3dc8", "2bfbe7330662cefe"},
      {"16", "1e198cd98f1aa4b0", "79c4e8c8904c4db5"}, {"17", "93281cc377ebf14c", "6b05a5ab5076e20"},
      {"33", "c07df2826b8717fa", "91a5ccac8defcb8c"}, {"65", "59afe797de99cef", "c9b26506e1bcccfb"},
      {"97", "8396181e812a1b26", "8ae73753f9dd693a"}, {"128", "e505018df047558b", "8f5f35ec84d2b4bf"},
      {"129", "bb5255d58c44b1b5", "1ff9cc274e8fa436"}, {"200", "79cf0d7e8475322c", "f562292375cdd130"},
      {"240", "6eb972bbf76faba5", "7d3b54ff49179cb9"}, {"241", "e82eb207b07f9eac", "ac73a7b4f791a7d7"},
      {"256", "3a26429770a7d9a3", "3b34dc56222c4812"}, {"300", "cb7f4674ee138b77", "d39c47e0eed363a1"},
      {"1100", "61609bd5bfb92af3", "92ad7893360a5ffb"},
    };
    for (String[] row : expected) {
      int n = Integer.parseInt(row[0]);
      byte[] data = new byte[n];
      for (int i = 0; i < n; ++i) data[i] = (byte) (i * 13 + 5);
      assertEquals(row[1], Long.toHexString(Xxh3.hash(data, Router.SEED)), "seeded, length " + n);
      assertEquals(row[2], Long.toHexString(Xxh3.hash(data, 0)), "seed 0, length " + n);
    }
  }

  @Test
  @SuppressWarnings("unchecked")
  void ownersMatchTheCppRouter() throws Exception {
    Path file = Path.of(System.getProperty("shardlock.clients", "clients"), "python", "tests",
        "router_vectors.json");
    Map<String, Object> root =
        (Map<String, Object>) new Json(Files.readString(file, StandardCharsets.UTF_8)).value();
    List<Object> maps = (List<Object>) root.get("maps");
    assertTrue(maps.size() >= 9);
    int checked = 0;
    for (Object o : maps) {
      Map<String, Object> map = (Map<String, Object>) o;
      List<Router.Member> members = new ArrayList<>();
      for (Object m : (List<Object>) map.get("members")) {
        List<Object> pair = (List<Object>) m;
        members.add(new Router.Member(((String) pair.get(0)).getBytes(StandardCharsets.UTF_8),
            ((Number) pair.get(1)).intValue()));
      }
      Router router = new Router(members);
      for (Object e : (List<Object>) map.get("owners")) {
        List<Object> pair = (List<Object>) e;
        byte[] key = ((String) pair.get(0)).getBytes(StandardCharsets.UTF_8);
        String owner = new String(router.owner(key), StandardCharsets.UTF_8);
        assertEquals(pair.get(1), owner, "key " + pair.get(0) + " in map " + members.size());
        ++checked;
      }
    }
    assertTrue(checked > 2000, "checked " + checked);
  }

  @Test
  void refusesWhatTheCppRouterRefuses() {
    byte[] a = {'a'};
    assertThrows(IllegalArgumentException.class, () -> new Router(List.of()));
    assertThrows(IllegalArgumentException.class,
        () -> new Router(List.of(new Router.Member(a, 1), new Router.Member(a, 2))));
    assertThrows(IllegalArgumentException.class, () -> new Router(List.of(new Router.Member(a, 0))));
    assertThrows(IllegalArgumentException.class,
        () -> new Router(List.of(new Router.Member(new byte[0], 1))));
  }

  /** Enough JSON for the vectors file: objects, arrays, strings, integers. */
  static final class Json {
    private final String s;
    private int at;

    Json(String s) {
      this.s = s;
    }

    Object value() {
      skip();
      char c = s.charAt(at);
      if (c == '{') {
        Map<String, Object> m = new LinkedHashMap<>();
        ++at;
        skip();
        if (s.charAt(at) == '}') {
          ++at;
          return m;
        }
        while (true) {
          skip();
          String k = string();
          skip();
          expect(':');
          m.put(k, value());
          skip();
          if (s.charAt(at++) == '}') return m;
        }
      }
      if (c == '[') {
        List<Object> l = new ArrayList<>();
        ++at;
        skip();
        if (s.charAt(at) == ']') {
          ++at;
          return l;
        }
        while (true) {
          l.add(value());
          skip();
          if (s.charAt(at++) == ']') return l;
        }
      }
      if (c == '"') return string();
      int start = at;
      while (at < s.length() && (Character.isDigit(s.charAt(at)) || s.charAt(at) == '-')) ++at;
      return Long.parseLong(s.substring(start, at));
    }

    private void expect(char c) {
      if (s.charAt(at++) != c) throw new IllegalStateException("expected " + c + " at " + at);
    }

    private void skip() {
      while (at < s.length() && Character.isWhitespace(s.charAt(at))) ++at;
    }

    private String string() {
      expect('"');
      StringBuilder b = new StringBuilder();
      while (true) {
        char c = s.charAt(at++);
        if (c == '"') return b.toString();
        if (c != '\\') {
          b.append(c);
          continue;
        }
        char e = s.charAt(at++);
        switch (e) {
          case 'n': b.append('\n'); break;
          case 't': b.append('\t'); break;
          case 'r': b.append('\r'); break;
          case 'b': b.append('\b'); break;
          case 'f': b.append('\f'); break;
          case 'u':
            b.append((char) Integer.parseInt(s.substring(at, at + 4), 16));
            at += 4;
            break;
          default: b.append(e);
        }
      }
    }
  }
}
