"""The training-step bench: per vocabulary and backend, the largest batch that fits and, at a
common batch, the whole step's peak memory (and its breakdown) and tokens/s. Timing and OOM
handling are suite.measure's: warm-up steps untimed, one step measured for memory, then timed
steps between CUDA events, their median."""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch

from suite.kernel.profile import own_path_of
from suite.measure import MIB, RegionTimer, free_memory, is_oom, time_calls, time_stats
from suite.results import CsvAppender
from suite.schema import TRAIN_BENCH_CSV, TRAIN_BENCH_FIELDS
from suite.train import hf
from suite.train.backends import failure, provider_problem
from suite.train.data import IGNORE_INDEX, instruction_batch, markov_chain, sample_tokens
from suite.train.model import (GPT, GPTConfig, init_optimizer_state, make_optimizer,
                               memory_breakdown_mib, param_counts, split_step_memory,
                               static_memory, train_step)


def _free_all():
    free_memory(torch.device("cuda" if torch.cuda.is_available() else "cpu"))


# ---- largest batch that fits ---------------------------------------------------------------

def fits_by_running(step, cleanup=_free_all):
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


# ---- one bench job (in the worker) ----------------------------------------------------------

@dataclass
class _Setup:
    """A job's model with its optimizer state allocated, the tokens of its largest batch, and
    its step (a GPT with a loss provider, or a Hugging Face model with a patched loss)."""
    dev: torch.device
    seq_len: int
    model: torch.nn.Module
    opt: torch.optim.Optimizer
    static: dict
    idx: torch.Tensor
    targets: torch.Tensor  # next-token targets (GPT) or Hugging Face labels (hf)
    step_fn: Callable      # (idx, targets) -> loss: one whole training step
    split_fn: Callable     # (idx, targets) -> dict: the same step split at E, bytes

    def step(self, batch: int):
        return self.step_fn(self.idx[:batch], self.targets[:batch])

    def split(self, batch: int) -> dict:
        return self.split_fn(self.idx[:batch], self.targets[:batch])


def _batch_rows(job: dict) -> int:
    """Sequences to sample: the largest batch the job may try."""
    return max(job["max_batch"] if job.get("search") else 0,
               job["batch"] if isinstance(job.get("batch"), int) else 0, 1)


def _setup(job: dict, provider) -> _Setup:
    dev = torch.device(job["device"])
    cfg = GPTConfig(**job["model"])
    torch.manual_seed(job["seed"])
    with dev:
        model = GPT(cfg)
    opt = make_optimizer(model, job["lr"], dev)
    init_optimizer_state(model, opt)
    chain = markov_chain(cfg.vocab, seed=job["seed"])
    idx, targets = instruction_batch(
        sample_tokens(chain, _batch_rows(job), cfg.seq_len + 1, seed=job["seed"] + 1, device=dev),
        prompt_frac=tuple(job["prompt_frac"]), seed=job["seed"] + 2)
    amp, softcap = job["dtype"] == "bf16", job.get("softcap")

    def loss_fn(e, c, t, **kw):
        return provider.fn(e, c, t, **kw)

    return _Setup(dev, cfg.seq_len, model, opt, static_memory(model), idx, targets,
                  lambda i, t: train_step(model, opt, i, t, loss_fn, amp=amp, softcap=softcap),
                  lambda i, t: split_step_memory(model, opt, i, t, loss_fn, amp=amp,
                                                 softcap=softcap))


def _hf_setup(job: dict) -> _Setup:
    """A Hugging Face model (``job['hf']``: arch and config kwargs) patched for the job's
    backend; raises hf.Unsupported when the backend cannot patch it."""
    dev = torch.device(job["device"])
    arch, kwargs = job["hf"]["arch"], job["hf"]["config"]
    torch.manual_seed(job["seed"])
    model = hf.build_model(arch, kwargs, dev)
    hf.apply_backend(model, job["backend"], arch)
    opt = make_optimizer(model, job["lr"], dev)
    init_optimizer_state(model, opt)
    idx, labels = hf.corpus(kwargs["vocab_size"], _batch_rows(job), job["seq_len"],
                            prompt_frac=job["prompt_frac"], seed=job["seed"], device=dev)
    amp = job["dtype"] == "bf16"
    return _Setup(dev, job["seq_len"], model, opt, static_memory(model), idx, labels,
                  lambda i, t: hf.hf_train_step(model, opt, i, t, amp=amp),
                  lambda i, t: hf.hf_split_step_memory(model, opt, i, t, amp=amp))


