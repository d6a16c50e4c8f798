"""thawpool's GPU pool: inventory, placement, replica lifecycle, cold start from S3,
activator, autoscaler, routing and scale to zero. The control plane uses
`PoolManager` (pool/manager.py) through the seam in pool/api.py.
"""
from pool.in_memory import EventLog, InMemoryDesiredState
from pool.manager import PoolManager
from pool.settings import PoolSettings

__all__ = ["EventLog", "InMemoryDesiredState", "PoolManager", "PoolSettings"]
