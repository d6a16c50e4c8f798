"""The OpenAI Batch API: files, batches, and the runner that works their lines on idle
capacity (docs/batch.md)."""
