"""Secrets the control plane keeps in Postgres to use later (the secret key of a tenant's
own bucket), sealed with AES-GCM under a key that never enters the database.

The key is THAWPOOL_SECRETS_KEY (32 bytes, base64), which every control plane sharing
one database must be given; without it, `secrets-key` in the data dir, made once with
mode 0600 (one control plane per database). Each sealed value is bound to the row it
belongs to (AES-GCM's associated data), so a sealed secret copied into another row
does not open.
"""
from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Optional

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

KEY_FILE = "secrets-key"
NONCE_BYTES = 12


class Sealer:
    def __init__(self, key: bytes):
        if len(key) != 32:
            raise ValueError("the secrets key must be 32 bytes (base64 in THAWPOOL_SECRETS_KEY)")
        self._aead = AESGCM(key)

    def seal(self, secret: str, bound_to: str) -> bytes:
        nonce = os.urandom(NONCE_BYTES)
        return nonce + self._aead.encrypt(nonce, secret.encode(), bound_to.encode())

    def open(self, sealed: bytes, bound_to: str) -> str:
        """The secret; cryptography's InvalidTag when the key or the row is not its own."""
        nonce, body = sealed[:NONCE_BYTES], sealed[NONCE_BYTES:]
        return self._aead.decrypt(nonce, body, bound_to.encode()).decode()


def load_sealer(configured: Optional[str], data_dir: Path) -> Sealer:
    """The configured key, else the data dir's key file (made now if there is none)."""
    if configured:
        return Sealer(base64.b64decode(configured, validate=True))
    path = data_dir / KEY_FILE
    if not path.exists():
        data_dir.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:          # another process made it first: use theirs
            pass
        else:
            with os.fdopen(fd, "w") as out:
                out.write(base64.b64encode(AESGCM.generate_key(bit_length=256)).decode() + "\n")
    return Sealer(base64.b64decode(path.read_text().strip(), validate=True))
