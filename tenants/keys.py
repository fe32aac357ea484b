"""API key format and hashing. A key is `fg_<prefix>_<secret>`; only sha256(key) is stored.

The secret has 256 bits of entropy, so a fast hash is safe here (no password stretching needed),
and comparison is constant-time.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

KEY_PREFIX = "fg"
PREFIX_LEN = 10


def key_generate() -> tuple[str, str, str]:
    """Return (full_key, prefix, secret_hash)."""
    prefix = secrets.token_hex(PREFIX_LEN // 2)
    secret = secrets.token_urlsafe(32)
    full_key = f"{KEY_PREFIX}_{prefix}_{secret}"
    return full_key, prefix, key_hash(full_key)


def key_hash(full_key: str) -> str:
    return hashlib.sha256(full_key.encode()).hexdigest()


def key_prefix(full_key: str) -> str | None:
    parts = full_key.split("_", 2)
    if len(parts) != 3 or parts[0] != KEY_PREFIX or len(parts[1]) != PREFIX_LEN:
        return None
    return parts[1]


def key_matches(full_key: str, stored_hash: str) -> bool:
    return hmac.compare_digest(key_hash(full_key), stored_hash)
