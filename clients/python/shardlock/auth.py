"""The keys datagrams are sealed with: the shared key of shardlockd
--auth-key, or a tenant's key and key id under shardlockd --tenants.

As include/shardlock/lease/wire/auth.h: server and clients share a 32-byte
key; every datagram, both ways, is sealed with a 16-byte keyed-BLAKE2b tag
(protocol.seal / protocol.open_sealed, standard library only). A tenant
(docs/security.md) has a key of its own and a key id that its datagrams
name, authenticated or encrypted, in the portable or the AES-GCM suite
(protocol.Envelope, envelope.h). A key
file holds the key as 64 hex digits, surrounding whitespace ignored; make
one with `shardlockctl keygen`.
"""

from __future__ import annotations

import os
from typing import Optional, Union

from .protocol import AUTH_KEY_SIZE, MAX_KEY_ID, Envelope

# Read as shardlockctl does, so a program run by `shardlockctl run` against
# an --auth-key or --tenants server reaches it too (run hands all three on).
KEY_FILE_ENVIRONMENT = "SHARDLOCK_AUTH_KEY_FILE"
TENANT_ENVIRONMENT = "SHARDLOCK_TENANT"
ENCRYPT_ENVIRONMENT = "SHARDLOCK_ENCRYPT"
CIPHER_ENVIRONMENT = "SHARDLOCK_CIPHER"


def parse_auth_key(text: str) -> bytes:
    """The key in `text`: 64 hex digits (either case), surrounding
    whitespace allowed. ValueError for anything else."""
    digits = text.strip(" \t\r\n")
    if len(digits) != 2 * AUTH_KEY_SIZE:
        raise ValueError("an auth key is 64 hex digits, not %d characters" % len(digits))
    try:
        return bytes.fromhex(digits)
    except ValueError:
        raise ValueError("an auth key is 64 hex digits") from None


def load_auth_key(path: str) -> bytes:
    """The key in the key file at `path`. OSError if it cannot be read,
    ValueError if it does not hold a key."""
    with open(path, "rb") as f:
        text = f.read(256)  # a key file is 64 digits and a newline
    try:
        return parse_auth_key(text.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        raise ValueError("key file %s does not hold a key (64 hex digits; make one with "
                         "`shardlockctl keygen`)" % path) from None


def resolve_auth_key(auth_key: Union[bytes, str, None],
                     auth_key_file: Optional[str]) -> Optional[bytes]:
    """The key a client uses: `auth_key` (32 bytes, or 64 hex digits), the
    file `auth_key_file`, or the file in $SHARDLOCK_AUTH_KEY_FILE; None when
    none is given (datagrams are not sealed)."""
    if auth_key is not None and auth_key_file is not None:
        raise ValueError("pass auth_key or auth_key_file, not both")
    if auth_key is not None:
        if isinstance(auth_key, str):
            return parse_auth_key(auth_key)
        key = bytes(auth_key)
        if len(key) != AUTH_KEY_SIZE:
            raise ValueError("auth_key must be %d bytes, not %d" % (AUTH_KEY_SIZE, len(key)))
        return key
    path = auth_key_file or os.environ.get(KEY_FILE_ENVIRONMENT)
    return load_auth_key(path) if path else None


def _tenant_from_environment() -> Optional[int]:
    text = os.environ.get(TENANT_ENVIRONMENT, "")
    if not text:
        return None
    if not text.isdigit() or int(text) > MAX_KEY_ID:
        raise ValueError("$%s wants a key id (0 to %d), not %r"
                         % (TENANT_ENVIRONMENT, MAX_KEY_ID, text))
    return int(text)


def resolve_envelope(auth_key: Union[bytes, str, None], auth_key_file: Optional[str],
                     tenant: Optional[int], encrypt: bool,
                     cipher: Optional[str] = None) -> Optional[Envelope]:
    """How a client seals its datagrams: under the key resolve_auth_key()
    finds, in the legacy form, or as `tenant` (a key id, whose key that
    is), encrypted with `encrypt`, in the suite `cipher` names ("auto",
    the default: AES-GCM where this CPU has it and the cryptography
    package is installed; "portable"; "aes"; protocol.Envelope); None
    without a key. A key from $SHARDLOCK_AUTH_KEY_FILE brings
    $SHARDLOCK_TENANT, $SHARDLOCK_ENCRYPT=1 and $SHARDLOCK_CIPHER along
    where `tenant`, `encrypt` and `cipher` are not given, as shardlockctl
    reads them. ValueError for a tenant without a key, encryption without a
    tenant, a bad key id or cipher; ImportError for a form whose package is
    missing (PyNaCl, cryptography)."""
    key = resolve_auth_key(auth_key, auth_key_file)
    if auth_key is None and auth_key_file is None and key is not None:
        if tenant is None:
            tenant = _tenant_from_environment()
        encrypt = encrypt or os.environ.get(ENCRYPT_ENVIRONMENT) == "1"
        if cipher is None:
            cipher = os.environ.get(CIPHER_ENVIRONMENT) or None
    if key is None:
        if tenant is not None or encrypt:
            raise ValueError("a tenant (and encryption) needs the tenant's key: auth_key or "
                             "auth_key_file")
        return None
    return Envelope(key, tenant, encrypt, cipher or "auto")
