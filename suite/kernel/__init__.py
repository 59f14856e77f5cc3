"""``python -m suite kernel <tool>``: the own kernel's measuring tools (GPU).

tune     time candidate configs (forward, backward, filtered) against the cuBLAS floor
interleave  config variants' calls interleaved in one process, at heads and budgets (CSV)
profile  launch each pass once for ncu, or profile the host's time per call
grid     the forward's grid as planned and its simulated span over the waves (no GPU; CSV)
memory   what is alive at the loss+grad memory peak (CUDA allocator trace)
check    gradient agreement of own / own_filter with the naive baseline on the suite's inputs
accuracy every route's loss and gradient errors against fp64, confident and large logits (CSV)
autocast loss+grad under bf16 autocast with an fp32 weight: own against torch.compile (CSV)
rl       per-token log-probability + entropy + backward against loss+grad, naive, Liger, verl (CSV)
invariance  batch_invariant's bitwise checks: rows alone vs inside other batches (JSON, markdown)
rows-gemm   batch_invariant's dE GEMM: candidate configs timed against cuBLAS, bits checked (CSV)
sass     the pointer kernels' k-loop in SASS, compiled for an architecture (no GPU; CSV)
"""
from __future__ import annotations

import importlib

TOOLS = {
    "tune": ("suite.kernel.tune", "time candidate configs against the cuBLAS floor E @ C.T"),
    "interleave": ("suite.kernel.interleave",
                   "config variants' calls interleaved in one process, vs torch.compile (CSV)"),
    "profile": ("suite.kernel.profile", "one launch per pass for ncu, or the host's time per call"),
    "grid": ("suite.kernel.grid", "the forward's planned grid and its simulated span (no GPU)"),
    "memory": ("suite.kernel.memory", "what is alive at the loss+grad memory peak"),
    "check": ("suite.kernel.check", "gradient agreement with the naive baseline"),
    "accuracy": ("suite.kernel.accuracy", "every route's loss and gradient errors vs fp64 (CSV)"),
    "autocast": ("suite.kernel.autocast", "bf16 autocast, fp32 weight: own vs torch.compile (CSV)"),
    "rl": ("suite.kernel.rl", "per-token logprob + entropy + backward vs loss+grad and peers"),
    "invariance": ("suite.kernel.invariance", "batch_invariant: rows' bits alone vs in batches"),
    "rows-gemm": ("suite.kernel.rows_gemm", "batch_invariant's dE GEMM candidates vs cuBLAS"),
    "sass": ("suite.kernel.sass", "the pointer kernels' k-loop in SASS per architecture (no GPU)"),
}


def add_arguments(parser) -> None:
    sub = parser.add_subparsers(dest="tool", metavar="tool")
    sub.required = True
    for name, (module, help_text) in TOOLS.items():
        mod = importlib.import_module(module)
        p = sub.add_parser(name, help=help_text, description=mod.__doc__)
        mod.add_arguments(p)
        p.set_defaults(_tool=mod)


def main(args) -> int:
    return int(args._tool.main(args) or 0)
