"""A real training step per loss backend, and convergence parity (issue 6).

    python -m suite train-bench --out results/train_h100 --mode all      # one GPU command
    python -m suite.train       --out results/train_h100 --mode all      # same, without the CLI

The model is a small GPT-style decoder in plain PyTorch (nanoGPT-like: token + position
embeddings, pre-LayerNorm blocks with causal SDPA attention and a 4x GELU MLP, final LayerNorm,
untied lm head). Its hidden states E (N, D) and lm-head weight C (V, D), both cast to bf16, go
to a loss provider of ``suite.registry``: ``fn(e, c, targets, softcap=..., ignore_index=...)``.
Default shape (seed 000): d_model 512, 6 layers, 8 heads, sequence length 2048, vocab 32000:
52.7M parameters counted WITH the token/position embeddings and the lm head (18.9M without).
The large-vocab variant swaps in V = 151936 (or any ``--vocab``). Weights are initialised
locally (normal, std 0.02; residual projections 0.02/sqrt(2 * layers)); nothing is downloaded.

Data: a deterministic synthetic corpus, a sparse bigram Markov chain whose successor lists are
drawn from a Zipf(1.1) prior (so token frequencies are Zipfian and the next token is
predictable), in the instruction-tuning layout of seed 000: the first 50-70 % of every sequence
(uniform per sequence) is "prompt", labelled ``ignore_index``.

Backends: any registry provider, and ``selective+X`` = provider X on only the rows whose target
is not ignore_index (seed 000's final setup is ``selective+liger_ce``).

Training step: bf16 autocast for the trunk, loss on bf16 E and C, ``loss.backward()``, gradient
clipping at 1.0, AdamW (fused where available), ``zero_grad(set_to_none=True)``.

Mode ``bench`` (per vocab, per backend; one row of ``train_bench.csv`` each):
- largest batch that fits: exponential search 1, 2, 4, ... then bisection, each try one full
  step on the same model (Adam states allocated beforehand, so one step is the steady state),
  OOM caught, cleanup (gc, empty_cache) between tries; capped at ``--max-batch``;
- at a common batch (``--batch``; default: the largest power of two the naive baseline fits,
  a margin below the edge of memory, measured on every backend at that same batch): whole-
  step peak memory and tokens/s (CUDA events; ``--warmup`` steps excluded, median of
  ``--timed-steps``), and the peak's breakdown (method below).
  Caveat: the bench starts from the random init, where the softmax is nearly flat, so gradient
  filtering (apple_cce, own_filter) skips more of the backward than it would in a trained model;
  the convergence run's tokens/s (second half of training, peaked softmax) is the fairer number.
Mode ``convergence``: the same model (``--conv-*`` shape) trained ``--steps`` steps from the same
seed on the same batches with each of ``--conv-backends``; loss curves to ``train_curves.csv``,
verdicts to ``train_convergence.csv``. Mode ``all`` runs convergence first (fixed cost), then
the bench with what is left of ``--budget-s``.

Memory breakdown of the whole-step peak (MiB):
- weights, gradients, Adam states: computed from parameter counts and dtypes (fp32 master
  weights, fp32 gradients, two fp32 moments per parameter);
- loss: measured in one extra, otherwise identical step whose backward is split at E:
  max_memory_allocated during the loss forward + backward minus memory_allocated just before
  it (logits and their gradients, and the loss's outputs dE and dC);
- activations: the rest, peak - weights - gradients - Adam - loss. It holds the trunk's saved
  tensors minus whatever of the gradients is not yet allocated when the peak happens, plus
  allocator slack and the batch itself. ``saved_act_mib`` is the trunk's saved tensors measured
  directly (allocated after the trunk forward minus before) as a cross-check.

Isolation: jobs run in one worker subprocess (``python -m suite.train --worker``), fed one job at
a time; a job that kills the process or its CUDA context (segfault, illegal address) is recorded
as ``crashed`` and a fresh worker takes the remaining jobs. ``--in-process`` skips this.

Files written into ``--out``: ``env.json``, ``train_bench.csv``, ``train_curves.csv``,
``train_convergence.csv``, ``train_bench.{png,pdf}``, ``train_convergence.{png,pdf}``. Run again
into the same folder (e.g. ``--backends own`` after a kernel change), the CSVs get the new rows
appended (readers take each backend's latest) and the session's environment goes to
``env-<k>.json``.

train_bench.csv columns (BENCH_FIELDS):
  run_id, timestamp, device      the run and the device it was measured on
  vocab, d_model, n_layer, n_head, seq_len, n_params (all), n_params_nonemb (without wte, wpe,
                                 lm head), dtype (bf16 = bf16 autocast), softcap, ignored_frac
                                 (mean fraction of targets that are ignore_index), optimizer
  backend, exact                 registry provider and whether its gradient is exact
  status, error                  ok | oom | error | unavailable | unsupported | crashed | timeout
                                 | skipped, and the reason
  batch, tokens_per_step         the common batch (sequences) and batch * seq_len
  peak_mib                       max_memory_allocated over one plain step (max over timed steps)
  weights_mib, grads_mib, optim_mib, act_mib, loss_mib   the breakdown above (sums to peak_mib)
  saved_act_mib, split_peak_mib  cross-checks from the split step
  ms_step, ms_step_p20, ms_step_p80, tokens_per_s   median step time, all tokens / median time
  max_batch, max_batch_capped    largest batch that fits; 1 when the search hit --max-batch
  max_batch_peak_mib, max_batch_tokens_per_s   the peak and tokens/s of that one try (its first
                                 step: a rough throughput, allocator warm-up included)
  search_log, search_s           every try as batch+ (fits) or batch- (OOM), and its wall time
train_curves.csv: run (label), backend, step, loss, lr, ms_step.
train_convergence.csv (CONV_FIELDS): per run, verdict pass | fail | diverged | reference | error
  | unavailable | ..., max relative deviation of the smoothed curve from naive's after warm-up and
  the step where it happens, final loss (mean of the last --smooth steps) and its relative
  difference from naive's, tolerance, step time (median over the second half of the run) and
  peak memory (which includes the run's whole token set, kept on the device).
"""
from __future__ import annotations

