"""What the gate measures, its protocol and limits, and how it is invoked; pure (no torch, no
pytest).

One benchmark per (shape, provider, phase), bf16 ``lm`` inputs (seed 0), named
``<shape>-<provider>-<phase>`` (the test id). The own kernel at every shape: its forward (every
variant's forward is the same forward-only call, so only the default's is timed) and the
forward + backward of each variant in ``OWN_VARIANTS``; ``small`` is a vocabulary where the
default call takes the three-matmul path. The peers at Gemma 2 (2B) only, so that a peer upgrade
shows. results/baselines/README.md says why the protocol and the limits are what they are.
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
# The own kernel's gated calls: own_kernel.linear_cross_entropy's keyword arguments, which
# own_kernel.plan also gets, to record the path each call takes. own: the API's default call
# (its path per GPU and shape is the recorded plan's); own_fused: the three-matmul path at an
# explicit budget (fewer chunks than the default's at the two large shapes).
OWN_VARIANTS = {
    "own": {},
    "own_filter": {"filter_eps": "auto"},
    "own_low_memory": {"low_memory": True},
    "own_fused": {"workspace_mib": 3072},
}
OWN_INEXACT = ("own_filter",)  # the gradient filter skips negligible gradient columns
PEER_PROVIDERS = ("torch_compile", "apple_cce")
PEER_SHAPES = (GEMMA2_2B.name,)
GATE_PHASES = ("fwd", "loss+grad")

# ---- the protocol --------------------------------------------------------------------------
# Inside benchmark.pedantic, as the suite measures: an untimed warm-up round (compilation,
# allocator), then timed rounds, each after an untimed setup (grads cleared, L2 flushed, CUDA
# synchronised). Both the minimum and the median of the rounds are kept, and a time fails only
# when both are above the smaller of their two limits (checks.time_rule): on an H100 one
# process's minimum moved by up to 5 % from a single lucky round of the baseline's
# (torch.compile at Gemma 2 (2B), its median within 0.3 %), and a 3 ms call's median by 20 % in
# a noisy process whose minimum stayed near; a slower kernel moves both. Rounds beyond 10
# tighten both little at the long calls; the time goes to fresh processes instead. The short
# calls (``small``, 3-15 ms) take more rounds: their median over 10 rounds varied by 9 % from
# process to process.
ROUNDS, WARMUP_ROUNDS = 10, 1
ROUNDS_BY_SHAPE = {"small": 40}
TIME_METRICS = ("min_ms", "median_ms")
# `--save` measures every benchmark in this many fresh processes: a process's own state (where
# its buffers landed, its clocks) moves a benchmark as a whole, which no number of rounds inside
# one process shows. The baseline keeps each process's values; the limits come from their spread.
SAVE_PROCESSES = 4
BASELINE_FORMAT = 2  # 1: one process, pytest-benchmark's median compare (refused now)


def rounds(shape: str) -> int:
    """Timed rounds of a benchmark of this shape."""
    return ROUNDS_BY_SHAPE.get(shape, ROUNDS)


def protocol() -> dict:
    """What a baseline and a check must share to compare (a baseline records it)."""
    return {"rounds": ROUNDS, "rounds_by_shape": dict(ROUNDS_BY_SHAPE),
            "warmup_rounds": WARMUP_ROUNDS, "time_statistics": list(TIME_METRICS)}


# ---- the limits ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Limit:
    """A metric fails above ``center * (1 + threshold) + slack``, ``threshold = max(floor, k *
    spread)``: center and spread (range / center) of the baseline's per-process values,
    ``slack`` in the metric's unit. ``cap``: where the center is at least ``cap_from`` (in the
    metric's unit), the threshold is at most cap."""
    floor: float
    k: float
    slack: float
    unit: str
    cap: float | None = None
    cap_from: float = 0.0

    def threshold(self, center: float, spread: float) -> float:
        t = max(self.floor, self.k * spread)
        return min(t, self.cap) if self.cap is not None and center >= self.cap_from else t


# k = 2 times the range of 4 processes is ~4 standard deviations of one process's value. The
# floors: 5 % for time (above the process-to-process spread of most benchmarks' minimum and
# median) and memory (with 1 MiB for the allocator's rounding of a forward's fraction of a MiB);
# +50 % for errors, which repeat to the bit where the kernels are deterministic (an error x2
# fails). Calls of 20 ms and more cap their time threshold at 9 %, so that +10 % fails there
# whatever the baseline's spread (one process's lucky minimum gave Llama 3 (8B)'s loss+grad
# 2 x 6 %); their jitter is a small part of the call. The short calls keep what their spread
# gives. The loss's slack is about two fp32 roundings of the loss (2**-24 relative each), the
# gradients' far below any bf16 gradient error (~1e-3).
_TIME = Limit(floor=0.05, k=2.0, slack=0.0, unit="ms", cap=0.09, cap_from=20.0)
LIMITS = {
    "min_ms": _TIME,
    "median_ms": _TIME,
    "peak_extra_mib": Limit(floor=0.05, k=2.0, slack=1.0, unit="MiB"),
    "loss_rel_err": Limit(floor=0.5, k=2.0, slack=1e-7, unit=""),
    "de_rel_err": Limit(floor=0.5, k=2.0, slack=1e-6, unit=""),
    "dc_rel_err": Limit(floor=0.5, k=2.0, slack=1e-6, unit=""),
    "dbias_rel_err": Limit(floor=0.5, k=2.0, slack=1e-6, unit=""),
}
ERROR_METRICS = ("loss_rel_err", "de_rel_err", "dc_rel_err", "dbias_rel_err")
PATH_METRIC = "own_path"  # own_kernel.plan(...).path of an own call, in extra_info

