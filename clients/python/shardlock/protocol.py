"""The shardlock lease wire format (UDP, version 1): a pure codec.

Bytes in, a message or a ProtocolError out; it never touches a socket. The
format is documented byte by byte at the top of
include/shardlock/lease/protocol.h; this module implements the part a client
needs: single-message requests (ACQUIRE, ACQUIRE_SHARED, ACQUIRE_PERMIT,
RENEW, RELEASE, QUERY, QUERY_HOLDERS, WATCH, and MAP for cluster mode) and
every reply a server sends to them, single or batched, sealed with datagram
authentication (auth.py), sealed for a tenant, authenticated or encrypted,
in the portable or the AES-GCM suite (Envelope), or not. Batched requests,
ACQUIRE_MANY and STATS are not implemented.

Header, 32 bytes, little-endian:
    u32 magic 0x4B4C4853 ("SHLK"), u8 version 1, u8 flags, u8 type,
    u8 count (1), u64 request_id, u64 client_id lo, u64 client_id hi
then, with flags bit 1 (FLAG_EPOCH, requests only), the sender's u64 map
epoch, then the body of `type` (a key is u16 length + bytes).

Anti-amplification: a request must be padded with zeros up to the largest
reply the server may send to it (max_reply_size()), or the server answers
ERROR(REQUEST_TOO_SMALL). encode_request() pads.

Watches (protocol.h, "Watches"): a key's version is (the token of its newest
holder, its holder count), (0, 0) while free. WATCH carries the version its
sender last saw and a wait; the server answers HOLDERS_REPLY at once when the
key's version differs (NO_VERSION_TOKEN: always), else when it changes or
the wait ends. Like a waiting ACQUIRE it may be answered later, so it is
padded to a whole datagram, which also makes its HOLDERS_REPLY a tail page
ending at the newest holder: the version is read off the last entry.

Speed: a client encodes and decodes a datagram per call, so both work from
struct.Struct objects built once: one per request type, key length and
header shape for encoding (a single pack() writes the padded datagram), one
per reply type for decoding.
"""

from __future__ import annotations

import hashlib
import hmac
import importlib
import importlib.util
import itertools
import os
import struct
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple, TypeVar, Union

MAGIC = 0x4B4C4853
VERSION = 1
HEADER_SIZE = 32
BATCH_ITEM_HEADER_SIZE = 12
BATCH_ITEM_OWNER_SIZE = 16
MAX_DATAGRAM_SIZE = 1400
MAX_BATCH = 64
MIN_KEY_LENGTH = 1
MAX_KEY_LENGTH = 256
MAX_PERMITS = 65535
FLAG_AUTHENTICATED = 0x01
FLAG_EPOCH = 0x02  # a u64 map epoch follows the header (cluster clients' requests)
EPOCH_SIZE = 8
MAX_MEMBER_ID_LENGTH = 128
MAX_MEMBER_ADDRESS_LENGTH = 64
ITEM_FLAG_OWNER = 0x01
ITEM_FLAG_VALUE = 0x02  # the item carries a holder value (single-key ACQUIREs)
HOLDER_FLAG_PENDING = 0x01  # a HOLDERS_REPLY entry of an ACQUIRE_MANY not yet complete
MAX_HOLDER_VALUE_LENGTH = 256
# A WATCH token no key's version has: the sender wants the state at once.
NO_VERSION_TOKEN = 0xFFFFFFFFFFFFFFFF

# Message types.
ACQUIRE = 0x01
RENEW = 0x02
RELEASE = 0x03
QUERY = 0x04
STATS = 0x05
ACQUIRE_SHARED = 0x06
ACQUIRE_PERMIT = 0x07
ACQUIRE_MANY = 0x08
MAP = 0x09
QUERY_HOLDERS = 0x0A
WATCH = 0x0C  # a blocking QUERY_HOLDERS
GRANTED = 0x81
BUSY = 0x82
TIMEOUT = 0x83
RENEWED = 0x84
RELEASED = 0x85
NOT_OWNER = 0x86
EXPIRED = 0x87
RECOVERING = 0x88
ERROR = 0x89
# A cluster node (docs/cluster.md): the key belongs to another node in the
# node's map of this epoch. A client in cluster mode refreshes its map and
# goes to the owner; one talking to a single server reports it
# (RedirectedError).
REDIRECT = 0x8E
MAP_REPLY = 0x8F
QUERY_REPLY = 0x8A
STATS_REPLY = 0x8B
GRANTED_MANY = 0x8C
BUSY_MANY = 0x8D
HOLDERS_REPLY = 0x90
BATCH = 0xFF

# Lease modes (QUERY_REPLY's mode).
MODE_EXCLUSIVE = 0
MODE_SHARED = 1
MODE_PERMIT = 2

# WireError: the code an ERROR reply carries.
WIRE_ERRORS = {
    1: "unsupported protocol version",
    2: "empty key",
    3: "key longer than 256 bytes",
    4: "ttl out of range",
    5: "wait out of range",
    6: "request datagram too small for its reply",
    7: "not a request",
    8: "internal server error",
    9: "request id reused for a different request",
    10: "a server limit is reached",
    11: "server out of memory",
    12: "key in use as another lease kind or permit limit",
    13: "permits out of range",
    14: "bad key list (none, too many, or a key twice)",
    15: "bad lease mode",
    16: "permission denied (the tenant has no right to this key or request)",
    17: "limit exceeded: the tenant's max-leases (leases it holds on this server)",
    18: "limit exceeded: the tenant's max-waiters (ACQUIREs it has queued on this server)",
    19: "limit exceeded: the tenant's max-watches (WATCHes it has parked on this server)",
}
ERROR_WAIT_OUT_OF_RANGE = 5  # e.g. a wait above the server's --max-wait
ERROR_REQUEST_TOO_SMALL = 6
ERROR_NOT_A_REQUEST = 7
ERROR_PERMISSION_DENIED = 16  # outside the tenant's prefixes and rights (--tenants)
ERROR_LIMIT_EXCEEDED = 10
# The tenant's own bounds (its tenant file line), named.
ERROR_TENANT_LEASE_LIMIT = 17
ERROR_TENANT_WAITER_LIMIT = 18
ERROR_TENANT_WATCH_LIMIT = 19
LIMIT_ERRORS = frozenset((ERROR_LIMIT_EXCEEDED, ERROR_TENANT_LEASE_LIMIT, ERROR_TENANT_WAITER_LIMIT,
                          ERROR_TENANT_WATCH_LIMIT))