import argparse
import csv
import gc
import json
import math
import os
import queue
import statistics
import subprocess
import sys
import threading
import time
import dataclasses
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from suite import registry

MiB = 2**20
IGNORE_INDEX = -100
# Run in this order (naive first: it sets the common batch); if --budget-s runs out, the last
# ones of the last vocab are recorded as skipped.
DEFAULT_BACKENDS = ("naive", "own", "apple_cce", "liger_flce", "liger_ce", "selective+liger_ce",
                    "selective", "chunked", "own_filter")
SELECTIVE_PREFIX = "selective+"  # "selective+X": drop ignore_index rows of E, then provider X
DEFAULT_CONV_BACKENDS = ("naive", "own", "own_filter", "apple_cce", "liger_flce")
RERUN_LABEL = "naive_rerun"  # naive trained twice: the run-to-run noise floor of the GPU

BENCH_FIELDS = [
    "run_id", "timestamp", "device", "vocab", "d_model", "n_layer", "n_head", "seq_len",
    "n_params", "n_params_nonemb", "dtype", "softcap", "ignored_frac", "optimizer",
    "backend", "exact", "status", "error", "batch", "tokens_per_step",
    "peak_mib", "weights_mib", "grads_mib", "optim_mib", "act_mib", "loss_mib",
    "saved_act_mib", "split_peak_mib", "ms_step", "ms_step_p20", "ms_step_p80", "tokens_per_s",
    "max_batch", "max_batch_capped", "max_batch_peak_mib", "max_batch_tokens_per_s",
    "search_log", "search_s",
]
CURVE_FIELDS = ["run", "backend", "step", "loss", "lr", "ms_step"]
CONV_FIELDS = [
    "run_id", "timestamp", "device", "run", "backend", "exact", "verdict", "error", "steps",
    "steps_done", "vocab", "d_model", "n_layer", "seq_len", "batch", "lr", "tol", "warmup_steps",
    "smooth", "first_loss", "final_loss", "final_loss_naive", "final_rel_diff", "max_rel_dev",
    "max_rel_dev_step", "ms_step", "tokens_per_s", "peak_mib",
]


# ---- model ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class GPTConfig:
    vocab: int = 32000
    seq_len: int = 2048
    d_model: int = 512
    n_layer: int = 6
    n_head: int = 8


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        d = cfg.d_model
        self.n_head = cfg.n_head
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.attn_proj = nn.Linear(d, d, bias=False)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d, bias=False)
        self.fc_proj = nn.Linear(4 * d, d, bias=False)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.n_head, d // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn_proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.fc_proj(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    """Returns the final hidden states (B, T, D); the lm head weight C is ``self.lm_head``."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        if cfg.d_model % cfg.n_head:
            raise ValueError(f"d_model={cfg.d_model} must be divisible by n_head={cfg.n_head}")
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab, cfg.d_model)
        self.wpe = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.lm_head = nn.Parameter(torch.empty(cfg.vocab, cfg.d_model))  # C, untied
        for name, p in self.named_parameters():
            if p.dim() < 2 or p.is_meta:  # meta: counted only (param_counts), nothing to fill
                continue  # LayerNorm weights/biases keep their (1, 0) init
            std = 0.02 / math.sqrt(2 * cfg.n_layer) if name.endswith("proj.weight") else 0.02
            nn.init.normal_(p, mean=0.0, std=std)

    def forward(self, idx):
        t = idx.shape[1]
        if t > self.cfg.seq_len:
            raise ValueError(f"sequence length {t} exceeds the model's seq_len={self.cfg.seq_len}")
        x = self.wte(idx) + self.wpe(torch.arange(t, device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x)


def param_counts(cfg: GPTConfig) -> tuple[int, int]:
    """(all parameters, parameters without wte, wpe and the lm head), counted on the meta device."""
    with torch.device("meta"):
        model = GPT(cfg)
    total = sum(p.numel() for p in model.parameters())
    emb = model.wte.weight.numel() + model.wpe.weight.numel() + model.lm_head.numel()
    return total, total - emb


def make_optimizer(model, lr, device):
    # fused AdamW: one kernel for all parameters and no foreach temporaries.
    fused = device.type == "cuda"
    return torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1,
                             fused=fused or None)


def init_optimizer_state(model, opt):
    """Allocate Adam's moments before the first measured step (a zero-gradient step), so that a
    single step shows the steady-state peak (moments and activations live together)."""
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    opt.zero_grad(set_to_none=True)


# ---- one training step -----------------------------------------------------------------------

def head_loss(model, h, targets, loss_fn, *, amp, softcap=None, ignore_index=IGNORE_INDEX):
    """The loss provider on E = h (N, D) and C = lm_head (V, D), in bf16 under ``amp``."""
    e = h.reshape(-1, h.shape[-1])
    c = model.lm_head
    if amp:
        e, c = e.to(torch.bfloat16), c.to(torch.bfloat16)
    return loss_fn(e, c, targets.reshape(-1), softcap=softcap, ignore_index=ignore_index)


def train_step(model, opt, idx, targets, loss_fn, *, amp, softcap=None, clip=1.0):
    """One plain step: forward, loss, backward, clip, AdamW, zero grads. Returns the loss."""
    with torch.autocast(device_type=idx.device.type, dtype=torch.bfloat16, enabled=amp):
        h = model(idx)
    loss = head_loss(model, h, targets, loss_fn, amp=amp, softcap=softcap)
    loss.backward()
    if clip:
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.detach()


