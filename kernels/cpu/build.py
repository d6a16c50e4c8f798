"""Compile a C kernel of this folder once per machine and load it with ctypes.

The shared object is built with the system C compiler (`cc`, else `gcc`) for this
very CPU (-march=native) and cached under the temp dir, keyed by the source, the
flags and the CPU, so a machine compiles each kernel once (about a second) and
every later process just loads it. A sandboxed replica has a private temp dir, so
the pool builds every kernel once (`prebuild`, `python -m kernels.cpu.build DIR`)
into a folder it binds read-only into each sandbox and names in KERNELS_DIR_ENV;
a library found there is loaded, any other is built as before. Concurrent builders each write a private file
and rename it into place, so a half-written library is never loaded.

Load after torch is imported: the library links libgomp by soname, and the
dynamic loader then binds it to the libgomp torch already loaded, so the kernels
share torch's OpenMP thread pool instead of starting a second one.

`load(name)` raises NativeUnavailable with the reason (no compiler, a failed
build); kernels/dispatch.py then keeps the pure-torch reference and says why.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from kernels.cpu.tape import Kernel

HERE = Path(__file__).resolve().parent
# -ffast-math lets the compiler reorder float sums into vector lanes and call glibc's
# vector expf. It is given to the compile step only: linked with it, a library sets the
# CPU to flush subnormals to zero for the whole process (crtfastmath.o) as it loads.
COMPILE_FLAGS = ("-O3", "-march=native", "-ffast-math", "-fopenmp", "-fPIC", "-std=c11")
LINK_FLAGS = ("-shared", "-fopenmp")
KERNELS_DIR_ENV = "THAWPOOL_KERNELS_DIR"      # kernels built ahead, read-only


class NativeUnavailable(RuntimeError):
    """A C kernel could not be built or loaded on this machine."""


def compiler() -> Optional[str]:
    """The C compiler the kernels are built with: `cc`, else `gcc`, else None."""
    return shutil.which("cc") or shutil.which("gcc")


@lru_cache(maxsize=None)
def load(name: str) -> ctypes.CDLL:
    """The compiled kernels/cpu/<name>.c, built on first use."""
    source = HERE / f"{name}.c"
    cc = compiler()
    if cc is None:
        raise NativeUnavailable("no C compiler (cc or gcc) on PATH")
    built = f"{name}-{_build_key(source, cc)}.so"
    ahead = os.environ.get(KERNELS_DIR_ENV)
    target = Path(ahead) / built if ahead else None
    if target is None or not target.exists():
        try:
            target = _cache_dir() / built
        except OSError as exc:
            raise NativeUnavailable(f"no cache folder for the built kernels: {exc}") from exc
    if not target.exists():
        _compile(cc, source, target)
    try:
        return ctypes.CDLL(str(target))
    except OSError as exc:
        raise NativeUnavailable(f"{target}: {exc}") from exc


def prebuild(folder: Path) -> list[Path]:
    """Every kernel of this folder built into `folder` (what KERNELS_DIR_ENV names)."""
    cc = compiler()
    if cc is None:
        raise NativeUnavailable("no C compiler (cc or gcc) on PATH")
    folder.mkdir(parents=True, exist_ok=True)
    built = []
    for source in sorted(HERE.glob("*.c")):
        target = folder / f"{source.stem}-{_build_key(source, cc)}.so"
        if not target.exists():
            _compile(cc, source, target)
        built.append(target)
    return built


def function(name: str, symbol: str, argtypes: list, restype=None) -> "Kernel":
    """`symbol` of kernels/cpu/<name>.c with its C types (kernels/cpu/tape.py's Kernel:
    a pointer argument is given as a tensor, or None for NULL). ctypes lets go of the GIL
    during the call."""
    from kernels.cpu.tape import Kernel     # torch's: this module is the pool's too

    fn = getattr(load(name), symbol)
    fn.argtypes = argtypes
    fn.restype = restype
    return Kernel(fn)


def _build_key(source: Path, cc: str) -> str:
    digest = hashlib.sha256(source.read_bytes())
    digest.update(" ".join((cc, *COMPILE_FLAGS, *LINK_FLAGS, platform.machine(),
                            cpu_identity())).encode())
    return digest.hexdigest()[:16]


def cpu_identity() -> str:
    """-march=native code is only good on the CPU it was built on."""
    try:
        with open("/proc/cpuinfo") as f:
            first_cpu = f.read().split("\n\n")[0]
    except OSError:
        return platform.processor()
    return "".join(line for line in first_cpu.splitlines() if line.startswith(("model name", "flags")))


def _cache_dir() -> Path:
    path = Path(tempfile.gettempdir()) / f"thawpool-kernels-{os.getuid()}"
    path.mkdir(mode=0o700, exist_ok=True)
    return path


def _compile(cc: str, source: Path, target: Path) -> None:
    obj = target.with_suffix(f".{os.getpid()}.o")
    partial = target.with_suffix(f".{os.getpid()}.tmp")
    try:
        _run([cc, *COMPILE_FLAGS, "-c", str(source), "-o", str(obj)])
        _run([cc, *LINK_FLAGS, str(obj), "-o", str(partial), "-lm"])
        os.replace(partial, target)
    finally:
        obj.unlink(missing_ok=True)
        partial.unlink(missing_ok=True)


def _run(cmd: list[str]) -> None:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NativeUnavailable(f"{' '.join(cmd)}: {exc}") from exc
    if done.returncode != 0:
        raise NativeUnavailable(f"{' '.join(cmd)} failed: {done.stderr.strip()[-2000:]}")


if __name__ == "__main__":
    import sys

    for path in prebuild(Path(sys.argv[1])):
        print(path)
