"""API keys and the bearer authentication of every request."""
