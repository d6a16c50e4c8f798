"""Per-revision venvs on the node: built once per requirements hash, the platform's torch
visible, the package's own wheels only, failures with pip's reason."""
import shutil
import subprocess

import pytest

from pool.api import ColdStartFailed
from pool.function_env import build_env, installer_env, plain_env
from pool.launch import FunctionServer, ReplicaLaunch
from pool.function_sandbox import FunctionSandboxes
from pool.settings import PoolSettings
from tests.functions.conftest import make_wheel
from tests.support.local_index import local_index

async_test = pytest.mark.asyncio(loop_scope="function")


@async_test
async def test_requirements_install_from_the_packages_wheels_and_are_cached(probe_package, tmp_path):
    settings = PoolSettings(accelerator="cpu", cache_dir=tmp_path)
    package = probe_package(requirements='["tinydep==0.1"]', wheels=True)
    sandboxes = FunctionSandboxes.from_settings(settings)
    first = await build_env(settings, package, sandboxes, "tenant-a")
    again = await build_env(settings, probe_package(requirements='["tinydep==0.1"]', wheels=True), sandboxes,
                            "tenant-a")
    assert (first.cached, again.cached, again.python) == (False, True, first.python)
    probe = subprocess.run([first.python, "-c", "import tinydep, torch, sys; "
                            "print(tinydep.VALUE, sys.prefix)"], capture_output=True, text=True)
    assert probe.returncode == 0, probe.stderr
    value, prefix = probe.stdout.split()
    assert value == "42" and prefix.startswith(str(tmp_path))       # its own venv, torch shared
    platform = subprocess.run([settings.runtime_python, "-c", "import tinydep"], capture_output=True)
    assert platform.returncode != 0                                   # never the platform's


@async_test
async def test_other_wheels_under_the_same_requirement_lines_get_a_venv_of_their_own(probe_package, tmp_path):
    settings = PoolSettings(accelerator="cpu", cache_dir=tmp_path)
    sandboxes = FunctionSandboxes.from_settings(settings)
    first = await build_env(settings, probe_package(requirements='["tinydep==0.1"]', wheels=True), sandboxes, "t")
    changed = probe_package(requirements='["tinydep==0.1"]', wheels=True)
    shutil.rmtree(changed / "wheels")
    make_wheel(changed / "wheels", "tinydep", "0.1", "VALUE = 43\n")      # same name and version, other bytes
    second = await build_env(settings, changed, sandboxes, "t")
    assert not second.cached and second.python != first.python
    probe = subprocess.run([second.python, "-c", "import tinydep; print(tinydep.VALUE)"], capture_output=True,
                           text=True)
    assert probe.stdout.strip() == "43", probe.stderr


@async_test
async def test_a_requirement_the_wheels_do_not_hold_fails_with_pips_reason(probe_package, tmp_path):
    settings = PoolSettings(accelerator="cpu", cache_dir=tmp_path)
    with pytest.raises(ColdStartFailed) as failed:
        await build_env(settings, probe_package(requirements='["tinydep==9.9"]', wheels=True),
                        FunctionSandboxes.from_settings(settings), "tenant-a")
    assert "installing requirements failed" in failed.value.reason and "tinydep" in failed.value.reason
    assert not [p for p in (tmp_path / "function-envs").glob("*/*-w*") if p.is_dir()]   # nothing half-built


@async_test
async def test_without_wheels_a_sandboxed_build_installs_from_the_operators_index(probe_package, tmp_path):
    """No network in the build's sandbox: pip reaches the index the operator names through
    the egress proxy (pool/egress.py), which opens nothing else (tests/pool/test_egress.py)."""
    source = probe_package(requirements='["tinydep==0.1"]', wheels=True)
    with local_index(source / "wheels", tmp_path / "www") as url:
        settings = PoolSettings(accelerator="cpu", cache_dir=tmp_path / "cache", function_index_url=url)
        built = await build_env(settings, probe_package(requirements='["tinydep==0.1"]'),
                                FunctionSandboxes.from_settings(settings), "tenant-a")
    probe = subprocess.run([built.python, "-c", "import tinydep; print(tinydep.VALUE)"], capture_output=True,
                           text=True)
    assert probe.stdout.strip() == "42", probe.stderr


def test_children_never_see_the_platforms_credentials():
    environ = {"PATH": "/bin", "HOME": "/root", "AWS_SECRET_ACCESS_KEY": "s", "AWS_ACCESS_KEY_ID": "k",
               "THAWPOOL_DATABASE_URL": "postgresql://x", "PIP_INDEX_URL": "https://user:token@mirror/simple",
               "UV_INDEX_URL": "https://user:token@mirror/simple", "HTTPS_PROXY": "http://proxy:3128"}
    assert plain_env(environ) == {"PATH": "/bin", "HOME": "/root"}
    # the installer's own index settings (and their credentials) never reach a tenant's build;
    # the index the operator names for tenants does
    assert installer_env(environ) == {"PATH": "/bin", "HOME": "/root", "HTTPS_PROXY": "http://proxy:3128"}
    assert installer_env(environ, "https://tenants/simple") == {
        "PATH": "/bin", "HOME": "/root", "HTTPS_PROXY": "http://proxy:3128",
        "PIP_INDEX_URL": "https://tenants/simple", "UV_INDEX_URL": "https://tenants/simple"}
    function = ReplicaLaunch(FunctionServer("rev", None), "/venv/bin/python", None, {"PYTHONPATH": "/src"}, None)
    served = function.environment(environ, "r", [1, 3])
    assert served == {"PATH": "/bin", "HOME": "/root", "THAWPOOL_REPLICA_SECRET": "r", "PYTHONPATH": "/src",
                      "CUDA_VISIBLE_DEVICES": "1,3"}
