"""What STYLE.md promises: everything but the model runner, models and kernels imports
without torch (the control plane, the pool and a standby replica's request path rely on it)."""
from __future__ import annotations

import subprocess
import sys

import pytest

TORCH_FREE = ["wire.requests", "wire.sse", "runtime", "runtime.engine.llm_engine", "runtime.engine.scheduler",
              "runtime.engine.block_manager", "runtime.serve.server", "runtime.serve.completions",
              "runtime.models",
              "pool.manager", "controlplane.app"]


@pytest.mark.parametrize("module", TORCH_FREE)
def test_module_imports_without_torch(module):
    code = f"import sys, {module}; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", f"{module} imports torch"


def test_the_model_runner_does_import_torch():
    """The negative case: the check above can see torch being imported."""
    code = "import sys, runtime.engine.model_runner; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"
