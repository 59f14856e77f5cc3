"""What the gate measures and how it is invoked; pure (no torch, no pytest).

One benchmark per (shape, provider, phase), bf16 ``lm`` inputs (seed 0), named
``<shape>-<provider>-<phase>`` (the test id). The own kernel runs at every shape: its default
call (``own``), the gradient filter, low memory, and the three-matmul path at an explicit budget
(``own_fused``); ``small`` is a vocabulary where the default takes the three-matmul path. The
peers run at Gemma 2 (2B) only, so that a peer upgrade shows.
"""
from __future__ import annotations

import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from suite.presets import GEMMA2_2B, LLAMA3_8B, Shape

DIST, DTYPE, SEED = "lm", "bf16", 0
SMALL_VOCAB = Shape("small", "N 8192, D 4096, V 32000 (Llama 2's vocabulary)", n=8192, d=4096,
                    v=32000)
GATE_SHAPES = {s.name: s for s in (GEMMA2_2B, LLAMA3_8B, SMALL_VOCAB)}
OWN_PROVIDERS = ("own", "own_filter", "own_low_memory", "own_fused")
PEER_PROVIDERS = ("torch_compile", "apple_cce")
PEER_SHAPES = (GEMMA2_2B.name,)
GATE_PHASES = ("fwd", "loss+grad")

# The suite's protocol inside benchmark.pedantic: untimed warm-up rounds (compilation,
# autotuning, allocator), then timed rounds, each after an untimed setup (grads cleared, L2
# flushed, CUDA synchronised). 20 rounds: the median of two runs of the same code agreed to
# ~1 % on an H100 with 5 rounds already; 20 keep it there for sub-millisecond calls.
ROUNDS, WARMUP_ROUNDS = 20, 3

# Fail thresholds. Time: pytest-benchmark's own --benchmark-compare-fail on the median.
TIME_FAIL_PERCENT = 10
# Memory: peak_extra_mib > baseline * (1 + MEM_FAIL_FRACTION) + MEM_SLACK_MIB. The slack keeps
# allocator rounding from failing a near-zero baseline (a forward keeps ~0.1 MiB), while any
# real extra buffer is far larger than 1 MiB.
MEM_FAIL_FRACTION, MEM_SLACK_MIB = 0.05, 1.0
# Accuracy: a gradient error > baseline * ERR_FAIL_FACTOR + ERR_SLACK, or not finite. The
# slack is far below any bf16 gradient error (~1e-3).
ERR_FAIL_FACTOR, ERR_SLACK = 2.0, 1e-6
GATED_ERRORS = ("de_rel_err", "dc_rel_err", "dbias_rel_err")

DEFAULT_BASELINE_DIR = "results/baselines"
INJECT_ENV = "CCE_GATE_INJECT"
REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Case:
    shape: str
    provider: str
    phase: str

    @property
    def id(self) -> str:
        return f"{self.shape}-{self.provider}-{self.phase}"


def cases() -> list[Case]:
    """Every gated benchmark, grouped by shape (the inputs of one shape are built once)."""
    out = []
    for shape in GATE_SHAPES:
        providers = OWN_PROVIDERS + (PEER_PROVIDERS if shape in PEER_SHAPES else ())
        out += [Case(shape, p, phase) for p in providers for phase in GATE_PHASES]
    return out


# ---- injected regressions ----------------------------------------------------------------

INJECT_KINDS = {
    # kind: (what the amount is, its lower bound (exclusive), what the variant does)
    "slow": ("fraction", 0.0, "adds GPU work worth this fraction of the call's time"),
    "mem": ("MiB", 0.0, "holds this many extra MiB from the call through its backward"),
    "err": ("factor", 1.0, "multiplies each gradient's deviation from the reference by at "
                           "least this"),
}


@dataclass(frozen=True)
class Injection:
    kind: str
    amount: float

    @property
    def text(self) -> str:
        return f"{self.kind}:{self.amount:g}"


def parse_injection(text: str | None) -> Injection | None:
    """``CCE_GATE_INJECT``'s value (``slow:0.15``, ``mem:100``, ``err:2``); None when unset."""
    if text is None or not text.strip():
        return None
    usage = ", ".join(f"{k}:<{unit}> ({what})" for k, (unit, _, what) in INJECT_KINDS.items())
    kind, _, amount = text.strip().partition(":")
    if kind not in INJECT_KINDS:
        raise ValueError(f"{INJECT_ENV}={text!r}: expected one of {usage}")
    try:
        value = float(amount)
    except ValueError:
        value = math.nan
    unit, low, _ = INJECT_KINDS[kind]
    if not (math.isfinite(value) and value > low):
        raise ValueError(f"{INJECT_ENV}={text!r}: the {unit} must be a number > {low:g}")
    return Injection(kind, value)


# ---- the baseline of a GPU model, the pytest command ------------------------------------

def gpu_slug(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'nvidia-h100-80gb-hbm3' (the baseline's file name)."""
    slug = re.sub(r"[^a-z0-9]+", "-", str(name).lower()).strip("-")
    if not slug:
        raise ValueError(f"cannot make a file name from GPU name {name!r}")
    return slug


def baseline_path(baseline_dir, gpu_name: str) -> Path:
    return Path(baseline_dir) / f"{gpu_slug(gpu_name)}.json"


def missing_baseline_message(path: Path, gpu_name: str) -> str:
    others = sorted(p.name for p in path.parent.glob("*.json")) if path.parent.is_dir() else []
    msg = (f"no baseline for {gpu_name}: {path} does not exist.\nCreate it on this GPU with "
           f"`nox -s gate -- --save` (or `python -m suite gate --save`), check the numbers, and "
           f"commit {path}.")
    if others:
        msg += f"\nBaselines exist for other GPU models only: {', '.join(others)}."
    return msg


def gate_command(baseline: Path, *, save: bool, keyword: str | None = None,
                 pytest_args=(), python: str = sys.executable) -> list[str]:
    """The gate's pytest command: compare with ``baseline`` (pytest-benchmark JSON) and fail a
    median more than TIME_FAIL_PERCENT slower, or write it (``save``)."""
    baseline = Path(baseline).resolve()
    cmd = [python, "-m", "pytest", "suite/gates", "-p", "no:cacheprovider", "-rs",
           # Baselines are compared and saved by path, so pytest-benchmark's storage is unused:
           # the working directory (no .benchmarks/ folder; its machine_info warning needs the
           # storage below the working directory).
           "--benchmark-storage=file://.",
           "--benchmark-columns=min,median,max,iqr,rounds", "--benchmark-sort=name"]
    if save:
        cmd.append(f"--benchmark-json={baseline}")
    else:
        cmd += [f"--benchmark-compare={baseline}",
                f"--benchmark-compare-fail=median:{TIME_FAIL_PERCENT}%"]
    if keyword:
        cmd += ["-k", keyword]
    return cmd + list(pytest_args)
