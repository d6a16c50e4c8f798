"""What a function deployment's package must be, checked at deploy from what the pool read.

The package's thawpool.toml is parsed by the replica's own rules
(spec.function_package, pure Python), so a package the replica would refuse is a
422 naming the field at deploy, not a failed cold start later; and the deployment
must give it the memory and GPUs it asks for.
"""
from __future__ import annotations

from controlplane.deploy.deployment_spec import Resources
from controlplane.store.errors import InvalidField
from pool.api import FUNCTION_ARCHITECTURE, ModelInfo
from spec.function_package import MANIFEST, FunctionPackage, parse_manifest


def check_function(info: ModelInfo, resources: Resources) -> FunctionPackage:
    if info.architecture != FUNCTION_ARCHITECTURE or info.function_manifest is None:
        raise InvalidField("model_uri", f"no {MANIFEST} under the prefix: a function package "
                                        "names its handler there")
    try:
        package = parse_manifest(info.function_manifest.encode())
    except ValueError as exc:
        raise InvalidField("model_uri", f"{MANIFEST}: {exc}") from None
    if resources.gpu_memory_gb < package.gpu_memory_gb:
        raise InvalidField("resources.gpu_memory_gb",
                           f"the package asks for {package.gpu_memory_gb:g} GB per replica")
    if resources.gpu_count < package.gpu_count:
        raise InvalidField("resources.gpu_count", f"the package asks for {package.gpu_count} GPUs")
    return package
