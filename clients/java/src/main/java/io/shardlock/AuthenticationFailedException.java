package io.shardlock;

/**
 * The server and this client do not share the datagram key: replies came back that failed
 * authentication (the server seals with a key or in a form this client does not have, or sends
 * unsealed replies to a client that has a key). Raised instead of {@link UnreachableException}
 * when such replies were seen. A server that drops this client's requests (a wrong key, an
 * unknown key id) sends nothing at all: that is a plain UnreachableException.
 */
public class AuthenticationFailedException extends UnreachableException {
  private static final long serialVersionUID = 1L;

  public AuthenticationFailedException(String message) {
    super(message);
  }
}