# Each body field in wire order: (attribute, struct format or "key").
_KEY = "key"
_MEMBERS = "members"  # u8 n, n x (u16 id length + id, u16 address length + address, u32 weight)
# u8 n, n x (u128 owner, u64 token, u32 ttl_left_ms, u8 flags, u16 value length + value)
_HOLDERS = "holder_list"
_LISTS = (_MEMBERS, _HOLDERS)
_BODIES = {
    ACQUIRE: (("key", _KEY), ("ttl_ms", "I"), ("wait_ms", "I")),
    ACQUIRE_SHARED: (("key", _KEY), ("ttl_ms", "I"), ("wait_ms", "I")),
    ACQUIRE_PERMIT: (("key", _KEY), ("ttl_ms", "I"), ("wait_ms", "I"), ("permits", "I")),
    RENEW: (("key", _KEY), ("token", "Q"), ("ttl_ms", "I")),
    RELEASE: (("key", _KEY), ("token", "Q")),
    QUERY: (("key", _KEY),),
    GRANTED: (("key", _KEY), ("token", "Q"), ("ttl_ms", "I")),
    BUSY: (("key", _KEY), ("ttl_ms", "I")),
    TIMEOUT: (("key", _KEY),),
    RENEWED: (("key", _KEY), ("ttl_ms", "I")),
    RELEASED: (),
    NOT_OWNER: (),
    EXPIRED: (),
    RECOVERING: (("retry_after_ms", "I"),),
    ERROR: (("error", "H"),),
    REDIRECT: (("epoch", "Q"),),
    MAP: (("first_member", "I"),),
    MAP_REPLY: (("epoch", "Q"), ("member_count", "I"), ("first_member", "I"),
                ("members", _MEMBERS)),
    QUERY_REPLY: (("key", _KEY), ("held", "B"), ("token", "Q"), ("ttl_ms", "I"),
                  ("waiters", "I"), ("mode", "B"), ("holders", "I"), ("permits", "I")),
    QUERY_HOLDERS: (("key", _KEY), ("first_holder", "I")),
    HOLDERS_REPLY: (("key", _KEY), ("mode", "B"), ("permits", "I"), ("waiters", "I"),
                    ("holders", "I"), ("first_holder", "I"), ("holder_list", _HOLDERS)),
    WATCH: (("key", _KEY), ("token", "Q"), ("holders", "I"), ("wait_ms", "I")),
}

# What the server sends each request (kRequestReplies). The reply bound is
# computed from exactly these; RECOVERING is also taken as an answer to the
# others (the server's lock-delay).
_REPLIES = {
    ACQUIRE: (GRANTED, BUSY, TIMEOUT, RECOVERING, ERROR, REDIRECT),
    ACQUIRE_SHARED: (GRANTED, BUSY, TIMEOUT, RECOVERING, ERROR, REDIRECT),
    ACQUIRE_PERMIT: (GRANTED, BUSY, TIMEOUT, RECOVERING, ERROR, REDIRECT),
    RENEW: (RENEWED, NOT_OWNER, EXPIRED, ERROR, REDIRECT, RECOVERING),
    RELEASE: (RELEASED, NOT_OWNER, EXPIRED, ERROR),
    QUERY: (QUERY_REPLY, ERROR, REDIRECT, RECOVERING),
    MAP: (MAP_REPLY, ERROR),
    QUERY_HOLDERS: (HOLDERS_REPLY, ERROR, REDIRECT, RECOVERING),
    WATCH: (HOLDERS_REPLY, ERROR, REDIRECT, RECOVERING),
}
_ALSO_ACCEPTED = {RELEASE: (RECOVERING,), MAP: (RECOVERING,)}

_NAMES = {
    ACQUIRE: "ACQUIRE", RENEW: "RENEW", RELEASE: "RELEASE", QUERY: "QUERY",
    STATS: "STATS", ACQUIRE_SHARED: "ACQUIRE_SHARED", ACQUIRE_PERMIT: "ACQUIRE_PERMIT",
    ACQUIRE_MANY: "ACQUIRE_MANY", GRANTED: "GRANTED", BUSY: "BUSY", TIMEOUT: "TIMEOUT",
    RENEWED: "RENEWED", RELEASED: "RELEASED", NOT_OWNER: "NOT_OWNER", EXPIRED: "EXPIRED",
    RECOVERING: "RECOVERING", ERROR: "ERROR", REDIRECT: "REDIRECT", QUERY_REPLY: "QUERY_REPLY",
    STATS_REPLY: "STATS_REPLY", GRANTED_MANY: "GRANTED_MANY", BUSY_MANY: "BUSY_MANY",
    BATCH: "BATCH", MAP: "MAP", MAP_REPLY: "MAP_REPLY", QUERY_HOLDERS: "QUERY_HOLDERS",
    HOLDERS_REPLY: "HOLDERS_REPLY", WATCH: "WATCH",
}

_HEADER = struct.Struct("<IBBBBQQQ")
_FLAGS_OFFSET = 5
_BATCH_ITEM = struct.Struct("<BBHQ")


def type_name(message_type: int) -> str:
    """"ACQUIRE", "GRANTED", ...; "UNKNOWN" for other values."""
    return _NAMES.get(message_type, "UNKNOWN")


T = TypeVar("T")


class ProtocolError(ValueError):
    """Bytes that are not a datagram this codec can read or write."""


@dataclass
class Holder:
    """One holder in a HOLDERS_REPLY."""

    owner: Tuple[int, int]  # (lo, hi), as a client id
    token: int
    ttl_left_ms: int
    flags: int = 0  # HOLDER_FLAG_PENDING
    value: bytes = b""


@dataclass
class Message:
    """One request or reply; only the fields of its type are meaningful."""

    type: int
    request_id: int = 0
    key: bytes = b""
    token: int = 0
    ttl_ms: int = 0  # ACQUIRE, RENEW, GRANTED, RENEWED; ttl left for BUSY, QUERY_REPLY
    wait_ms: int = 0  # ACQUIRE*, WATCH
    permits: int = 0
    retry_after_ms: int = 0
    error: int = 0
    held: int = 0
    waiters: int = 0
    mode: int = 0
    holders: int = 0  # QUERY_REPLY, HOLDERS_REPLY: all of them; WATCH: of the version seen
    epoch: int = 0  # REDIRECT, MAP_REPLY: the sender's map epoch
    first_member: int = 0  # MAP, MAP_REPLY
    member_count: int = 0  # MAP_REPLY: the map's members, all pages
    # MAP_REPLY: this page's members, each (id, address "host:port", weight).
    members: List[Tuple[bytes, str, int]] = field(default_factory=list)
    first_holder: int = 0  # QUERY_HOLDERS, HOLDERS_REPLY
    value: bytes = b""  # a single-key ACQUIRE's holder value (ITEM_FLAG_VALUE)
    # HOLDERS_REPLY: this page's holders, oldest grant first.
    holder_list: List[Holder] = field(default_factory=list)


