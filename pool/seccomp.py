"""The seccomp filter of every sandboxed process, compiled by libseccomp.

A handler needs files, sockets it is given, threads and memory; it never needs
to trace another process, mount, load BPF or kernel modules, make namespaces,
touch the kernel keyring, or reach the kernel's larger attack surfaces
(io_uring, userfaultfd, perf events). Those calls fail with EPERM, the way
Docker's and gVisor's default profiles refuse them; everything else is allowed.
`clone3` answers ENOSYS so that the C library falls back to `clone`, whose
flags a filter can read: a clone asking for a new namespace is refused there.

libseccomp (Debian's libseccomp2, which bubblewrap depends on) writes the BPF
program; bubblewrap loads it (`--seccomp FD`) after it built the sandbox and
before it runs the sandboxed command.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
from pathlib import Path

REFUSED = (
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp",
    "mount", "umount2", "pivot_root", "chroot", "move_mount", "open_tree", "fsopen", "fsmount",
    "fspick", "mount_setattr",
    "unshare", "setns",
    "bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register",
    "keyctl", "add_key", "request_key",
    "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
    "reboot", "swapon", "swapoff", "acct", "syslog", "quotactl", "lookup_dcookie",
    "open_by_handle_at", "name_to_handle_at", "fanotify_init",
    "settimeofday", "clock_settime", "clock_adjtime", "adjtimex",
)
NAMESPACE_FLAGS = 0x00000080 | 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 \
    | 0x20000000 | 0x40000000     # CLONE_NEWTIME, NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET

_ALLOW = 0x7FFF0000
_CMP_MASKED_EQ = 7
_ATTR_OPTIMIZE = 8             # SCMP_FLTATR_CTL_OPTIMIZE (libseccomp 2.5)
_BINARY_TREE = 2               # every syscall pays a tree search, not a walk of the list


def _errno(code: int) -> int:
    return 0x00050000 | (code & 0xFFFF)


class _ArgCmp(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int),
                ("datum_a", ctypes.c_uint64), ("datum_b", ctypes.c_uint64)]


class SeccompUnavailable(RuntimeError):
    pass


def _library() -> ctypes.CDLL:
    name = ctypes.util.find_library("seccomp")
    if name is None:
        raise SeccompUnavailable("libseccomp is not installed (Debian: libseccomp2)")
    lib = ctypes.CDLL(name, use_errno=True)
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint,
                                           ctypes.POINTER(_ArgCmp)]
    lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.seccomp_attr_set.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32]
    return lib


def write_filter(path: Path) -> None:
    """The BPF program, for this machine's architecture, into path."""
    lib = _library()
    ctx = lib.seccomp_init(_ALLOW)
    if not ctx:
        raise SeccompUnavailable("seccomp_init failed")
    try:
        lib.seccomp_attr_set(ctx, _ATTR_OPTIMIZE, _BINARY_TREE)      # older libseccomp: the list
        for name in REFUSED:
            _rule(lib, ctx, _errno(errno.EPERM), name)
        _rule(lib, ctx, _errno(errno.ENOSYS), "clone3")
        for flag in _bits(NAMESPACE_FLAGS):
            _rule(lib, ctx, _errno(errno.EPERM), "clone", _ArgCmp(0, _CMP_MASKED_EQ, flag, flag))
        # whole, then renamed: a sandbox another process (a Ray actor) launches meanwhile
        # reads the old program or the new one, never half of one
        partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
        try:
            with open(partial, "wb") as out:
                if lib.seccomp_export_bpf(ctx, out.fileno()) != 0:
                    raise SeccompUnavailable("seccomp_export_bpf failed")
            os.replace(partial, path)
        finally:
            partial.unlink(missing_ok=True)
    finally:
        lib.seccomp_release(ctx)


def _rule(lib: ctypes.CDLL, ctx: int, action: int, name: str, *args: _ArgCmp) -> None:
    number = lib.seccomp_syscall_resolve_name(name.encode())
    if number < 0:
        return                      # not a call on this architecture: nothing to refuse
    array = (_ArgCmp * len(args))(*args) if args else None
    if lib.seccomp_rule_add_array(ctx, action, number, len(args), array) != 0:
        raise SeccompUnavailable(f"seccomp: cannot add the rule for {name}")


def _bits(mask: int) -> list[int]:
    return [1 << i for i in range(mask.bit_length()) if mask >> i & 1]