def _search(s: _Setup, max_batch: int) -> dict:
    """The largest batch that fits (CUDA only: OOM is only caught there), as row fields."""
    if s.dev.type != "cuda":
        return {"search_log": "no search: OOM is only caught on CUDA"}
    peaks, speed = {}, {}

    def one_try(b):
        s.opt.zero_grad(set_to_none=True)
        torch.cuda.reset_peak_memory_stats(s.dev)
        timer = RegionTimer(s.dev)
        with timer.region():
            s.step(b)
        speed[b] = b * s.seq_len / (timer.times()[0] / 1e3)
        peaks[b] = torch.cuda.max_memory_allocated(s.dev)

    def cleanup():
        s.opt.zero_grad(set_to_none=True)
        free_memory(s.dev)

    t0 = time.perf_counter()
    best, log = largest_batch(fits_by_running(one_try, cleanup), max_batch)
    return dict(max_batch=best, max_batch_capped=int(best == max_batch),
                max_batch_peak_mib=peaks.get(best, float("nan")) / MIB,
                max_batch_tokens_per_s=speed.get(best, float("nan")),
                search_log=" ".join(f"{b}{'+' if ok else '-'}" for b, ok in log),
                search_s=time.perf_counter() - t0)


def _peak_of_one_step(s: _Setup, batch: int) -> int:
    """max_memory_allocated (bytes) over one plain step."""
    torch.cuda.synchronize(s.dev)
    torch.cuda.reset_peak_memory_stats(s.dev)
    s.step(batch)
    torch.cuda.synchronize(s.dev)
    return torch.cuda.max_memory_allocated(s.dev)


def _measure_batch(s: _Setup, job: dict, batch: int) -> dict:
    """Peak memory, its breakdown and step times at ``batch``, as row fields."""
    row = dict(batch=batch, tokens_per_step=batch * s.seq_len,
               ignored_frac=(s.targets[:batch] == IGNORE_INDEX).float().mean().item())
    cuda = s.dev.type == "cuda"
    if cuda:
        split = s.split(batch)
    for _ in range(job["warmup"]):
        s.step(batch)
    peak = _peak_of_one_step(s, batch) if cuda else None
    # No L2 flush: a step streams far more than any L2 holds, and the flush buffer (256 MiB)
    # would only take memory from a batch chosen near the edge of memory.
    stats = time_stats(time_calls(lambda _: s.step(batch), device=s.dev, reps=job["timed_steps"],
                                  flush_l2=False))
    row.update(ms_step=stats["ms"], ms_step_p20=stats["ms_p20"], ms_step_p80=stats["ms_p80"],
               tokens_per_s=batch * s.seq_len / (stats["ms"] / 1e3))
    if cuda:
        row.update(peak_mib=peak / MIB, saved_act_mib=split["saved_act"] / MIB,
                   split_peak_mib=split["peak"] / MIB, loss_path=_loss_path(s, batch),
                   **memory_breakdown_mib(peak, s.static, split["loss"]))
    return row


def _loss_path(s: _Setup, batch: int) -> str:
    """The own kernel's path in one step at ``batch`` (profile.own_path_of over the GPU
    kernels the step launched): what ran, as the step's autocast and weights chose it."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        s.step(batch)
        torch.cuda.synchronize(s.dev)
    return own_path_of(ev.name for ev in prof.events())


def _common_batch(batch, row: dict):
    """The job's ``batch``: an int, "max" for the batch just found, or "pow2" for the largest
    power of two up to it (a margin below the edge of memory)."""
    if batch == "pow2" and row.get("max_batch"):
        return 2 ** int(math.log2(row["max_batch"]))
    if batch in ("max", "pow2"):
        return row.get("max_batch")
    return batch


def _job_problem(job: dict, dev) -> tuple[int, str | None, str | None]:
    """(exact, status, reason) of the job's backend: status None when it can run here."""
    if job.get("hf"):
        return hf.backend_problem(job["backend"], dev)
    provider, status, reason = provider_problem(job["backend"], dev, job.get("softcap"))
    return int(provider.exact), status, reason


def _job_setup(job: dict) -> _Setup:
    if job.get("hf"):
        return _hf_setup(job)
    return _setup(job, provider_problem(job["backend"], torch.device(job["device"]),
                                        job.get("softcap"))[0])


def bench_job(job: dict) -> dict:
    """Search the largest batch (``job['search']``) and/or measure one batch (``job['batch']``)
    for one backend and model (a GPT of ``job['model']``, or ``job['hf']``)."""
    dev = torch.device(job["device"])
    row = {"backend": job["backend"], "status": "ok", "error": ""}
    row["exact"], status, reason = _job_problem(job, dev)
    if status:
        return {**row, "status": status, "error": reason}
    try:
        s = _job_setup(job)
    except hf.Unsupported as err:
        return {**row, "status": "unsupported", "error": str(err)}
    if job.get("search"):
        try:
            row.update(_search(s, job["max_batch"]))
        except Exception as err:  # noqa: BLE001 - a failing backend is data
            return {**row, **failure(err, dev, "search: ")}
        if row.get("max_batch") == 0:
            return {**row, "status": "oom", "error": "batch 1 does not fit"}
    batch = _common_batch(job.get("batch"), row)
    if not batch:
        return row
    try:
        row.update(_measure_batch(s, job, batch))
    except Exception as err:  # noqa: BLE001
        s.opt.zero_grad(set_to_none=True)
        return {**row, **failure(err, dev)}
    return row


# ---- the bench over vocabularies and backends (in the parent) --------------------------------

