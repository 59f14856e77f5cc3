"""`python -m suite gate`: did this change make the loss slower, hungrier or less accurate here?

The gate is a bench run plus a comparison. It measures its cells through the suite's one
measuring path (``suite.runner`` / ``suite.measure``: CUDA events around the phase only, L2
flushed between repetitions, median of the repetitions; rows of ``suite.schema.ROW_FIELDS``)
into a run folder, and compares the rows with the baseline of the GPU model it runs on,
``results/baselines/<gpu-slug>/`` (``results.csv`` + ``env.json``, written by ``--save``).

A benchmark is one (shape, provider, phase), named ``<shape>/<provider>/<phase>``. Checks:
- ``ms`` (median time): fails when now > baseline * (1 + time threshold) (default +10 %);
- ``peak_extra_mib``: fails when now > baseline * (1 + mem threshold) + MEM_SLACK_MIB
  (default +5 % + 1 MiB);
- gradient errors (``de/dc/dbias_rel_err`` against the fp32 reference): fail when now >
  baseline * (1 + err threshold) + ERR_SLACK (default: the error doubles) or is not finite;
- ``status``: a row whose status is a failure (oom, error, nan, crashed) is FAILED.
One table is printed: benchmark, metric, baseline, now, change, verdict. Exit status 0 on pass,
1 on a regression, 2 when the baseline is missing or was measured on another GPU model.
"""
from __future__ import annotations

import datetime as dt
import json
import math
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from suite.presets import GEMMA2_2B, LLAMA3_8B, Shape
from suite.results import CSV_NAME, ENV_NAME, ResultsWriter, read_rows

DEFAULT_BASELINE_DIR = "results/baselines"

# The gate's cells: bf16 ``lm`` inputs, seed 0, at these shapes (suite/presets.py), and one
# with a small vocabulary, where the kernel's fixed costs weigh most.
DIST, DTYPE, SEED = "lm", "bf16", 0
SMALL_VOCAB = Shape("small", "N 8192, D 4096, V 32000 (Llama 2's vocabulary)", n=8192, d=4096,
                    v=32000)
GATE_SHAPES = {s.name: s for s in (GEMMA2_2B, LLAMA3_8B, SMALL_VOCAB)}
PEER_SHAPES = (GEMMA2_2B.name,)  # peers run here only, unless --all-shapes
OWN_PROVIDERS = ("own", "own_filter")  # the own kernel runs at every shape
GATE_PHASES = ("fwd", "loss+grad")

# Absolute slack of the memory check: allocator rounding must not fail a near-zero baseline
# (a forward that keeps ~0.1 MiB), while any real extra buffer is far larger than 1 MiB.
MEM_SLACK_MIB = 1.0
# Absolute slack of the error check, far below any bf16 gradient error (~1e-3).
ERR_SLACK = 1e-6
GATED_ERRORS = ("de_rel_err", "dc_rel_err", "dbias_rel_err")
# Statuses that say why a provider did not run here; anything else but ok is a failure.
NOT_RUN_STATUSES = ("unavailable", "unsupported")
FAILING = ("REGRESSED", "FAILED")


class GateError(Exception):
    """A condition that stops the gate before any comparison (missing or foreign baseline)."""


@dataclass(frozen=True)
class Thresholds:
    """Relative increases that fail the gate."""
    time: float = 0.10
    mem: float = 0.05
    err: float = 1.0

    def __post_init__(self):
        for flag, value in (("--time-threshold", self.time), ("--mem-threshold", self.mem),
                            ("--err-threshold", self.err)):
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise GateError(f"{flag} must be a finite number >= 0, got {value!r}")


@dataclass(frozen=True)
class Benchmark:
    shape: str
    provider: str
    phase: str

    @property
    def name(self) -> str:
        return f"{self.shape}/{self.provider}/{self.phase}"


# ---- which benchmarks ---------------------------------------------------------------------

def gate_cells() -> dict:
    """Shape name -> runner.Cell of the gate."""
    from suite.runner import Cell

    return {name: Cell(dist=DIST, n=s.n, d=s.d, v=s.v, dtype=DTYPE, softcap=s.softcap, seed=SEED)
            for name, s in GATE_SHAPES.items()}


