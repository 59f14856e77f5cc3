"""Convergence parity: the same model trained from the same seed on the same batches with each
backend; each loss curve is compared with the naive baseline's (and naive is trained twice, the
run-to-run noise floor of the GPU)."""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import asdict
from pathlib import Path

import torch

from suite.measure import MIB, RegionTimer
from suite.results import CsvAppender
from suite.schema import (TRAIN_CONVERGENCE_CSV, TRAIN_CONVERGENCE_FIELDS, TRAIN_CURVE_FIELDS,
                          TRAIN_CURVES_CSV)
from suite.train import hf
from suite.train.backends import failure, provider_problem
from suite.train.data import instruction_batch, markov_chain, sample_tokens
from suite.train.model import GPT, GPTConfig, make_optimizer, train_step

RERUN_LABEL = "naive_rerun"  # naive trained twice: the run-to-run noise floor of the GPU


def lr_at(step: int, *, steps: int, lr: float, warmup: int, min_ratio: float = 0.1) -> float:
    """Linear warm-up, then cosine decay to min_ratio * lr."""
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return lr * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def _train(job: dict, step, idx_all, tgt_all, out: dict) -> tuple[list, list, RegionTimer]:
    """Train ``job['steps']`` steps of ``step(opt_lr, idx, targets) -> loss``, each timed; stops
    early on a non-finite loss. A failure goes into ``out``; returns (losses, learning rates,
    timer) of the steps done."""
    dev, steps, batch = idx_all.device, job["steps"], job["batch"]
    losses, lrs, timer = [], [], RegionTimer(dev)
    try:
        for s in range(steps):
            lr = lr_at(s, steps=steps, lr=job["lr"], warmup=job["warmup_steps"])
            lrs.append(lr)
            sl = slice(s * batch, (s + 1) * batch)
            with timer.region():
                losses.append(step(lr, idx_all[sl], tgt_all[sl]))
            if (s + 1) % 50 == 0 and not torch.isfinite(losses[-1]).item():
                break  # diverged: no point finishing
    except Exception as err:  # noqa: BLE001 - a failing backend is data
        out.update(failure(err, dev))
    return losses, lrs, timer


def _with_lr(opt, train_one):
    """``train_one(idx, targets)`` as a step of the schedule: sets the learning rate first."""
    def step(lr, idx, targets):
        for group in opt.param_groups:
            group["lr"] = lr
        return train_one(idx, targets)

    return step


def _gpt_run(job: dict, dev, provider):
    """(step, input ids, targets, sequence length) of a GPT job."""
    cfg = GPTConfig(**job["model"])
    chain = markov_chain(cfg.vocab, seed=job["seed"])
    idx_all, tgt_all = instruction_batch(
        sample_tokens(chain, job["steps"] * job["batch"], cfg.seq_len + 1, seed=job["seed"] + 1,
                      device=dev),
        prompt_frac=tuple(job["prompt_frac"]), seed=job["seed"] + 2)
    torch.manual_seed(job["seed"])
    with dev:
        model = GPT(cfg)
    opt = make_optimizer(model, job["lr"], dev)
    amp, softcap = job["dtype"] == "bf16", job.get("softcap")

    def loss_fn(e, c, t, **kw):
        return provider.fn(e, c, t, **kw)

    return (_with_lr(opt, lambda i, t: train_step(model, opt, i, t, loss_fn, amp=amp,
                                                  softcap=softcap)),
            idx_all, tgt_all, cfg.seq_len)


