"""Pool backends: where replicas run. `build_backend` picks one from the settings."""
from __future__ import annotations

from pool.backends.base import Backend
from pool.settings import PoolSettings


def build_backend(settings: PoolSettings) -> Backend:
    """The backend `settings.backend` names; ray is imported only when asked for,
    so a machine without ray runs the local backend."""
    if settings.backend == "ray":
        from pool.backends.ray import RayBackend
        return RayBackend(settings)
    from pool.backends.local import LocalBackend
    return LocalBackend(settings)
