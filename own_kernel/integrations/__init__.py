"""The kernel beside other libraries: Hugging Face models (transformers.py) and DTensor
arguments (distributed.py)."""
