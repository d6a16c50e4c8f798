"""What one replica process is and how it is confined: built once by the cold start
(pool/cold_start.py), started by a backend, which decides only where it runs.

The launch names the server (its module, its arguments, its engine), the interpreter,
what its environment adds, and its confinement. A backend fills in only what the node
it picks knows, each part named here:

  address      --host/--port (an unconfined process, on a free port of the node) or
               --uds (a sandboxed one, on the socket of its sandbox folder)
  folder       the model folder or function package as the node reads it: the pool's
               copy (`folder`), or where that is None, the node's own pull of the revision
  interpreter  where None (`interpreter`): the node's own runtime interpreter for a model
               (a Ray node's path may differ from the pool's), the venv the node builds
               for a function
  draft        a speculative draft model the engine still names by URI: the node pulls it
  secret       a fresh one for each process (`environment`)
  GPUs         the devices of the slots the replica gets
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import ClassVar, Mapping, Optional, Sequence

from pool.api import ReplicaKind
from pool.backends.runtime_args import engine_flags
from pool.function_env import plain_env
from spec.engine_options import ChosenOptions
from wire.replica_secret import SECRET_ENV

MODEL_SERVER = "runtime.serve.server"
FUNCTION_SERVER = "runtime.functions.server"
MAX_OPEN_FILES = 4096                  # a function server's descriptors


@dataclass(frozen=True)
class ModelServer:
    """`python -m runtime.serve.server`: an LLM served from a model folder."""
    served_name: str
    engine: ChosenOptions              # the revision's, with what the slots imply

    kind: ClassVar[ReplicaKind] = "model"

    def argv(self, folder: str) -> list[str]:
        """After the interpreter, less the address."""
        return ["-m", MODEL_SERVER, "--model", folder, "--served-model-name", self.served_name,
                *engine_flags(self.engine)]

    def with_engine(self, engine: ChosenOptions) -> ModelServer:
        """The same server with the engine as its node sees it (a draft's folder, a sandbox's paths)."""
        return replace(self, engine=engine)


@dataclass(frozen=True)
class FunctionServer:
    """`python -m runtime.functions.server`: a function package in its own venv."""
    served_name: str
    memory_mb: Optional[int]           # its address space (--memory-limit-mb); None: no limit

    kind: ClassVar[ReplicaKind] = "function"

    def argv(self, folder: str) -> list[str]:
        """After the interpreter, less the address."""
        args = ["-m", FUNCTION_SERVER, "--package", folder, "--served-model-name", self.served_name,
                "--max-open-files", str(MAX_OPEN_FILES)]
        return args + (["--memory-limit-mb", str(self.memory_mb)] if self.memory_mb else [])


@dataclass(frozen=True)
class Confinement:
    """The process runs in a sandbox (pool/sandbox.py); its profile (uid, binds, folders)
    is made on the node it runs on, from this."""
    tenant_id: str
    memory_mb: Optional[int]           # its cgroup's memory; None: no limit
    egress: tuple[str, ...] = ()       # the hosts its tenant was granted (a function's)


@dataclass(frozen=True)
class ReplicaLaunch:
    """One replica's process as the cold start describes it, for a backend to start where
    it placed it (module docstring: what the node fills in)."""
    program: ModelServer | FunctionServer
    interpreter: Optional[str]         # None: the node's (module docstring)
    folder: Optional[Path]             # the pool's copy of the weights or package; None: the node pulls
    env: Mapping[str, str]             # added to its environment, its secret aside (pool/backends/runtime_args.py)
    sandbox: Optional[Confinement]     # None: unconfined (the operator turned the sandbox off)

    @property
    def kind(self) -> ReplicaKind:
        return self.program.kind

    @property
    def takes_standby(self) -> bool:
        """A warm standby (`--standby`, the runtime's interpreter) may load it: a model's
        does; a function runs its own venv's interpreter, which no standby has."""
        return isinstance(self.program, ModelServer)

    @property
    def clean_env(self) -> bool:
        """It sees only plain variables of the node's environment: a function's handler is
        the tenant's code, and the node's environment holds the platform's credentials."""
        return isinstance(self.program, FunctionServer)

    def visible_gpus(self, gpus: Sequence[int]) -> list[int]:
        """The GPUs CUDA_VISIBLE_DEVICES narrows it to where the node shows it all of them
        (empty: left as it is): a function's always (its handler says "cuda"); a model's
        when it has several, since one GPU is named by index in its engine (a standby,
        started before its GPU is known, sees them all)."""
        return list(gpus) if self.clean_env or len(gpus) > 1 else []

    def environment(self, node_environ: Mapping[str, str], secret: str,
                    gpus: Sequence[int | str] = ()) -> dict[str, str]:
        """Its whole environment, from the node's (empty: a sandbox's start, which adds its
        own), what the launch adds and its secret, with only `gpus` visible (empty: as the
        node's environment says)."""
        env = {**(plain_env(node_environ) if self.clean_env else node_environ), **self.env, SECRET_ENV: secret}
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpus)
        return env

    def command(self, interpreter: str, folder: str, host: str, port: int) -> list[str]:
        """An unconfined process's command line, on host:port."""
        return [interpreter, *self.program.argv(folder), "--host", host, "--port", str(port)]
