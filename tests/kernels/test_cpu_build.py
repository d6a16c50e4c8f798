"""kernels/cpu/build.py: compiled once per machine, cached, sharing torch's OpenMP; a
machine without a compiler gets the references and a reason."""
import subprocess
import sys

import pytest

from tests.kernels.cpu_support import threads  # noqa: F401  (skips without a compiler)

from kernels.cpu import build


def test_a_second_load_reuses_the_cached_library(tmp_path, monkeypatch):
    monkeypatch.setattr(build.tempfile, "gettempdir", lambda: str(tmp_path))
    build.load.cache_clear()
    try:
        build.load("activation")
        [library] = list(tmp_path.glob("thawpool-kernels-*/activation-*.so"))
        built_at = library.stat().st_mtime_ns
        build.load.cache_clear()
        build.load("activation")
        assert library.stat().st_mtime_ns == built_at
        assert not list(tmp_path.glob("thawpool-kernels-*/*.tmp"))
    finally:
        build.load.cache_clear()


def test_a_failed_build_names_the_compiler_error(tmp_path, monkeypatch):
    monkeypatch.setattr(build, "HERE", tmp_path)
    monkeypatch.setattr(build.tempfile, "gettempdir", lambda: str(tmp_path))
    (tmp_path / "broken.c").write_text("int f(void) { return undeclared; }\n")
    with pytest.raises(build.NativeUnavailable, match="undeclared"):
        build.load.__wrapped__("broken")


def test_one_openmp_runtime_in_the_process():
    code = ("import torch; from kernels.dispatch import get_kernels; get_kernels('cpu');"
            "maps = open('/proc/self/maps').read().splitlines();"
            "print(sorted({l.split()[-1] for l in maps if 'gomp' in l}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    libraries = eval(out.stdout.strip())
    assert len(libraries) == 1, libraries


def test_loading_the_kernels_keeps_subnormals():
    # A library linked with -ffast-math would switch the whole process to flush-to-zero.
    code = ("import torch; from kernels.dispatch import get_kernels; get_kernels('cpu');"
            "import kernels.cpu.int8_matmul;"
            "print((torch.tensor(1e-30) * 1e-10).item() != 0.0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"


def test_no_compiler_means_the_references_and_a_warning(tmp_path):
    code = ("import logging; logging.basicConfig();"
            "from kernels.dispatch import get_kernels; ks = get_kernels('cpu');"
            "print(ks.backend, ks.paged_decode_attention.__module__, ks.linear.__module__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PATH": str(tmp_path), "TMPDIR": str(tmp_path)})
    assert out.stdout.split() == ["torch", "kernels.attention", "kernels.cpu.linear"]
    assert "no C compiler" in out.stderr
