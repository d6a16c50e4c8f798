"""What every room of the runtime reads, torch-free: architectures, configs, the tokenizer."""
