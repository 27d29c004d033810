package io.shardlock;

import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.junit.jupiter.api.Assumptions;

/** shardlockd as a child process on 127.0.0.1:0, its port read from its JSON ready line. */
final class Daemon implements AutoCloseable {
  final Process process;
  final int port;
  final String address;

  Daemon(String lockDelay, String... extra) throws IOException {
    String binary = System.getenv("SHARDLOCKD");
    Assumptions.assumeTrue(binary != null && !binary.isEmpty(),
        "set SHARDLOCKD to the shardlockd binary (ctest does)");
    List<String> command = new ArrayList<>(List.of(binary, "--listen", "127.0.0.1:0",
        "--lock-delay", lockDelay, "--shards", "4"));
    command.addAll(List.of(extra));
    Path log = Files.createTempFile("shardlockd", ".log");
    process = new ProcessBuilder(command).redirectError(log.toFile()).start();
    BufferedReader out = new BufferedReader(new InputStreamReader(process.getInputStream(),
        StandardCharsets.UTF_8));
    String line = out.readLine();
    if (line == null) {
      throw new IOException("shardlockd did not start: " + Files.readString(log));
    }
    Matcher m = Pattern.compile("\"port\"\\s*:\\s*(\\d+)").matcher(line);
    if (!line.contains("\"ready\"") || !m.find()) throw new IOException("no ready line: " + line);
    port = Integer.parseInt(m.group(1));
    address = "127.0.0.1:" + port;
    // Keep draining stdout so the daemon never blocks on a full pipe.
    Thread drain = new Thread(() -> {
      try {
        while (out.readLine() != null) {
          // discarded
        }
      } catch (IOException e) {
        // the daemon exited
      }
    });
    drain.setDaemon(true);
    drain.start();
  }

  void signal(String name) throws IOException, InterruptedException {
    new ProcessBuilder("kill", "-" + name, Long.toString(process.pid())).inheritIO().start()
        .waitFor();
  }

  ShardLockClient client() {
    return client(ShardLockConfig.builder().servers(address));
  }

  ShardLockClient client(ShardLockConfig.Builder builder) {
    return ShardLockClient.create(builder.build());
  }

  @Override
  public void close() throws InterruptedException {
    process.destroy();
    if (!process.waitFor(10, TimeUnit.SECONDS)) process.destroyForcibly().waitFor();
  }
}
