package io.shardlock;

import io.shardlock.wire.Protocol;

/** The server refused the request (ERROR); {@link #code()} is its wire error code. */
public class ServerErrorException extends ShardLockException {
  private static final long serialVersionUID = 1L;
  private final int code;

  public ServerErrorException(int code) {
    super("the server refused the request: " + Protocol.errorText(code) + " (error " + code
        + ")");
    this.code = code;
  }

  public int code() {
    return code;
  }

  /** The exception for {@code code}: its own class where the code has one. */
  static ServerErrorException of(int code) {
    if (code == Protocol.ERROR_PERMISSION_DENIED) return new PermissionDeniedException();
    return Protocol.isLimitExceeded(code) ? new LimitExceededException(code)
        : new ServerErrorException(code);
  }
}