def split_step_memory(model, opt, idx, targets, loss_fn, *, amp, softcap=None, clip=1.0) -> dict:
    """The same step with its backward split at E, to measure the loss's own peak (bytes).
    Numerically identical to :func:`train_step` (the chain rule applied in two calls)."""
    dev = idx.device
    torch.cuda.synchronize(dev)
    torch.cuda.reset_peak_memory_stats(dev)
    base = torch.cuda.memory_allocated(dev)
    with torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=amp):
        h = model(idx)
    torch.cuda.synchronize(dev)
    after_fwd = torch.cuda.memory_allocated(dev)
    peak = torch.cuda.max_memory_allocated(dev)
    h_cut = h.detach().requires_grad_()
    torch.cuda.reset_peak_memory_stats(dev)
    before_loss = torch.cuda.memory_allocated(dev)
    loss = head_loss(model, h_cut, targets, loss_fn, amp=amp, softcap=softcap)
    loss.backward()
    torch.cuda.synchronize(dev)
    loss_peak = torch.cuda.max_memory_allocated(dev) - before_loss
    peak = max(peak, torch.cuda.max_memory_allocated(dev))
    torch.cuda.reset_peak_memory_stats(dev)
    h.backward(h_cut.grad)
    del h, h_cut, loss
    if clip:
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    opt.step()
    opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize(dev)
    peak = max(peak, torch.cuda.max_memory_allocated(dev))
    return {"base": base, "saved_act": after_fwd - base, "loss": loss_peak, "peak": peak}


def static_memory(model) -> dict:
    """Bytes of weights, gradients and AdamW moments, from parameter counts and dtypes.
    Gradients have the parameters' dtype; AdamW keeps exp_avg and exp_avg_sq in it too (its
    per-parameter step counter, a scalar, is left out)."""
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    trained = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    return {"weights": weights, "grads": trained, "optim": 2 * trained}


def memory_breakdown_mib(peak: int, static: dict, loss: int) -> dict:
    """Split a step's peak (bytes) into components (MiB); activations are the rest."""
    parts = {"weights_mib": static["weights"], "grads_mib": static["grads"],
             "optim_mib": static["optim"], "loss_mib": loss}
    parts["act_mib"] = peak - sum(parts.values())
    return {k: v / MiB for k, v in parts.items()}


# ---- data: a Zipfian sparse Markov chain -----------------------------------------------------

@dataclass
class MarkovChain:
    succ: torch.Tensor      # (V, k) successor token ids of each token
    cum_prob: torch.Tensor  # (V, k) cumulative transition probabilities
    start: torch.Tensor     # (V,) distribution of the first token (the Zipf prior)


def zipf_prior(vocab: int, exponent: float, gen: torch.Generator) -> torch.Tensor:
    """Zipf(exponent) probabilities over the vocabulary; ranks are a random permutation of the
    ids (token ids do not follow frequency)."""
    p = torch.arange(1, vocab + 1, dtype=torch.float64).pow(-exponent)
    p = p / p.sum()
    return p[torch.argsort(torch.randperm(vocab, generator=gen))]


def markov_chain(vocab: int, *, branching: int = 8, zipf: float = 1.1, seed: int = 0) -> MarkovChain:
    """Each token has ``branching`` successors drawn from the Zipf prior, with peaked random
    weights: the marginal token frequencies follow the prior (E[P(j | s)] = prior_j), and the
    next token is predictable from the current one (entropy well below log V)."""
    if vocab < 2 or branching < 1:
        raise ValueError(f"markov_chain: need vocab >= 2 and branching >= 1, got {vocab}, {branching}")
    gen = torch.Generator().manual_seed(seed)
    prior = zipf_prior(vocab, zipf, gen)
    succ = torch.multinomial(prior, vocab * branching, replacement=True, generator=gen)
    weights = torch.rand(vocab, branching, generator=gen, dtype=torch.float64).pow(4)  # peaked
    prob = weights / weights.sum(1, keepdim=True)
    cum = prob.cumsum(1)
    cum[:, -1] = 1.0
    return MarkovChain(succ.view(vocab, branching), cum, prior)


def sample_tokens(chain: MarkovChain, n_seq: int, length: int, *, seed: int,
                  device="cpu") -> torch.Tensor:
    """(n_seq, length) int64 token ids on ``device``. The random numbers come from a CPU
    generator seeded with ``seed`` and the walk only compares them with the chain's
    probabilities, so the tokens are the same on every device."""
    gen = torch.Generator().manual_seed(seed)
    first = torch.multinomial(chain.start, n_seq, replacement=True, generator=gen)
    u = torch.rand(n_seq, length, generator=gen, dtype=torch.float64).to(device)
    succ, cum = chain.succ.to(device), chain.cum_prob.to(device)
    out = torch.empty(n_seq, length, dtype=torch.long, device=device)
    cur = first.to(device)
    out[:, 0] = cur
    for t in range(1, length):  # one vectorised step of every sequence's walk
        j = (cum[cur] < u[:, t:t + 1]).sum(1).clamp_max(succ.shape[1] - 1)
        cur = succ[cur, j]
        out[:, t] = cur
    return out


def instruction_batch(tokens: torch.Tensor, *, prompt_frac=(0.5, 0.7), seed: int,
                      ignore_index: int = IGNORE_INDEX):
    """Inputs and next-token targets from (B, T+1) tokens; the first prompt_frac of every
    sequence (uniform in the range, per sequence) is prompt, labelled ``ignore_index``."""
    lo, hi = prompt_frac
    if not 0 <= lo <= hi < 1:
        raise ValueError(f"prompt_frac must satisfy 0 <= lo <= hi < 1, got {prompt_frac}")
    idx, targets = tokens[:, :-1], tokens[:, 1:].clone()
    b, t = idx.shape
    gen = torch.Generator().manual_seed(seed)
    prompt_len = ((lo + (hi - lo) * torch.rand(b, generator=gen)) * t).long().to(tokens.device)
    positions = torch.arange(t, device=tokens.device)
    targets[positions.unsqueeze(0) < prompt_len.unsqueeze(1)] = ignore_index
    return idx.contiguous(), targets


# ---- largest batch that fits ---------------------------------------------------------------

def is_oom(err: BaseException) -> bool:
    if isinstance(err, torch.cuda.OutOfMemoryError):
        return True
    text = str(err)
    return "out of memory" in text.lower() or "CUBLAS_STATUS_ALLOC_FAILED" in text