def _body_size(message: Message) -> int:
    n = 0
    for _, fmt in _BODIES[message.type]:
        n += 2 + len(message.key) if fmt == _KEY else struct.calcsize("<" + fmt)
    return n


def _fixed_size(message_type: int) -> Tuple[bool, int]:
    """(carries a key, body size less the key's bytes; a member or holder
    list counted empty)."""
    keyed = False
    n = 0
    for _, fmt in _BODIES[message_type]:
        if fmt in _LISTS:
            n += 1
        elif fmt == _KEY:
            keyed = True
            n += 2
        else:
            n += struct.calcsize("<" + fmt)
    return keyed, n


def max_reply_body(request: Message) -> int:
    """The largest reply body the server sends to `request`
    (max_reply_body_bound() in protocol.h): a key is counted at the
    request's key length."""
    largest = 0
    for reply in _REPLIES[request.type]:
        keyed, n = _fixed_size(reply)
        largest = max(largest, n + (len(request.key) if keyed else 0))
    return largest


def max_reply_size(request: Message) -> int:
    """The size a single-message request datagram must be padded to."""
    return HEADER_SIZE + max_reply_body(request)


_TAIL_FORMATS = {t: "".join(fmt for _, fmt in fields if fmt not in (_KEY,) + _LISTS)
                 for t, fields in _BODIES.items()}
_TAIL_NAMES = {t: tuple(name for name, fmt in fields if fmt not in (_KEY,) + _LISTS)
               for t, fields in _BODIES.items()}
_KEYED = {t: any(fmt == _KEY for _, fmt in fields) for t, fields in _BODIES.items()}
_REQUEST_STRUCTS: Dict[Tuple[int, int, bool, int], struct.Struct] = {}


def _request_struct(message_type: int, key_length: int, with_epoch: bool,
                    pad_to: int) -> struct.Struct:
    """The whole request datagram as one Struct: header, [epoch], body,
    zero padding up to `pad_to` (0: none). Cached: a client reuses a few."""
    cache_key = (message_type, key_length, with_epoch, pad_to)
    s = _REQUEST_STRUCTS.get(cache_key)
    if s is None:
        fmt = "<IBBBBQQQ" + ("Q" if with_epoch else "")
        if _KEYED[message_type]:
            fmt += "H%ds" % key_length
        fmt += _TAIL_FORMATS[message_type]
        size = struct.calcsize(fmt)
        if pad_to > size:
            fmt += "%dx" % (pad_to - size)
        s = struct.Struct(fmt)
        if len(_REQUEST_STRUCTS) < 4096:  # bounded: key lengths are 1..256
            _REQUEST_STRUCTS[cache_key] = s
    return s


_REQUEST_PAD: Dict[Tuple[int, int], int] = {}
_PAGED = (MAP, QUERY_HOLDERS, WATCH)


def request_pad(message_type: int, key_length: int, auth: bool = False) -> int:
    """The size a request of this type and key length is padded to: its
    max_reply_size(), or for a MAP, QUERY_HOLDERS or WATCH, whose reply
    page fills what it may (and a WATCH's answer may come later, within
    the bytes its datagram left), a whole datagram, or SEALED_PAYLOAD_LIMIT
    when sealed."""
    if message_type in _PAGED:
        return SEALED_PAYLOAD_LIMIT if auth else MAX_DATAGRAM_SIZE
    pad = _REQUEST_PAD.get((message_type, key_length))
    if pad is None:
        pad = max_reply_size(Message(type=message_type, key=bytes(key_length)))
        _REQUEST_PAD[(message_type, key_length)] = pad
    return pad


_VALUE_TYPES = (ACQUIRE, ACQUIRE_SHARED, ACQUIRE_PERMIT)


def _pack_with_value(message_type: int, request_id: int, client_id: Tuple[int, int], key: bytes,
                     values: Tuple[int, ...], epoch: Optional[int], value: bytes,
                     pad: bool) -> bytes:
    """A single-key ACQUIRE with a holder value: a batch of one whose item
    carries ITEM_FLAG_VALUE and the value (u16 length + bytes) before the
    body, padded as the server bounds a batch: the item's largest reply, and
    a whole datagram header more for a waiting ACQUIRE's later answer."""
    if message_type not in _VALUE_TYPES:
        raise ProtocolError("only ACQUIRE, ACQUIRE_SHARED and ACQUIRE_PERMIT carry a value")
    if len(value) > MAX_HOLDER_VALUE_LENGTH:
        raise ProtocolError("value longer than %d bytes" % MAX_HOLDER_VALUE_LENGTH)
    body = struct.pack("<H", len(key)) + key + _TAIL_STRUCTS[message_type].pack(*values)
    lo, hi = client_id
    flags = 0 if epoch is None else FLAG_EPOCH
    data = _HEADER.pack(MAGIC, VERSION, flags, BATCH, 1, request_id, lo, hi)
    if epoch is not None:
        data += _U64.pack(epoch)
    data += _BATCH_ITEM.pack(message_type, ITEM_FLAG_VALUE, len(body), request_id)
    data += struct.pack("<H", len(value)) + value + body
    if pad:
        bound = HEADER_SIZE + BATCH_ITEM_HEADER_SIZE + max_reply_body(
            Message(type=message_type, key=key))
        if values[1]:  # wait_ms: its answer may come later, in a datagram of its own
            bound += HEADER_SIZE - BATCH_ITEM_HEADER_SIZE
        data += bytes(max(0, bound - len(data)))
    return data


