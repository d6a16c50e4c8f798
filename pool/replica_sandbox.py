"""The sandbox a replica's launch asks for (`ReplicaLaunch.sandbox`), made on the node it runs on.

A model's server runs in a sandbox of its own (pool/model_sandbox.py: a uid of its own,
its model's files linked in); a function's as its tenant's uid, with its package and
venv bound in (pool/function_sandbox.py). Both backends make them here, the local one
on the pool's machine, a Ray actor on its node with that node's settings.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from pool.api import ReplicaKind
from pool.function_sandbox import PACKAGE, FunctionSandboxes
from pool.launch import FunctionServer, ReplicaLaunch
from pool.model_sandbox import MODEL, ModelSandboxes
from pool.sandbox import SandboxedServer
from pool.settings import PoolSettings


def model_sandbox_name(replica_id: str) -> str:
    """A model replica's sandbox (its folders, its cgroups) when it is started for the replica."""
    return f"model-{replica_id}"


@dataclass(frozen=True)
class ReplicaSandboxes:
    functions: FunctionSandboxes
    models: ModelSandboxes

    @classmethod
    def from_settings(cls, settings: PoolSettings) -> Optional[ReplicaSandboxes]:
        """None where the operator turned the sandbox off (THAWPOOL_SANDBOX=off)."""
        functions = FunctionSandboxes.from_settings(settings)
        return cls(functions, ModelSandboxes(functions.sandbox, settings)) if functions is not None else None

    def server(self, launch: ReplicaLaunch, replica_id: str, interpreter: str, folder: Path, secret: str,
               shown: Sequence[int | str], devices: Sequence[int]) -> SandboxedServer:
        """The launch's server in its sandbox, on its unix socket: `folder` and `interpreter`
        as this node has them, `shown` the GPUs its CUDA_VISIBLE_DEVICES names (empty: not
        set), `devices` the indices of the GPU device files it may open."""
        confinement = launch.sandbox
        if confinement is None:
            raise ValueError("an unconfined launch has no sandbox")
        env = launch.environment({}, secret, shown)
        program = launch.program
        if isinstance(program, FunctionServer):
            return self.functions.server(confinement.tenant_id, replica_id, folder, interpreter,
                                         program.argv(str(PACKAGE)), confinement.memory_mb, env, devices,
                                         confinement.egress)
        models, name = self.models, model_sandbox_name(replica_id)
        return models.server(name, interpreter, env, confinement.memory_mb, devices, lambda: program.with_engine(
            models.place(name, folder, confinement.tenant_id, None, program.engine)).argv(str(MODEL)))

    def remove(self, kind: ReplicaKind, replica_id: str) -> None:
        """The sandbox `server` made for the replica: its folders, cgroups and egress proxy's socket."""
        if kind == "model":
            self.models.remove(model_sandbox_name(replica_id))
        else:
            self.functions.remove(replica_id)
