"""`python -m suite gate`: the regression gate on this GPU (what ``nox -s gate`` runs).

Check (the default): one pytest process of the gate's benchmarks (``pytest suite/gates``),
each checked against this GPU model's baseline ``results/baselines/<gpu-slug>.json`` as it ends
(suite/gates/checks.py: per-benchmark limits from the baseline's process-to-process spread).
``--save``: the same benchmarks in ``--processes`` fresh processes, merged into the baseline
(suite/gates/baseline.py). ``--baseline FILE`` reads or writes any file instead, e.g. one saved
from another checkout. Exit status: pytest's (0 pass, 1 a failing check or test, 4 a refused
baseline); 2 when this GPU has no baseline, there is no GPU, or the arguments are wrong.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

from suite.gates import spec
from suite.gates.baseline import Baseline, BaselineError, merge


def add_arguments(parser) -> None:
    parser.add_argument("--save", action="store_true",
                        help="measure and write this GPU's baseline (refused while "
                             f"{spec.INJECT_ENV} is set)")
    parser.add_argument("--processes", type=int, default=spec.SAVE_PROCESSES, metavar="N",
                        help="--save: fresh processes that measure every benchmark (at least "
                             "2; default %(default)s)")
    parser.add_argument("--processes-dir", default=None, metavar="DIR",
                        help="--save: keep each process's pytest-benchmark JSON here (default: "
                             "a temporary folder)")
    parser.add_argument("--baseline-dir", default=spec.DEFAULT_BASELINE_DIR,
                        help="folder of the per-GPU baselines <gpu-slug>.json "
                             "(default %(default)s)")
    parser.add_argument("--baseline", default=None, metavar="FILE",
                        help="compare with (or --save to) this file instead")
    parser.add_argument("--report", default=None, metavar="FILE",
                        help="check: also write the checks and the verdict to this JSON file")
    parser.add_argument("-k", dest="keyword", default=None, metavar="EXPR",
                        help="pytest -k on the benchmark ids <shape>-<provider>-<phase>, e.g. "
                             "'gemma2-2b-own-'")
    parser.add_argument("--print-command", action="store_true",
                        help="print the pytest command and exit")
    parser.add_argument("pytest_args", nargs=argparse.REMAINDER,
                        help="after --: more pytest arguments (e.g. -- -x --benchmark-verbose)")


def _gpu_name() -> str | None:
    import torch

    return torch.cuda.get_device_name(torch.cuda.current_device()) \
        if torch.cuda.is_available() else None


def _fail(message: str) -> int:
    print(f"gate: {message}", file=sys.stderr)
    return 2


def main(args) -> int:
    if args.pytest_args and args.pytest_args[0] != "--":
        return _fail(f"unexpected arguments {args.pytest_args}; pass pytest's after --")
    pytest_args = args.pytest_args[1:]
    if args.baseline:
        path = Path(args.baseline)
    else:
        gpu = _gpu_name()
        if gpu is None:
            return _fail("no CUDA device: the gate measures on the GPU whose baseline it checks "
                         "or saves")
        path = spec.baseline_path(args.baseline_dir, gpu)
    if args.save:
        return save(path, args, pytest_args)
    if not path.is_file() and not args.print_command:
        return _fail(spec.missing_baseline_message(path, _gpu_name() or "this GPU"))
    report = [f"--gate-report={Path(args.report).resolve()}"] if args.report else []
    cmd = spec.gate_command(baseline=path, keyword=args.keyword,
                            pytest_args=report + pytest_args)
    print(f"gate: {shlex.join(cmd)}", flush=True)
    if args.print_command:
        return 0
    return subprocess.run(cmd, cwd=spec.REPO_ROOT).returncode


def save(path: Path, args, pytest_args) -> int:
    """Run ``args.processes`` fresh processes of the benchmarks and merge them into ``path``."""
    if os.environ.get(spec.INJECT_ENV):
        return _fail(f"{spec.INJECT_ENV}={os.environ[spec.INJECT_ENV]} is set: refusing to save a "
                     f"baseline with a deliberately injected regression; unset it")
    if args.processes < 2:
        return _fail(f"--processes {args.processes}: a baseline needs at least 2 (their spread "
                     f"sets the limits)")
    if args.print_command:
        cmd = spec.gate_command(json_out=Path("<process>.json"), keyword=args.keyword,
                                pytest_args=pytest_args)
        print(f"gate: {args.processes} x: {shlex.join(cmd)}; merged into {path}")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(args.processes_dir or tmp)
        folder.mkdir(parents=True, exist_ok=True)
        # The processes build each shape's inputs once between them (suite/gates/cache.py).
        cache = os.environ.get(spec.INPUTS_CACHE_ENV) or str(Path(tmp) / "inputs")
        env = {**os.environ, spec.INPUTS_CACHE_ENV: cache}
        parts = []
        for i in range(1, args.processes + 1):
            part = folder / f"process-{i}.json"
            part.unlink(missing_ok=True)
            cmd = spec.gate_command(json_out=part, keyword=args.keyword, pytest_args=pytest_args)
            print(f"gate: --save, process {i} of {args.processes}: {shlex.join(cmd)}", flush=True)
            code = subprocess.run(cmd, cwd=spec.REPO_ROOT, env=env).returncode
            if code != 0:
                print(f"gate: --save: process {i} exited {code}; no baseline written",
                      file=sys.stderr)
                return code
            if not part.is_file():
                print(f"gate: --save: process {i} wrote no {part.name} (no benchmark ran); no "
                      f"baseline written", file=sys.stderr)
                return 1
            parts.append(part)
        try:
            doc = merge([json.loads(p.read_text()) for p in parts], [p.name for p in parts])
        except BaselineError as err:
            print(f"gate: --save: {err}; no baseline written", file=sys.stderr)
            return 1
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")
    from suite.gates.checks import limits_table

    print(limits_table(Baseline(doc, str(path))))
    print(f"gate: saved {path} from {args.processes} processes", flush=True)
    return 0
