"""Post-training 4-bit quantization of a float model folder into a Hugging Face quantized
folder the engine serves (spec/quantization_config.py): GPTQ (gptq.py), AWQ (awq.py) and
plain round-to-nearest, written by writers.py; `python -m runtime.quantize` runs one.

This package's __init__ imports nothing: the runtime never needs it to serve."""
