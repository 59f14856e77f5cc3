"""A bench cell (one input shape, dtype and distribution) and the run folder's plan file: what
the runner (suite/runner.py) and its children (isolated cells, suite/ranks.py's ranks) share."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from suite.inputs import LM_ENTROPY

PLAN = "plan.json"
INFLIGHT = ".inflight"  # (cell_id, provider) being measured, for crash attribution


@dataclass(frozen=True)
class Cell:
    dist: str
    n: int
    d: int
    v: int
    dtype: str
    softcap: float | None = None
    ignore_frac: float = 0.0
    bias: bool = False
    seed: int = 0
    file: str | None = None
    lm_entropy: float = LM_ENTROPY  # the lm generator's mean softmax entropy (nats)

    @property
    def cell_id(self) -> str:
        dist = self.dist if self.file is None else f"file:{Path(self.file).stem}"
        sc = "none" if self.softcap is None else f"{self.softcap:g}"
        # the entropy only where it is not the default: earlier runs' ids stay valid
        h = f"-h{self.lm_entropy:g}" if self.dist == "lm" and self.lm_entropy != LM_ENTROPY else ""
        return (f"{dist}{h}-n{self.n}-d{self.d}-v{self.v}-{self.dtype}-sc{sc}"
                f"-ig{self.ignore_frac:g}-b{int(self.bias)}-s{self.seed}")

    def fields(self) -> dict:
        return {"cell_id": self.cell_id, "dist": self.dist, "n": self.n, "d": self.d,
                "v": self.v, "dtype": self.dtype, "softcap": self.softcap,
                "ignore_frac": self.ignore_frac, "bias": self.bias, "seed": self.seed}
