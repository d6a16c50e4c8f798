"""The step loop in one process: scheduler, block manager, model runner, sampler."""
