"""What the backward's kernels read per row and add into per row and column, grouped so that
each launcher takes them as two arguments instead of a dozen."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from own_kernel.kernels.gemm_rows import add_slices_in_order


@dataclass(frozen=True)
class Rows:
    """Per-row inputs of the softmax gradient, each (N,), unit stride:
    d[n, v] = (w_n + w'_n) p[n, v] - w_n ((1 - ls) [v == t_n] + ls / V)
              - w_H,n p[n, v] (z[n, v] - mu_n)   (mu_n = sum_v p z = lse_n - H_n)."""
    targets: torch.Tensor             # int64
    lse: torch.Tensor                 # fp32, natural log
    nll: torch.Tensor                 # fp32, -log p_target (the target column, tile.py)
    weight: torch.Tensor              # fp32 w_n, 0 where ignored
    weight_lse: torch.Tensor | None   # fp32 w'_n (a gradient into lse), or None
    eps: torch.Tensor | None = None   # fp32 filter thresholds (0: never skips), or None
    lse_lo: torch.Tensor | None = None  # fp32, what rounding lse removed (lse_combine.py); None: 0
    entropy: torch.Tensor | None = None     # fp32 H_n (the forward's), with weight_ent
    weight_ent: torch.Tensor | None = None  # fp32 w_H,n (a gradient into H), 0 where ignored

    def select(self, start: int, stop: int) -> "Rows":
        """Rows [start, stop)."""
        def cut(t):
            return t[start:stop] if t is not None else None
        return Rows(*(cut(getattr(self, f)) for f in
                      ("targets", "lse", "nll", "weight", "weight_lse", "eps", "lse_lo",
                       "entropy", "weight_ent")))

    def gathered(self, index: torch.Tensor) -> "Rows":
        """The rows at index (filter thresholds not carried: set after gathering)."""
        def take(t):
            return t[index] if t is not None else None
        return Rows(*(take(getattr(self, f)) for f in
                      ("targets", "lse", "nll", "weight", "weight_lse")), None,
                    *(take(getattr(self, f)) for f in ("lse_lo", "entropy", "weight_ent")))

    def entropy_args(self) -> tuple:
        """(H, w_H) for the kernels: stand-ins (never read) without an entropy gradient."""
        if self.weight_ent is None:
            return self.lse, self.lse
        return self.entropy, self.weight_ent

    def lse_lo_or_zeros(self) -> torch.Tensor:
        """lse_lo for the kernels, zeros where the caller had none."""
        return self.lse_lo if self.lse_lo is not None else torch.zeros_like(self.lse)


@dataclass
class Sums:
    """fp32 sums the kernels add into (atomics), in one zero-filled buffer:
    - row_round / col_round: what rounding W to the input dtype removed, per row / column;
    - col_sum: d per column (dbias);
    - row_skip: the filter's skipped mass per row (and, briefly, its kept share);
    - col_wsum, col_keep, kept_count (filtered calls): per column, the rounded d of the rows
      that may skip and whether any of their entries was kept (int32); per chunk, how many
      columns were kept (int32)."""
    row_round: torch.Tensor
    col_round: torch.Tensor
    col_sum: torch.Tensor
    row_skip: torch.Tensor
    col_wsum: torch.Tensor | None = None
    col_keep: torch.Tensor | None = None
    kept_count: torch.Tensor | None = None

    @classmethod
    def zeros(cls, n: int, v: int, device, filter_chunks: int | None = None) -> "Sums":
        """filter_chunks: the number of chunks that may filter (None: an exact call)."""
        sizes = [n, v, v, n] + ([v, v, filter_chunks] if filter_chunks is not None else [])
        parts = torch.zeros(sum(sizes), device=device, dtype=torch.float32).split(sizes)
        sums = cls(*parts[:4])
        if filter_chunks is not None:  # int32 views: zero bits are 0 either way
            sums.col_wsum = parts[4]
            sums.col_keep = parts[5].view(torch.int32)
            sums.kept_count = parts[6].view(torch.int32)
        return sums


class Partials:
    """Deterministic mode's stand-in for the kernels' atomics: each tile stores its row sums
    in a plane of (column slices x rows) and its column sums in a plane of (row slices x
    columns); add_to() then sums each plane over its slices, a reduction whose order is fixed,
    into the Sums. Off (deterministic False), the buffer is one element, never written."""

    ROW_PLANES = ("row_round", "row_skip")
    COL_PLANES = ("col_round", "col_sum", "col_wsum")

    def __init__(self, deterministic: bool, row_slices: int, rows: int, col_slices: int,
                 cols: int, device):
        self.on = deterministic
        self.shape = (row_slices, rows, col_slices, cols)
        size = 2 * row_slices * rows + 3 * col_slices * cols if deterministic else 1
        self.buffer = torch.empty(size, device=device, dtype=torch.float32)

    def add_to(self, sums: Sums, v_start: int, written: set) -> None:
        """Sum the planes named in `written` into sums (columns from v_start)."""
        if not self.on:
            return
        row_slices, rows, col_slices, cols = self.shape
        row_part = self.buffer[:2 * row_slices * rows].view(2, row_slices, rows)
        col_part = self.buffer[2 * row_slices * rows:].view(3, col_slices, cols)
        for i, name in enumerate(self.ROW_PLANES):
            if name in written:  # in a fixed order per row: batch_invariant's dE reads these
                add_slices_in_order(getattr(sums, name), row_part[i])
        for i, name in enumerate(self.COL_PLANES):
            if name in written:
                getattr(sums, name)[v_start:v_start + cols].add_(col_part[i].sum(dim=0))
