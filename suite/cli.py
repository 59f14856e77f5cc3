"""``python -m suite <command>`` (or ``cce-bench <command>``): list | bench, plus report |
reproduce | plots | train-bench | gate | kernel (modules of their own, imported only when their
command is chosen)."""
from __future__ import annotations

import argparse
import datetime as dt
import importlib
import os
import re
import sys
from pathlib import Path

from suite import presets, smoke
from suite.kernel import TOOLS as KERNEL_TOOLS  # names only: the tools load when chosen

# Subcommands implemented in their own modules: each has add_arguments(parser) and main(args).
EXTERNAL = {
    "reproduce": ("suite.reproduce", "reproduce the paper's Table 1 (Gemma 2 2B shape)"),
    "plots": ("suite.plots", "draw every figure from the curated runs into plots/"),
    "train-bench": ("suite.train", "end-to-end training-step benchmark"),
    "gate": ("suite.gates.cli", "regression gates (pytest-benchmark) against this GPU's baseline"),
    "report": ("suite.report",
               "markdown tables from run folders; --update-readme; --results-doc; --notes"),
    "kernel": ("suite.kernel", f"the own kernel's tools: {' | '.join(KERNEL_TOOLS)}"),
    "frontier": ("suite.frontier", "time-memory frontier of exact loss+grad per shape"),
    "provenance": ("suite.provenance", "the commits whose own kernel a run measured"),
}
DTYPES = ("bf16", "fp16", "fp32")
# suite.runner.PRESETS' names, read without importing runner (it imports torch, which this
# module loads only when a command needs it).
PRESET_NAMES = ("smoke", "smoke-sweep", *presets.SHAPES, "peers", "grid")
DISTS = ("uniform", "lm", "file")


# ---- argument types: a clear message naming what was expected ---------------------------

def _split(text: str) -> list[str]:
    items = [t.strip() for t in text.split(",")]
    if not text.strip() or any(not t for t in items):
        raise argparse.ArgumentTypeError(f"expected a comma-separated list, got {text!r}")
    return items


def int_list(text: str) -> list[int]:
    out = []
    for t in _split(text):
        if not re.fullmatch(r"\d+", t) or int(t) < 1:
            raise argparse.ArgumentTypeError(
                f"expected comma-separated positive integers (e.g. 2048,8192), got {t!r} in {text!r}")
        out.append(int(t))
    return out


def choice_list(choices):
    def parse(text: str) -> list[str]:
        items = _split(text)
        for t in items:
            if t not in choices:
                raise argparse.ArgumentTypeError(
                    f"expected a comma-separated subset of {', '.join(choices)}, got {t!r}")
        return items

    return parse


def _float_list(text: str, ok, expected: str, none_ok: bool = False) -> list:
    """Comma-separated numbers each passing ``ok`` (and 'none' where ``none_ok``), else an
    argparse error saying what was ``expected``."""
    out = []
    for t in _split(text):
        if none_ok and t.lower() == "none":
            out.append(None)
            continue
        try:
            value = float(t)
        except ValueError:
            value = float("nan")
        if not ok(value):
            raise argparse.ArgumentTypeError(f"expected comma-separated {expected}, got {t!r}")
        out.append(value)
    return out


def softcap_list(text: str) -> list[float | None]:
    return _float_list(text, lambda x: x > 0, "positive numbers or 'none' (e.g. 30,none)",
                       none_ok=True)


def fraction_list(text: str) -> list[float]:
    return _float_list(text, lambda x: 0.0 <= x < 1.0, "fractions in [0, 1) (e.g. 0,0.5)")


def entropy_list(text: str) -> list[float]:
    return _float_list(text, lambda x: x > 0.0, "entropies in nats above 0 (e.g. 2.2,3)")


def nonneg_int(text: str) -> int:
    if not re.fullmatch(r"\d+", text.strip()):
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}")
    return int(text)


def positive_int(text: str) -> int:
    value = nonneg_int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def name_list(text: str) -> list[str]:
    return _split(text)