def bench_settings(args) -> list[tuple[dict, dict]]:
    """(the rows' model columns, the jobs' model fields) of each model the bench measures: one
    GPT per ``--vocab``, or the one Hugging Face model of ``args.hf``."""
    if getattr(args, "hf", None):
        fields = hf.shape_fields(args.hf["arch"], args.hf["config"], args.seq_len)
        return [(fields, dict(hf=args.hf, seq_len=args.seq_len, softcap=None))]
    settings = []
    for vocab in args.vocab:
        cfg = GPTConfig(vocab, args.seq_len, args.d_model, args.n_layer, args.n_head)
        n_params, n_nonemb = param_counts(cfg)
        fields = {"model": "gpt", **asdict(cfg), "n_params": n_params, "n_params_nonemb": n_nonemb,
                  "softcap": args.softcap if args.softcap is not None else ""}
        settings.append((fields, dict(model=asdict(cfg), softcap=args.softcap)))
    return settings


def _bench_base(args, fields: dict, common: dict, backend: str) -> dict:
    return {**common, **fields, "dtype": args.dtype,
            "optimizer": "AdamW(fused)" if args.device.startswith("cuda") else "AdamW",
            "backend": backend}


def _bench_job_of(args, model_fields: dict, backend: str, batch) -> dict:
    return dict(kind="bench", backend=backend, device=args.device, **model_fields,
                dtype=args.dtype, seed=args.seed, lr=1e-4,
                prompt_frac=args.prompt_frac, search=not args.no_search,
                max_batch=args.max_batch, warmup=args.warmup, timed_steps=args.timed_steps,
                batch=batch or "pow2")


def run_bench(args, runner, out: Path, deadline: float, common: dict) -> list[dict]:
    table = CsvAppender(out / TRAIN_BENCH_CSV, TRAIN_BENCH_FIELDS, extras="ignore")
    rows = []
    reference = hf.reference_backend(args)
    order = sorted(args.backends, key=lambda b: b != reference)  # it sets the batch (stable)
    for fields, model_fields in bench_settings(args):
        batch = args.batch
        for backend in order:
            left = deadline - time.monotonic()
            if left < 5:
                res = {"status": "skipped", "error": "time budget (--budget-s) spent"}
            else:
                t0 = time.monotonic()
                res = runner.run(_bench_job_of(args, model_fields, backend, batch),
                                 timeout_s=min(args.job_timeout_s, left))
                res["wall_s"] = time.monotonic() - t0
            res.pop("fatal", None)
            row = {**_bench_base(args, fields, common, backend), **res}
            if backend == reference and batch is None and res.get("status") == "ok":
                batch = res.get("batch")  # the common batch for the other backends
            table.add(row)
            rows.append(row)
            print(f"bench V={fields['vocab']} {backend:>11}: {row['status']:<11} batch "
                  f"{row.get('batch', '-')} peak {_gib(row.get('peak_mib'))} loss "
                  f"{_gib(row.get('loss_mib'))} {_count(row.get('tokens_per_s'))} tok/s, max batch "
                  f"{row.get('max_batch', '-')} ({row.get('wall_s', 0):.1f} s) "
                  f"{row.get('error', '')}", flush=True)
    return rows


def _gib(x):
    return "-" if x in (None, "") or (isinstance(x, float) and math.isnan(x)) else f"{x / 1024:.2f} GiB"


def _count(x):
    return "-" if x in (None, "") else f"{x:,.0f}"


def print_savings(rows, reference: str = "naive"):
    """Seed 000's comparison: peak-memory savings at the common batch, relative to the
    reference backend (naive, or hf_loss for a Hugging Face model)."""
    by_vocab = {}
    for r in rows:
        by_vocab.setdefault(r["vocab"], {})[r["backend"]] = r
    for vocab, rs in by_vocab.items():
        ref = rs.get(reference, {})
        if ref.get("status") != "ok" or "peak_mib" not in ref:
            continue
        print(f"V={vocab}, batch {ref['batch']} x {ref['seq_len']}: {reference} peak {_gib(ref['peak_mib'])}")
        for name, r in rs.items():
            if name != reference and r.get("status") == "ok" and r.get("batch") == ref["batch"]:
                saved = (ref["peak_mib"] - r["peak_mib"]) / 1024
                print(f"  {name:>11}: peak {_gib(r['peak_mib'])}, saves {saved:.2f} GiB; "
                      f"max batch {r.get('max_batch', '-')} vs {reference} {ref.get('max_batch', '-')}")
        liger, sel = rs.get("liger_ce", {}), rs.get("selective+liger_ce", {})
        if all(x.get("status") == "ok" and x.get("batch") == ref["batch"] for x in (liger, sel)):
            print(f"  seed 000's steps (A100: -16 GB with Liger CE, then -11 GB with selective): "
                  f"here {(liger['peak_mib'] - ref['peak_mib']) / 1024:+.2f} GiB, then "
                  f"{(sel['peak_mib'] - liger['peak_mib']) / 1024:+.2f} GiB")
