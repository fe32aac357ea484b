"""Key format and hashing. An API key is `fg_<prefix>_<secret>`, a report token
`fgr_<prefix>_<secret>`; only sha256(key) is stored.

The secret has 256 bits of entropy, so a fast hash is safe here (no password stretching needed),
and comparison is constant-time.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

KEY_PREFIX = "fg"
REPORT_TOKEN_PREFIX = "fgr"
PREFIX_LEN = 10


def key_generate(kind: str = KEY_PREFIX) -> tuple[str, str, str]:
    """Return (full_key, prefix, secret_hash) of a new key of ``kind`` (an API key, or a report token)."""
    prefix = secrets.token_hex(PREFIX_LEN // 2)
    secret = secrets.token_urlsafe(32)
    full_key = f"{kind}_{prefix}_{secret}"
    return full_key, prefix, key_hash(full_key)


def key_hash(full_key: str) -> str:
    return hashlib.sha256(full_key.encode()).hexdigest()


def key_prefix(full_key: str, kind: str = KEY_PREFIX) -> str | None:
    parts = full_key.split("_", 2)
    if len(parts) != 3 or parts[0] != kind or len(parts[1]) != PREFIX_LEN:
        return None
    return parts[1]


def key_matches(full_key: str, stored_hash: str) -> bool:
    return hmac.compare_digest(key_hash(full_key), stored_hash)
