package io.shardlock;

/** The client was closed before or during the call. */
public class ClientClosedException extends ShardLockException {
  private static final long serialVersionUID = 1L;

  public ClientClosedException() {
    super("the shardlock client is closed");
  }
}
