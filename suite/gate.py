"""`python -m suite gate`: did this change make the loss slower or hungrier on this GPU?

Runs the GPU benchmarks in tests/bench with pytest-benchmark and compares them with the baseline
of the GPU model it runs on, ``results/baselines/<gpu-slug>.json`` (a pytest-benchmark JSON):

- median time: pytest-benchmark's own ``--benchmark-compare-fail=median:<T>%`` against the
  baseline file (default T = 10);
- peak extra memory (``extra_info["peak_extra_mib"]``): this module's check, fails when
  now > baseline * (1 + mem_threshold) + MEM_SLACK_MIB (default +5 %);
- gradient error (``extra_info`` de/dc/dbias_rel_err vs an fp32 reference): this module's check,
  fails when now > baseline * (1 + err_threshold) + ERR_SLACK (default: the error doubles).

pytest-benchmark gates only times, hence the second and third checks. One table is printed:
benchmark, metric, baseline, now, change, verdict. ``--save`` (re)writes this GPU's baseline.
A baseline measured on another GPU model is refused, never compared.
"""
from __future__ import annotations

import json
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH_DIR = ROOT / "tests" / "bench"
DEFAULT_BASELINE_DIR = "results/baselines"

# Absolute slack of the memory check: allocator rounding must not fail a near-zero baseline
# (a forward that keeps ~0.1 MiB), while any real extra buffer is far larger than 1 MiB.
MEM_SLACK_MIB = 1.0
# Absolute slack of the error check, far below any bf16 gradient error (~1e-3).
ERR_SLACK = 1e-6
GATED_ERRORS = ("de_rel_err", "dc_rel_err", "dbias_rel_err")

# Verdicts that fail the gate.
FAILING = ("REGRESSED", "FAILED")


class GateError(Exception):
    """A condition that stops the gate before any comparison (missing or foreign baseline)."""


# ---- identity of the GPU --------------------------------------------------------------------