def free_memory():
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def fits_by_running(step, cleanup=free_memory):
    """Turn ``step(batch)`` into ``fits(batch) -> bool``: an OOM means False, other errors
    propagate; ``cleanup`` runs after every try (the failed try's tensors are gone by then)."""

    def fits(batch: int) -> bool:
        ok = False
        try:
            step(batch)
            ok = True
        except Exception as err:  # noqa: BLE001  (only OOM is swallowed)
            if not is_oom(err):
                raise
        cleanup()
        return ok

    return fits


def largest_batch(fits, max_batch: int):
    """Largest b in [1, max_batch] with fits(b), assuming fits is monotone (0 when batch 1 does
    not fit): doubling until a try fails, then bisection. Returns (best, log of (batch, ok))."""
    if max_batch < 1:
        raise ValueError(f"max_batch must be >= 1, got {max_batch}")
    log = []

    def tryit(b):
        ok = fits(b)
        log.append((b, ok))
        return ok

    good, bad, b = 0, None, 1
    while bad is None:
        if tryit(b):
            good = b
            if b == max_batch:
                return good, log
            b = min(2 * b, max_batch)
        else:
            bad = b
    while bad - good > 1:
        mid = (good + bad) // 2
        if tryit(mid):
            good = mid
        else:
            bad = mid
    return good, log


# ---- jobs (run in the worker) ---------------------------------------------------------------

def _sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _status_of(err: BaseException) -> str:
    if is_oom(err):
        return "oom"
    if isinstance(err, ImportError):
        return "unavailable"
    return "error"


def _fatal(err: BaseException, dev) -> bool:
    """True when the CUDA context is probably unusable after ``err`` (the worker must restart)."""
    if dev.type != "cuda" or is_oom(err):
        return False
    text = str(err)
    if any(s in text for s in ("illegal memory access", "device-side assert", "CUDA error",
                               "unspecified launch failure", "misaligned address")):
        return True
    try:
        torch.cuda.synchronize(dev)
    except Exception:  # noqa: BLE001
        return True
    return False


def get_backend(name: str) -> registry.Provider:
    """A registry provider, or ``selective+X``: provider X on the rows whose target is not
    ignore_index only (seed 000's last step: selective hidden states + LigerCrossEntropyLoss)."""
    if not name.startswith(SELECTIVE_PREFIX):
        return registry.get(name)
    base = registry.get(name[len(SELECTIVE_PREFIX):])

    def fn(e, c, targets, *, ignore_index=IGNORE_INDEX, **kw):
        keep = targets != ignore_index
        return base.fn(e[keep], c, targets[keep], ignore_index=ignore_index, **kw)

    return dataclasses.replace(base, name=name, fn=fn, summary=f"selective rows, then {base.summary}")


def _provider_problem(name, device, softcap):
    provider = get_backend(name)
    reason = provider.unavailable_reason(device)
    if reason:
        return provider, "unavailable", reason
    reason = provider.unsupported_reason(bias=False, softcap=softcap)
    if reason:
        return provider, "unsupported", reason
    return provider, None, None


def _timed_steps(step, dev, n_warmup, n_timed):
    for _ in range(n_warmup):
        step()
    times, peak = [], 0
    for _ in range(n_timed):
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats(dev)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
            peak = max(peak, torch.cuda.max_memory_allocated(dev))
        else:
            t0 = time.perf_counter()
            step()
            times.append((time.perf_counter() - t0) * 1e3)
    return times, peak