def keyword_matches(expr: str | None, name: str) -> bool:
    """pytest-style ``-k``: words (substrings of ``name``) joined by and / or / not, brackets."""
    if expr is None or not expr.strip():
        return True
    tokens = re.findall(r"\(|\)|[^\s()]+", expr)
    words = [t if t in ("and", "or", "not", "(", ")") else str(t in name) for t in tokens]
    try:
        # Only True, False, and, or, not and brackets reach eval.
        return bool(eval(" ".join(words), {"__builtins__": {}}, {}))  # noqa: S307
    except SyntaxError:
        raise GateError(f"-k: cannot parse {expr!r} (words joined by and / or / not)") from None


def plan(providers, *, all_shapes=False, keyword=None) -> list[Benchmark]:
    """The gate's benchmarks among ``providers`` (registered names), selected by ``keyword``."""
    out = []
    for shape in GATE_SHAPES:
        for provider in providers:
            if provider not in OWN_PROVIDERS and not all_shapes and shape not in PEER_SHAPES:
                continue
            for phase in GATE_PHASES:
                bench = Benchmark(shape, provider, phase)
                if keyword_matches(keyword, bench.name):
                    out.append(bench)
    return out


def benchmark_name(row: dict, shape_of_cell: dict) -> str | None:
    """The benchmark a results row measures (a degraded variant counts as its provider)."""
    from suite.degrade import base_provider

    shape = shape_of_cell.get(row["cell_id"])
    if shape is None:
        return None
    return Benchmark(shape, base_provider(row["provider"]), row["phase"]).name


def rows_by_benchmark(rows: list[dict], selected=None) -> dict[str, dict]:
    """Rows of the gate's cells keyed by benchmark name (``selected``: only those names)."""
    shape_of_cell = {cell.cell_id: name for name, cell in gate_cells().items()}
    out = {}
    for row in rows:
        name = benchmark_name(row, shape_of_cell)
        if name is not None and (selected is None or name in selected):
            out[name] = row
    return out


# ---- identity of the GPU, the baseline folder ------------------------------------------------