def _hf_run(job: dict, dev):
    """(step, input ids, labels, sequence length) of a Hugging Face job (``job['hf']``), its
    model patched for the job's backend (hf.Unsupported when the backend cannot)."""
    arch, kwargs = job["hf"]["arch"], job["hf"]["config"]
    idx_all, labels_all = hf.corpus(kwargs["vocab_size"], job["steps"] * job["batch"],
                                    job["seq_len"], prompt_frac=job["prompt_frac"],
                                    seed=job["seed"], device=dev)
    torch.manual_seed(job["seed"])
    model = hf.build_model(arch, kwargs, dev)
    hf.apply_backend(model, job["backend"], arch)
    opt = make_optimizer(model, job["lr"], dev)
    amp = job["dtype"] == "bf16"
    return (_with_lr(opt, lambda i, t: hf.hf_train_step(model, opt, i, t, amp=amp)),
            idx_all, labels_all, job["seq_len"])


def _problem_and_run(job: dict, dev, out: dict):
    """The job's (step, inputs, targets, sequence length), or None with the reason in ``out``."""
    if job.get("hf"):
        out["exact"], status, reason = hf.backend_problem(job["backend"], dev)
    else:
        provider, status, reason = provider_problem(job["backend"], dev, job.get("softcap"))
        out["exact"] = int(provider.exact)
    if status:
        out.update(status=status, error=reason)
        return None
    if not job.get("hf"):
        return _gpt_run(job, dev, provider)
    try:
        return _hf_run(job, dev)
    except hf.Unsupported as err:
        out.update(status="unsupported", error=str(err))
        return None


def converge_job(job: dict) -> dict:
    """Train ``job['steps']`` steps from ``job['seed']`` on the same batches; returns the curve."""
    dev = torch.device(job["device"])
    out = {"run": job["run"], "backend": job["backend"], "status": "ok", "error": ""}
    run = _problem_and_run(job, dev, out)
    if run is None:
        return out
    step, idx_all, tgt_all, seq_len = run
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    losses, lrs, timer = _train(job, step, idx_all, tgt_all, out)
    if out.get("fatal"):
        return out  # the context is gone: nothing on the device can be read back
    times = timer.times()
    out["loss"] = torch.stack(losses).tolist() if losses else []
    out["lr"] = lrs[:len(out["loss"])]
    out["ms_step"] = times[:len(out["loss"])]
    out["tokens_per_step"] = job["batch"] * seq_len
    if dev.type == "cuda":
        out["peak_mib"] = torch.cuda.max_memory_allocated(dev) / MIB
    return out


# ---- verdicts -----------------------------------------------------------------------------

def smooth(xs, window: int):
    """Trailing moving average (the first points average what exists so far)."""
    out, acc = [], 0.0
    for i, x in enumerate(xs):
        acc += x
        if i >= window:
            acc -= xs[i - window]
        out.append(acc / min(i + 1, window))
    return out


def parity_verdict(loss, ref, *, tol: float, warmup: int, window: int, shift: int = 0) -> dict:
    """Compare a loss curve with the reference (naive) curve of the same steps and data.

    pass: after ``warmup`` steps the smoothed curve stays within ``tol`` (relative) of the
    smoothed reference's range over steps ``s - shift .. s + shift``, and the final loss (mean
    of the last ``window`` steps) is within ``tol``. ``shift`` forgives a run that is a step or
    two ahead or behind in the steep part of the descent, where one step moves the loss by
    several per cent (the deviation then measures the slope, not the run);
    fail: otherwise; diverged: a non-finite loss, or a final loss more than 10 * tol above the
    reference's; incomplete: fewer steps than the reference."""
    res = {"max_rel_dev": float("nan"), "max_rel_dev_step": "", "final_loss": float("nan"),
           "final_rel_diff": float("nan"), "first_loss": loss[0] if loss else float("nan")}
    if not all(math.isfinite(x) for x in loss):
        return {**res, "verdict": "diverged"}
    if len(loss) < len(ref):
        return {**res, "verdict": "incomplete"}
    if warmup >= len(ref):
        raise ValueError(f"warm-up ({warmup} steps) must be shorter than the run ({len(ref)} steps)")
    s, s_ref = smooth(loss, window), smooth(ref, window)
    devs = [_outside(s[i], s_ref[max(0, i - shift):i + shift + 1]) / abs(s_ref[i])
            for i in range(warmup, len(s_ref))]
    worst = max(range(len(devs)), key=devs.__getitem__)
    final = statistics.fmean(loss[-window:])
    final_ref = statistics.fmean(ref[-window:])
    final_rel = (final - final_ref) / abs(final_ref)
    res.update(max_rel_dev=devs[worst], max_rel_dev_step=warmup + worst, final_loss=final,
               final_rel_diff=final_rel, final_loss_naive=final_ref)
    if final_rel > 10 * tol:
        return {**res, "verdict": "diverged"}
    ok = devs[worst] <= tol and abs(final_rel) <= tol
    return {**res, "verdict": "pass" if ok else "fail"}