def variant_spec(text: str) -> tuple[str, str, dict]:
    """BASE@NAME=JSON -> (base provider, variant name, config overrides)."""
    import json

    head, eq, body = text.partition("=")
    base, at, name = head.partition("@")
    if not (eq and at and base and name):
        raise argparse.ArgumentTypeError(
            f"expected PROVIDER@NAME=JSON (e.g. own@notma='{{\"forward\": {{\"tma\": false}}}}'), "
            f"got {text!r}")
    try:
        overrides = json.loads(body)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"{head}: the overrides are not JSON ({err})") from None
    return base, name, overrides


# ---- parser ------------------------------------------------------------------------------

def add_bench_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", choices=PRESET_NAMES,
                   help="cells to run (default: gemma2-2b with CUDA; without, smoke: every "
                        "provider once on one tiny cell; smoke-sweep: the longer CPU sweep)")
    p.add_argument("--providers", type=name_list, help="comma-separated providers (default: all)")
    p.add_argument("--exclude", type=name_list, default=[], help="providers to leave out")
    p.add_argument("--n", type=int_list, help="tokens, e.g. 2048,8192 (overrides the preset)")
    p.add_argument("--d", type=int_list, help="hidden sizes, e.g. 2304,4096")
    p.add_argument("--v", type=int_list, help="vocabulary sizes, e.g. 32000,256000")
    p.add_argument("--dtype", type=choice_list(DTYPES), help="bf16,fp16,fp32")
    p.add_argument("--dist", type=choice_list(DISTS), help="uniform,lm,file")
    p.add_argument("--file", help=".pt or .safetensors with e, c, targets (for --dist file)")
    p.add_argument("--softcap", type=softcap_list, help="softcap values or none, e.g. 30,none")
    p.add_argument("--ignore-frac", type=fraction_list,
                   help="fractions of targets set to ignore_index, e.g. 0,0.5")
    p.add_argument("--bias", action=argparse.BooleanOptionalAction, default=None,
                   help="give the classifier a bias (--no-bias: none; default: the preset's)")
    p.add_argument("--seed", type=int_list, help="input seeds (default 0)")
    p.add_argument("--lm-entropy", type=entropy_list,
                   help="mean softmax entropy (nats) of --dist lm's inputs (default 2.2)")
    p.add_argument("--phases", type=choice_list(("fwd", "loss", "grad", "loss+grad")),
                   help="phases to measure (default: fwd,loss,grad,loss+grad)")
    p.add_argument("--reps", type=positive_int, help="timed repetitions (default 10 on GPU, 3 on CPU)")
    p.add_argument("--warmup", type=nonneg_int, help="untimed warm-up calls (default 3 on GPU, 1 on CPU)")
    p.add_argument("--out", help="run folder (default runs/<preset>-<gpu or cpu>-<date>; runs/ is git-ignored)")
    p.add_argument("--resume", action="store_true",
                   help="continue the run in --out, skipping finished (cell, provider) pairs")
    p.add_argument("--rerun", type=name_list, default=[], metavar="PROVIDERS",
                   help="with --resume: measure these providers again where rows exist (e.g. "
                        "after a kernel change); readers keep the latest rows")
    p.add_argument("--isolate", nargs="?", const="cell", default=False,
                   choices=["cell", "provider"],
                   help="one subprocess per cell (or, with 'provider', per (cell, provider) "
                        "pair: no provider's time then depends on what ran before it); a "
                        "crashing provider is recorded as 'crashed'")
    p.add_argument("--rounds", type=positive_int, default=1, metavar="K",
                   help="K >= 2: measure every pair K times, one process per (cell, provider) "
                        "pair, the provider order reversed every other round, each round into "
                        "its own folder OUT/round-<r>; compare within each round with "
                        "'python -m suite report OUT/round-* --versus A --peers B'")
    p.add_argument("--variant", type=variant_spec, action="append", default=[],
                   metavar="PROVIDER@NAME=JSON",
                   help="measure own provider PROVIDER under the own kernel's config overrides "
                        "JSON as provider PROVIDER@NAME, beside the unchanged one (list it in "
                        "--providers; repeatable), e.g. own@notma='{\"forward\": {\"tma\": "
                        "false}}'")
    p.add_argument("--clocks", action="store_true",
                   help="each row also records the median SM clock its timed calls ran at and "
                        "how often it was limited (power cap, thermal): large matmuls run at "
                        "the power cap, where the clock follows each kernel's power "
                        "(suite/clocks.py; needs nvidia-ml-py and a GPU)")
    p.add_argument("--device", help="cuda, cuda:1 or cpu (default: cuda when available)")
    p.add_argument("--plugin", action="append", default=[], metavar="MODULE",
                   help="import MODULE first, so the providers it registers can be measured "
                        "(e.g. your own kernel; repeatable)")
    p.add_argument("--quiet", action="store_true", help="no progress bar or summary")
    p.add_argument("--vocab-parallel", type=int, metavar="K",
                   help="C sharded by vocabulary over K >= 2 ranks, launched by the bench "
                        "(NCCL, one GPU each; gloo on the CPU); the own providers only, rows "
                        "with world_size K (suite/ranks.py)")