DEFAULT_BASELINE_DIR = "results/baselines"
INJECT_ENV = "CCE_GATE_INJECT"
INPUTS_CACHE_ENV = "CCE_GATE_INPUTS_CACHE"  # suite/gates/cache.py
# A folder holding another checkout's own_kernel/ to measure instead of this one's, with this
# gate (suite/gates/conftest.py): the kernel of two checkouts, one protocol.
KERNEL_FROM_ENV = "CCE_GATE_KERNEL_FROM"
REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Case:
    shape: str
    provider: str
    phase: str

    @property
    def id(self) -> str:
        return f"{self.shape}-{self.provider}-{self.phase}"

    @property
    def own(self) -> bool:
        return self.provider in OWN_VARIANTS


def cases() -> list[Case]:
    """Every gated benchmark, grouped by shape (the inputs of one shape are built once)."""
    out = []
    for shape in GATE_SHAPES:
        out.append(Case(shape, "own", "fwd"))
        out += [Case(shape, p, "loss+grad") for p in OWN_VARIANTS]
        if shape in PEER_SHAPES:
            out += [Case(shape, p, phase) for p in PEER_PROVIDERS for phase in GATE_PHASES]
    return out


# ---- injected regressions ----------------------------------------------------------------

INJECT_KINDS = {
    # kind: (what the amount is, its lower bound (exclusive), what the variant does)
    "slow": ("fraction", 0.0, "adds GPU work worth this fraction of the call's time"),
    "mem": ("MiB", 0.0, "holds this many extra MiB from the call through its backward"),
    "err": ("factor", 1.0, "multiplies each gradient's deviation from the reference by at "
                           "least this"),
    "loss_err": ("factor", 1.0, "multiplies the loss's deviation from the reference by this"),
}


@dataclass(frozen=True)
class Injection:
    kind: str
    amount: float
    target: str | None = None  # one benchmark's id; None: every benchmark

    @property
    def text(self) -> str:
        return f"{self.kind}:{self.amount:g}" + (f"@{self.target}" if self.target else "")

    def applies_to(self, benchmark: str) -> bool:
        return self.target is None or self.target == benchmark


def _usage() -> str:
    kinds = ", ".join(f"{k}:<{unit}> ({what})" for k, (unit, _, what) in INJECT_KINDS.items())
    return f"a comma-separated list of kind:amount[@benchmark], kinds {kinds}"


def _parse_one(item: str, text: str) -> Injection:
    spec, _, target = item.partition("@")
    kind, _, amount = spec.partition(":")
    if kind not in INJECT_KINDS:
        raise ValueError(f"{INJECT_ENV}={text!r}: unknown kind {kind!r}; expected {_usage()}")
    try:
        value = float(amount)
    except ValueError:
        value = math.nan
    unit, low, _ = INJECT_KINDS[kind]
    if not (math.isfinite(value) and value > low):
        raise ValueError(f"{INJECT_ENV}={text!r}: {kind}'s {unit} must be a number > {low:g}")
    if target and target not in {c.id for c in cases()}:
        raise ValueError(f"{INJECT_ENV}={text!r}: {target!r} names no gated benchmark "
                         f"(<shape>-<provider>-<phase>, e.g. {cases()[0].id})")
    return Injection(kind, value, target or None)


def parse_injections(text: str | None) -> tuple[Injection, ...]:
    """``CCE_GATE_INJECT``'s value: ``slow:0.15`` (every benchmark), or several, each on one
    benchmark, ``slow:0.1@gemma2-2b-own-loss+grad,mem:100@small-own-fwd``; () when unset."""
    if text is None or not text.strip():
        return ()
    out = tuple(_parse_one(item.strip(), text) for item in text.split(","))
    keys = [(i.kind, i.target) for i in out]
    clash = [i for i in out if keys.count((i.kind, i.target)) > 1
             or (i.target and (i.kind, None) in keys)]
    if clash:
        raise ValueError(f"{INJECT_ENV}={text!r}: {clash[0].kind} is injected twice into "
                         f"{clash[0].target or 'every benchmark'}")
    return out


def injections_text(injections) -> str | None:
    return ",".join(i.text for i in injections) or None


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


def gate_command(*, baseline: Path | None = None, json_out: Path | None = None,
                 keyword: str | None = None, pytest_args=(),
                 python: str = sys.executable) -> list[str]:
    """One pytest process of the gate: checked against ``baseline`` (the gate's file), and/or
    writing pytest-benchmark's JSON of this process to ``json_out`` (what ``--save`` merges)."""
    cmd = [python, "-m", "pytest", "suite/gates", "-p", "no:cacheprovider", "-rfEs",
           # Baselines are read and written by path, so pytest-benchmark's storage is unused.
           "--benchmark-storage=file://.",
           "--benchmark-columns=min,median,max,iqr,rounds", "--benchmark-sort=name"]
    if baseline is not None:
        cmd.append(f"--gate-baseline={Path(baseline).resolve()}")
    if json_out is not None:
        cmd.append(f"--benchmark-json={Path(json_out).resolve()}")
    if keyword:
        cmd += ["-k", keyword]
    return cmd + list(pytest_args)
