"""Weights from disk to memory and device: safetensors, packed layers, int8, load threads."""
