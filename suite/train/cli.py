"""``python -m suite train-bench``: arguments, the session (environment, convergence, bench,
plots) and its exit status."""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch

from suite import catalog
from suite.isolate import InProcess, Worker
from suite.results import RUNS_DIR
from suite.train import hf
from suite.train.backends import SELECTIVE_PREFIX
from suite.train.bench import bench_settings, print_savings, run_bench
from suite.train.convergence import RERUN_LABEL, run_convergence
from suite.train.model import GPTConfig, param_counts

# Run in this order (naive first: it sets the common batch); if --budget-s runs out, the last
# ones of the last vocab are recorded as skipped.
DEFAULT_BACKENDS = ("naive", "own", "apple_cce", "liger_flce", "liger_ce", "selective+liger_ce",
                    "selective", "chunked", "own_filter")
DEFAULT_CONV_BACKENDS = ("naive", "own", "own_filter", "apple_cce", "liger_flce")
WORKER_CMD = ("-m", "suite.train", "--worker")
# The Hugging Face models' convergence defaults: ~1B parameters want a cooler AdamW than the
# GPT's 1e-3, and the reference's logits at Gemma 2's vocabulary (fp32 upcast, softcap, log-softmax
# and gradient, ~16 B per logit) fit an 80 GiB GPU at 4 x 1024 tokens, not at 16 x 1024.
HF_CONV_LR = 3e-4
# The GPT's shape arguments and their defaults: with --model hf: the architecture sets these, and
# a value other than the default is an error rather than silently ignored.
GPT_ONLY = {"vocab": [32000, 151936], "d_model": 512, "n_layer": 6, "n_head": 8, "softcap": None,
            "conv_vocab": 32000}
HF_CONV_BATCH = 4


def estimate_seconds(args, gpu_gib: float = 75.0, tflops: float = 150e12) -> dict:
    """Rough wall time on an H100, for the user (no measurement depends on it). Assumes ~150
    TFLOP/s on the model, 15 ms per step of overhead, 40 * D bytes of saved activations per
    token and layer, 14 bytes per logit for the backends that materialise the logits (scaled
    by the labelled fraction for selective ones), and a search costing ~6 steps at the largest
    batch, plus at the common batch the warm-up, split, memory and timed steps and ~5 s of
    start-up per job."""
    def step_s(cfg, tokens):
        n_params, _ = param_counts(cfg)
        flops = tokens * (6 * n_params + 6 * cfg.n_layer * cfg.seq_len * cfg.d_model)
        return flops / tflops + 0.015

    conv_cfg = GPTConfig(args.conv_vocab, args.conv_seq_len, args.d_model, args.n_layer, args.n_head)
    n_conv = len(args.conv_backends) + (0 if args.no_rerun else 1)
    conv = n_conv * (args.steps * step_s(conv_cfg, args.conv_batch * args.conv_seq_len) + 5)
    bench = 0.0
    labelled = 1 - sum(args.prompt_frac) / 2
    for v in args.vocab:
        cfg = GPTConfig(v, args.seq_len, args.d_model, args.n_layer, args.n_head)
        n_params, _ = param_counts(cfg)
        free = gpu_gib * 2**30 - 16 * n_params
        act = 40 * args.d_model * args.n_layer
        batches = {}
        for b in args.backends:
            logits = 14 * v if b in ("naive", "chunked", "liger_ce", "torch_compile") else 0
            if b == "selective" or b.startswith(SELECTIVE_PREFIX):
                logits = 14 * v * labelled
            batches[b] = max(1, min(args.max_batch, int(free / ((act + logits) * args.seq_len))))
        common = args.batch or 2 ** int(math.log2(batches.get("naive", min(batches.values()))))
        for b, biggest in batches.items():
            search = 0 if args.no_search else 6 * step_s(cfg, biggest * args.seq_len)
            timed = (args.warmup + args.timed_steps + 2) * step_s(cfg, common * args.seq_len)
            bench += search + timed + 5
    return {"convergence": conv, "bench": bench}



def _int_list(text):
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not vals or min(vals) < 2:
        raise argparse.ArgumentTypeError(f"expected vocabulary sizes >= 2, got {text!r}")
    return vals