def invoked_name(argv0: str | None = None) -> str:
    """How the user called us: 'cce-bench' for the console script, 'python -m suite' for the
    module (whose argv[0] is suite/__main__.py), so --help shows a command that works."""
    argv0 = sys.argv[0] if argv0 is None else argv0
    name = os.path.basename(argv0)
    if not name or name in ("__main__.py", "-c") or name.endswith(".py"):
        return "python -m suite"
    return name


def build_parser(chosen: str | None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=invoked_name(), description=__doc__)
    sub = parser.add_subparsers(dest="command", metavar="command")
    sub.required = True
    p_list = sub.add_parser("list", help="every provider, with availability and the reason")
    p_list.add_argument("--device", help="device to check availability on (default: cuda if any)")
    add_bench_arguments(sub.add_parser("bench", help="measure providers on a preset/grid of cells"))
    for name, (module, help_text) in EXTERNAL.items():
        p = sub.add_parser(name, help=help_text)
        if name == chosen:
            try:
                mod = importlib.import_module(module)
            except ImportError as err:
                parser.exit(2, f"python -m suite {name}: {module} cannot be imported ({err})\n")
            mod.add_arguments(p)
            p.set_defaults(_module=mod)
    return parser


def _chosen_command(argv) -> str | None:
    return next((a for a in argv if not a.startswith("-")), None)


def _device_arg(argv) -> str | None:
    for i, a in enumerate(argv):
        if a == "--device" and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith("--device="):
            return a.split("=", 1)[1]
    return None


def _compiles_only(argv) -> bool:
    """`kernel sass` compiles kernels for a GPU without one: the interpreter would replace them."""
    words = [a for a in argv if not a.startswith("-")]
    return words[:2] == ["kernel", "sass"]


def _prepare_triton(argv) -> bool:
    """Set TRITON_INTERPRET=1 when measuring on the CPU, before anything imports triton.
    Returns whether CUDA is usable for this command."""
    import torch  # importing torch does not import triton

    device = _device_arg(argv)
    cuda = torch.cuda.is_available() and not (device or "").startswith("cpu")
    if not cuda:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    return cuda


# ---- commands ----------------------------------------------------------------------------

def cmd_list(args) -> int:
    import torch

    from suite import catalog

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    print(f"providers on device {device!r}:")
    for name in catalog.names():
        p = catalog.get(name)
        reason = p.unavailable_reason(device)
        state = "available" if reason is None else f"unavailable: {reason}"
        extras = ", ".join(sorted(p.features)) or "-"
        exact = "exact" if p.exact else "approximate gradient"
        print(f"  {name:20s} {state}")
        print(f"  {'':20s} {p.summary} [{exact}; options: {extras}]")
        if p.package:
            print(f"  {'':20s} {_peer_line(p)}")
    return 0


def _peer_line(provider) -> str:
    """The peer's installed version (commit and source where pip recorded them), or the line
    that installs it."""
    info = provider.installed()
    if info is None:
        return f"{provider.package}: not installed; install: {provider.install}"
    commit = f" at commit {info['commit']}" if info.get("commit") else ""
    source = f" from {info['source']}" if info.get("source") not in (None, "index") else ""
    return f"{provider.package} {info['version']}{commit}{source}"


