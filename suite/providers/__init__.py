"""Importing this package registers every provider (one module per peer)."""
from suite.providers import (apple, chunked, liger, liger_scaled, liger_tp, naive, own, quack,  # noqa: F401
                             torch_native, verl)