def pack_request(message_type: int, request_id: int, client_id: Tuple[int, int], key: bytes,
                 values: Tuple[int, ...], epoch: Optional[int] = None,
                 auth_key: Union[bytes, "Envelope", None] = None, pad: bool = True,
                 value: bytes = b"") -> bytes:
    """A single-message request datagram: `values` are the type's fixed body
    fields in wire order after the key (ACQUIRE: ttl_ms, wait_ms; RENEW:
    token, ttl_ms; RELEASE: token; QUERY: none; QUERY_HOLDERS: first_holder;
    WATCH: token, holders, wait_ms; MAP: first_member). A `value`
    (single-key ACQUIREs: the holder value, at most MAX_HOLDER_VALUE_LENGTH
    bytes) frames the request as a batch of one. `auth_key` seals it: a
    32-byte key in the legacy form, or an Envelope in its form. The
    client's hot path; encode_request() is the same from a Message."""
    if message_type not in _REPLIES:
        raise ProtocolError("not a request type this codec encodes: %s" % type_name(message_type))
    if len(key) > 0xFFFF:
        raise ProtocolError("key too long for its u16 length")
    envelope = auth_key if auth_key is None or isinstance(auth_key, Envelope) \
        else Envelope(auth_key)
    overhead = 0 if envelope is None else envelope.overhead
    if value:
        data = _pack_with_value(message_type, request_id, client_id, key, values, epoch, value,
                                pad)
        if len(data) + overhead > MAX_DATAGRAM_SIZE:
            raise ProtocolError("datagram larger than %d bytes" % MAX_DATAGRAM_SIZE)
        return data if envelope is None else envelope.seal(data)
    pad_to = request_pad(message_type, len(key), envelope is not None) if pad else 0
    flags = (0 if epoch is None else FLAG_EPOCH) | (0 if envelope is None else envelope.flags)
    s = _request_struct(message_type, len(key), epoch is not None, pad_to)
    lo, hi = client_id
    head: Tuple[Any, ...] = (MAGIC, VERSION, flags, message_type, 1, request_id, lo, hi)
    if epoch is not None:
        head += (epoch,)
    if _KEYED[message_type]:
        head += (len(key), key)
    data = s.pack(*head, *values)
    if len(data) + overhead > MAX_DATAGRAM_SIZE:
        raise ProtocolError("datagram larger than %d bytes" % MAX_DATAGRAM_SIZE)
    return data if envelope is None else envelope.finish(data)


def encode_request(message: Message, client_id: Tuple[int, int], pad: bool = True,
                   epoch: Optional[int] = None,
                   auth_key: Union[bytes, "Envelope", None] = None) -> bytes:
    """A single-message request datagram for `client_id` (lo, hi), zero-padded
    to max_reply_size() unless `pad` is false (tests only: the server refuses
    such a request). A MAP is padded to a whole datagram, so its MAP_REPLY
    page carries as many members as fit. With `epoch` (a cluster client's
    map epoch) the header carries FLAG_EPOCH and the epoch follows it; the
    epoch does not change the padding, as the reply is no larger. With
    `auth_key` the datagram is sealed: a key seals it in the legacy form
    (FLAG_AUTHENTICATED and a tag), an Envelope in its own form."""
    if message.type not in _REPLIES:
        raise ProtocolError("not a request type this codec encodes: %s" % type_name(message.type))
    values = tuple(getattr(message, name) for name in _TAIL_NAMES[message.type])
    return pack_request(message.type, message.request_id, client_id, message.key, values,
                        epoch=epoch, auth_key=auth_key, pad=pad)


# ---- authentication ---------------------------------------------------------
#
# As include/shardlock/lease/wire/auth.h: a 32-byte key shared by server and
# clients; a sealed datagram has FLAG_AUTHENTICATED set in its header and ends
# in a 16-byte tag, keyed BLAKE2b (libsodium's crypto_generichash, which
# hashlib's blake2b with key= and digest_size=16 equals) over every byte
# before it, flag and padding included.

AUTH_KEY_SIZE = 32
AUTH_TAG_SIZE = 16


def _tag(data: bytes, auth_key: bytes) -> bytes:
    return hashlib.blake2b(data, key=auth_key, digest_size=AUTH_TAG_SIZE).digest()


def seal(data: bytes, auth_key: bytes) -> bytes:
    """`data` (a datagram) with FLAG_AUTHENTICATED set and its tag appended."""
    if len(data) < HEADER_SIZE:
        raise ProtocolError("truncated")
    sealed = bytearray(data)
    sealed[_FLAGS_OFFSET] |= FLAG_AUTHENTICATED
    return bytes(sealed) + _tag(bytes(sealed), auth_key)


def open_sealed(data: bytes, auth_key: bytes) -> Optional[bytes]:
    """The datagram without its tag if it is sealed under `auth_key` (flag
    set, tag verified in constant time); None otherwise."""
    if len(data) < HEADER_SIZE + AUTH_TAG_SIZE or not data[_FLAGS_OFFSET] & FLAG_AUTHENTICATED:
        return None
    body = data[:-AUTH_TAG_SIZE]
    if not hmac.compare_digest(_tag(body, auth_key), data[-AUTH_TAG_SIZE:]):
        return None
    return body


# ---- the envelope: sealing for a tenant ------------------------------------
#
# As include/shardlock/lease/wire/envelope.h, where several tenants, each
# with its own 32-byte key, share a server (shardlockd --tenants). A sealed
# datagram names its key by a u32 key id; integers are little-endian, n is
# the plain datagram's length:
#
#   form               flags  bytes
#   legacy             0x01   [datagram n][tag 16]                  (seal() above)
#   authenticated      0x05   [datagram n][u32 key_id][tag 16]
#   encrypted          0x0D   [bytes 0..5][ciphertext n-6][u32 key_id][nonce 24][tag 16]
#   authenticated-AES  0x15   [datagram n][u32 key_id][nonce 24][tag 16]
#   encrypted-AES      0x1D   [bytes 0..5][ciphertext n-6][u32 key_id][nonce 24][tag 16]
#
# authenticated: the legacy tag (keyed BLAKE2b, 16 bytes) over every byte
# before it, so the flags and the key id are covered. encrypted:
# XChaCha20-Poly1305-IETF of bytes 6..n-1 (everything after magic, version
# and flags) under the key's cipher subkey (cipher_key()), a random nonce
# per datagram, and bytes 0..5 followed by the key id as associated data.
# The AES forms (FLAG_AES) use AES-256-GCM instead, under a stream's key:
# the nonce field is a stream's 16-byte random prefix and u64 counter, the
# stream's key is keyed BLAKE2b-256 of the prefix under aes_key(key), and
# GCM's 12-byte nonce is the counter followed by 4 zero bytes.
# authenticated-AES has no plaintext and all bytes before the tag as
# associated data; encrypted-AES encrypts as the encrypted form does.
# FLAG_EPOCH may stand beside any form. An opened datagram keeps
# FLAG_AUTHENTICATED, as open_sealed() leaves it, and loses the others.
# XChaCha20-Poly1305 is PyNaCl's (Debian: python3-nacl), AES-GCM
# cryptography's (python3-cryptography), each imported only by an Envelope
# that needs it; the rest is the standard library.