def _quantile(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def bench_job(job: dict) -> dict:
    """Search the largest batch (``job['search']``) and/or measure one batch (``job['batch']``:
    an int, "max" for the batch just found, or "pow2" for the largest power of two up to it)
    for one backend and vocab."""
    dev = torch.device(job["device"])
    cfg = GPTConfig(**job["model"])
    amp = job["dtype"] == "bf16"
    softcap = job.get("softcap")
    row = {"backend": job["backend"], "status": "ok", "error": ""}
    provider, status, reason = _provider_problem(job["backend"], dev, softcap)
    row["exact"] = int(provider.exact)
    if status:
        return {**row, "status": status, "error": reason}

    def loss_fn(e, c, t, **kw):
        return provider.fn(e, c, t, **kw)

    torch.manual_seed(job["seed"])
    with dev:
        model = GPT(cfg)
    opt = make_optimizer(model, job["lr"], dev)
    init_optimizer_state(model, opt)
    static = static_memory(model)
    n_max = max(job["max_batch"] if job.get("search") else 0,
                job["batch"] if isinstance(job.get("batch"), int) else 0, 1)
    chain = markov_chain(cfg.vocab, seed=job["seed"])
    idx_all, tgt_all = instruction_batch(
        sample_tokens(chain, n_max, cfg.seq_len + 1, seed=job["seed"] + 1, device=dev),
        prompt_frac=tuple(job["prompt_frac"]), seed=job["seed"] + 2)

    def step(b):
        return train_step(model, opt, idx_all[:b], tgt_all[:b], loss_fn, amp=amp, softcap=softcap)

    if job.get("search"):
        if dev.type != "cuda":
            row["search_log"] = "no search: OOM is only caught on CUDA"
        else:
            peaks, speed = {}, {}

            def one_try(b):
                opt.zero_grad(set_to_none=True)
                torch.cuda.reset_peak_memory_stats(dev)
                t0 = time.perf_counter()
                step(b)
                torch.cuda.synchronize(dev)
                speed[b] = b * cfg.seq_len / (time.perf_counter() - t0)
                peaks[b] = torch.cuda.max_memory_allocated(dev)

            def cleanup():
                opt.zero_grad(set_to_none=True)
                free_memory()

            t0 = time.perf_counter()
            try:
                best, log = largest_batch(fits_by_running(one_try, cleanup), job["max_batch"])
            except Exception as err:  # noqa: BLE001
                return {**row, "status": _status_of(err), "error": f"search: {err!r}"[:500],
                        "fatal": _fatal(err, dev)}
            row.update(max_batch=best, max_batch_capped=int(best == job["max_batch"]),
                       max_batch_peak_mib=peaks.get(best, float("nan")) / MiB,
                       max_batch_tokens_per_s=speed.get(best, float("nan")),
                       search_log=" ".join(f"{b}{'+' if ok else '-'}" for b, ok in log),
                       search_s=time.perf_counter() - t0)
            if best == 0:
                return {**row, "status": "oom", "error": "batch 1 does not fit"}
    batch = job.get("batch")
    if batch == "pow2" and row.get("max_batch"):  # a margin below the edge of memory
        batch = 2 ** int(math.log2(row["max_batch"]))
    elif batch in ("max", "pow2"):
        batch = row.get("max_batch")
    if not batch:
        return row
    row.update(batch=batch, tokens_per_step=batch * cfg.seq_len,
               ignored_frac=(tgt_all[:batch] == IGNORE_INDEX).float().mean().item())
    try:
        if dev.type == "cuda":
            split = split_step_memory(model, opt, idx_all[:batch], tgt_all[:batch], loss_fn,
                                      amp=amp, softcap=softcap)
        times, peak = _timed_steps(lambda: step(batch), dev, job["warmup"], job["timed_steps"])
    except Exception as err:  # noqa: BLE001
        opt.zero_grad(set_to_none=True)
        return {**row, "status": _status_of(err), "error": repr(err)[:500], "fatal": _fatal(err, dev)}
    ms = statistics.median(times)
    row.update(ms_step=ms, ms_step_p20=_quantile(times, 0.2), ms_step_p80=_quantile(times, 0.8),
               tokens_per_s=batch * cfg.seq_len / (ms / 1e3))
    if dev.type == "cuda":
        row.update(peak_mib=peak / MiB, saved_act_mib=split["saved_act"] / MiB,
                   split_peak_mib=split["peak"] / MiB, **memory_breakdown_mib(peak, static, split["loss"]))
    return row


def lr_at(step: int, *, steps: int, lr: float, warmup: int, min_ratio: float = 0.1) -> float:
    """Linear warm-up, then cosine decay to min_ratio * lr."""
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return lr * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def converge_job(job: dict) -> dict:
    """Train ``job['steps']`` steps from ``job['seed']`` on the same batches; returns the curve."""
    dev = torch.device(job["device"])
    cfg = GPTConfig(**job["model"])
    amp = job["dtype"] == "bf16"
    softcap = job.get("softcap")
    out = {"run": job["run"], "backend": job["backend"], "status": "ok", "error": ""}
    provider, status, reason = _provider_problem(job["backend"], dev, softcap)
    out["exact"] = int(provider.exact)
    if status:
        return {**out, "status": status, "error": reason}
    steps, batch = job["steps"], job["batch"]
    chain = markov_chain(cfg.vocab, seed=job["seed"])
    idx_all, tgt_all = instruction_batch(
        sample_tokens(chain, steps * batch, cfg.seq_len + 1, seed=job["seed"] + 1, device=dev),
        prompt_frac=tuple(job["prompt_frac"]), seed=job["seed"] + 2)
    torch.manual_seed(job["seed"])
    with dev:
        model = GPT(cfg)
    opt = make_optimizer(model, job["lr"], dev)
    losses, lrs, times = [], [], []
    timer = (lambda: torch.cuda.Event(enable_timing=True)) if dev.type == "cuda" else None
    events = []
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    try:
        for s in range(steps):
            lr = lr_at(s, steps=steps, lr=job["lr"], warmup=job["warmup_steps"])
            for group in opt.param_groups:
                group["lr"] = lr
            lrs.append(lr)
            sl = slice(s * batch, (s + 1) * batch)
            if timer:
                events.append((timer(), timer()))
                events[-1][0].record()
            else:
                t0 = time.perf_counter()
            losses.append(train_step(model, opt, idx_all[sl], tgt_all[sl], lambda e, c, t, **kw:
                                     provider.fn(e, c, t, **kw), amp=amp, softcap=softcap))
            if timer:
                events[-1][1].record()
            else:
                times.append((time.perf_counter() - t0) * 1e3)
            if (s + 1) % 50 == 0 and not torch.isfinite(losses[-1]).item():
                break  # diverged: no point finishing
    except Exception as err:  # noqa: BLE001
        out.update(status=_status_of(err), error=repr(err)[:500], fatal=_fatal(err, dev))
    if out.get("fatal"):
        return out  # the context is gone: nothing on the device can be read back
    _sync(dev)
    if timer:
        times = [a.elapsed_time(b) for a, b in events[:len(losses)]]
    out["loss"] = torch.stack(losses).tolist() if losses else []
    out["lr"] = lrs[:len(out["loss"])]
    out["ms_step"] = times[:len(out["loss"])]
    out["tokens_per_step"] = batch * cfg.seq_len
    if dev.type == "cuda":
        out["peak_mib"] = torch.cuda.max_memory_allocated(dev) / MiB
    return out


def env_job(job: dict) -> dict:
    """The environment, taken in the worker: the parent never touches CUDA (a context there
    would take GPU memory from the measured process)."""
    return {"status": "ok", "env": _environment(job["device"]),
            "device_name": _device_name(torch.device(job["device"]))}


def run_job(job: dict) -> dict:
    kinds = {"bench": bench_job, "converge": converge_job, "env": env_job}
    try:
        result = kinds[job["kind"]](job)
    except Exception as err:  # noqa: BLE001  (a failing job is data)
        dev = torch.device(job.get("device", "cpu"))
        result = {"status": _status_of(err), "error": repr(err)[:500], "fatal": _fatal(err, dev)}
    free_memory()
    return result


# ---- running jobs in an isolated worker -----------------------------------------------------

RESULT_TAG = "@@RESULT "


def worker_loop():
    """Read one JSON job per stdin line, answer with one tagged JSON line; exit after a fatal
    CUDA error so the parent starts a fresh process."""
    for line in sys.stdin:
        if not line.strip():
            continue
        result = run_job(json.loads(line))
        print(RESULT_TAG + json.dumps(result), flush=True)
        if result.get("fatal"):
            sys.exit(3)


class InProcessRunner:
    def run(self, job, timeout_s=None):
        return run_job(job)

    def close(self):
        pass


class IsolatedRunner:
    """Runs jobs one at a time in a worker subprocess; restarts it after a crash or timeout."""

    def __init__(self, worker_cmd=None, env=None):
        root = str(Path(__file__).resolve().parent.parent)
        self.worker_cmd = worker_cmd or [sys.executable, "-m", "suite.train", "--worker"]
        self.env = dict(os.environ if env is None else env)
        self.env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, self.env.get("PYTHONPATH")]))
        self.proc = None
        self.lines = None

    def _start(self):
        self.proc = subprocess.Popen(self.worker_cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, bufsize=1, env=self.env)
        self.lines = queue.Queue()
        threading.Thread(target=self._pump, args=(self.proc, self.lines), daemon=True).start()

    @staticmethod
    def _pump(proc, lines):
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)  # EOF: the worker exited

    def _stop(self):
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
        self.proc = None

    def run(self, job, timeout_s=None):
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        try:
            self.proc.stdin.write(json.dumps(job) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass  # died at start-up; reported below as crashed
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                self._stop()
                return {"status": "timeout", "error": f"no result within {timeout_s:.0f} s; worker killed"}
            if line is None:
                code = self.proc.wait()
                self.proc = None
                return {"status": "crashed", "error": f"worker exited with code {code} during the job"}
            if line.startswith(RESULT_TAG):
                result = json.loads(line[len(RESULT_TAG):])
                if result.get("fatal"):
                    self._stop()
                return result
            sys.stdout.write("  | " + line)

    def close(self):
        if self.proc is not None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=30)
            except Exception:  # noqa: BLE001
                self._stop()
            self.proc = None