def gpu_slug(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'nvidia-h100-80gb-hbm3' (the baseline's folder name)."""
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    if not slug:
        raise ValueError(f"cannot make a folder name from GPU name {name!r}")
    return slug


def current_gpu_name() -> str | None:
    import torch

    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_name(torch.cuda.current_device())


def run_gpu_name(run_dir: Path) -> str | None:
    """The GPU recorded in a run folder's env.json (None when it has none)."""
    path = Path(run_dir) / ENV_NAME
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text()).get("gpu_name")
    except json.JSONDecodeError:
        return None


def baseline_folder(baseline_dir, gpu_name: str) -> Path:
    return Path(baseline_dir) / gpu_slug(gpu_name)


def check_same_gpu(folder: Path, gpu_name: str) -> None:
    base_gpu = run_gpu_name(folder)
    if base_gpu is None:
        raise GateError(f"baseline {folder} records no GPU in {ENV_NAME}: it was not written by "
                        f"the gate; re-create it with `python -m suite gate --save`")
    if gpu_slug(base_gpu) != gpu_slug(gpu_name):
        raise GateError(f"refusing to compare: baseline {folder} was measured on {base_gpu}, this "
                        f"is {gpu_name}. Times and memory are only comparable on the same GPU "
                        f"model; create a baseline for this GPU with `python -m suite gate --save`.")


def load_baseline(folder: Path, gpu_name: str) -> list[dict]:
    """The baseline's rows, refused (GateError) when missing or measured on another GPU."""
    folder = Path(folder)
    if not (folder / CSV_NAME).is_file():
        parent = folder.parent
        others = sorted(p.name for p in parent.iterdir() if (p / CSV_NAME).is_file()) \
            if parent.is_dir() else []
        msg = (f"no baseline for {gpu_name}: {folder / CSV_NAME} does not exist.\n"
               f"Create it on this GPU with `python -m suite gate --save` (or `nox -s gate -- "
               f"--save`), check that the numbers are sane, and commit {folder}/.")
        if others:
            msg += f"\nBaselines exist for other GPUs only: {', '.join(others)}."
        raise GateError(msg)
    check_same_gpu(folder, gpu_name)
    return read_rows(folder)


# ---- comparison ---------------------------------------------------------------------------

def _num(x) -> float | None:
    """A CSV cell (or number) as a float; None when empty."""
    if x is None or x == "":
        return None
    return float(x)


def relative_change(base: float, now: float) -> float:
    if base == 0:
        return 0.0 if now == 0 else math.inf
    return now / base - 1.0


def _verdict(regressed: bool, improved: bool) -> str:
    return "REGRESSED" if regressed else ("better" if improved else "ok")


def _row(name, metric, base, now, change, verdict) -> dict:
    return {"benchmark": name, "metric": metric, "baseline": base, "now": now, "change": change,
            "verdict": verdict}


def _status_check(name: str, old: dict | None, row: dict) -> dict | None:
    """A row for a benchmark that did not measure (None when its status is ok)."""
    status = row["status"]
    if status == "ok":
        return None
    was = None if old is None else old["status"]
    text = f"{status}: {row.get('error') or ''}".strip().rstrip(":")
    verdict = "not run" if status in NOT_RUN_STATUSES else "FAILED"
    return _row(name, "status", was, text, None, verdict)


def _metric_checks(name: str, old: dict, row: dict, th: Thresholds) -> list[dict]:
    out = []
    base_ms, now_ms = _num(old.get("ms")), _num(row.get("ms"))
    ch = relative_change(base_ms, now_ms)
    out.append(_row(name, "ms", base_ms, now_ms, ch, _verdict(ch > th.time, ch < -th.time)))
    base_mib, now_mib = _num(old.get("peak_extra_mib")), _num(row.get("peak_extra_mib"))
    if now_mib is not None and base_mib is not None and math.isfinite(base_mib):
        high = base_mib * (1 + th.mem) + MEM_SLACK_MIB
        low = base_mib * (1 - th.mem) - MEM_SLACK_MIB
        out.append(_row(name, "peak_extra_mib", base_mib, now_mib,
                        relative_change(base_mib, now_mib),
                        _verdict(not math.isfinite(now_mib) or now_mib > high, now_mib < low)))
    for metric in GATED_ERRORS:
        base_err, now_err = _num(old.get(metric)), _num(row.get(metric))
        if now_err is None:
            continue
        if base_err is None or not math.isfinite(base_err):
            out.append(_row(name, metric, base_err, now_err, None, "new"))
            continue
        limit = base_err * (1 + th.err) + ERR_SLACK
        out.append(_row(name, metric, base_err, now_err, relative_change(base_err, now_err),
                        _verdict(not math.isfinite(now_err) or now_err > limit, False)))
    return out


def compare(baseline: dict[str, dict], now: dict[str, dict], th: Thresholds = Thresholds(),
            selected=None) -> list[dict]:
    """Rows of the gate table from results rows keyed by benchmark name: every benchmark of
    ``now``, and those of ``baseline`` that were ``selected`` but have no row now (FAILED: a
    benchmark that silently stops being measured must show)."""
    rows = []
    for name, row in now.items():
        old = baseline.get(name)
        failed = _status_check(name, old, row)
        if failed is not None:
            rows.append(failed)
        elif old is None or old["status"] != "ok":
            rows.append(_row(name, "ms", None, _num(row.get("ms")), None, "new"))
        else:
            rows += _metric_checks(name, old, row, th)
    for name in baseline:
        if name not in now and name in (selected or ()):
            rows.append(_row(name, "status", baseline[name]["status"], "no row", None, "FAILED"))
    return rows


def failed_rows(rows: list[dict]) -> list[dict]:
    return [r for r in rows if r["verdict"] in FAILING]


def _fmt(metric: str, x) -> str:
    if x is None:
        return "-"
    if isinstance(x, str):
        return x
    if not math.isfinite(x):
        return str(x)
    if metric == "ms":
        return f"{x:.3f}"
    if metric == "peak_extra_mib":
        return f"{x:.1f}"
    return f"{x:.2e}"


def _fmt_change(ch) -> str:
    if ch is None:
        return "-"
    if not math.isfinite(ch):
        return "+inf"
    return f"{ch * 100:+.1f}%"


def format_table(rows: list[dict]) -> str:
    header = ["benchmark", "metric", "baseline", "now", "change", "verdict"]
    body = [[r["benchmark"], r["metric"], _fmt(r["metric"], r["baseline"]),
             _fmt(r["metric"], r["now"]), _fmt_change(r["change"]), r["verdict"]] for r in rows]
    widths = [max(len(str(x)) for x in col) for col in zip(header, *body)]
    right = {2, 3, 4}  # numbers right-aligned

    def line(cells):
        return "  ".join(str(c).rjust(w) if i in right else str(c).ljust(w)
                         for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    sep = "  ".join("-" * w for w in widths)
    return "\n".join([line(header), sep] + [line(b) for b in body])


# ---- measuring and saving -----------------------------------------------------------------

def measure(benchmarks: list[Benchmark], out: Path, *, degrade=None, reps=None, warmup=None,
            device="cuda") -> Path:
    """Measure ``benchmarks`` through the runner into the run folder ``out``; ``degrade``
    ('slow' | 'hungry') measures the own kernel's degraded variants (suite/degrade.py) in place
    of ``own`` and ``own_filter``."""
    from suite import runner
    from suite.degrade import degraded_name, register_degraded

    cells = gate_cells()
    measured = {}  # provider name as run -> the benchmarks' provider
    for b in benchmarks:
        name = b.provider
        if degrade and b.provider in OWN_PROVIDERS:
            register_degraded(degrade, [b.provider])
            name = degraded_name(b.provider, degrade)
        measured[name] = b.provider
    wanted = {(cells[b.shape].cell_id, b.provider) for b in benchmarks}
    phases = [p for p in GATE_PHASES if any(b.phase == p for b in benchmarks)]
    shapes = list(dict.fromkeys(b.shape for b in benchmarks))
    return runner.run([cells[s] for s in shapes], list(measured), phases, out, reps=reps,
                      warmup=warmup, device=device, summary=False,
                      select=lambda cell, p: (cell.cell_id, measured[p]) in wanted)


def save_baseline(folder: Path, run_dir: Path, now: dict[str, dict], merge: bool) -> tuple[int, int]:
    """Write the ok rows of ``now`` as ``folder``'s baseline, with ``run_dir``'s env.json;
    ``merge``: keep the baseline's other benchmarks. Returns (rows written, rows left out)."""
    ok = {name: row for name, row in now.items() if row["status"] == "ok"}
    kept = {}
    if merge and (folder / CSV_NAME).is_file():
        kept = {n: r for n, r in rows_by_benchmark(read_rows(folder)).items() if n not in ok}
    elif folder.is_dir():
        for path in [folder / CSV_NAME, *folder.glob("env*.json")]:
            path.unlink(missing_ok=True)
    if not ok:
        return 0, len(now)
    (folder / CSV_NAME).unlink(missing_ok=True)
    env = json.loads((Path(run_dir) / ENV_NAME).read_text())
    run_id = next(iter(ok.values()))["run_id"]
    writer = ResultsWriter(folder, env, run_id)
    writer.write(list(kept.values()) + list(ok.values()))
    return len(kept) + len(ok), len(now) - len(ok)


# ---- entry point --------------------------------------------------------------------------

def add_arguments(parser) -> None:
    parser.add_argument("--baseline-dir", default=DEFAULT_BASELINE_DIR,
                        help="folder of per-GPU baseline folders <gpu-slug>/ (default %(default)s)")
    parser.add_argument("--baseline", default=None, metavar="DIR",
                        help="compare with (or --save to) this folder instead of "
                             "<baseline-dir>/<gpu-slug>/")
    parser.add_argument("--time-threshold", type=float, default=0.10,
                        help="median-time increase that fails (default 0.10 = +10%%)")
    parser.add_argument("--mem-threshold", type=float, default=0.05,
                        help=f"peak-extra-memory increase that fails (default 0.05 = +5%%, "
                             f"plus {MEM_SLACK_MIB:g} MiB slack)")
    parser.add_argument("--err-threshold", type=float, default=1.0,
                        help="gradient-error increase that fails (default 1.0: the error doubles)")
    parser.add_argument("--save", action="store_true",
                        help="measure and (re)write this GPU's baseline; with -k or --providers, "
                             "replace only the selected benchmarks")
    parser.add_argument("-k", dest="keyword", default=None, metavar="EXPR",
                        help="select benchmarks <shape>/<provider>/<phase> by substrings joined "
                             "with and / or / not (e.g. 'own and not filter')")
    parser.add_argument("--providers", default=None, metavar="NAMES",
                        help="comma-separated providers (default: all registered)")
    parser.add_argument("--all-shapes", action="store_true",
                        help="every peer at every shape (default: peers at gemma2-2b only, the "
                             "own kernel at all shapes)")
    parser.add_argument("--degrade", choices=("slow", "hungry"), default=None,
                        help="measure deliberately degraded own-kernel variants (suite/degrade.py) "
                             "in place of own and own_filter, to prove the gate fails")
    parser.add_argument("--out", default=None, metavar="DIR",
                        help="run folder of this measurement (default: a new temporary folder)")
    parser.add_argument("--run", default=None, metavar="DIR",
                        help="measure nothing: compare (or --save) the rows of this run folder")
    parser.add_argument("--reps", type=int, default=None, help="timed repetitions (runner default)")
    parser.add_argument("--warmup", type=int, default=None, help="warm-up calls (runner default)")


def main(args) -> int:
    try:
        return _main(args)
    except GateError as err:
        print(f"gate: {err}", file=sys.stderr)
        return 2


def _selection(args) -> list[Benchmark]:
    from suite import catalog

    known = catalog.names()
    providers = known if args.providers is None else [p.strip() for p in args.providers.split(",")]
    bad = [p for p in providers if p not in known]
    if bad or not providers:
        raise GateError(f"--providers: unknown provider(s) {', '.join(bad) or '(none given)'}; "
                        f"known providers: {', '.join(known)}")
    benchmarks = plan(providers, all_shapes=args.all_shapes, keyword=args.keyword)
    if not benchmarks:
        raise GateError(f"no benchmark selected (-k {args.keyword!r}, --providers "
                        f"{args.providers or 'all'})")
    return benchmarks


def _validate(args) -> Thresholds:
    th = Thresholds(args.time_threshold, args.mem_threshold, args.err_threshold)
    if args.save and args.degrade:
        raise GateError("--save with --degrade would save a deliberately degraded baseline")
    for flag, value, low in (("--reps", args.reps, 1), ("--warmup", args.warmup, 0)):
        if value is not None and value < low:
            raise GateError(f"{flag} must be >= {low}, got {value}")
    if args.run and (args.degrade or args.out):
        raise GateError("--run compares an existing run folder: --degrade and --out do not apply")
    if args.run and not (Path(args.run) / CSV_NAME).is_file():
        raise GateError(f"--run: {Path(args.run) / CSV_NAME} does not exist")
    return th


def _run_folder(args, gpu: str, benchmarks) -> Path:
    """The run folder to compare: --run as given, or a new measurement."""
    if args.run:
        return Path(args.run)
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = Path(args.out) if args.out else \
        Path(tempfile.mkdtemp(prefix=f"cce-gate-{gpu_slug(gpu)}-{stamp}-"))
    print(f"gate: {len(benchmarks)} benchmark(s) on {gpu} -> {out}", flush=True)
    try:
        return measure(benchmarks, out, degrade=args.degrade, reps=args.reps, warmup=args.warmup)
    except FileExistsError as err:
        raise GateError(f"--out: {err}") from None


def _main(args) -> int:
    th = _validate(args)
    benchmarks = _selection(args)
    gpu = run_gpu_name(Path(args.run)) if args.run else current_gpu_name()
    if gpu is None:
        raise GateError(f"no GPU: {'--run ' + args.run + ' records none' if args.run else 'no CUDA device'}"
                        "; the gate compares GPU measurements, run it on the GPU whose baseline "
                        "you want to check or create")
    folder = Path(args.baseline) if args.baseline else baseline_folder(args.baseline_dir, gpu)
    if args.save:
        if (folder / CSV_NAME).is_file():
            check_same_gpu(folder, gpu)
        baseline = {}
    else:
        baseline = rows_by_benchmark(load_baseline(folder, gpu))
    run_dir = _run_folder(args, gpu, benchmarks)
    selected = {b.name for b in benchmarks}
    now = rows_by_benchmark(read_rows(run_dir), selected)
    if args.save:
        partial = args.keyword is not None or args.providers is not None
        return _save(folder, run_dir, now, merge=partial, gpu=gpu)
    return _report(baseline, now, th, selected, folder, run_dir, args.degrade)


def _report(baseline, now, th: Thresholds, selected, folder: Path, run_dir: Path,
            degrade) -> int:
    rows = compare(baseline, now, th, selected)
    bad = failed_rows(rows)
    base_env = json.loads((folder / ENV_NAME).read_text())
    now_env = json.loads((run_dir / ENV_NAME).read_text()) if (run_dir / ENV_NAME).is_file() else {}
    print()
    print(f"gate: {now_env.get('gpu_name')}, baseline {folder}")
    for label, env in (("baseline", base_env), ("now     ", now_env)):
        print(f"  {label}: {env.get('date', '?')}, commit {env.get('git_commit')}"
              f"{' (dirty)' if env.get('git_dirty') else ''}; torch {env.get('torch')}, triton "
              f"{env.get('triton')}, CUDA {env.get('cuda')}, driver {env.get('driver')}")
    print(f"  run folder: {run_dir}")
    if degrade:
        print(f"  DEGRADED: own providers measured as their '{degrade}' variants (suite/degrade.py)")
    print(f"  fails on: ms > +{th.time * 100:g}%, peak_extra_mib > +{th.mem * 100:g}% + "
          f"{MEM_SLACK_MIB:g} MiB, gradient error > x{1 + th.err:g} or not finite, failing status")
    print()
    print(format_table(rows))
    print()
    if bad:
        counts = {}
        for r in bad:
            counts[r["metric"]] = counts.get(r["metric"], 0) + 1
        what = ", ".join(f"{metric} x{k}" for metric, k in sorted(counts.items()))
        print(f"gate: FAIL: {len(bad)} failing check(s): {what}")
        return 1
    print(f"gate: PASS ({len(now)} benchmarks, {len(rows)} checks)")
    return 0


def _save(folder: Path, run_dir: Path, now: dict[str, dict], merge: bool, gpu: str) -> int:
    """Write this run's ok rows as this GPU's baseline; failing rows are left out and fail."""
    written, left_out = save_baseline(folder, run_dir, now, merge)
    rows = [_status_check(name, None, row) for name, row in now.items() if row["status"] != "ok"]
    rows += [_row(name, m, None, _num(row.get(m)), None, "saved") for name, row in now.items()
             if row["status"] == "ok" for m in ("ms", "peak_extra_mib") + GATED_ERRORS
             if _num(row.get(m)) is not None]
    print()
    print(format_table(sorted(rows, key=lambda r: r["benchmark"])))
    print()
    if not written:
        print(f"gate: no benchmark measured ok; no baseline written to {folder}")
        return 1
    print(f"gate: saved baseline for {gpu} ({written} benchmarks) to {folder}; commit it")
    failing = failed_rows(rows)
    if failing:
        print(f"gate: {len(failing)} benchmark(s) FAILED and were left out: "
              f"{', '.join(r['benchmark'] for r in failing)}")
        return 1
    return 0


if __name__ == "__main__":  # python -m suite.gate, same as python -m suite gate
    import argparse

    _parser = argparse.ArgumentParser(prog="python -m suite.gate", description=__doc__.split("\n")[0])
    add_arguments(_parser)
    sys.exit(main(_parser.parse_args()))