def gpu_slug(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'nvidia-h100-80gb-hbm3' (the baseline's file name)."""
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    if not slug:
        raise ValueError(f"cannot make a file name from GPU name {name!r}")
    return slug


def gpu_name_of(bench_json: dict) -> str | None:
    """GPU name recorded by tests/bench/conftest.py in a pytest-benchmark JSON's machine_info."""
    gpu = (bench_json.get("machine_info") or {}).get("gpu") or {}
    return gpu.get("name")


def current_gpu_name() -> str | None:
    import torch

    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_name(torch.cuda.current_device())


def baseline_path(baseline_dir: str | Path, gpu_name: str) -> Path:
    return Path(baseline_dir) / f"{gpu_slug(gpu_name)}.json"


def load_baseline(path: str | Path, gpu_name: str) -> dict:
    """The baseline at ``path``, refused (GateError) when missing or measured on another GPU."""
    path = Path(path)
    if not path.is_file():
        others = sorted(p.stem for p in path.parent.glob("*.json")) if path.parent.is_dir() else []
        msg = (f"no baseline for {gpu_name}: {path} does not exist.\n"
               f"Create it on this GPU with `python -m suite gate --save` "
               f"(or `nox -s gate -- --save`), check that the numbers are sane, and commit it.")
        if others:
            msg += f"\nBaselines exist for other GPUs only: {', '.join(others)}."
        raise GateError(msg)
    try:
        baseline = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise GateError(f"baseline {path} is not valid JSON ({err}); re-create it with --save") from None
    if not isinstance(baseline, dict) or "benchmarks" not in baseline:
        raise GateError(f"baseline {path} is not a pytest-benchmark JSON (no 'benchmarks' key)")
    check_same_gpu(baseline, gpu_name, path)
    return baseline


def check_same_gpu(baseline: dict, gpu_name: str, path: str | Path) -> None:
    base_gpu = gpu_name_of(baseline)
    if base_gpu is None:
        raise GateError(f"baseline {path} records no GPU in machine_info['gpu']['name']: it was not "
                        f"produced by tests/bench; re-create it with `python -m suite gate --save`")
    if gpu_slug(base_gpu) != gpu_slug(gpu_name):
        raise GateError(f"refusing to compare: baseline {path} was measured on {base_gpu}, this is "
                        f"{gpu_name}. Times and memory are only comparable on the same GPU model; "
                        f"create a baseline for this GPU with `python -m suite gate --save`.")


# ---- comparison -------------------------------------------------------------------------------

def by_name(bench_json: dict) -> dict[str, dict]:
    return {b["name"]: b for b in bench_json.get("benchmarks", [])}


def median_ms(bench: dict) -> float:
    return bench["stats"]["median"] * 1e3


def relative_change(base: float, now: float) -> float:
    if base == 0:
        return 0.0 if now == 0 else math.inf
    return now / base - 1.0


def _verdict(regressed: bool, improved: bool) -> str:
    return "REGRESSED" if regressed else ("better" if improved else "ok")


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def compare(baseline: dict, now: dict, *, time_threshold: float = 0.10,
            mem_threshold: float = 0.05, err_threshold: float = 1.0,
            time_flagged: frozenset | set = frozenset(), outcomes: dict | None = None) -> list[dict]:
    """Rows of the gate table: one per (benchmark, metric) present in ``now``.

    ``time_flagged`` holds the benchmark names pytest-benchmark reported as median regressions;
    the time verdict is REGRESSED when it flagged the benchmark or the same rule computed here
    (now > baseline * (1 + time_threshold)) holds. ``outcomes`` maps benchmark name to the pytest
    outcome (passed/failed/skipped/error); failed tests and baseline benchmarks that were
    selected but did not run get a row of their own.
    """
    outcomes = outcomes or {}
    base, cur = by_name(baseline), by_name(now)
    rows = []

    def row(name, metric, b, n, change, verdict):
        rows.append({"benchmark": name, "metric": metric, "baseline": b, "now": n,
                     "change": change, "verdict": verdict})

    for name, bench in cur.items():
        if outcomes.get(name) in ("failed", "error"):
            row(name, "test", None, outcomes[name], None, "FAILED")
            continue
        old = base.get(name)
        now_ms = median_ms(bench)
        if old is None:
            row(name, "median_ms", None, now_ms, None, "new")
        else:
            ch = relative_change(median_ms(old), now_ms)
            row(name, "median_ms", median_ms(old), now_ms, ch,
                _verdict(name in time_flagged or ch > time_threshold, ch < -time_threshold))

        info, old_info = bench.get("extra_info", {}), (old or {}).get("extra_info", {})
        now_mib, old_mib = info.get("peak_extra_mib"), old_info.get("peak_extra_mib")
        if now_mib is not None:
            if old_mib is None:
                row(name, "peak_extra_mib", None, now_mib, None, "new")
            else:
                limit = old_mib * (1 + mem_threshold) + MEM_SLACK_MIB
                low = old_mib * (1 - mem_threshold) - MEM_SLACK_MIB
                row(name, "peak_extra_mib", old_mib, now_mib, relative_change(old_mib, now_mib),
                    _verdict(not _finite(now_mib) or now_mib > limit, now_mib < low))

        for metric in GATED_ERRORS:
            now_err, old_err = info.get(metric), old_info.get(metric)
            if now_err is None:
                continue
            if old_err is None or not _finite(old_err):
                row(name, metric, old_err, now_err, None, "new")
                continue
            limit = old_err * (1 + err_threshold) + ERR_SLACK
            row(name, metric, old_err, now_err, relative_change(old_err, now_err),
                _verdict(not _finite(now_err) or now_err > limit, False))

    # Tests that were selected this time but produced no measurement (failed before timing,
    # skipped): a baseline benchmark that silently stops running must be visible.
    for name, outcome in outcomes.items():
        if name in cur:
            continue
        if outcome in ("failed", "error"):
            row(name, "test", None, outcome, None, "FAILED")
        elif name in base:
            row(name, "test", None, outcome, None, "not run")
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
    if metric == "median_ms":
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
    body = [[r["benchmark"], r["metric"], _fmt(r["metric"], r["baseline"]), _fmt(r["metric"], r["now"]),
             _fmt_change(r["change"]), r["verdict"]] for r in rows]
    widths = [max(len(str(x)) for x in col) for col in zip(header, *body)]
    right = {2, 3, 4}  # numbers right-aligned

    def line(cells):
        return "  ".join(str(c).rjust(w) if i in right else str(c).ljust(w)
                         for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    sep = "  ".join("-" * w for w in widths)
    return "\n".join([line(header), sep] + [line(b) for b in body])


# ---- running the benchmarks --------------------------------------------------------------------

REGRESSION_LINE = re.compile(r"^\t(?P<name>\S+) \(.*\) - Field '(?P<field>\w+)' has failed")


def parse_time_regressions(output: str) -> set[str]:
    """Benchmark names listed under pytest-benchmark's 'Performance has regressed:' report."""
    flagged, inside = set(), False
    for line in output.splitlines():
        if line.startswith("Performance has regressed:"):
            inside = True
            continue
        if inside:
            m = REGRESSION_LINE.match(line)
            if m:
                flagged.add(m["name"])
            elif line.strip():
                inside = False
    return flagged


def run_benchmarks(pytest_args: list[str], env: dict) -> tuple[int, str]:
    """Run pytest on tests/bench, echoing its output as it comes; return (exit status, output).

    pytest-benchmark reports a time regression by raising PerformanceRegression out of its
    terminal summary; its traceback says nothing the table does not, so it is cut to one line.
    """
    cmd = [sys.executable, "-m", "pytest", str(BENCH_DIR)] + pytest_args
    print("gate: " + shlex.join(cmd), flush=True)
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, bufsize=1)
    out, held = [], None
    for line in proc.stdout:
        out.append(line)
        if held is None and line.startswith("Traceback (most recent call last):"):
            held = [line]
        elif held is not None:
            held.append(line)
        else:
            print(line, end="", flush=True)
    rc = proc.wait()
    if held:
        last = [x for x in held if x.strip()][-1]
        if "PerformanceRegression" in last:
            print("(pytest-benchmark raised PerformanceRegression: time regression, see above)")
        else:
            print("".join(held), end="")
    return rc, "".join(out)


def read_outcomes(junit_path: Path) -> dict[str, str]:
    """Test name (as pytest-benchmark names benchmarks) -> passed | failed | error | skipped."""
    if not junit_path.is_file():
        return {}
    outcomes = {}
    for case in ET.parse(junit_path).getroot().iter("testcase"):
        kinds = {child.tag for child in case}
        if "error" in kinds:
            outcome = "error"
        elif "failure" in kinds:
            outcome = "failed"
        elif "skipped" in kinds:
            outcome = "skipped"
        else:
            outcome = "passed"
        name = case.get("name")
        # A failing teardown adds a second entry for the same test; keep the worst.
        if outcomes.get(name) not in ("failed", "error"):
            outcomes[name] = outcome
    return outcomes


def merge_baseline(old: dict | None, new: dict) -> dict:
    """``new`` plus the benchmarks of ``old`` it did not re-measure (for --save with -k)."""
    if not old:
        return new
    fresh = {b["name"] for b in new["benchmarks"]}
    merged = dict(new)
    merged["benchmarks"] = new["benchmarks"] + [b for b in old["benchmarks"] if b["name"] not in fresh]
    merged["benchmarks"].sort(key=lambda b: b["name"])
    return merged


def _percent(threshold: float, flag: str) -> int:
    if threshold < 0:
        raise GateError(f"{flag} must be >= 0, got {threshold}")
    pct = threshold * 100
    if abs(pct - round(pct)) > 1e-9:
        # pytest-benchmark's --benchmark-compare-fail=median:N% takes whole percents only.
        raise GateError(f"{flag} must be a whole percentage for pytest-benchmark "
                        f"(e.g. 0.10 for 10 %), got {threshold}")
    return round(pct)


def _versions_line(bench_json: dict) -> str:
    mi = bench_json.get("machine_info") or {}
    gpu, libs = mi.get("gpu") or {}, mi.get("libraries") or {}
    parts = [f"driver {gpu.get('driver', '?')}", f"CUDA {gpu.get('cuda', '?')}"]
    parts += [f"{k} {v}" for k, v in sorted(libs.items())]
    return ", ".join(parts)


# ---- entry point -------------------------------------------------------------------------------

def add_arguments(parser) -> None:
    parser.add_argument("--baseline-dir", default=DEFAULT_BASELINE_DIR,
                        help="folder of per-GPU baselines <gpu-slug>.json (default %(default)s)")
    parser.add_argument("--baseline", default=None, metavar="PATH",
                        help="compare with (or --save to) this file instead of "
                             "<baseline-dir>/<gpu-slug>.json")
    parser.add_argument("--time-threshold", type=float, default=0.10,
                        help="median-time increase that fails, whole percent (default 0.10 = 10%%)")
    parser.add_argument("--mem-threshold", type=float, default=0.05,
                        help=f"peak-extra-memory increase that fails (default 0.05 = 5%%, "
                             f"plus {MEM_SLACK_MIB:g} MiB slack)")
    parser.add_argument("--err-threshold", type=float, default=1.0,
                        help="gradient-error increase that fails (default 1.0: fails when an "
                             "error more than doubles)")
    parser.add_argument("--save", action="store_true",
                        help="run the benchmarks and (re)write this GPU's baseline; with -k, "
                             "replace only the selected benchmarks")
    parser.add_argument("-k", dest="keyword", default=None, metavar="EXPR",
                        help="pytest -k expression selecting benchmarks (e.g. 'own')")
    parser.add_argument("--all-shapes", action="store_true",
                        help="benchmark every peer at every shape (default: peers at gemma2-2b "
                             "only, own kernel at all shapes)")
    parser.add_argument("--output", default=None, metavar="PATH",
                        help="also keep this run's pytest-benchmark JSON at PATH")


def main(args) -> int:
    try:
        return _main(args)
    except GateError as err:
        print(f"gate: {err}", file=sys.stderr)
        return 2


def _main(args) -> int:
    time_pct = _percent(args.time_threshold, "--time-threshold")
    if args.mem_threshold < 0 or args.err_threshold < 0:
        raise GateError("--mem-threshold and --err-threshold must be >= 0")
    gpu = current_gpu_name()
    if gpu is None:
        raise GateError("no CUDA device: the gate times GPU kernels; run it on the GPU whose "
                        "baseline you want to check or create")
    path = Path(args.baseline) if args.baseline else baseline_path(args.baseline_dir, gpu)
    path = path if path.is_absolute() else Path.cwd() / path

    baseline = None
    if args.save:
        if path.is_file():
            old = json.loads(path.read_text())
            check_same_gpu(old, gpu, path)
            baseline = old if args.keyword else None  # -k: merge into it; else replace it
    else:
        baseline = load_baseline(path, gpu)

    env = dict(os.environ)
    if args.all_shapes:
        env["CCE_BENCH_ALL_SHAPES"] = "1"
    with tempfile.TemporaryDirectory(prefix="cce-gate-") as tmp:
        now_path, junit_path = Path(tmp) / "now.json", Path(tmp) / "junit.xml"
        pytest_args = ["-q", "-p", "no:cacheprovider", "--benchmark-only", "--benchmark-quiet",
                       "--benchmark-disable-gc", f"--benchmark-json={now_path}",
                       f"--junitxml={junit_path}"]
        if args.keyword:
            pytest_args += ["-k", args.keyword]
        if not args.save:
            pytest_args += [f"--benchmark-compare={path}",
                            f"--benchmark-compare-fail=median:{time_pct}%"]
        rc, output = run_benchmarks(pytest_args, env)
        outcomes = read_outcomes(junit_path)
        now = json.loads(now_path.read_text()) if now_path.is_file() and now_path.stat().st_size else None
        if now is not None and args.output:
            Path(args.output).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(now_path, args.output)

    if rc == 5:
        raise GateError(f"no benchmark selected (pytest exit status 5){' by -k ' + args.keyword if args.keyword else ''}")
    failed = sorted(n for n, o in outcomes.items() if o in ("failed", "error"))
    now = now or {"benchmarks": []}
    if not now.get("benchmarks") and not failed:
        seen = sorted(set(outcomes.values()))
        raise GateError(f"no benchmark produced a measurement (pytest exit status {rc}, outcomes "
                        f"{seen or 'none'}); see the pytest output above")
    if gpu_name_of(now) and gpu_slug(gpu_name_of(now)) != gpu_slug(gpu):
        raise GateError(f"benchmarks ran on {gpu_name_of(now)} but the gate saw {gpu}; "
                        f"set CUDA_VISIBLE_DEVICES to one GPU model")

    if args.save:
        return _save(path, baseline, now, failed, gpu)

    rows = compare(baseline, now, time_threshold=args.time_threshold,
                   mem_threshold=args.mem_threshold, err_threshold=args.err_threshold,
                   time_flagged=parse_time_regressions(output), outcomes=outcomes)
    bad = failed_rows(rows)
    print()
    print(f"gate: {gpu}, baseline {path}")
    print(f"  baseline: {baseline.get('datetime', '?')}; {_versions_line(baseline)}")
    print(f"  now:      {now.get('datetime', '?')}; {_versions_line(now)}")
    print(f"  fails on: median time > +{time_pct}% (pytest-benchmark --benchmark-compare-fail), "
          f"peak_extra_mib > +{args.mem_threshold * 100:g}% + {MEM_SLACK_MIB:g} MiB, "
          f"gradient error > x{1 + args.err_threshold:g} (gate's own checks)")
    print()
    print(format_table(rows))
    print()
    # pytest's status also covers what the table cannot show (a crash after the JSON was written).
    if rc not in (0, 1):
        print(f"gate: FAIL: pytest exited with status {rc}")
        return 1
    if rc == 1 and not bad:
        print("gate: FAIL: pytest reported a failure that the table does not show; see its output")
        return 1
    if bad:
        counts = {}
        for r in bad:
            counts[r["metric"]] = counts.get(r["metric"], 0) + 1
        what = ", ".join(f"{metric} x{k}" for metric, k in sorted(counts.items()))
        print(f"gate: FAIL: {len(bad)} failing check(s): {what} (failing test: metric 'test')")
        return 1
    print(f"gate: PASS ({len(now['benchmarks'])} benchmarks, {len(rows)} checks)")
    return 0


def _save(path: Path, old: dict | None, now: dict, failed: list[str], gpu: str) -> int:
    """Write this run (minus failed tests) as the baseline of this GPU."""
    now = dict(now)
    now["benchmarks"] = [b for b in now["benchmarks"] if b["name"] not in failed]
    if not now["benchmarks"]:
        print(f"gate: every benchmark test failed ({', '.join(failed)}); no baseline written")
        return 1
    merged = merge_baseline(old, now)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(merged, indent=2, allow_nan=True) + "\n")
    rows = [{"benchmark": b["name"], "metric": m, "baseline": None, "now": v, "change": None,
             "verdict": "saved"}
            for b in now["benchmarks"]
            for m, v in [("median_ms", median_ms(b))] + [
                (k, b.get("extra_info", {}).get(k)) for k in ("peak_extra_mib",) + GATED_ERRORS]
            if v is not None]
    print()
    print(format_table(rows))
    print()
    print(f"gate: saved baseline for {gpu} ({len(merged['benchmarks'])} benchmarks) to {path}")
    if failed:
        print(f"gate: {len(failed)} benchmark test(s) FAILED and were left out: {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":  # python -m suite.gate, same as python -m suite gate
    import argparse

    _parser = argparse.ArgumentParser(prog="python -m suite.gate", description=__doc__.split("\n")[0])
    add_arguments(_parser)
    sys.exit(main(_parser.parse_args()))
