"""Model shapes the suite measures, defined once.

A shape is the loss layer of one published model at one batch: ``n`` tokens, hidden size ``d``,
vocabulary ``v``, and the model's logit softcap (``None`` when it has none). ``suite.runner``'s
presets, ``suite.reproduce`` (the paper's Table 1) and the bench tests read their shapes from
here; the numbers come from each model's ``config.json`` (see ``suite/model_configs.py``).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Shape:
    name: str
    title: str        # how tables and notes name the model
    n: int            # tokens in the batch
    d: int            # hidden size
    v: int            # vocabulary size
    softcap: float | None = None

    def axes(self, dist=("uniform", "lm"), dtype=("bf16",)) -> dict:
        """This shape as one axis product of ``suite.runner.PRESETS``."""
        return dict(dist=list(dist), n=[self.n], d=[self.d], v=[self.v], dtype=list(dtype),
                    softcap=[self.softcap])


# The paper's Table 1: Gemma 2 (2B), 8192 tokens, final-logit softcap 30.
GEMMA2_2B = Shape("gemma2-2b", "Gemma 2 (2B)", n=8192, d=2304, v=256000, softcap=30.0)
LLAMA3_8B = Shape("llama3-8b", "Llama 3 (8B)", n=8192, d=4096, v=128256)
QWEN25_7B = Shape("qwen25-7b", "Qwen 2.5 (7B)", n=16384, d=3584, v=152064)

SHAPES = {s.name: s for s in (GEMMA2_2B, LLAMA3_8B, QWEN25_7B)}
# The shapes every peer is measured at (issue 26): both input distributions, bf16.
PEER_SHAPES = (GEMMA2_2B, LLAMA3_8B, QWEN25_7B)


def shape(name: str) -> Shape:
    try:
        return SHAPES[name]
    except KeyError:
        raise ValueError(f"unknown shape {name!r}; shapes: {', '.join(SHAPES)}") from None