def _name_list(text):
    names = [x.strip() for x in text.split(",") if x.strip()]
    known = catalog.names()
    bad = [n for n in names if n.removeprefix(SELECTIVE_PREFIX) not in known
           and n not in hf.HF_BACKENDS]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"unknown backend(s) {bad or text!r}; known: {', '.join(known)}, "
                                         f"and {SELECTIVE_PREFIX}<known>; with --model hf:<arch>: "
                                         f"{', '.join(hf.HF_BACKENDS)}")
    return names


def _model_name(text):
    """``gpt`` or ``hf:<arch>``; an unknown one names the supported ones."""
    if text == "gpt":
        return text
    try:
        hf.arch_of(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


def _frac_range(text):
    try:
        lo, hi = (float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'lo,hi' fractions, got {text!r}") from None
    if not 0 <= lo <= hi < 1:
        raise argparse.ArgumentTypeError(f"expected 0 <= lo <= hi < 1, got {text!r}")
    return (lo, hi)


def add_arguments(parser) -> None:
    a = parser.add_argument
    a("--mode", choices=("bench", "convergence", "all"), default="all")
    a("--model", type=_model_name, default="gpt",
      help=f"gpt (the suite's own decoder, default) or a Hugging Face architecture built from a "
           f"config with random init: {', '.join(hf.SUPPORTED)}")
    a("--tiny", action="store_true",
      help="with --model hf:<arch>: a tiny config (hidden 32, 2 layers, vocab 512) for the CPU")
    a("--attn", default=None,
      help="with --model hf:<arch>: the attention implementation (default: the model's)")
    a("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a("--out", default=None,
      help="output folder (default: runs/train; runs/train-hf-<arch> with --model hf:)")
    a("--backends", type=_name_list, default=None,
      help=f"bench backends (default: {','.join(DEFAULT_BACKENDS)}; with --model hf: "
           f"{','.join(hf.HF_BENCH_BACKENDS)}; also hf_loss_fp32)")
    a("--vocab", type=_int_list, default=GPT_ONLY["vocab"],
      help="bench vocab sizes (default: 32000,151936; --model gpt only)")
    a("--d-model", type=int, default=GPT_ONLY["d_model"], help="--model gpt only (default: 512)")
    a("--n-layer", type=int, default=GPT_ONLY["n_layer"], help="--model gpt only (default: 6)")
    a("--n-head", type=int, default=GPT_ONLY["n_head"], help="--model gpt only (default: 8)")
    a("--seq-len", type=int, default=2048)
    a("--dtype", choices=("bf16", "fp32"), default="bf16", help="bf16 = bf16 autocast (default)")
    a("--softcap", type=float, default=GPT_ONLY["softcap"],
      help="--model gpt only (a Hugging Face model has its architecture's)")
    a("--prompt-frac", type=_frac_range, default=(0.5, 0.7),
      help="range of the prompt fraction per sequence, labelled ignore_index (default: 0.5,0.7)")
    a("--seed", type=int, default=0)
    a("--batch", type=int, default=None,
      help="common bench batch (sequences); default: the largest power of two naive fits")
    a("--max-batch", type=int, default=512, help="cap of the batch search (default: 512)")
    a("--no-search", action="store_true", help="skip the largest-batch search")
    a("--warmup", type=int, default=2, help="untimed steps before timing (default: 2)")
    a("--timed-steps", type=int, default=5, help="timed steps per backend (default: 5)")
    a("--steps", type=int, default=300, help="convergence training steps (default: 300)")
    a("--conv-backends", type=_name_list, default=None,
      help=f"convergence backends (default: {','.join(DEFAULT_CONV_BACKENDS)}; with --model hf: "
           f"{','.join(hf.HF_CONV_BACKENDS)})")
    a("--no-rerun", action="store_true",
      help=f"do not train the reference twice ({RERUN_LABEL}, or hf_loss_rerun)")
    a("--conv-vocab", type=int, default=GPT_ONLY["conv_vocab"],
      help="--model gpt only (default: 32000)")
    a("--conv-seq-len", type=int, default=1024)
    a("--conv-batch", type=int, default=None,
      help=f"sequences per convergence step (default: 16; {HF_CONV_BATCH} with --model hf:)")
    a("--conv-lr", type=float, default=None,
      help=f"peak learning rate (default: 1e-3; {HF_CONV_LR:g} with --model hf:)")
    a("--conv-warmup", type=int, default=30, help="lr warm-up steps (default: 30)")
    a("--tol", type=float, default=0.01, help="parity tolerance, relative (default: 0.01)")
    a("--smooth", type=int, default=20, help="moving-average window of the parity check (default: 20)")
    a("--shift-steps", type=int, default=2,
      help="the parity check compares with the reference's range over this many steps either "
           "side (a run a step ahead in the steep descent is not a different run; default: 2)")
    a("--budget-s", type=float, default=510,
      help="wall-time budget; a job still running at its end is killed, later ones are recorded "
           "as skipped (default: 510)")
    a("--job-timeout-s", type=float, default=240, help="a job running longer is killed (default: 240)")
    a("--in-process", action="store_true", help="run jobs in this process (no crash isolation)")
    a("--strict", action="store_true", help="exit 1 when a convergence parity check fails")
    a("--replot", action="store_true", help="only redraw the plots from the CSVs in --out")


def resolve_model(args) -> None:
    """Fill in what depends on --model: ``args.hf`` (the architecture and its config kwargs, or
    None for the GPT), the default backends, output folder and convergence batch and learning
    rate; a backend of the other model kind is an error naming the argument."""
    is_hf = args.model != "gpt"
    args.hf = None
    if is_hf:
        given = [n for n, default in GPT_ONLY.items() if getattr(args, n) != default]
        if given:
            raise SystemExit(f"train-bench: {', '.join('--' + n.replace('_', '-') for n in given)} "
                             f"applies to --model gpt only; {args.model} has its architecture's")
        arch = hf.arch_of(args.model)
        args.hf = {"arch": arch, "config": hf.config_kwargs(arch, seq_len=max(
            args.seq_len, args.conv_seq_len), tiny=args.tiny, attn=args.attn)}
    elif args.tiny or args.attn:
        raise SystemExit("train-bench: --tiny and --attn apply to --model hf:<arch> only")
    if args.out is None:
        args.out = str(RUNS_DIR / (f"train-hf-{args.hf['arch']}" if is_hf else "train"))
    if args.conv_lr is None:
        args.conv_lr = HF_CONV_LR if is_hf else 1e-3
    if args.conv_batch is None:
        args.conv_batch = HF_CONV_BATCH if is_hf else 16
    _resolve_backends(args, is_hf)


def _resolve_backends(args, is_hf: bool) -> None:
    """--backends and --conv-backends: the model kind's defaults, or the names given, each of
    which must be a backend of that kind."""
    defaults = {"backends": hf.HF_BENCH_BACKENDS if is_hf else DEFAULT_BACKENDS,
                "conv_backends": hf.HF_CONV_BACKENDS if is_hf else DEFAULT_CONV_BACKENDS}
    for flag, default in defaults.items():
        names = getattr(args, flag)
        if names is None:
            setattr(args, flag, list(default))
            continue
        if is_hf:
            bad = [n for n in names if n not in hf.HF_BACKENDS]
        else:
            bad = [n for n in names if n.removeprefix(SELECTIVE_PREFIX) not in catalog.names()]
        if bad:
            known = ", ".join(hf.HF_BACKENDS) if is_hf else "the suite's providers (suite list)"
            raise SystemExit(f"train-bench: --{flag.replace('_', '-')} {','.join(bad)}: not a "
                             f"backend of --model {args.model}; its backends: {known}")


def _check_args(args):
    resolve_model(args)
    for name in ("d_model", "n_layer", "n_head", "seq_len", "max_batch", "timed_steps", "steps",
                 "conv_seq_len", "conv_batch", "conv_vocab", "smooth"):
        if getattr(args, name) < 1:
            flag = "--" + name.replace("_", "-")
            raise SystemExit(f"train-bench: {flag} must be >= 1, got {getattr(args, name)}")
    if args.batch is not None and args.batch < 1:
        raise SystemExit(f"train-bench: --batch must be >= 1, got {args.batch}")
    if args.d_model % args.n_head:
        raise SystemExit(f"train-bench: --d-model {args.d_model} must be divisible by --n-head {args.n_head}")
    if args.mode != "bench" and max(args.conv_warmup, args.steps // 10) >= args.steps:
        raise SystemExit(f"train-bench: --steps {args.steps} must exceed the warm-up "
                         f"({max(args.conv_warmup, args.steps // 10)} steps)")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("train-bench: --device cuda but no CUDA device is visible")



def _session(args, runner, out: Path) -> dict:
    """The columns every row of this session shares; the session's environment goes to
    env.json, or env-<k>.json when the folder was measured before (its run_id ties it to its
    rows)."""
    import sys

    env = runner.run({"kind": "env", "device": args.device}, timeout_s=120)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
    common = {"run_id": f"{out.name}-{stamp.replace(':', '')}", "timestamp": stamp,
              "device": env.get("device_name", "unknown")}
    env_path, session = out / "env.json", 2
    while env_path.exists():
        env_path, session = out / f"env-{session}.json", session + 1
    train_args = {k: v for k, v in vars(args).items() if not k.startswith("_") and k != "command"}
    env_path.write_text(json.dumps(
        {**env.get("env", {"error": env.get("error")}), "run_id": common["run_id"],
         "train_args": train_args}, indent=2, default=str))
    return common


def _announce(args) -> None:
    if args.hf:
        fields = bench_settings(args)[0][0]
        cfg = args.hf["config"]
        print(f"train-bench: {args.model}: {cfg['num_hidden_layers']} layers, hidden "
              f"{cfg['hidden_size']}, vocab {cfg['vocab_size']}, {fields['n_params'] / 1e6:.1f}M "
              f"params ({fields['n_params_nonemb'] / 1e6:.1f}M without the embedding and an "
              f"untied head), softcap {fields['softcap'] or 'none'}; budget {args.budget_s:.0f} s",
              flush=True)
        return
    est = estimate_seconds(args)
    n_params, n_nonemb = param_counts(GPTConfig(32000, args.seq_len, args.d_model, args.n_layer,
                                                args.n_head))
    print(f"train-bench: model d{args.d_model} x {args.n_layer} layers: {n_params / 1e6:.1f}M "
          f"params at V=32000 with embeddings + lm head ({n_nonemb / 1e6:.1f}M without)")
    print(f"train-bench: expected ~{est['convergence'] / 60:.1f} min convergence + "
          f"~{est['bench'] / 60:.1f} min bench on an H100 (rough); budget {args.budget_s:.0f} s",
          flush=True)


def _verdict(args, conv_rows) -> int:
    not_run = [r["run"] for r in conv_rows
               if r.get("verdict") in ("unavailable", "unsupported", "skipped")]
    failed = [r["run"] for r in conv_rows
              if r.get("verdict") not in ("pass", "reference", "noise floor")
              and r["run"] not in not_run]
    if not_run:
        print(f"train-bench: convergence not run for: {', '.join(not_run)}")
    if failed:
        print(f"train-bench: convergence parity FAILED for: {', '.join(failed)}")
    return 1 if (args.strict and failed) else 0


def make_runner(in_process: bool):
    """The jobs' runner: one isolated worker process (suite.isolate), or this process."""
    from suite.train.worker import run_job

    return InProcess(run_job) if in_process else Worker([sys.executable, *WORKER_CMD])


def main(args) -> int:
    if args.replot:
        resolve_model(args)
        for path in make_plots(Path(args.out)):
            print(path)
        return 0
    _check_args(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    deadline = t0 + args.budget_s
    runner = make_runner(args.in_process)
    conv_rows = []
    try:
        common = _session(args, runner, out)
        _announce(args)
        if args.mode in ("convergence", "all"):
            conv_rows = run_convergence(args, runner, out, deadline, common)
        if args.mode in ("bench", "all"):
            print_savings(run_bench(args, runner, out, deadline, common),
                          hf.reference_backend(args))
    finally:
        runner.close()
    try:
        for path in make_plots(out):
            print(f"train-bench: wrote {path}")
    except Exception as err:  # noqa: BLE001  (the CSVs are the results; a plot can be redrawn)
        print(f"train-bench: plotting failed ({err!r}); redraw with --replot")
    print(f"train-bench: done in {time.monotonic() - t0:.0f} s; results in {out}")
    return _verdict(args, conv_rows)


def make_plots(out: Path) -> list[Path]:
    """train_bench and train_convergence figures of the run folder ``out``, drawn by
    suite.plots (imported here: the worker never needs matplotlib)."""
    from suite import plots

    return plots.plot_training([out], out)
