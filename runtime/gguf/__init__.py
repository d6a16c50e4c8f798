"""GGUF files imported as model folders: weights and tokenizer."""
