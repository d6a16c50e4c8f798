"""Where the bootstrap admin key goes: to the terminal when there is one, else into a
file of the data dir that only the owner can read, written once; never into logs
(`thawpool up` under systemd or in a container ships its stdout to CloudWatch)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import TextIO

FILE_NAME = "admin-key"


def announce(secret: str, data_dir: Path, stdout: TextIO) -> str:
    """The banner line for a new admin key; off a terminal the key goes to a 0600 file."""
    if stdout.isatty():
        return f"thawpool: admin key      {secret}   (shown once; stored hashed)"
    path = write_key_file(secret, data_dir)
    return f"thawpool: admin key      written to {path} (mode 0600; shown nowhere else)"


def write_key_file(secret: str, data_dir: Path) -> Path:
    """`data_dir/admin-key`, created 0600 before a byte is written (replacing an older
    one, whose key was revoked, since a new key is only made when no admin key lives)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / FILE_NAME
    partial = path.with_suffix(".partial")
    partial.unlink(missing_ok=True)
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(secret + "\n")
    os.replace(partial, path)
    return path