def _outside(x: float, around: list[float]) -> float:
    """How far x lies outside the range of ``around`` (0 inside)."""
    return max(min(around) - x, x - max(around), 0.0)


# ---- the convergence runs (in the parent) -----------------------------------------------------

def conv_setting(args) -> tuple[dict, dict]:
    """(the verdict rows' model columns, the jobs' model fields) of the convergence model: the
    GPT of the --conv-* shape, or the Hugging Face model of ``args.hf`` at --conv-seq-len."""
    if getattr(args, "hf", None):
        kwargs = args.hf["config"]
        fields = dict(model=f"hf:{args.hf['arch']}", vocab=kwargs["vocab_size"],
                      d_model=kwargs["hidden_size"], n_layer=kwargs["num_hidden_layers"],
                      seq_len=args.conv_seq_len)
        return fields, dict(hf=args.hf, seq_len=args.conv_seq_len, softcap=None)
    cfg = GPTConfig(args.conv_vocab, args.conv_seq_len, args.d_model, args.n_layer, args.n_head)
    fields = dict(model="gpt", vocab=cfg.vocab, d_model=cfg.d_model, n_layer=cfg.n_layer,
                  seq_len=cfg.seq_len)
    return fields, dict(model=asdict(cfg), softcap=args.softcap)


def rerun_label(reference: str) -> str:
    return RERUN_LABEL if reference == "naive" else f"{reference}_rerun"


def _train_runs(args, runner, model_fields: dict, runs, deadline: float, out: Path) -> dict:
    """Each (label, backend) run's job result; their curves appended to train_curves.csv."""
    curves = CsvAppender(out / TRAIN_CURVES_CSV, TRAIN_CURVE_FIELDS, extras="ignore")
    results = {}
    for label, backend in runs:
        left = deadline - time.monotonic()
        if left < 5:
            results[label] = {"status": "skipped", "error": "time budget (--budget-s) spent"}
            continue
        job = dict(kind="converge", run=label, backend=backend, device=args.device,
                   **model_fields, dtype=args.dtype, seed=args.seed,
                   steps=args.steps, batch=args.conv_batch, lr=args.conv_lr,
                   warmup_steps=args.conv_warmup, prompt_frac=args.prompt_frac)
        t0 = time.monotonic()
        res = runner.run(job, timeout_s=min(args.job_timeout_s, left))
        res.setdefault("backend", backend)
        results[label] = res
        curves.write([{"run": label, "backend": backend, "step": s, "loss": loss,
                       "lr": res["lr"][s], "ms_step": res["ms_step"][s] if res["ms_step"] else ""}
                      for s, loss in enumerate(res.get("loss", []))])
        final = res["loss"][-1] if res.get("loss") else float("nan")
        print(f"convergence {label:>12}: {res['status']:<11} last loss {final:.4f} "
              f"({time.monotonic() - t0:.1f} s) {res.get('error', '')}", flush=True)
    return results


NOISE_MARGIN = 1.5  # a run passes within this multiple of the reference's own rerun spread