FLAG_KEY_ID = 0x04
FLAG_ENCRYPTED = 0x08
FLAG_AES = 0x10
KEY_ID_SIZE = 4
NONCE_SIZE = 24
MAX_KEY_ID = 0xFFFFFFFF
# The forms (envelope.h's EnvelopeMode, in its order).
LEGACY, AUTHENTICATED, ENCRYPTED, AUTHENTICATED_AES, ENCRYPTED_AES = 0, 1, 2, 3, 4
_AES_FORMS = (AUTHENTICATED_AES, ENCRYPTED_AES)
_ENCRYPTING_FORMS = (ENCRYPTED, ENCRYPTED_AES)
_FORM_FLAGS = {
    LEGACY: FLAG_AUTHENTICATED,
    AUTHENTICATED: FLAG_AUTHENTICATED | FLAG_KEY_ID,
    ENCRYPTED: FLAG_AUTHENTICATED | FLAG_KEY_ID | FLAG_ENCRYPTED,
    AUTHENTICATED_AES: FLAG_AUTHENTICATED | FLAG_KEY_ID | FLAG_AES,
    ENCRYPTED_AES: FLAG_AUTHENTICATED | FLAG_KEY_ID | FLAG_ENCRYPTED | FLAG_AES,
}
_FORM_OF_BITS = {flags & ~FLAG_AUTHENTICATED: form for form, flags in _FORM_FLAGS.items()}
_ENVELOPE_BITS = FLAG_KEY_ID | FLAG_ENCRYPTED | FLAG_AES
_FORM_OVERHEAD = {
    LEGACY: AUTH_TAG_SIZE,
    AUTHENTICATED: KEY_ID_SIZE + AUTH_TAG_SIZE,
    ENCRYPTED: KEY_ID_SIZE + NONCE_SIZE + AUTH_TAG_SIZE,
    AUTHENTICATED_AES: KEY_ID_SIZE + NONCE_SIZE + AUTH_TAG_SIZE,
    ENCRYPTED_AES: KEY_ID_SIZE + NONCE_SIZE + AUTH_TAG_SIZE,
}
MAX_ENVELOPE_OVERHEAD = max(_FORM_OVERHEAD.values())
# The most a sealed datagram's plain part may take: a server with a key
# (--auth-key or --tenants) encodes every reply into a whole datagram less
# the largest seal it may need, whatever its request's seal; so a paged
# request padded further would be paid a page that cannot be sent. The C++
# client's payload_limit() is the same.
SEALED_PAYLOAD_LIMIT = MAX_DATAGRAM_SIZE - MAX_ENVELOPE_OVERHEAD
# Magic, version and flags stay readable; encryption starts at the type.
_CIPHER_OFFSET = _FLAGS_OFFSET + 1
# envelope_key()'s crypto_kdf subkeys: their id and 8-byte contexts.
_CIPHER_SUBKEY_ID = 1
_CIPHER_KEY_CONTEXT = b"SLKaead1"
_AES_KEY_CONTEXT = b"SLKaesg1"
_MAGIC_BYTES = struct.pack("<I", MAGIC)
_KEY_ID = struct.Struct("<I")
# An AES stream: its prefix, then its counter; GCM's nonce is the counter
# and 4 zero bytes.
_PREFIX_SIZE = 16
_GCM_NONCE_PAD = bytes(4)
# Seals per AES stream before a fresh prefix (envelope.cc's kAesStreamSeals).
AES_STREAM_SEALS = 1 << 24
# Opened AES streams whose key an Envelope keeps (per Envelope, all threads).
_AES_OPEN_CACHE = 64
# The cipher choices (envelope.h's EnvelopeCipher).
CIPHERS = ("auto", "portable", "aes")


def envelope_overhead(form: int) -> int:
    """The bytes sealing in `form` (LEGACY .. ENCRYPTED_AES) adds."""
    return _FORM_OVERHEAD[form]


def _kdf(key: bytes, context: bytes) -> bytes:
    """libsodium's crypto_kdf_derive_from_key(32, 1, context, key): keyed
    BLAKE2b-256 of nothing, with the subkey id (u64) as salt and the context
    as personalisation, each zero-padded to 16 bytes."""
    return hashlib.blake2b(b"", digest_size=32, key=key,
                           salt=struct.pack("<Q", _CIPHER_SUBKEY_ID) + bytes(8),
                           person=context + bytes(8)).digest()


def cipher_key(key: bytes) -> bytes:
    """The XChaCha20-Poly1305 key the encrypted form uses for `key`:
    crypto_kdf_derive_from_key(32, 1, "SLKaead1", key), as envelope_key()
    derives it, so one key never serves two primitives."""
    return _kdf(key, _CIPHER_KEY_CONTEXT)


def aes_key(key: bytes) -> bytes:
    """The root of the AES forms' stream keys for `key`:
    crypto_kdf_derive_from_key(32, 1, "SLKaesg1", key), as envelope_key()
    derives it."""
    return _kdf(key, _AES_KEY_CONTEXT)


def aes_stream_key(root: bytes, prefix: bytes) -> bytes:
    """An AES stream's AES-256 key: keyed BLAKE2b-256 of its 16-byte prefix
    under aes_key()'s root (crypto_generichash)."""
    return hashlib.blake2b(prefix, digest_size=32, key=root).digest()


def peek_key_id(data: bytes) -> Optional[Tuple[int, int]]:
    """(key id, form) of a sealed client datagram, read from its flags and
    trailer; None when it is not one (not the client magic, not sealed, an
    impossible combination of flags, too short for a header and its
    trailer). Verifies nothing. A legacy datagram reads as (0, LEGACY)."""
    if len(data) < HEADER_SIZE or data[:4] != _MAGIC_BYTES:
        return None
    flags = data[_FLAGS_OFFSET]
    if not flags & FLAG_AUTHENTICATED:
        return None
    form = _FORM_OF_BITS.get(flags & _ENVELOPE_BITS)
    if form is None:  # FLAG_ENCRYPTED or FLAG_AES without a key id
        return None
    overhead = _FORM_OVERHEAD[form]
    if len(data) < HEADER_SIZE + overhead:
        return None
    if form == LEGACY:
        return 0, LEGACY
    return _KEY_ID.unpack_from(data, len(data) - overhead)[0], form


def _import(modules: Tuple[str, ...], what: str, install: str) -> List[Any]:
    """The modules, or ImportError saying what needs them and how to
    install them."""
    try:
        return [importlib.import_module(name) for name in modules]
    except ImportError:
        raise ImportError("%s; %s" % (what, install)) from None


def _xchacha() -> Tuple[Any, Any]:
    """PyNaCl's bindings and its CryptoError, or ImportError saying how to
    install it."""
    bindings, exceptions = _import(
        ("nacl.bindings", "nacl.exceptions"),
        "encryption (encrypt=True) in the portable cipher needs PyNaCl for XChaCha20-Poly1305",
        "Debian/Ubuntu: apt-get install python3-nacl; pip: pip install 'shardlock[encrypt]'")
    return bindings, exceptions.CryptoError


