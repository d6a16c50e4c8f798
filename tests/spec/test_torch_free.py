"""Every spec/ module imports where torch cannot: the control plane and the pool read them,
and neither may bring torch in."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SPEC = Path(__file__).resolve().parents[2] / "spec"
MODULES = sorted("spec." + p.stem for p in SPEC.glob("*.py") if p.stem != "__init__")
# torch set to None in sys.modules: any `import torch` under it raises ImportError
NO_TORCH = "import sys; sys.modules['torch'] = None; import importlib; importlib.import_module({!r})"


def test_every_spec_module_is_listed():
    assert {"spec.architectures", "spec.gguf", "spec.function_package"} <= set(MODULES)


@pytest.mark.parametrize("module", MODULES)
def test_imports_with_torch_unavailable(module):
    run = subprocess.run([sys.executable, "-c", NO_TORCH.format(module)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr


def test_the_check_sees_a_torch_import():
    """The negative control: a module that imports torch fails the same way."""
    run = subprocess.run([sys.executable, "-c", NO_TORCH.format("runtime.engine.model_runner")],
                         capture_output=True, text=True)
    assert run.returncode != 0 and "torch" in run.stderr