def _slug(text: str) -> str:
    text = re.sub(r"^nvidia\s+", "", text.lower())
    return re.sub(r"[^a-z0-9]+", "-", text).strip("-")


def default_out(preset: str, device: str, resume: bool) -> Path:
    from suite.results import RUNS_DIR, device_label

    base = RUNS_DIR / f"{preset}-{_slug(device_label(device))}-{dt.date.today():%Y%m%d}"
    if resume or not (base / "results.csv").exists():
        return base
    return base.with_name(base.name + f"-{dt.datetime.now():%H%M%S}")


def cmd_bench(args, parser) -> int:
    from suite import runner

    device, dev = _bench_device(args, parser)
    preset = args.preset or ("gemma2-2b" if dev.type == "cuda" else "smoke")
    providers = _bench_providers(args, parser)
    if args.dist and "file" in args.dist and not args.file:
        parser.error("--dist file needs --file PATH (a .pt or .safetensors with e, c, targets)")
    if args.file and not Path(args.file).is_file():
        parser.error(f"--file: no such file {args.file!r}")
    overrides = dict(n=args.n, d=args.d, v=args.v, dtype=args.dtype, dist=args.dist,
                     softcap=args.softcap, ignore_frac=args.ignore_frac,
                     bias=None if args.bias is None else [args.bias], seed=args.seed,
                     lm_entropy=args.lm_entropy)
    try:
        cells = runner.preset_cells(preset, file=args.file, **overrides)
    except ValueError as err:
        parser.error(str(err))
    if args.vocab_parallel is not None:
        return _bench_vocab_parallel(args, parser, cells, providers, preset, device)
    out = Path(args.out) if args.out else default_out(preset, device, args.resume)
    if dev.type == "cpu":
        print("NOTE: running on the CPU (Triton kernels under TRITON_INTERPRET=1). Times and "
              "memory from this run are NOT GPU numbers; it checks that everything runs.")
    if not args.quiet:
        print(f"bench: preset {preset}, {len(cells)} cell(s) x {len(providers)} provider(s) on "
              f"{device} -> {out}")
    phases, reps, warmup = args.phases or runner.PHASES, args.reps, args.warmup
    if preset == smoke.PRESET:  # one call each: it checks that everything runs
        phases, reps = args.phases or list(smoke.PHASES), reps or smoke.REPS
        warmup = smoke.WARMUP if warmup is None else warmup
    folders = _run_rounds(args, parser, cells, providers, out, device, phases, reps, warmup)
    if preset != smoke.PRESET:
        return 0
    return max(_smoke_verdict(folder, providers) for folder in folders)


def _bench_device(args, parser):
    """(device name, torch.device) of --device (default: cuda where there is one), checked."""
    import torch

    from suite import runner

    device = args.device or runner.default_device()
    try:
        dev = torch.device(device)
    except RuntimeError:
        parser.error(f"--device: expected cuda, cuda:<index> or cpu, got {device!r}")
    if dev.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is available here (use --device cpu)")
    if dev.type not in ("cuda", "cpu"):
        parser.error(f"--device: expected cuda, cuda:<index> or cpu, got {device!r}")
    return device, dev


def _bench_providers(args, parser) -> list[str]:
    """The providers to measure: --providers (default all) less --exclude, after --plugin's
    modules and --variant's providers are registered; unknown names are errors."""
    from suite import catalog, runner

    for module in args.plugin:
        try:
            importlib.import_module(module)
        except ImportError as err:
            parser.error(f"--plugin: cannot import {module!r} ({err})")
    try:
        runner.load_extras((), args.variant)
    except ValueError as err:
        parser.error(f"--variant: {err}")
    known = catalog.names()
    for flag, names in (("--providers", args.providers or []), ("--exclude", args.exclude),
                        ("--rerun", args.rerun)):
        bad = [n for n in names if n not in known]
        if bad:
            parser.error(f"{flag}: unknown provider(s) {', '.join(bad)}; known providers: "
                         f"{', '.join(known)}")
    providers = [p for p in (args.providers or known) if p not in args.exclude]
    if not providers:
        parser.error("--providers/--exclude: no provider left to run")
    return providers


