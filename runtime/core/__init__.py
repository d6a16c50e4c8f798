"""What every room of the runtime reads, torch-free: configs, the tokenizer."""
