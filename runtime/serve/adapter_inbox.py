"""A replica's adapter inbox: the folder it takes an adapter's adapter_model.safetensors
from when a PUT of /admin/adapters names a file there (wire/replica_control.py's
ADAPTER_FILE_HEADER) in place of carrying it as the body. Given at start
(ADAPTER_INBOX_FLAG); under the pool it is a folder of the replica's own, bound
read-only into its sandbox (pool/model_sandbox.py), holding hard links to the node's
cache entries of the adapters being loaded into it, and only while they are.

A name is trusted no more than a body would be: wire's rule first (one plain path
component), then opened relative to the folder, never through a symbolic link, without
blocking on a FIFO, and refused unless it is a regular file of at most
MAX_WEIGHTS_BYTES; the adapter reader then checks its contents as it checks a body's.
Refusals are AdapterRefused naming the header: 400, 404 for a file that is not there
(the pool's to retry, not the adapter's fault), 413 above the limit.

The file is mapped, not read: the reader copies each tensor once into the adapter's
buffer anyway, so reading it into memory first would be a second pass over the file
(about 4 ms of a 20 MB adapter's load on two cores). The mapping is copy-on-write, so
the reader's views are writable as a body's are and the file stays as it is. Mapping
is safe with what the pool links: cache entries are replaced by rename and removed by
unlink, never truncated in place, and a removed link leaves a mapped file whole.
"""
from __future__ import annotations

import errno
import mmap
import os
import stat
from pathlib import Path

from runtime.serve.adapters import AdapterRefused, Weights
from spec.lora_adapter import MAX_WEIGHTS_BYTES, WEIGHTS_FILE
from wire.errors import ProtocolError
from wire.replica_control import ADAPTER_FILE_HEADER, adapter_file

_OPEN = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class AdapterInbox:
    def __init__(self, folder: Path):
        self.folder = folder

    def open(self, given: str) -> Weights:
        """The file `given` names in the inbox, mapped; AdapterRefused if not one to read."""
        try:
            name = adapter_file(given)
        except ProtocolError as exc:
            raise _refused(400, exc.message) from None
        try:
            fd = self._open(name)
        except OSError as exc:
            raise _unopened(name, exc) from None
        try:
            return _mapped(name, fd)
        finally:
            os.close(fd)

    def _open(self, name: str) -> int:
        # relative to the folder's descriptor: the name is one component, so nothing but
        # the folder's own entry is looked up, and O_NOFOLLOW refuses it if a link
        folder = os.open(self.folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            return os.open(name, _OPEN, dir_fd=folder)
        finally:
            os.close(folder)


def _mapped(name: str, fd: int) -> Weights:
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        raise _refused(400, f"{name} is not a regular file of the adapter inbox")
    if info.st_size > MAX_WEIGHTS_BYTES:
        raise _refused(413, f"{name}: {WEIGHTS_FILE} larger than {MAX_WEIGHTS_BYTES} bytes")
    if info.st_size == 0:              # mmap maps no empty file; the reader refuses it as cut off
        return bytearray()
    return mmap.mmap(fd, info.st_size, access=mmap.ACCESS_COPY)


def _unopened(name: str, exc: OSError) -> AdapterRefused:
    if exc.errno == errno.ENOENT:
        return _refused(404, f"{name}: no such file in the adapter inbox")
    if exc.errno == errno.ELOOP:
        return _refused(400, f"{name} is a symbolic link: the adapter inbox takes files only")
    return _refused(400, f"{name}: cannot open it in the adapter inbox: {exc.strerror}")


def _refused(status: int, message: str) -> AdapterRefused:
    prefix = f"{ADAPTER_FILE_HEADER}: "
    return AdapterRefused(status, message if message.startswith(prefix) else prefix + message,
                          param=ADAPTER_FILE_HEADER)
