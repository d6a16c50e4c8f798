"""The replica's process: its HTTP server, the model host and the engine-core process."""
