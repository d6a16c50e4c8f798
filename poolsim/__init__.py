"""A trace-driven simulator of the pool: the pool's own decisions over a simulated clock."""
