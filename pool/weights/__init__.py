"""A model's files on the node: what they hold (inspection), the S3 download and the
verified cache (store), GGUF import, prefetch decisions."""
