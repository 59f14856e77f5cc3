"""Importing this package registers every provider (one module per peer)."""
from suite.providers import (  # noqa: F401
    apple, chunked, liger, liger_scaled, liger_tp, naive, own, quack, torch_native, verl)