def _run_rounds(args, parser, cells, providers, out, device, phases, reps, warmup) -> list[Path]:
    """runner.run for each round (_rounds); returns the rounds' folders."""
    from suite import runner

    if args.rounds > 1 and args.isolate == "cell":
        parser.error("--rounds: each round runs one process per (cell, provider) pair; "
                     "--isolate cell would share a process between providers")
    rounds = _rounds(out, providers, args.rounds, args.isolate)
    for folder, order, isolate in rounds:
        try:
            runner.run(cells, order, phases, folder, resume=args.resume, reps=reps,
                       warmup=warmup, device=device, isolate=isolate, quiet=args.quiet,
                       plugins=args.plugin, rerun=args.rerun, variants=args.variant,
                       clocks=args.clocks)
        except FileExistsError as err:
            parser.error(f"--out: {err}")
        except ValueError as err:
            parser.error(f"--rerun: {err}" if args.rerun else str(err))
    return [folder for folder, _, _ in rounds]


def _rounds(out: Path, providers, rounds: int, isolate):
    """(folder, provider order, isolate mode) of each round. One round: the run as asked.
    More: a process per pair, so that no provider's time depends on what ran before it in its
    process, and the order reversed every other round, so that a GPU that warms or throttles
    over a run does not favour the provider that always runs first."""
    if rounds == 1:
        return [(out, providers, isolate)]
    return [(out / f"round-{r}", providers if r % 2 else providers[::-1], "provider")
            for r in range(1, rounds + 1)]


def _smoke_verdict(out: Path, providers) -> int:
    """Print what the smoke run checked; 1 if a provider failed."""
    from suite import catalog
    from suite.results import read_rows

    rows = [r for r in read_rows(out) if r["provider"] in providers]
    text, failed = smoke.summarize(rows, {p: catalog.get(p).exact for p in providers})
    print(text)
    return 1 if failed else 0


def _bench_vocab_parallel(args, parser, cells, providers, preset, device) -> int:
    """``bench --vocab-parallel K``: the cells with C sharded over K ranks."""
    from suite import ranks, runner

    k = args.vocab_parallel
    reason = ranks.check_world_size(k, device)
    if reason:
        parser.error(f"--vocab-parallel: {reason}")
    for flag, value in (("--isolate", args.isolate), ("--rerun", args.rerun),
                        ("--plugin", args.plugin), ("--rounds", args.rounds > 1),
                        ("--variant", args.variant), ("--clocks", args.clocks)):
        if value:
            parser.error(f"{flag} is not available with --vocab-parallel")
    out = Path(args.out) if args.out else default_out(f"{preset}-vp{k}", device, args.resume)
    if device.startswith("cpu"):
        print("NOTE: running on the CPU (gloo, Triton kernels interpreted): times and memory "
              "are NOT GPU numbers; it checks that everything runs.")
    if not args.quiet:
        print(f"bench: preset {preset}, {len(cells)} cell(s) x {len(providers)} provider(s), C "
              f"sharded over {k} ranks on {device} -> {out}")
    try:
        runner.run(cells, providers, args.phases or runner.PHASES, out, world_size=k,
                   device=device, reps=args.reps, warmup=args.warmup, resume=args.resume,
                   quiet=args.quiet)
    except FileExistsError as err:
        parser.error(f"--out: {err}")
    except ValueError as err:
        parser.error(str(err))
    return 0


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    chosen = _chosen_command(argv)
    if chosen in ("bench", "list", *EXTERNAL) and not _compiles_only(argv):
        _prepare_triton(argv)
    parser = build_parser(chosen)
    args = parser.parse_args(argv)
    if args.command == "list":
        return cmd_list(args)
    if args.command == "bench":
        return cmd_bench(args, parser)
    return int(args._module.main(args) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
