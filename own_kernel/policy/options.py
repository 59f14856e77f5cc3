"""Every option a user passes, validated here and nowhere else, and the typed options the
kernels' host code reads.

- ``CallOptions``: the options of one ``linear_cross_entropy`` call (and of ``plan``), checked
  in one pass (``check``) with the errors naming the argument; ``kernel_options`` resolves them
  (``filter_eps="auto"``'s constants included) into ...
- ``Options``: what the passes read, one frozen object from the API down to the custom ops'
  edge, whose schema takes it as plain optional scalars (``op_args``).
- ``PatchOptions``: ``own_kernel.transformers.patch``'s options, checked with the same rules.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

REDUCTIONS = ("mean", "sum", "none")
# filter_eps="auto": skip a tile when every gradient entry is below the input dtype's resolution
# relative to the target's O(1) entry.
AUTO_EPS = {torch.bfloat16: 2.0**-12, torch.float16: 2.0**-14, torch.float32: 2.0**-20}
# ... but only in rows whose softmax is peaked (largest probability >= AUTO_FLAT_P_MAX). In a flat
# row the skipped tail carries almost all the mass and it correlates with the row's own hidden
# state (p_v grows with e.c_v), a direction no mean-row compensation can restore: on the suite's
# uniform inputs filtering every row costs a 2e-2 dE error (naive bf16: 2e-3), as Apple's does.
AUTO_FLAT_P_MAX = 2.0**-8


@dataclass(frozen=True)
class FilterOptions:
    """The gradient filter of one call: skip entries below eps (relative to the row's weight)
    in rows whose largest probability is at least min_p_max (flatter rows stay exact)."""
    eps: float
    min_p_max: float = 0.0
    # filter_eps="auto": the route may run the call exact where filtering would not pay
    # (policy/route.py, auto_filter_runs_exact); a number the caller passed always filters.
    auto: bool = False


def auto_filter(dtype: torch.dtype) -> FilterOptions:
    """filter_eps="auto" for inputs of this dtype."""
    return FilterOptions(AUTO_EPS[dtype], AUTO_FLAT_P_MAX, auto=True)


@dataclass(frozen=True)
class Options:
    """One call's options as the passes read them (CallOptions.kernel_options)."""
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
    # Each row's outputs and dE row the same bits whatever else is in the call (the route pins
    # every choice that could depend on the batch; implies deterministic).
    batch_invariant: bool = False

    def op_args(self) -> tuple:
        """The custom ops' trailing arguments."""
        f = self.filter
        return (self.ignore_index, self.softcap, self.label_smoothing,
                f.eps if f else None, f.min_p_max if f else 0.0, self.ignored_lse,
                self.low_memory, self.deterministic, self.temperature, self.entropy,
                self.batch_invariant)

    @classmethod
    def from_op_args(cls, ignore_index, softcap, label_smoothing, filter_eps, filter_min_p_max,
                     ignored_lse, low_memory, deterministic, temperature=1.0,
                     entropy=False, batch_invariant=False) -> "Options":
        f = FilterOptions(filter_eps, filter_min_p_max) if filter_eps is not None else None
        return cls(ignore_index, softcap, label_smoothing, f, ignored_lse, low_memory,
                   deterministic, temperature, entropy, batch_invariant)


# ---- the rules, one function per option (the API, plan() and the HF patch share them) -----------

def check_bool(name: str, value) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{name}: expected True or False; got {value!r}")


def check_filter_eps(filter_eps) -> None:
    if filter_eps is not None and filter_eps != "auto":
        if isinstance(filter_eps, str) or not float(filter_eps) >= 0:
            raise ValueError(f"filter_eps: expected None, 'auto' or a float >= 0; got {filter_eps!r}")


def check_exact_only(low_memory: bool, filter_eps) -> None:
    """low_memory=True computes exact gradients only."""
    if low_memory and filter_eps is not None:
        raise ValueError(f"low_memory: computes exact gradients only; got filter_eps={filter_eps!r} "
                         f"(pass filter_eps=None)")


def check_workspace_mib(workspace_mib) -> None:
    if workspace_mib is not None and (not isinstance(workspace_mib, int)
                                      or isinstance(workspace_mib, bool) or workspace_mib < 0):
        raise ValueError(f"workspace_mib: expected None or an int >= 0; got {workspace_mib!r}")


def check_temperature(temperature) -> None:
    if (isinstance(temperature, bool) or not isinstance(temperature, (int, float))
            or not math.isfinite(temperature) or not temperature > 0):
        raise ValueError(f"temperature: expected a finite number > 0; got {temperature!r}")


def check_batch_invariant(batch_invariant, filter_eps, low_memory) -> None:
    """batch_invariant=True runs one pinned route (exact, the recompute path); with
    vocab_parallel, shard boundaries on its vocabulary block (paths/vocab_gathered.py)."""
    check_bool("batch_invariant", batch_invariant)
    if not batch_invariant:
        return
    if filter_eps is not None:
        raise ValueError(f"filter_eps: batch_invariant=True computes exact gradients only; got "
                         f"filter_eps={filter_eps!r} (pass filter_eps=None)")
    if low_memory:
        raise ValueError("low_memory: not supported with batch_invariant=True (its row chunks "
                         "depend on N); pass low_memory=False")


@dataclass(frozen=True)
class CallOptions:
    """The options of one ``linear_cross_entropy`` call, as the user passed them. ``check``
    validates them all, in the order the API always has (so the first bad one is named)."""
    ignore_index: int = -100
    softcap: float | None = None
    reduction: str = "mean"
    shift: int = 0
    label_smoothing: float = 0.0
    filter_eps: float | str | None = None
    return_lse: bool = False
    low_memory: bool = False
    vocab_parallel: object = None   # a VocabParallel (checked against c by its own path)
    workspace_mib: int | None = None
    temperature: float = 1.0
    return_entropy: bool = False
    batch_invariant: bool = False

    def check(self, e_shape: tuple) -> "CallOptions":
        """Self, or an error naming the first bad option; e_shape: the hidden states' shape
        (shift needs a sequence dimension)."""
        check_workspace_mib(self.workspace_mib)
        if self.reduction not in REDUCTIONS:
            raise ValueError(f"reduction: expected 'mean', 'sum' or 'none'; got {self.reduction!r}")
        shift = self.shift
        if not isinstance(shift, int) or isinstance(shift, bool) or shift < 0:
            raise ValueError(f"shift: expected an int >= 0; got {shift!r}")
        if shift and (len(e_shape) < 2 or shift >= e_shape[-2]):
            raise ValueError(f"shift: {shift} needs a sequence dimension longer than it "
                             f"(e.shape = {tuple(e_shape)})")
        if not 0.0 <= float(self.label_smoothing) <= 1.0:
            raise ValueError(f"label_smoothing: expected a value in [0, 1]; got "
                             f"{self.label_smoothing}")
        if self.softcap is not None and not float(self.softcap) > 0:
            raise ValueError(f"softcap: expected None or a positive number; got {self.softcap}")
        check_filter_eps(self.filter_eps)
        check_bool("low_memory", self.low_memory)
        check_exact_only(self.low_memory, self.filter_eps)
        self._check_rl()
        check_batch_invariant(self.batch_invariant, self.filter_eps, self.low_memory)
        return self

    def _check_rl(self) -> None:
        """temperature and return_entropy, and what they do not combine with."""
        check_temperature(self.temperature)
        check_bool("return_entropy", self.return_entropy)
        if self.return_entropy and self.filter_eps is not None:
            # The filter's eps bounds p - onehot; the entropy's p (z - mu) terms are another
            # approximation, not tested: exact gradients only.
            raise ValueError(f"filter_eps: return_entropy=True computes exact gradients only; "
                             f"got filter_eps={self.filter_eps!r} (pass filter_eps=None)")

    def filter(self, dtype: torch.dtype) -> FilterOptions | None:
        """The filter these options ask for on inputs of this dtype (None: exact)."""
        if self.filter_eps == "auto":
            return auto_filter(dtype)
        if self.filter_eps is not None and float(self.filter_eps) > 0:
            return FilterOptions(float(self.filter_eps))
        return None

    def kernel_options(self, dtype: torch.dtype) -> Options:
        """The passes' Options for inputs of this dtype (in the deterministic mode in force)."""
        return Options(int(self.ignore_index),
                       float(self.softcap) if self.softcap is not None else None,
                       float(self.label_smoothing), self.filter(dtype), bool(self.return_lse),
                       self.low_memory,
                       torch.are_deterministic_algorithms_enabled() or self.batch_invariant,
                       float(self.temperature), self.return_entropy, self.batch_invariant)


@dataclass(frozen=True)
class PatchOptions:
    """``own_kernel.transformers.patch``'s options, checked when made (at patch time; the kernel
    checks them again at each call)."""
    filter_eps: float | str | None = None
    low_memory: bool = False
    logits_in_eval: bool = True

    def __post_init__(self):
        check_filter_eps(self.filter_eps)
        check_bool("low_memory", self.low_memory)
        check_bool("logits_in_eval", self.logits_in_eval)
        check_exact_only(self.low_memory, self.filter_eps)
