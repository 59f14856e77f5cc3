"""One call's options, as one typed object from the public API down to the kernels' host
code; the custom ops' schema takes them as plain optional scalars (op_args)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FilterOptions:
    """The gradient filter of one call: skip entries below eps (relative to the row's weight)
    in rows whose largest probability is at least min_p_max (flatter rows stay exact)."""
    eps: float
    min_p_max: float = 0.0


@dataclass(frozen=True)
class Options:
    """One call's options, validated by api.py."""
    ignore_index: int = -100
    softcap: float | None = None
    label_smoothing: float = 0.0
    filter: FilterOptions | None = None
    ignored_lse: bool = False   # the lse of ignored rows is wanted (return_lse)
    low_memory: bool = False
    # Sums per tile stored apart and added in a fixed order instead of atomics (the backward
    # bitwise the same run to run): torch.use_deterministic_algorithms(True) asks for it.
    deterministic: bool = False
    # The logits are softcap(x) / temperature; entropy: each row's softmax entropy is an
    # output with a gradient (return_entropy).
    temperature: float = 1.0
    entropy: bool = False

    def op_args(self) -> tuple:
        """The custom ops' trailing arguments."""
        f = self.filter
        return (self.ignore_index, self.softcap, self.label_smoothing,
                f.eps if f else None, f.min_p_max if f else 0.0, self.ignored_lse,
                self.low_memory, self.deterministic, self.temperature, self.entropy)

    @classmethod
    def from_op_args(cls, ignore_index, softcap, label_smoothing, filter_eps, filter_min_p_max,
                     ignored_lse, low_memory, deterministic, temperature=1.0,
                     entropy=False) -> "Options":
        f = FilterOptions(filter_eps, filter_min_p_max) if filter_eps is not None else None
        return cls(ignore_index, softcap, label_smoothing, f, ignored_lse, low_memory,
                   deterministic, temperature, entropy)
