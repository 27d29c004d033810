package io.shardlock;

/**
 * No answer before the call's deadline (the request timeout, plus an acquire's wait). The
 * message says what the client saw: nothing at all, or replies that failed authentication. An
 * acquire that ends this way may still have been granted; the server then holds the lease until
 * its TTL runs out.
 */
public class UnreachableException extends ShardLockException {
  private static final long serialVersionUID = 1L;

  public UnreachableException(String message) {
    super(message);
  }
}
