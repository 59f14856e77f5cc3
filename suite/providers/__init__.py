"""Importing this package registers every provider (one module per peer). BUILT_IN names the
providers these modules register, whatever a plugin (``--plugin``, suite.frontier's budget
sweep) registered before or after them: the figures' fixed styles are theirs alone."""
from suite.registry import PROVIDERS

_BEFORE = set(PROVIDERS)

from suite.providers import (  # noqa: E402,F401
    apple, chunked, liger, liger_scaled, liger_tp, naive, own, quack, torch_native, verl)

BUILT_IN = frozenset(PROVIDERS) - _BEFORE
