"""Tensor parallelism: how weights shard, and the worker group that runs the shards."""
