package io.shardlock;

/**
 * The server and this client do not share the datagram key: replies came back that failed
 * authentication (the server seals with a key this client does not have, or sends unsealed
 * replies to a client that has one). Raised instead of {@link UnreachableException} when such
 * replies were seen.
 */
public class PermissionDeniedException extends UnreachableException {
  private static final long serialVersionUID = 1L;

  public PermissionDeniedException(String message) {
    super(message);
  }
}