# ---- convergence verdicts -------------------------------------------------------------------

def smooth(xs, window: int):
    """Trailing moving average (the first points average what exists so far)."""
    out, acc = [], 0.0
    for i, x in enumerate(xs):
        acc += x
        if i >= window:
            acc -= xs[i - window]
        out.append(acc / min(i + 1, window))
    return out


def parity_verdict(loss, ref, *, tol: float, warmup: int, window: int) -> dict:
    """Compare a loss curve with the reference (naive) curve of the same steps and data.

    pass: after ``warmup`` steps the smoothed curve stays within ``tol`` (relative) of the
    smoothed reference, and the final loss (mean of the last ``window`` steps) is within ``tol``;
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
    devs = [abs(a - b) / abs(b) for a, b in zip(s[warmup:], s_ref[warmup:])]
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


# ---- orchestration --------------------------------------------------------------------------

def _environment(device):
    try:
        from suite.results import environment
        return environment(device)
    except Exception as err:  # noqa: BLE001  (suite.results may not exist yet)
        env = {"torch": torch.__version__, "python": sys.version.split()[0],
               "note": f"suite.results.environment unavailable: {err!r}"}
        if torch.cuda.is_available():
            env["device"] = torch.cuda.get_device_name()
            env["cuda"] = torch.version.cuda
        for mod in ("triton", "liger_kernel", "cut_cross_entropy"):
            try:
                env[mod] = __import__(mod).__version__
            except Exception:  # noqa: BLE001
                env[mod] = None
        return env


def _device_name(dev):
    return torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"


class CsvAppender:
    """Append rows to a CSV as they come (a killed run keeps what it measured). An existing file
    with the same columns is appended to (a later session re-measuring some backends keeps the
    earlier rows; readers take each backend's latest); one with other columns is an error."""

    def __init__(self, path: Path, fields):
        self.path, self.fields = path, fields
        if path.exists() and path.stat().st_size:
            with open(path, newline="") as f:
                header = next(csv.reader(f), [])
            if header != list(fields):
                raise ValueError(f"{path}: its columns are not this version's ({', '.join(fields)}); "
                                 f"move it aside or pick another --out")
            return
        with open(path, "w", newline="") as f:
            csv.DictWriter(f, fields).writeheader()

    def add(self, row: dict):
        with open(self.path, "a", newline="") as f:
            csv.DictWriter(f, self.fields, extrasaction="ignore").writerow(
                {k: _fmt(row.get(k, "")) for k in self.fields})


def _fmt(x):
    if isinstance(x, float):
        return "" if math.isnan(x) else f"{x:.6g}"
    return x


def estimate_seconds(args, gpu_gib: float = 75.0, tflops: float = 150e12) -> dict:
    """Rough wall time on an H100, for the user (no measurement depends on it). Assumes ~150
    TFLOP/s on the model, 15 ms per step of overhead, 40 * D bytes of saved activations per
    token and layer, 14 bytes per logit for the backends that materialise the logits (scaled
    by the labelled fraction for selective ones), and a search costing ~6 steps at the largest
    batch, plus the timed steps at the common batch and ~5 s of start-up per job."""
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
            timed = (args.warmup + args.timed_steps + 1) * step_s(cfg, common * args.seq_len)
            bench += search + timed + 5
    return {"convergence": conv, "bench": bench}


def run_convergence(args, runner, out: Path, deadline: float, common: dict) -> list[dict]:
    cfg = GPTConfig(args.conv_vocab, args.conv_seq_len, args.d_model, args.n_layer, args.n_head)
    runs = [(b, b) for b in args.conv_backends]
    if not args.no_rerun and "naive" in args.conv_backends:
        runs.insert(1, (RERUN_LABEL, "naive"))
    curves = CsvAppender(out / "train_curves.csv", CURVE_FIELDS)
    results = {}
    for label, backend in runs:
        left = deadline - time.monotonic()
        if left < 5:
            results[label] = {"status": "skipped", "error": "time budget (--budget-s) spent"}
            continue
        job = dict(kind="converge", run=label, backend=backend, device=args.device,
                   model=asdict(cfg), dtype=args.dtype, softcap=args.softcap, seed=args.seed,
                   steps=args.steps, batch=args.conv_batch, lr=args.conv_lr,
                   warmup_steps=args.conv_warmup, prompt_frac=args.prompt_frac)
        t0 = time.monotonic()
        res = runner.run(job, timeout_s=min(args.job_timeout_s, left))
        res.setdefault("backend", backend)
        results[label] = res
        for s, loss in enumerate(res.get("loss", [])):
            curves.add({"run": label, "backend": backend, "step": s, "loss": loss,
                        "lr": res["lr"][s], "ms_step": res["ms_step"][s] if res["ms_step"] else ""})
        final = res["loss"][-1] if res.get("loss") else float("nan")
        print(f"convergence {label:>12}: {res['status']:<11} last loss {final:.4f} "
              f"({time.monotonic() - t0:.1f} s) {res.get('error', '')}", flush=True)

    ref = results.get("naive", {}).get("loss") or []
    warm = max(args.conv_warmup, args.steps // 10)
    summary = CsvAppender(out / "train_convergence.csv", CONV_FIELDS)
    rows = []
    for label, backend in runs:
        res = results[label]
        loss = res.get("loss") or []
        row = {**common, "run": label, "backend": backend, "exact": res.get("exact", ""),
               "error": res.get("error", ""), "steps": args.steps, "steps_done": len(loss),
               "vocab": cfg.vocab, "d_model": cfg.d_model, "n_layer": cfg.n_layer,
               "seq_len": cfg.seq_len, "batch": args.conv_batch, "lr": args.conv_lr,
               "tol": args.tol, "warmup_steps": warm, "smooth": args.smooth,
               "peak_mib": res.get("peak_mib", float("nan"))}
        ms = res.get("ms_step") or []
        if ms:
            tail = ms[len(ms) // 2:]  # trained state; compile and warm-up excluded
            row["ms_step"] = statistics.median(tail)
            row["tokens_per_s"] = res["tokens_per_step"] / (row["ms_step"] / 1e3)
        if res.get("status") != "ok" and not loss:
            row["verdict"] = res.get("status", "error")
        elif label == "naive":
            row.update(verdict="reference", first_loss=loss[0],
                       final_loss=statistics.fmean(loss[-args.smooth:]))
        elif not ref:
            row["verdict"] = "no reference"
            row["error"] = row["error"] or "the naive run has no curve"
        else:
            row.update(parity_verdict(loss, ref, tol=args.tol, warmup=warm, window=args.smooth))
            if res.get("status") != "ok":
                row["verdict"] = "diverged" if row["verdict"] == "diverged" else res["status"]
        summary.add(row)
        rows.append(row)
        print(f"parity {label:>12}: {row['verdict']:<10} max dev "
              f"{_pct(row.get('max_rel_dev'))} final diff {_pct(row.get('final_rel_diff'))} "
              f"(tol {args.tol:.1%}, after step {warm}, smoothed over {args.smooth})", flush=True)
    return rows


def _pct(x):
    return "-" if x is None or x == "" or (isinstance(x, float) and math.isnan(x)) else f"{x:+.3%}"


def run_bench(args, runner, out: Path, deadline: float, common: dict) -> list[dict]:
    table = CsvAppender(out / "train_bench.csv", BENCH_FIELDS)
    rows = []
    order = sorted(args.backends, key=lambda b: b != "naive")  # naive first: it sets the batch (stable)
    for vocab in args.vocab:
        cfg = GPTConfig(vocab, args.seq_len, args.d_model, args.n_layer, args.n_head)
        n_params, n_nonemb = param_counts(cfg)
        batch = args.batch
        for backend in order:
            left = deadline - time.monotonic()
            base = {**common, **asdict(cfg), "n_params": n_params, "n_params_nonemb": n_nonemb,
                    "dtype": args.dtype, "softcap": args.softcap if args.softcap is not None else "",
                    "optimizer": "AdamW(fused)" if args.device.startswith("cuda") else "AdamW",
                    "backend": backend}
            if left < 5:
                res = {"status": "skipped", "error": "time budget (--budget-s) spent"}
            else:
                job = dict(kind="bench", backend=backend, device=args.device, model=asdict(cfg),
                           dtype=args.dtype, softcap=args.softcap, seed=args.seed, lr=1e-4,
                           prompt_frac=args.prompt_frac, search=not args.no_search,
                           max_batch=args.max_batch, warmup=args.warmup,
                           timed_steps=args.timed_steps, batch=batch or "pow2")
                t0 = time.monotonic()
                res = runner.run(job, timeout_s=min(args.job_timeout_s, left))
                res["wall_s"] = time.monotonic() - t0
            res.pop("fatal", None)
            row = {**base, **res}
            if backend == "naive" and batch is None and res.get("status") == "ok":
                batch = res.get("batch")  # the common batch for the other backends
            table.add(row)
            rows.append(row)
            print(f"bench V={vocab} {backend:>11}: {row['status']:<11} batch {row.get('batch', '-')} "
                  f"peak {_mib(row.get('peak_mib'))} loss {_mib(row.get('loss_mib'))} "
                  f"{_num(row.get('tokens_per_s'))} tok/s, max batch {row.get('max_batch', '-')} "
                  f"({row.get('wall_s', 0):.1f} s) {row.get('error', '')}", flush=True)
    return rows


def _mib(x):
    return "-" if x in (None, "") or (isinstance(x, float) and math.isnan(x)) else f"{x / 1024:.2f} GiB"


def _num(x):
    return "-" if x in (None, "") else f"{x:,.0f}"


def print_savings(rows):
    """Seed 000's comparison: peak-memory savings at the common batch, relative to naive."""
    by_vocab = {}
    for r in rows:
        by_vocab.setdefault(r["vocab"], {})[r["backend"]] = r
    for vocab, rs in by_vocab.items():
        ref = rs.get("naive", {})
        if ref.get("status") != "ok" or "peak_mib" not in ref:
            continue
        print(f"V={vocab}, batch {ref['batch']} x {ref['seq_len']}: naive peak {_mib(ref['peak_mib'])}")
        for name, r in rs.items():
            if name != "naive" and r.get("status") == "ok" and r.get("batch") == ref["batch"]:
                saved = (ref["peak_mib"] - r["peak_mib"]) / 1024
                print(f"  {name:>11}: peak {_mib(r['peak_mib'])}, saves {saved:.2f} GiB; "
                      f"max batch {r.get('max_batch', '-')} vs naive {ref.get('max_batch', '-')}")
        liger, sel = rs.get("liger_ce", {}), rs.get("selective+liger_ce", {})
        if all(x.get("status") == "ok" and x.get("batch") == ref["batch"] for x in (liger, sel)):
            print(f"  seed 000's steps (A100: -16 GB with Liger CE, then -11 GB with selective): "
                  f"here {(liger['peak_mib'] - ref['peak_mib']) / 1024:+.2f} GiB, then "
                  f"{(sel['peak_mib'] - liger['peak_mib']) / 1024:+.2f} GiB")


# ---- CLI ------------------------------------------------------------------------------------

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
    known = registry.names()
    bad = [n for n in names if n.removeprefix(SELECTIVE_PREFIX) not in known]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"unknown backend(s) {bad or text!r}; known: {', '.join(known)}, "
                                         f"and {SELECTIVE_PREFIX}<known>")
    return names


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
    a("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a("--out", default="results/train", help="output folder (default: results/train)")
    a("--backends", type=_name_list, default=list(DEFAULT_BACKENDS),
      help=f"bench backends (default: {','.join(DEFAULT_BACKENDS)})")
    a("--vocab", type=_int_list, default=[32000, 151936], help="bench vocab sizes (default: 32000,151936)")
    a("--d-model", type=int, default=512)
    a("--n-layer", type=int, default=6)
    a("--n-head", type=int, default=8)
    a("--seq-len", type=int, default=2048)
    a("--dtype", choices=("bf16", "fp32"), default="bf16", help="bf16 = bf16 autocast (default)")
    a("--softcap", type=float, default=None)
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
    a("--conv-backends", type=_name_list, default=list(DEFAULT_CONV_BACKENDS),
      help=f"convergence backends (default: {','.join(DEFAULT_CONV_BACKENDS)})")
    a("--no-rerun", action="store_true", help=f"do not train naive twice ({RERUN_LABEL})")
    a("--conv-vocab", type=int, default=32000)
    a("--conv-seq-len", type=int, default=1024)
    a("--conv-batch", type=int, default=16)
    a("--conv-lr", type=float, default=1e-3)
    a("--conv-warmup", type=int, default=30, help="lr warm-up steps (default: 30)")
    a("--tol", type=float, default=0.01, help="parity tolerance, relative (default: 0.01)")
    a("--smooth", type=int, default=20, help="moving-average window of the parity check (default: 20)")
    a("--budget-s", type=float, default=510,
      help="wall-time budget; a job still running at its end is killed, later ones are recorded "
           "as skipped (default: 510)")
    a("--job-timeout-s", type=float, default=240, help="a job running longer is killed (default: 240)")
    a("--in-process", action="store_true", help="run jobs in this process (no crash isolation)")
    a("--strict", action="store_true", help="exit 1 when a convergence parity check fails")
    a("--replot", action="store_true", help="only redraw the plots from the CSVs in --out")


def _check_args(args):
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


def main(args) -> int:
    out = Path(args.out)
    if args.replot:
        for path in make_plots(out):
            print(path)
        return 0
    _check_args(args)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    deadline = t0 + args.budget_s
    runner = InProcessRunner() if args.in_process else IsolatedRunner()
    env = runner.run({"kind": "env", "device": args.device}, timeout_s=120)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
    common = {"run_id": f"{out.name}-{stamp.replace(':', '')}", "timestamp": stamp,
              "device": env.get("device_name", "unknown")}
    # A folder measured again (some backends, a later commit) keeps the first session's
    # env.json; each later session's goes to env-<k>.json, its run_id tying it to its rows.
    env_path, session = out / "env.json", 2
    while env_path.exists():
        env_path, session = out / f"env-{session}.json", session + 1
    env_path.write_text(json.dumps(
        {**env.get("env", {"error": env.get("error")}), "run_id": common["run_id"],
         "train_args": {k: v for k, v in vars(args).items() if not k.startswith("_") and k != "command"}},
        indent=2, default=str))
    est = estimate_seconds(args)
    n_params, n_nonemb = param_counts(GPTConfig(32000, args.seq_len, args.d_model, args.n_layer, args.n_head))
    print(f"train-bench: model d{args.d_model} x {args.n_layer} layers: {n_params / 1e6:.1f}M params "
          f"at V=32000 with embeddings + lm head ({n_nonemb / 1e6:.1f}M without)")
    print(f"train-bench: expected ~{est['convergence'] / 60:.1f} min convergence + "
          f"~{est['bench'] / 60:.1f} min bench on an H100 (rough); budget {args.budget_s:.0f} s",
          flush=True)
    conv_rows = []
    try:
        if args.mode in ("convergence", "all"):
            conv_rows = run_convergence(args, runner, out, deadline, common)
        if args.mode in ("bench", "all"):
            print_savings(run_bench(args, runner, out, deadline, common))
    finally:
        runner.close()
    try:
        for path in make_plots(out):
            print(f"train-bench: wrote {path}")
    except Exception as err:  # noqa: BLE001  (the CSVs are the results; a plot can be redrawn)
        print(f"train-bench: plotting failed ({err!r}); redraw with --replot")
    print(f"train-bench: done in {time.monotonic() - t0:.0f} s; results in {out}")
    not_run = [r["run"] for r in conv_rows if r.get("verdict") in ("unavailable", "unsupported", "skipped")]
    failed = [r["run"] for r in conv_rows
              if r.get("verdict") not in ("pass", "reference") and r["run"] not in not_run]
    if not_run:
        print(f"train-bench: convergence not run for: {', '.join(not_run)}")
    if failed:
        print(f"train-bench: convergence parity FAILED for: {', '.join(failed)}")
    return 1 if (args.strict and failed) else 0


def make_plots(out: Path) -> list[Path]:
    """train_bench and train_convergence figures of the run folder ``out``, drawn by
    suite.plots (imported here: the worker never needs matplotlib)."""
    from suite import plots

    return plots.plot_training([out], out)


if __name__ == "__main__":
    if sys.argv[1:] == ["--worker"]:
        worker_loop()
    else:
        parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
        add_arguments(parser)
        raise SystemExit(main(parser.parse_args()))