def noise_tolerance(tol: float, rerun_row: dict) -> float:
    """The parity tolerance given the reference's rerun: ``tol``, or NOISE_MARGIN times the
    rerun's largest deviation (or final difference) where the GPU's run-to-run noise is larger
    (no run can be held closer to the reference than the reference is to itself)."""
    spread = [abs(rerun_row.get(k, math.nan)) for k in ("max_rel_dev", "final_rel_diff")]
    spread = [x for x in spread if math.isfinite(x)]
    return max([tol] + [NOISE_MARGIN * x for x in spread])


def _verdict_row(args, fields, label, backend, res, ref, warm, common, *, tol=None) -> dict:
    tol = args.tol if tol is None else tol
    loss = res.get("loss") or []
    reference = hf.reference_backend(args)
    row = {**common, "run": label, "backend": backend, "exact": res.get("exact", ""),
           "error": res.get("error", ""), "steps": args.steps, "steps_done": len(loss),
           **fields, "batch": args.conv_batch, "lr": args.conv_lr,
           "tol": tol, "warmup_steps": warm, "smooth": args.smooth,
           "shift_steps": args.shift_steps,
           "peak_mib": res.get("peak_mib", float("nan"))}
    ms = res.get("ms_step") or []
    if ms:
        tail = ms[len(ms) // 2:]  # trained state; compile and warm-up excluded
        row["ms_step"] = statistics.median(tail)
        row["tokens_per_s"] = res["tokens_per_step"] / (row["ms_step"] / 1e3)
    if res.get("status") != "ok" and not loss:
        row["verdict"] = res.get("status", "error")
    elif label == reference:
        row.update(verdict="reference", first_loss=loss[0],
                   final_loss=statistics.fmean(loss[-args.smooth:]))
    elif not ref:
        row["verdict"] = "no reference"
        row["error"] = row["error"] or f"the {reference} run has no curve"
    else:
        row.update(parity_verdict(loss, ref, tol=tol, warmup=warm, window=args.smooth,
                                  shift=args.shift_steps))
        if res.get("status") != "ok":
            row["verdict"] = "diverged" if row["verdict"] == "diverged" else res["status"]
    return row


def run_convergence(args, runner, out: Path, deadline: float, common: dict) -> list[dict]:
    fields, model_fields = conv_setting(args)
    reference = hf.reference_backend(args)
    runs = [(b, b) for b in args.conv_backends]
    if not args.no_rerun and reference in args.conv_backends:
        runs.insert(1, (rerun_label(reference), reference))
    results = _train_runs(args, runner, model_fields, runs, deadline, out)
    ref = results.get(reference, {}).get("loss") or []
    warm = max(args.conv_warmup, args.steps // 10)
    summary = CsvAppender(out / TRAIN_CONVERGENCE_CSV, TRAIN_CONVERGENCE_FIELDS, extras="ignore")
    tol, noise = args.tol, None
    rerun = rerun_label(reference)
    if rerun in results:  # the reference's spread against itself widens every other tolerance
        noise = _verdict_row(args, fields, rerun, reference, results[rerun], ref, warm, common)
        tol = noise_tolerance(args.tol, noise)
        if noise["verdict"] in ("pass", "fail"):
            noise["verdict"] = "noise floor"
    rows = []
    for label, backend in runs:
        row = (noise if label == rerun else
               _verdict_row(args, fields, label, backend, results[label], ref, warm, common,
                            tol=tol))
        summary.add(row)
        rows.append(row)
        print(f"parity {label:>12}: {row['verdict']:<10} max dev "
              f"{_pct(row.get('max_rel_dev'))} final diff {_pct(row.get('final_rel_diff'))} "
              f"(tol {row['tol']:.2%}, after step {warm}, smoothed over {args.smooth}, "
              f"shift {args.shift_steps})", flush=True)
    return rows


def _pct(x):
    return "-" if x is None or x == "" or (isinstance(x, float) and math.isnan(x)) else f"{x:+.3%}"
