"""LoRA adapters on a base model: many fine-tunes served by one replica, batched together.

- adapter.py: a PEFT adapter read from its files' bytes (a folder's, or a replica's PUT)
  under spec/lora_adapter.py's rules, into one float32 buffer (LoraAdapter);
- files.py: a PEFT folder's two files, as bytes (torch-free);
- shared_buffers.py: shared-memory buffers for adapters the server sends the engine core;
- slots.py: which adapters sit in the device's fixed adapter slots (pure decisions: the
  scheduler places an adapter when it admits a request for it, least recently used out);
- weights.py: the slots' stacked A and B matrices per layer and projection, and the
  gathered delta each token's adapter adds to a projection (kernels/lora.py computes it).
"""
