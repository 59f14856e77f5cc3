"""Importing this package registers every provider (one module per peer)."""
from suite.providers import apple, chunked, liger, naive, own, quack, torch_native  # noqa: F401