def _aes_gcm() -> Tuple[Any, Any]:
    """cryptography's AESGCM and its InvalidTag, or ImportError saying how
    to install it."""
    aead, exceptions = _import(
        ("cryptography.hazmat.primitives.ciphers.aead", "cryptography.exceptions"),
        "the AES-GCM cipher (cipher='aes') needs the cryptography package",
        "Debian/Ubuntu: apt-get install python3-cryptography; pip: pip install "
        "'shardlock[aes]'")
    return aead.AESGCM, exceptions.InvalidTag


def _cpu_has_aes() -> bool:
    """Whether this CPU has the instructions fast, constant-time AES-GCM
    needs, as libsodium's crypto_aead_aes256gcm_is_available() asks: AES-NI
    and PCLMULQDQ on x86 (/proc/cpuinfo "flags"), AES and PMULL on ARM
    ("Features"). False where it cannot tell."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                name, _, value = line.partition(":")
                words = set(value.split())
                if name.strip() == "flags":
                    return {"aes", "pclmulqdq"} <= words
                if name.strip() == "Features":
                    return {"aes", "pmull"} <= words
    except OSError:
        pass
    return False


_aes_available: Optional[bool] = None


def aes_gcm_available() -> bool:
    """Whether cipher='auto' picks AES-GCM here: this CPU has AES-NI (or
    ARM's AES) and the cryptography package is installed. Read once."""
    global _aes_available
    if _aes_available is None:
        _aes_available = _cpu_has_aes() and \
            importlib.util.find_spec("cryptography") is not None
    return _aes_available


# Bumped in a forked child (os.register_at_fork), so an Envelope's AES
# stream, which the child inherits, is never continued there: the child
# starts a stream of its own, as envelope.cc's fork generation makes the
# C++ client do.
_fork_generation = 0


def _after_fork_in_child() -> None:
    global _fork_generation
    _fork_generation += 1


os.register_at_fork(after_in_child=_after_fork_in_child)


class _AesStream:
    """One AES sealing stream: a random prefix, its key's AESGCM, and the
    counter of its next seal (itertools.count: next() is atomic under the
    GIL, so threads sharing the stream never take one counter twice)."""

    def __init__(self, aead_class: Any, root: bytes) -> None:
        self.generation = _fork_generation
        self.prefix = os.urandom(_PREFIX_SIZE)
        self.aead = aead_class(aes_stream_key(root, self.prefix))
        self.counter = itertools.count()


class Envelope:
    """A 32-byte key made ready to seal client datagrams in one form under
    one key id, and to open replies in that form and under that id only
    (the server answers in its request's form): no key id is the legacy
    form (shardlockd --auth-key); a key id is a tenant's (--tenants),
    authenticated, or encrypted with `encrypt`. With a key id, `cipher`
    picks the suite: "auto" (AES-256-GCM where aes_gcm_available(), else
    portable), "portable" (BLAKE2b and XChaCha20-Poly1305: for a server
    without AES-NI, which drops AES datagrams) or "aes". ValueError for a
    bad key, key id or cipher, `encrypt` without a key id, or "aes" without
    a key id; ImportError when the form's package is missing (PyNaCl for
    portable encryption, cryptography for AES)."""

    def __init__(self, key: bytes, key_id: Optional[int] = None, encrypt: bool = False,
                 cipher: str = "auto") -> None:
        key = bytes(key)
        if len(key) != AUTH_KEY_SIZE:
            raise ValueError("a key is %d bytes, not %d" % (AUTH_KEY_SIZE, len(key)))
        if key_id is not None and (isinstance(key_id, bool) or not isinstance(key_id, int) or
                                   not 0 <= key_id <= MAX_KEY_ID):
            raise ValueError("a tenant's key id is an integer in 0..%d, not %r"
                             % (MAX_KEY_ID, key_id))
        if encrypt and key_id is None:
            raise ValueError("encryption needs a tenant key id (tenant=)")
        if cipher not in CIPHERS:
            raise ValueError("cipher is one of %s, not %r" % (", ".join(CIPHERS), cipher))
        if cipher == "aes" and key_id is None:
            raise ValueError("the AES-GCM cipher seals a tenant's datagrams: it needs a key id "
                             "(tenant=)")
        aes = cipher == "aes" or (cipher == "auto" and aes_gcm_available())
        self.key = key
        self.key_id = key_id
        if key_id is None:
            self.form = LEGACY
        elif aes:
            self.form = ENCRYPTED_AES if encrypt else AUTHENTICATED_AES
        else:
            self.form = ENCRYPTED if encrypt else AUTHENTICATED
        self.cipher = "aes" if self.form in _AES_FORMS else "portable"
        self.flags = _FORM_FLAGS[self.form]
        self.overhead = _FORM_OVERHEAD[self.form]
        self._claim = (key_id or 0, self.form)
        self._key_id_bytes = _KEY_ID.pack(key_id or 0)
        self._cipher_key = b""
        if self.form == ENCRYPTED:
            self._bindings, self._crypto_error = _xchacha()
            self._cipher_key = cipher_key(key)
        if self.form in _AES_FORMS:
            self._aesgcm, self._invalid_tag = _aes_gcm()
            self._aes_root = aes_key(key)
            self._stream: Optional[_AesStream] = None
            # Opened streams' AESGCM by prefix, oldest first (dicts keep
            # insertion order); filled only by datagrams that verified.
            self._opened: Dict[bytes, Any] = {}

    def seal(self, data: bytes) -> bytes:
        """`data`, a plain client datagram, sealed: its form's flags set,
        bytes 6.. encrypted in the encrypting forms, the trailer appended.
        ProtocolError when it is shorter than a header, is no client
        datagram or carries an envelope flag (FLAG_KEY_ID, FLAG_ENCRYPTED,
        FLAG_AES) already."""
        if len(data) < HEADER_SIZE or data[:4] != _MAGIC_BYTES or \
                data[_FLAGS_OFFSET] & _ENVELOPE_BITS:
            raise ProtocolError("not a plain client datagram")
        flagged = bytearray(data)
        flagged[_FLAGS_OFFSET] |= self.flags
        return self.finish(bytes(flagged))

    def finish(self, flagged: bytes) -> bytes:
        """seal() of a datagram whose header carries `flags` already (an
        encoder sets them as it packs): the trailer, and the encryption.
        The encrypted form's nonce is os.urandom()'s: 24 random bytes never
        repeat in practice. The AES forms take the next counter of this
        Envelope's stream (a fresh one after a fork or AES_STREAM_SEALS
        seals)."""
        if self.form == LEGACY:
            return flagged + _tag(flagged, self.key)
        if self.form == AUTHENTICATED:
            body = flagged + self._key_id_bytes
            return body + _tag(body, self.key)
        if self.form == ENCRYPTED:
            nonce = os.urandom(NONCE_SIZE)
            head = flagged[:_CIPHER_OFFSET]
            # Combined mode: the ciphertext, then Poly1305's tag.
            sealed = self._bindings.crypto_aead_xchacha20poly1305_ietf_encrypt(
                flagged[_CIPHER_OFFSET:], head + self._key_id_bytes, nonce, self._cipher_key)
            return b"".join((head, sealed[:-AUTH_TAG_SIZE], self._key_id_bytes, nonce,
                             sealed[-AUTH_TAG_SIZE:]))
        stream = self._stream
        counter = -1 if stream is None else next(stream.counter)
        if stream is None or counter >= AES_STREAM_SEALS or \
                stream.generation != _fork_generation:
            # Threads that race here start a stream each: every one of
            # them has a prefix of its own, so no nonce repeats.
            stream = _AesStream(self._aesgcm, self._aes_root)
            self._stream = stream
            counter = next(stream.counter)
        return self._seal_aes(flagged, stream.prefix + struct.pack("<Q", counter), stream.aead)

    def _seal_aes(self, flagged: bytes, nonce: bytes, aead: Any) -> bytes:
        """The AES forms' seal of `flagged` with the nonce field `nonce`
        (prefix and counter) under the stream key's `aead`."""
        gcm_nonce = nonce[_PREFIX_SIZE:] + _GCM_NONCE_PAD
        if self.form == AUTHENTICATED_AES:
            body = flagged + self._key_id_bytes + nonce
            tag: bytes = aead.encrypt(gcm_nonce, b"", body)
            return body + tag
        head = flagged[:_CIPHER_OFFSET]
        sealed = aead.encrypt(gcm_nonce, flagged[_CIPHER_OFFSET:], head + self._key_id_bytes)
        return b"".join((head, sealed[:-AUTH_TAG_SIZE], self._key_id_bytes, nonce,
                         sealed[-AUTH_TAG_SIZE:]))

    def _opening_aead(self, prefix: bytes) -> Tuple[Any, bool]:
        """The AESGCM of stream `prefix`, and whether it came from the
        cache (else it is derived, to be filed once a datagram verified)."""
        aead = self._opened.get(prefix)
        if aead is not None:
            return aead, True
        return self._aesgcm(aes_stream_key(self._aes_root, prefix)), False

    def open(self, data: bytes) -> Optional[bytes]:
        """The plain datagram in `data` if it is sealed in this envelope's
        form, under its key id and key (tags checked in constant time,
        before anything is decrypted); None otherwise."""
        if peek_key_id(data) != self._claim:
            return None
        if self.form == LEGACY:
            return open_sealed(data, self.key)
        plain_size = len(data) - self.overhead
        trailer = data[plain_size:]
        if self.form == AUTHENTICATED:
            body = data[:-AUTH_TAG_SIZE]
            if not hmac.compare_digest(_tag(body, self.key), data[-AUTH_TAG_SIZE:]):
                return None
            text = data[_CIPHER_OFFSET:plain_size]
        elif self.form == ENCRYPTED:
            nonce = trailer[KEY_ID_SIZE:KEY_ID_SIZE + NONCE_SIZE]
            try:
                text = self._bindings.crypto_aead_xchacha20poly1305_ietf_decrypt(
                    data[_CIPHER_OFFSET:plain_size] + trailer[-AUTH_TAG_SIZE:],
                    data[:_CIPHER_OFFSET] + trailer[:KEY_ID_SIZE], nonce, self._cipher_key)
            except self._crypto_error:
                return None
        else:
            nonce = trailer[KEY_ID_SIZE:KEY_ID_SIZE + NONCE_SIZE]
            prefix = nonce[:_PREFIX_SIZE]
            gcm_nonce = nonce[_PREFIX_SIZE:] + _GCM_NONCE_PAD
            aead, cached = self._opening_aead(prefix)
            try:
                if self.form == AUTHENTICATED_AES:
                    aead.decrypt(gcm_nonce, trailer[-AUTH_TAG_SIZE:], data[:-AUTH_TAG_SIZE])
                    text = data[_CIPHER_OFFSET:plain_size]
                else:
                    text = aead.decrypt(
                        gcm_nonce, data[_CIPHER_OFFSET:plain_size] + trailer[-AUTH_TAG_SIZE:],
                        data[:_CIPHER_OFFSET] + trailer[:KEY_ID_SIZE])
            except self._invalid_tag:
                return None
            if not cached:
                if len(self._opened) >= _AES_OPEN_CACHE:
                    try:  # the oldest; another thread may be at it too
                        self._opened.pop(next(iter(self._opened)), None)
                    except (RuntimeError, StopIteration):
                        pass
                self._opened[prefix] = aead
        flags = data[_FLAGS_OFFSET] & ~_ENVELOPE_BITS
        return data[:_FLAGS_OFFSET] + bytes((flags,)) + text


@dataclass
class Datagram:
    request_id: int
    client_id: Tuple[int, int]
    messages: List[Message]
    epoch: Optional[int] = None  # FLAG_EPOCH: the sender's map epoch (requests only)


def _read_uint(body: memoryview, at: int, fmt: str) -> Tuple[int, int]:
    """The integer of struct format `fmt` at `at`, and the offset after it."""
    size = struct.calcsize("<" + fmt)
    if at + size > len(body):
        raise ProtocolError("truncated")
    return struct.unpack_from("<" + fmt, body, at)[0], at + size


def _read_bytes(body: memoryview, at: int) -> Tuple[bytes, int]:
    """A u16 length and that many bytes at `at`, and the offset after them."""
    length, at = _read_uint(body, at, "H")
    if at + length > len(body):
        raise ProtocolError("truncated")
    return bytes(body[at:at + length]), at + length


_TAIL_STRUCTS = {t: struct.Struct("<" + fmt) for t, fmt in _TAIL_FORMATS.items()}
_U16 = struct.Struct("<H")
_U64 = struct.Struct("<Q")


def _decode_body(message_type: int, body: memoryview, request_id: int) -> Tuple[Message, int]:
    """Reads one body from the front of `body`; returns it and its size.
    Every body is: the key if it has one, fixed fields, a member or holder
    list if it has one (_BODIES), so one Struct reads the fixed part."""
    tail = _TAIL_STRUCTS.get(message_type)
    if tail is None:
        raise ProtocolError("unknown message type 0x%02x" % message_type)
    m = Message(message_type, request_id)
    at = 0
    if _KEYED[message_type]:
        if len(body) < 2:
            raise ProtocolError("truncated")
        (length,) = _U16.unpack_from(body, 0)
        at = 2 + length
        if at > len(body):
            raise ProtocolError("truncated")
        m.key = bytes(body[2:at])
    if at + tail.size > len(body):
        raise ProtocolError("truncated")
    if tail.size:
        m.__dict__.update(zip(_TAIL_NAMES[message_type], tail.unpack_from(body, at)))
        at += tail.size
    if message_type == MAP_REPLY:
        m.members, at = _decode_list(body, at, _read_member)
    elif message_type == QUERY_REPLY and (m.held > 1 or m.mode > MODE_PERMIT):
        raise ProtocolError("bad field")
    elif message_type == HOLDERS_REPLY:
        if m.mode > MODE_PERMIT:
            raise ProtocolError("bad field")
        m.holder_list, at = _decode_list(body, at, _read_holder)
    return m, at


_HOLDER = struct.Struct("<QQQIB")


def _decode_list(body: memoryview, at: int, read_entry: Callable[[memoryview, int], Tuple[T, int]]
                 ) -> Tuple[List[T], int]:
    """A u8 count and that many entries from `at`, each read by
    `read_entry(body, at)` -> (entry, offset after it)."""
    if at + 1 > len(body):
        raise ProtocolError("truncated")
    count = body[at]
    at += 1
    entries = []
    for _ in range(count):
        entry, at = read_entry(body, at)
        entries.append(entry)
    return entries, at


def _read_holder(body: memoryview, at: int) -> Tuple[Holder, int]:
    """One HOLDERS_REPLY entry; as the C++ codec, flags other than
    HOLDER_FLAG_PENDING and values over MAX_HOLDER_VALUE_LENGTH bytes are
    refused."""
    if at + _HOLDER.size > len(body):
        raise ProtocolError("truncated")
    lo, hi, token, ttl_left_ms, flags = _HOLDER.unpack_from(body, at)
    value, at = _read_bytes(body, at + _HOLDER.size)
    if flags & ~HOLDER_FLAG_PENDING or len(value) > MAX_HOLDER_VALUE_LENGTH:
        raise ProtocolError("bad holder")
    return Holder((lo, hi), token, ttl_left_ms, flags, value), at


def _read_member(body: memoryview, at: int) -> Tuple[Tuple[bytes, str, int], int]:
    """One MAP_REPLY member; as the C++ codec, ids of 1..128 bytes,
    addresses of 1..64 (text), weights of at least 1."""
    member_id, at = _read_bytes(body, at)
    address, at = _read_bytes(body, at)
    weight, at = _read_uint(body, at, "I")
    if not (1 <= len(member_id) <= MAX_MEMBER_ID_LENGTH and
            1 <= len(address) <= MAX_MEMBER_ADDRESS_LENGTH and weight >= 1):
        raise ProtocolError("bad member")
    try:
        address_text = address.decode("ascii")
    except UnicodeDecodeError:
        raise ProtocolError("bad member address") from None
    return (member_id, address_text, weight), at


def decode(data: bytes, auth_key: Union[bytes, Envelope, None] = None) -> Datagram:
    """Decodes a datagram of the message types above (single or batch).
    With `auth_key` the datagram must be sealed under it: a key, in the
    legacy form; an Envelope, in its form and under its key id (the seal is
    checked, decrypted and dropped). Without, it must not be sealed. Raises
    ProtocolError for anything else; never reads outside `data`."""
    if auth_key is not None:
        opened = auth_key.open(data) if isinstance(auth_key, Envelope) else \
            open_sealed(data, auth_key)
        if opened is None:
            raise ProtocolError("not sealed under this key")
        data = opened
    view = memoryview(data)
    if len(view) < HEADER_SIZE:
        raise ProtocolError("truncated")
    magic, version, flags, message_type, count, request_id, lo, hi = _HEADER.unpack_from(view, 0)
    if magic != MAGIC:
        raise ProtocolError("bad magic")
    if version != VERSION:
        raise ProtocolError("unsupported version %d" % version)
    allowed = FLAG_EPOCH | (FLAG_AUTHENTICATED if auth_key is not None else 0)
    if flags & ~allowed:
        raise ProtocolError("flags 0x%02x: authenticated or reserved" % flags)
    messages = []
    at = HEADER_SIZE
    epoch = None
    if flags & FLAG_EPOCH:
        if at + EPOCH_SIZE > len(view):
            raise ProtocolError("truncated")
        (epoch,) = _U64.unpack_from(view, at)
        at += EPOCH_SIZE
    if message_type != BATCH:
        if count != 1:
            raise ProtocolError("bad count")
        m, size = _decode_body(message_type, view[at:], request_id)
        messages.append(m)
        at += size
    else:
        if count == 0 or count > MAX_BATCH:
            raise ProtocolError("bad count")
        for _ in range(count):
            if at + BATCH_ITEM_HEADER_SIZE > len(view):
                raise ProtocolError("truncated")
            item_type, item_flags, body_length, item_id = _BATCH_ITEM.unpack_from(view, at)
            at += BATCH_ITEM_HEADER_SIZE
            if item_flags & ~(ITEM_FLAG_OWNER | ITEM_FLAG_VALUE):
                raise ProtocolError("bad item flags")
            if item_flags & ITEM_FLAG_OWNER:
                at += BATCH_ITEM_OWNER_SIZE  # replies never carry one; skip it
            value = b""
            if item_flags & ITEM_FLAG_VALUE:  # requests only
                value, at = _read_bytes(view, at)
                if item_type not in _VALUE_TYPES or not 1 <= len(value) <= MAX_HOLDER_VALUE_LENGTH:
                    raise ProtocolError("bad value")
            if at + body_length > len(view):
                raise ProtocolError("truncated")
            m, size = _decode_body(item_type, view[at:at + body_length], item_id)
            if size != body_length:
                raise ProtocolError("bad length")
            m.value = value
            messages.append(m)
            at += body_length
    if any(view[at:]):
        raise ProtocolError("non-zero padding")
    return Datagram(request_id=request_id, client_id=(lo, hi), messages=messages, epoch=epoch)


def reply_answers(request_type: int, reply_type: int) -> bool:
    """Whether a client takes `reply_type` as the answer to `request_type`."""
    return reply_type in _REPLIES.get(request_type, ()) or \
        reply_type in _ALSO_ACCEPTED.get(request_type, ())


def reply_carries_key(reply_type: int) -> bool:
    """Whether the reply carries its request's key, which a client checks."""
    fields = _BODIES.get(reply_type, ())
    return reply_type >= 0x80 and any(fmt == _KEY for _, fmt in fields)
