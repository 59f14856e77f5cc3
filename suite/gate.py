"""`python -m suite gate`: the regression gate's pytest command, for this GPU (what
``nox -s gate`` runs).

The gate is ``pytest suite/gates`` on pytest-benchmark (suite/gates/): compared with this GPU
model's baseline ``results/baselines/<gpu-slug>.json`` (pytest-benchmark's own JSON), failing a
median more than 10 % slower (``--benchmark-compare-fail``), and, by the gate's plugin, a peak
extra memory more than 5 % + 1 MiB higher or a gradient error more than doubled or not finite.
``--save`` writes this GPU's baseline instead. Exit status: pytest's (0 pass, 1 a regression or
a failing test, 4 a refused comparison); 2 when this GPU has no baseline or there is no GPU.
"""
from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from pathlib import Path

from suite.gates import spec


def add_arguments(parser) -> None:
    parser.add_argument("--save", action="store_true",
                        help="measure and write this GPU's baseline (refused while "
                             f"{spec.INJECT_ENV} is set)")
    parser.add_argument("--baseline-dir", default=spec.DEFAULT_BASELINE_DIR,
                        help="folder of the per-GPU baselines <gpu-slug>.json "
                             "(default %(default)s)")
    parser.add_argument("--baseline", default=None, metavar="FILE",
                        help="compare with (or --save to) this file instead")
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


def main(args) -> int:
    if args.pytest_args and args.pytest_args[0] != "--":
        print(f"gate: unexpected arguments {args.pytest_args}; pass pytest's after --",
              file=sys.stderr)
        return 2
    gpu = _gpu_name()
    if args.baseline:
        path = Path(args.baseline)
    elif gpu is None:
        print("gate: no CUDA device: the gate measures on the GPU whose baseline it checks or "
              "saves", file=sys.stderr)
        return 2
    else:
        path = spec.baseline_path(args.baseline_dir, gpu)
    if not args.save and not path.is_file():
        print(f"gate: {spec.missing_baseline_message(path, gpu)}", file=sys.stderr)
        return 2
    cmd = spec.gate_command(path, save=args.save, keyword=args.keyword,
                            pytest_args=args.pytest_args[1:])
    print(f"gate: {shlex.join(cmd)}", flush=True)
    if args.print_command:
        return 0
    if args.save:
        path.parent.mkdir(parents=True, exist_ok=True)
    return subprocess.run(cmd, cwd=spec.REPO_ROOT).returncode
