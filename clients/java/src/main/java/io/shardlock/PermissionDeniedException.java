package io.shardlock;

import io.shardlock.wire.Protocol;

/**
 * The server answered ERROR permission_denied ({@link #code()} 16): the request is outside the
 * rights of this client's tenant (shardlockd --tenants: the key is under none of the tenant's
 * prefixes, or the prefix grants acquire but not query, or the other way round).
 */
public class PermissionDeniedException extends ServerErrorException {
  private static final long serialVersionUID = 1L;

  public PermissionDeniedException() {
    super(Protocol.ERROR_PERMISSION_DENIED);
  }
}
