"""A real multi-GPU training step: a Hugging Face causal LM under FSDP2, per loss backend.

    python -m suite.train.distributed --out results/train-2gpu        # two GPUs, ~5 minutes

Each configuration ``backend[+tp|+head]@world`` trains the same model (``suite.train.hf``'s Llama
from its config: ~1B parameters, Llama 3's vocabulary 128256, random init, seeded alike on
every rank) for ``--steps`` steps on the same global batches, in a fresh world of ``world``
processes (torch.multiprocessing, NCCL, one GPU each; gloo on the CPU) launched here, with
NVLink multicast off in every rank (``MULTICAST_OFF``):

- ``backend@W``: FSDP2 (fully_shard on every decoder layer, then the root, which holds the
  embedding, the final norm and lm_head), ``MixedPrecisionPolicy(param_dtype=bf16,
  reduce_dtype=fp32)`` and bf16 autocast (fp32 and no policy with ``--dtype fp32``), data
  parallel: each rank takes its ``--batch`` sequences of the step's ``W x --batch``. The loss
  is each rank's sum over its used targets divided by (the global count / W)
  (``num_items_in_batch``): FSDP's gradient average is then the gradient of the global batch's
  mean, the single-GPU run's. ``W = 1`` is the single-GPU run of the same global batch.
- ``backend+tp@W``: lm_head tensor-parallel (ColwiseParallel with the output gathered,
  transformers' ``colwise_rep``: vocabulary-sharded over the W ranks; ``own`` takes the
  DTensor weight's vocab-parallel path and builds no logits, ``hf_loss`` computes its logits'
  shards and gathers them), the trunk (model.model)
  under FSDP2; the data replicated (every rank trains on the whole global batch), so the trunk's
  work is repeated on each rank: the configuration shows the head's memory and time.
- ``backend+head@W``: as ``backend@W`` with lm_head its own FSDP unit: its gradient's
  reduce-scatter can start when the loss's backward ends, under the layers' backward, where in
  the root (with the embedding) it waits for the whole backward and runs exposed
  (step_profile.unit_collectives reads which).

Backends: ``own`` (own_kernel.transformers.patch), ``hf_loss`` (the model's own logits and
loss), ``liger_flce`` (Liger's fused linear cross entropy; suite.train.hf.apply_backend).
AdamW (foreach), linear warm-up then cosine decay, gradient clipping at 1.0 over the
sharded gradients. Every step is timed (CUDA events); steps after ``--warmup`` give the median
step time and tokens/s (global tokens per step over it). Peak memory: each rank's
max_memory_allocated over the whole run (model, optimizer states, steps).

Host synchronisations: the last warm-up step runs under ``torch.cuda.set_sync_debug_mode("warn")``
with ``torch.cuda.Event.synchronize`` counted too (HostSyncCounter): ``host_syncs_per_step``
(the most of any rank), ``host_sync_wait_ms`` (the host's time blocked in those Event waits)
and ``host_sync_sites`` (where). Under FSDP2 the host must run ahead of
the GPU to queue the backward's all-gathers and reduce-scatters; a wait at the loss stops it.

``--max-batch CAP``: after each configuration, its per-rank batch doubled in fresh worlds of
``--max-batch-steps`` steps until one runs out of memory (a result, not an error), the next
would pass CAP, or ``--max-batch-budget-s`` is spent: ``largest_batch_per_rank``, its step time
and tokens/s, and ``max_batch_stop`` (why the search stopped: oom@B, error@B, cap, budget).

A world of 2 first measures NCCL's all-reduce (``nccl_allreduce.csv``: bytes, dtype, ms,
algorithm and bus bandwidth) for the scaling note (suite/report/scaling.py).

Files in ``--out``: ``results.csv`` (a row per configuration: time, tokens/s, peak memory per
rank, final loss, and loss parity against the single-GPU run of the same backend, or of
hf_loss, over the whole curve: suite.train.convergence.parity_verdict), ``curves.csv`` (the loss
of every step), ``nccl_allreduce.csv``, ``env.json``.
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import datetime as dt
import json
import os
import socket
import statistics
import sys
import time
import traceback
import warnings
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist

MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                 "NVSHMEM_DISABLE_NVLS": "1"}
BACKENDS = ("own", "hf_loss", "liger_flce")
TP_BACKENDS = ("own", "hf_loss")  # +tp, +head: lm_head sharded apart (Liger needs a plain weight)
DEFAULT_CONFIGS = "own@1,hf_loss@1,own@2,hf_loss@2,liger_flce@2,own+tp@2,hf_loss+tp@2"
RESULT_FIELDS = ["config", "backend", "variant", "own_config", "world_size", "tp_head", "head_unit",
                 "status", "error", "model", "vocab",
                 "hidden", "layers", "n_params", "seq_len", "batch_per_rank", "global_tokens",
                 "steps", "ms", "ms_p20", "ms_p80", "tokens_per_s", "peak_mib_max",
                 "peak_mib_per_rank", "worlds", "world_ms", "final_loss", "parity_ref", "max_rel_dev",
                 "final_rel_diff", "verdict", "host_ms", "host_syncs_per_step", "host_sync_wait_ms",
                 "host_sync_sites",
                 "largest_batch_per_rank", "largest_batch_ms", "largest_batch_tokens_per_s",
                 "max_batch_stop", "device", "run_id"]
NCCL_FIELDS = ["world_size", "dtype", "bytes", "ms", "algbw_gbs", "busbw_gbs"]
PROFILE_FIELDS = ["config", "profiled_steps", "kernels", "compute_window_ms", "compute_busy_ms",
                  "compute_idle_ms", "own_ms", "gemm_ms", "other_ms", "nccl_ms",
                  "nccl_AllGather_ms", "nccl_ReduceScatter_ms", "nccl_AllReduce_ms",
                  "nccl_exposed_ms", "root_nccl_ms", "root_nccl_exposed_ms"]
NCCL_SIZES = [2 ** k for k in range(12, 30, 2)] + [2 ** 29]  # 4 KiB .. 512 MiB


# ``own:<variant>``: the own backend under a config override (CCE_OWN_CONFIG in its ranks), to
# measure a candidate route in the same run as the default.
OWN_VARIANTS = {
    "recompute": {"fused": {"default_workspace_mib": 0}},      # the backward in the backward
    "cublas-logits": {"fused": {"logits_shifted": False}},    # cuBLAS writes the chunk's logits
    "ws4g": {"fused": {"default_workspace_mib": 4096}},       # fewer, larger row chunks
}


@dataclass(frozen=True)
class RunConfig:
    backend: str
    world: int
    tp_head: bool
    variant: str = ""     # a key of OWN_VARIANTS (own only)
    head_unit: bool = False  # lm_head its own FSDP unit (+head)

    @property
    def name(self) -> str:
        variant = f":{self.variant}" if self.variant else ""
        head = "+tp" if self.tp_head else "+head" if self.head_unit else ""
        return f"{self.backend}{variant}{head}@{self.world}"

    @property
    def own_config(self) -> dict | None:
        return OWN_VARIANTS[self.variant] if self.variant else None


def parse_configs(text: str) -> list[RunConfig]:
    """'own@1,own+tp@2,own+head@2' -> configs; a clear error naming --configs otherwise."""
    configs = []
    for item in (x.strip() for x in text.split(",") if x.strip()):
        head, _, world = item.partition("@")
        backend, _, modifier = head.partition("+")
        backend, _, variant = backend.partition(":")
        tp = modifier == "tp"
        if variant and (backend != "own" or variant not in OWN_VARIANTS):
            raise ValueError(f"--configs: {item!r}: a variant is own:<one of "
                             f"{', '.join(OWN_VARIANTS)}>")
        if backend not in BACKENDS or modifier not in ("", "tp", "head") or not world.isdigit():
            raise ValueError(f"--configs: {item!r} is not backend[+tp|+head]@world with backend "
                             f"one of {', '.join(BACKENDS)}")
        if int(world) < 1 or (tp and int(world) < 2):
            raise ValueError(f"--configs: {item!r}: world >= 1 (>= 2 with +tp)")
        if modifier and backend not in TP_BACKENDS:
            raise ValueError(f"--configs: {item!r}: +{modifier} with {', '.join(TP_BACKENDS)} "
                             f"only ({backend} reads lm_head.weight as a plain tensor)")
        configs.append(RunConfig(backend, int(world), tp, variant, modifier == "head"))
    if not configs:
        raise ValueError("--configs: empty")
    return configs


@dataclass(frozen=True)
class Settings:
    arch: str
    tiny: bool
    device: str           # "cuda" or "cpu"
    dtype: str            # "bf16" (mixed precision) or "fp32"
    steps: int
    warmup: int           # steps left out of the timing
    batch: int            # sequences per rank (data parallel)
    seq_len: int
    lr: float
    lr_warmup: int
    seed: int
    max_world: int        # the global batch: max_world * batch sequences
    profile_steps: int = 0  # after the timed steps, this many more under torch.profiler (rank 0)

    @property
    def global_seqs(self) -> int:
        return self.max_world * self.batch


# ---- one rank ----------------------------------------------------------------------------------

def _build(cfg: RunConfig, s: Settings, device, mesh):
    """The model on ``device``, its backend applied, sharded as the configuration says."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from suite.train import hf

    kwargs = hf.config_kwargs(s.arch, seq_len=s.seq_len, tiny=s.tiny)
    torch.manual_seed(s.seed)  # the same initial weights on every rank and world
    model = hf.build_model(s.arch, kwargs, device)
    hf.apply_backend(model, cfg.backend, s.arch)
    policy = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
              if s.dtype == "bf16" else MixedPrecisionPolicy())
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    if cfg.tp_head:
        from torch.distributed.tensor import Replicate
        from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module
        # transformers' "colwise_rep": the logits gathered for the model's own loss (hf_loss);
        # the own kernel's patch builds no logits and takes the sharded weight.
        head = ColwiseParallel(output_layouts=Replicate())
        parallelize_module(model, mesh, {"lm_head": head})
        fully_shard(model.model, mesh=mesh, mp_policy=policy)
    else:
        if cfg.head_unit:  # before the root, which then holds the embedding and the norm
            fully_shard(model.lm_head, mesh=mesh, mp_policy=policy)
        fully_shard(model, mesh=mesh, mp_policy=policy)
    return model, kwargs


def _clip_(params, max_norm: float, world: int) -> None:
    """Clip the gradients' global norm: each DTensor's local shard squared, summed over the
    ranks (plain tensors are replicated: each rank adds 1/world of theirs)."""
    from torch.distributed.tensor import DTensor
    grads = [p.grad for p in params if p.grad is not None]
    sq = torch.zeros((), device=grads[0].device, dtype=torch.float32)
    for g in grads:
        local = g.to_local() if isinstance(g, DTensor) else g
        sq += local.float().square().sum() / (1 if isinstance(g, DTensor) else world)
    dist.all_reduce(sq)
    scale = (max_norm / (sq.sqrt() + 1e-6)).clamp(max=1.0)
    for g in grads:
        (g.to_local() if isinstance(g, DTensor) else g).mul_(scale)


def _step_batch(cfg: RunConfig, s: Settings, idx, labels, step: int, rank: int):
    """This rank's (input ids, labels, num_items_in_batch) of ``step``."""
    rows = slice(step * s.global_seqs, (step + 1) * s.global_seqs)
    ids, lab = idx[rows], labels[rows]
    count = (lab[:, 1:] != -100).sum().float()
    if cfg.tp_head:  # replicated data: every rank the whole batch, its sum over the global count
        return ids, lab, count
    per = s.global_seqs // cfg.world
    mine = slice(rank * per, (rank + 1) * per)
    return ids[mine], lab[mine], count / cfg.world


class HostSyncCounter:
    """Counts the host's waits for the GPU inside a ``with`` block: the synchronising CUDA calls
    that torch's sync debug mode reports as warnings (.item(), float(tensor), nonzero, boolean
    mask indexing, a blocking copy, stream or device synchronize) and every
    ``torch.cuda.Event.synchronize``, which that mode does not see (own_kernel's HostScalar
    reads wait on one). Under FSDP2 such a wait at the loss stops the host from running ahead
    to queue the backward's all-gathers and reduce-scatters. ``sites``: where they were
    called (file:line of the first frames outside torch), at most ``MAX_SITES``.
    ``event_wait_ms``: the host's time blocked in those Event waits (a wait on work already
    done costs ~0: a count alone does not tell a harmless read from a stall)."""

    MAX_SITES = 6

    def __init__(self, cuda: bool, event_cls: type | None = None):
        self.cuda = cuda
        self.event_cls = event_cls if event_cls is not None else (
            torch.cuda.Event if cuda else None)
        self.count = 0
        self.event_wait_ms = 0.0
        self.sites: list[str] = []

    def _add(self, site: str) -> None:
        self.count += 1
        if site not in self.sites and len(self.sites) < self.MAX_SITES:
            self.sites.append(site)

    def __enter__(self) -> "HostSyncCounter":
        self._catch = warnings.catch_warnings(record=True)
        self._caught = self._catch.__enter__()
        warnings.simplefilter("always")  # every sync, not the first per call site
        if self.cuda:
            torch.cuda.set_sync_debug_mode("warn")
        if self.event_cls is not None:
            original = self._original = self.event_cls.synchronize

            def synchronize(event, *args, **kwargs):
                self._add(_caller_sites(traceback.extract_stack()[:-1]))
                t0 = time.perf_counter()
                try:
                    return original(event, *args, **kwargs)
                finally:
                    self.event_wait_ms += (time.perf_counter() - t0) * 1e3
            self.event_cls.synchronize = synchronize
        return self

    def __exit__(self, *exc) -> None:
        if self.cuda:
            torch.cuda.set_sync_debug_mode(0)
        if self.event_cls is not None:
            self.event_cls.synchronize = self._original
        self._catch.__exit__(*exc)
        for w in self._caught:
            if "synchroniz" in str(w.message):
                self._add(f"{Path(w.filename).name}:{w.lineno}")
            else:  # not ours: shown as it would have been
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)


def _caller_sites(stack) -> str:
    """'gemm.py:120<fused.py:245': the two innermost frames outside torch and this file."""
    torch_dir = str(Path(torch.__file__).parent)
    frames = [f for f in reversed(stack)
              if not f.filename.startswith(torch_dir) and f.filename != __file__]
    return "<".join(f"{Path(f.filename).name}:{f.lineno}" for f in frames[:2])


def _step(cfg: RunConfig, s: Settings, model, opt, device, batch) -> torch.Tensor:
    """One optimizer step on this rank's (input ids, labels, num_items_in_batch); the loss."""
    from torch.profiler import record_function  # phases named in a profiled step's trace

    ids, lab, items = batch
    with record_function("step:forward"), torch.autocast(device.type, dtype=torch.bfloat16,
                                                         enabled=s.dtype == "bf16"):
        loss = model(input_ids=ids, labels=lab, num_items_in_batch=items).loss
    with record_function("step:backward"):
        loss.backward()
    with record_function("step:optimizer"):
        _clip_(list(model.parameters()), 1.0, cfg.world)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return loss


def _train(cfg: RunConfig, s: Settings, model, device, rank: int,
           trace_dir: Path | None = None) -> dict:
    """Every step timed (CUDA events); the last warm-up step (untimed, past the first calls'
    one-time work: autotuning, cuBLAS probes) counts the host's waits for the GPU
    (HostSyncCounter) from the forward to the optimizer step."""
    from suite.train import hf
    from suite.train.convergence import lr_at

    cuda = device.type == "cuda"
    idx, labels = hf.corpus(model.config.vocab_size, s.steps * s.global_seqs, s.seq_len,
                            prompt_frac=(0.5, 0.7), seed=s.seed + 1, device=device)
    opt = torch.optim.AdamW(model.parameters(), lr=s.lr, weight_decay=0.1)  # foreach: DTensor-safe
    probe_step = min(max(s.warmup - 1, 0), s.steps - 1)
    losses, times, host_ms, syncs = [], [], [], HostSyncCounter(cuda)
    for step in range(s.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps=s.steps, lr=s.lr, warmup=s.lr_warmup)
        batch = _step_batch(cfg, s, idx, labels, step, rank)
        t0 = time.perf_counter()
        start = torch.cuda.Event(enable_timing=True) if cuda else None
        end = torch.cuda.Event(enable_timing=True) if cuda else None
        if cuda:
            start.record()
        if step == probe_step:
            with syncs:
                loss = _step(cfg, s, model, opt, device, batch)
        else:
            loss = _step(cfg, s, model, opt, device, batch)
        if cuda:
            end.record()
            host_ms.append((time.perf_counter() - t0) * 1e3)  # the host's queueing, no wait
            end.synchronize()
        times.append(start.elapsed_time(end) if cuda else (time.perf_counter() - t0) * 1e3)
        whole = loss.detach().float().reshape(1)
        if not cfg.tp_head:  # data parallel: the global mean is the ranks' parts summed / W
            dist.all_reduce(whole)
            whole /= cfg.world
        losses.append(float(whole))
    result = {"losses": losses, "ms": times, "host_ms": host_ms, "host_syncs": syncs.count,
              "host_sync_wait_ms": syncs.event_wait_ms, "host_sync_sites": syncs.sites}
    if s.profile_steps and cuda:
        result["profile"] = _profiled_steps(cfg, s, model, opt, device, rank, idx, labels,
                                            trace_dir)
    return result


def _profiled_steps(cfg: RunConfig, s: Settings, model, opt, device, rank: int, idx, labels,
                    trace_dir: Path | None) -> dict | None:
    """``s.profile_steps`` more steps (the first batches again), under torch.profiler on rank
    0 (every rank runs them: they hold collectives): its summary (step_profile.py), and its
    chrome trace, gzipped, in ``trace_dir``. Not timed with the others: the profiler costs."""
    import gzip
    import shutil

    from torch.profiler import ProfilerActivity, profile
    from suite.train import step_profile

    steps = [_step_batch(cfg, s, idx, labels, i % s.steps, rank) for i in range(s.profile_steps)]
    torch.cuda.synchronize(device)
    if rank != 0:
        for batch in steps:
            _step(cfg, s, model, opt, device, batch)
        torch.cuda.synchronize(device)
        return None
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        for batch in steps:
            _step(cfg, s, model, opt, device, batch)
        torch.cuda.synchronize(device)
    raw = Path(trace_dir or ".") / f"trace_{cfg.name.replace('@', '-at-')}.json"
    prof.export_chrome_trace(str(raw))
    summary = step_profile.summarise_trace_file(raw, s.profile_steps)
    with open(raw, "rb") as src, gzip.open(f"{raw}.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    raw.unlink()
    return summary


def nccl_allreduce(device, world: int, reps: int = 10, warmup: int = 3) -> list[dict]:
    """All-reduce (SUM) time per message size and dtype on this world: algorithm bandwidth
    bytes / time, bus bandwidth x 2 (W - 1) / W (what each link carries in a ring)."""
    rows = []
    for dtype in (torch.bfloat16, torch.float32):
        for size in NCCL_SIZES if device.type == "cuda" else NCCL_SIZES[:1]:
            buf = torch.ones(size // dtype.itemsize, dtype=dtype, device=device)
            for _ in range(warmup):
                dist.all_reduce(buf)
            ms = []
            for _ in range(reps):
                dist.barrier()
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                t0 = time.perf_counter()
                dist.all_reduce(buf)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                ms.append((time.perf_counter() - t0) * 1e3)
            med = statistics.median(ms)
            algbw = size / (med / 1e3) / 1e9
            rows.append({"world_size": world, "dtype": str(dtype).removeprefix("torch."),
                         "bytes": size, "ms": med, "algbw_gbs": algbw,
                         "busbw_gbs": algbw * 2 * (world - 1) / world})
            del buf
    return rows


def _rank_main(rank: int, cfg: RunConfig, s: Settings, port: int, out_dir: str,
               with_nccl: bool) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    from torch.distributed.device_mesh import init_device_mesh

    cuda = s.device == "cuda"
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // cfg.world))
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=cfg.world,
                            timeout=dt.timedelta(seconds=300), device_id=device if cuda else None)
    try:
        mesh = init_device_mesh(device.type, (cfg.world,))
        result = {"rank": rank}
        if with_nccl:
            result["nccl"] = nccl_allreduce(device, cfg.world)
        model, kwargs = _build(cfg, s, device, mesh)
        if cuda:
            torch.cuda.reset_peak_memory_stats(device)
        result.update(_train(cfg, s, model, device, rank, Path(out_dir).parent))
        result["peak_mib"] = torch.cuda.max_memory_allocated(device) / 2**20 if cuda else None
        result["n_params"] = sum(p.numel() for p in model.parameters())
        result["model"] = {k: kwargs[k] for k in ("vocab_size", "hidden_size",
                                                  "num_hidden_layers")}
        with open(Path(out_dir) / f"{cfg.name}.rank{rank}.json", "w") as f:
            json.dump(result, f)
        dist.barrier()  # every rank's result is written
    except BaseException:
        dist.destroy_process_group()
        raise
    # Done: leave without the group's C++ teardown. Tearing down a gloo world of two ranks
    # (destroy_process_group, then the interpreter's exit) aborted a rank now and then
    # ("terminate called without an active exception", SIGABRT), even after a barrier: the
    # max-batch test's flake. The parent would read that abort as a failed world.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# ---- the parent --------------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_environment(cfg: RunConfig, device: str) -> dict[str, str]:
    """What every rank's environment gets, set in the parent before the ranks start (a rank
    imports suite.train, and with it own_kernel, which reads CCE_OWN_CONFIG at import, before
    its own code runs): NVLink multicast off; one OpenMP thread per rank on a GPU, as torchrun
    sets it (each rank's CPU thread pool sized to the whole host contends with the others'
    Python threads, and a multi-GPU step queues from the host); the variant's override."""
    env = dict(MULTICAST_OFF)
    if device == "cuda":
        env["OMP_NUM_THREADS"] = os.environ.get("OMP_NUM_THREADS", "1")
    if cfg.own_config is not None:
        env["CCE_OWN_CONFIG"] = json.dumps(cfg.own_config)
    return env


@contextlib.contextmanager
def _environment(extra: dict[str, str]):
    """os.environ with ``extra`` for the duration (the spawned ranks inherit it), restored."""
    saved = {k: os.environ.get(k) for k in extra}
    os.environ.update(extra)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run_config(cfg: RunConfig, s: Settings, out: Path, with_nccl: bool,
               timeout_s: float | None = None) -> list[dict] | str:
    """Every rank's result of one configuration (a fresh world), or why it failed: an OOM
    reads "oom: ..." (its message's tail, which names no OOM, would not say so). A rank that
    raises ends the world (torch.multiprocessing stops the others, which would wait in a
    collective); past ``timeout_s`` the world is stopped: "timeout ...". """
    import torch.multiprocessing as mp

    parts = out / "ranks"
    parts.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    try:
        with _environment(rank_environment(cfg, s.device)):
            ctx = mp.start_processes(_rank_main, args=(cfg, s, _free_port(), str(parts),
                                                       with_nccl),
                                     nprocs=cfg.world, start_method="spawn", join=False)
        while not ctx.join(timeout=2):
            if timeout_s is not None and time.monotonic() - t0 > timeout_s:
                for p in ctx.processes:
                    p.terminate()
                return f"timeout after {timeout_s:.0f} s"
    except Exception as exc:  # noqa: BLE001 - a failed configuration is a row
        from suite.measure import is_oom_text

        text = " ".join(str(exc).split())
        return f"oom: {text[-300:]}" if is_oom_text(text) else text[-400:]
    return [json.loads((parts / f"{cfg.name}.rank{r}.json").read_text())
            for r in range(cfg.world)]


# ---- the largest batch per configuration -------------------------------------------------------

@dataclass(frozen=True)
class BatchTrial:
    """One attempt at a per-rank batch: status "ok", "oom" or "error" (error: why), and the
    median step time after its first step (ok only)."""
    batch: int
    status: str
    error: str = ""
    ms: float | None = None


@dataclass(frozen=True)
class BatchSearch:
    """The search's outcome: the largest per-rank batch that ran (the configured one when no
    larger did), its step time (None: the configured run's), why the search stopped ("oom@B",
    "error@B", "cap", "budget") and every trial."""
    largest: int
    ms: float | None
    stop: str
    trials: list[BatchTrial] = field(default_factory=list)


def next_batch(start: int, cap: int, trials: list[BatchTrial]) -> int | None:
    """The next per-rank batch to try: double the last one that ran (the configured ``start``
    first), until a trial fails or the cap would be passed (None)."""
    if trials and trials[-1].status != "ok":
        return None
    nxt = 2 * (trials[-1].batch if trials else start)
    return nxt if nxt <= cap else None


def search_largest_batch(start: int, cap: int, budget_s: float,
                         try_batch: Callable[[int], BatchTrial],
                         clock: Callable[[], float] = time.monotonic) -> BatchSearch:
    """Doubling search above the configured per-rank batch ``start`` (which ran): each batch
    through ``try_batch`` (a fresh world in the benchmark, a fake in the tests) until one
    runs out of memory or fails, the next would pass ``cap``, or ``budget_s`` is spent (checked
    before each trial: the last may overrun it by its own time). OOM is a result, not an
    error: the largest batch is the last that ran."""
    t0, trials = clock(), []
    stop = "cap"
    while (batch := next_batch(start, cap, trials)) is not None:
        if clock() - t0 > budget_s:
            stop = "budget"
            break
        trials.append(try_batch(batch))
    if trials and trials[-1].status != "ok":
        stop = f"{trials[-1].status}@{trials[-1].batch}"
    ran = [t for t in trials if t.status == "ok"]
    return BatchSearch(ran[-1].batch if ran else start, ran[-1].ms if ran else None, stop, trials)


def trial_settings(cfg: RunConfig, s: Settings, batch_per_rank: int, steps: int) -> Settings:
    """Settings whose step gives each rank of ``cfg`` ``batch_per_rank`` sequences: data
    parallel, a global batch of world x batch; +tp, every rank the whole (global) batch."""
    return replace(s, batch=batch_per_rank, max_world=1 if cfg.tp_head else cfg.world,
                   steps=steps, warmup=1, lr_warmup=1)


def _try_batch(cfg: RunConfig, s: Settings, out: Path, steps: int,
               timeout_s: float) -> Callable[[int], BatchTrial]:
    def attempt(batch: int) -> BatchTrial:
        ranks = run_config(cfg, trial_settings(cfg, s, batch, steps), out / "max-batch",
                           False, timeout_s)
        if isinstance(ranks, str):
            return BatchTrial(batch, "oom" if ranks.startswith("oom: ") else "error", ranks)
        ms = [max(r["ms"][i] for r in ranks) for i in range(1, steps)] or [ranks[0]["ms"][0]]
        print(f"train-2gpu: {cfg.name}: batch {batch} per rank ran "
              f"({statistics.median(ms):.0f} ms/step)", flush=True)
        return BatchTrial(batch, "ok", ms=statistics.median(ms))
    return attempt


def _largest_batch_fields(cfg: RunConfig, s: Settings, row: dict, out: Path, cap: int,
                          budget_s: float, steps: int) -> dict:
    """The row's largest-batch columns: a search above its configured batch (when it ran)."""
    if row.get("status") != "ok":
        return {"max_batch_stop": "the configured batch did not run"}
    start = int(row["batch_per_rank"])
    found = search_largest_batch(start, cap, budget_s,
                                 _try_batch(cfg, s, out, steps, timeout_s=max(budget_s, 60)))
    ms = found.ms if found.ms is not None else row["ms"]
    seqs = found.largest * (1 if cfg.tp_head else cfg.world)
    return {"largest_batch_per_rank": found.largest, "largest_batch_ms": ms,
            "largest_batch_tokens_per_s": seqs * s.seq_len / (ms / 1e3),
            "max_batch_stop": found.stop}


def _step_ms(ranks, warmup: int) -> list[float]:
    """One world's timed steps (those after the warm-up), each the slowest rank's time."""
    ms = [max(r["ms"][i] for r in ranks) for i in range(warmup, len(ranks[0]["ms"]))]
    return ms or [max(r["ms"][-1] for r in ranks)]


def _row(cfg: RunConfig, s: Settings, worlds: list, common: dict) -> dict:
    """One configuration's row from its worlds (each world's ranks, or why it failed): the
    step time pooled over every world's timed steps (its p20-p80 spans the spread between
    worlds too), each world's median (``world_ms``), the largest peak of each rank."""
    row = {**common, "config": cfg.name, "backend": cfg.backend, "variant": cfg.variant,
           "own_config": json.dumps(cfg.own_config) if cfg.own_config else "",
           "world_size": cfg.world,
           "tp_head": int(cfg.tp_head), "head_unit": int(cfg.head_unit), "seq_len": s.seq_len,
           "steps": s.steps,
           "batch_per_rank": s.global_seqs if cfg.tp_head else s.global_seqs // cfg.world,
           "global_tokens": s.global_seqs * s.seq_len}
    ok = [w for w in worlds if not isinstance(w, str)]
    failed = [w for w in worlds if isinstance(w, str)]
    if not ok:
        return {**row, "status": "error", "error": failed[0], "worlds": 0}
    first = ok[0][0]
    per_world = [_step_ms(w, s.warmup) for w in ok]
    ms = [x for steps in per_world for x in steps]
    q = statistics.quantiles(ms, n=5, method="inclusive") if len(ms) > 1 else [ms[0]] * 4
    peaks = [max(w[r]["peak_mib"] or 0 for w in ok) if first["peak_mib"] is not None else None
             for r in range(cfg.world)]
    row.update(status="ok", error="; ".join(failed)[:400], model=f"hf:{s.arch}",
               vocab=first["model"]["vocab_size"], hidden=first["model"]["hidden_size"],
               layers=first["model"]["num_hidden_layers"], n_params=first["n_params"],
               worlds=len(ok), world_ms=";".join(f"{statistics.median(x):.2f}" for x in per_world),
               ms=statistics.median(ms), ms_p20=q[0], ms_p80=q[3],
               tokens_per_s=s.global_seqs * s.seq_len / (statistics.median(ms) / 1e3),
               peak_mib_max=max(peaks) if None not in peaks else "",
               peak_mib_per_rank=";".join(f"{p:.0f}" for p in peaks) if None not in peaks else "",
               final_loss=statistics.fmean(first["losses"][-10:]),
               host_ms=statistics.median(_host_ms(w, s.warmup) for w in ok),
               host_syncs_per_step=max(r.get("host_syncs", 0) for w in ok for r in w),
               host_sync_wait_ms=max(r.get("host_sync_wait_ms", 0.0) for w in ok for r in w),
               host_sync_sites=";".join(first.get("host_sync_sites", [])))
    return row


def _host_ms(ranks, warmup: int):
    """The median over timed steps of the slowest rank's host time to queue a step (until
    its end event is recorded, before waiting on it; a host read inside the step counts):
    near the step's time, the host, not the GPU, sets the pace."""
    per_step = [max(r["host_ms"][i] for r in ranks)
                for i in range(warmup, min(len(r["host_ms"]) for r in ranks))]
    return statistics.median(per_step) if per_step else 0.0


def _parity_ref(row: dict, curves: dict) -> str | None:
    """The curve a configuration is held to: a single-GPU run (its backend's, else hf_loss's,
    else own's), else hf_loss in the same world with the same head, else with the plain head
    (a tensor-parallel world's replicated batch is the data-parallel world's global batch)."""
    name, world = row["config"], int(row["world_size"])
    order = ([f"{row['backend']}@1"] if world > 1 else []) + ["hf_loss@1", "own@1"]
    tp = str(row.get("tp_head")) in ("1", "True")  # an int in the run, a string in its CSV
    order += ([f"hf_loss+tp@{world}"] if tp else []) + [f"hf_loss@{world}"]
    return next((r for r in order if r in curves and r != name), None)


def _parity(rows: list[dict], curves: dict, tol: float, window: int) -> None:
    """Each configuration's curve against its _parity_ref (a configuration others are held to
    and that has none of its own is the "reference")."""
    from suite.train.convergence import parity_verdict

    refs = {row["config"]: _parity_ref(row, curves) for row in rows if row["status"] == "ok"}
    for row in rows:
        name = row["config"]
        if row["status"] != "ok":
            continue
        ref = None if name == "hf_loss@1" else refs[name]
        if ref is None:
            row["verdict"] = "reference" if name in refs.values() or name == "hf_loss@1" \
                else "no reference"
            continue
        loss = curves[name]
        v = parity_verdict(loss, curves[ref], tol=tol, warmup=min(len(loss) // 10, 10),
                           window=min(window, len(loss)), shift=2)
        row.update(parity_ref=ref, max_rel_dev=v["max_rel_dev"],
                   final_rel_diff=v["final_rel_diff"], verdict=v["verdict"])


def rejudge(out: Path, tol: float, window: int) -> list[dict]:
    """A finished run's parity verdicts again by the current rule, from its results.csv and
    curves.csv (the measured columns are kept as they are); results.csv rewritten."""
    with open(out / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    curves: dict[str, list[float]] = {}
    with open(out / "curves.csv", newline="") as f:
        for r in csv.DictReader(f):
            curves.setdefault(r["config"], []).append(float(r["loss"]))
    for row in rows:
        for key in ("parity_ref", "max_rel_dev", "final_rel_diff", "verdict"):
            row[key] = ""
    _parity(rows, curves, tol, window)
    _write_csv(out / "results.csv", RESULT_FIELDS, rows)
    return rows


def _write_csv(path: Path, fields, rows) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)


@dataclass(frozen=True)
class MaxBatchOptions:
    """--max-batch: the per-rank batch cap of the search (0: no search), the seconds each
    configuration's search may start trials in, and the steps of each trial."""
    cap: int = 0
    budget_s: float = 150.0
    steps: int = 3


def run(configs: list[RunConfig], s: Settings, out: Path, *, budget_s: float, tol: float,
        window: int, max_batch: MaxBatchOptions = MaxBatchOptions(),
        repeats: int = 1) -> list[dict]:
    """Every configuration in turn, ``repeats`` times interleaved (a fresh world each time:
    A B A B, so that drift over the run falls on every configuration alike); worlds past
    ``budget_s`` are not started (a configuration with none is a ``skipped`` row). Then each
    configuration's largest-batch search where ``max_batch.cap`` is set. The profile and the
    loss curve come from each configuration's first world. The CSVs and env.json into
    ``out``."""
    from suite.results import environment

    out.mkdir(parents=True, exist_ok=True)
    run_id = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    env = {**environment(s.device), "settings": asdict(s), "configs": [c.name for c in configs],
           "repeats": repeats, "multicast_off": MULTICAST_OFF, "run_id": run_id}
    (out / "env.json").write_text(json.dumps(env, indent=2, default=str) + "\n")
    common = {"device": env.get("gpu_name") or s.device, "run_id": run_id}
    worlds: dict[str, list] = {c.name: [] for c in configs}
    curves, nccl, profiles, t0 = {}, [], {}, time.monotonic()
    for rep in range(repeats):
        for cfg in configs:
            if time.monotonic() - t0 > budget_s:
                continue
            ranks = run_config(cfg, s if rep == 0 else replace(s, profile_steps=0), out,
                               not nccl and cfg.world >= 2)
            worlds[cfg.name].append(ranks)
            if not isinstance(ranks, str) and cfg.name not in curves:
                curves[cfg.name] = ranks[0]["losses"]
                nccl = nccl or ranks[0].get("nccl", [])
                if ranks[0].get("profile"):
                    profiles[cfg.name] = ranks[0]["profile"]
            done = "failed" if isinstance(ranks, str) else \
                f"{statistics.median(_step_ms(ranks, s.warmup)):.1f} ms/step"
            print(f"train-distributed: {cfg.name} world {rep + 1}/{repeats}: {done} "
                  f"({time.monotonic() - t0:.0f} s)", flush=True)
    rows = []
    for cfg in configs:
        if not worlds[cfg.name]:
            rows.append({**common, "config": cfg.name, "backend": cfg.backend,
                         "world_size": cfg.world, "status": "skipped", "worlds": 0,
                         "error": f"--budget-s {budget_s:.0f} spent"})
            continue
        rows.append(_row(cfg, s, worlds[cfg.name], common))
        if max_batch.cap:
            rows[-1].update(_largest_batch_fields(cfg, s, rows[-1], out, max_batch.cap,
                                                  max_batch.budget_s, max_batch.steps))
    _parity(rows, curves, tol, window)
    _write_csv(out / "results.csv", RESULT_FIELDS, rows)
    _write_csv(out / "curves.csv", ["config", "step", "loss"],
               [{"config": c, "step": i, "loss": x} for c, xs in curves.items()
                for i, x in enumerate(xs)])
    if nccl:
        _write_csv(out / "nccl_allreduce.csv", NCCL_FIELDS, nccl)
    if profiles:
        (out / "profile.json").write_text(json.dumps(profiles, indent=1) + "\n")
        _write_csv(out / "profile.csv", PROFILE_FIELDS,
                   [{"config": name, **p} for name, p in profiles.items()])
    return rows


def add_arguments(p: argparse.ArgumentParser) -> None:
    a = p.add_argument
    a("--out", required=True, help="output folder")
    a("--configs", default=DEFAULT_CONFIGS, help=f"backend[+tp|+head]@world, ... (default: "
      f"{DEFAULT_CONFIGS}); backends: {', '.join(BACKENDS)}")
    a("--arch", default="llama", help="a suite.train.hf architecture (default: llama, ~1B "
      "parameters at Llama 3's vocabulary)")
    a("--tiny", action="store_true", help="the tiny config (CPU checks)")
    a("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=("cuda", "cpu"))
    a("--dtype", default="bf16", choices=("bf16", "fp32"))
    a("--steps", type=int, default=100)
    a("--warmup", type=int, default=10, help="steps left out of the timing (default: 10)")
    a("--batch", type=int, default=2, help="sequences per rank in the largest world (default 2)")
    a("--seq-len", type=int, default=2048)
    a("--lr", type=float, default=3e-4)
    a("--lr-warmup", type=int, default=10)
    a("--seed", type=int, default=0)
    a("--tol", type=float, default=0.01, help="parity tolerance, relative (default 0.01)")
    a("--smooth", type=int, default=10, help="parity's moving-average window (default 10)")
    a("--budget-s", type=float, default=330,
      help="configurations starting after this many seconds are skipped (default 330)")
    a("--max-batch", type=int, default=0, metavar="CAP",
      help="after each configuration, double its per-rank batch until CUDA runs out of memory "
      "or CAP is passed (each a fresh world of --max-batch-steps steps); the largest that ran "
      "is the row's largest_batch_per_rank (default 0: no search)")
    a("--max-batch-budget-s", type=float, default=150,
      help="seconds per configuration in which the search starts trials (default 150)")
    a("--max-batch-steps", type=int, default=3, help="steps per trial (default 3)")
    a("--repeats", type=int, default=1, metavar="R",
      help="worlds per configuration, interleaved across configurations (default 1); the "
      "row's p20-p80 pools every world's steps, world_ms lists each world's median")
    a("--rejudge", action="store_true",
      help="no run: judge --out's finished run's loss parity again by the current rule "
      "(its results.csv and curves.csv; results.csv rewritten)")
    a("--profile-steps", type=int, default=0, metavar="S",
      help="after the timed steps, S more under torch.profiler on rank 0: profile.csv / "
      "profile.json (suite/train/step_profile.py) and a gzipped chrome trace per "
      "configuration (default 0: none)")


def settings_from(args, configs: list[RunConfig]) -> Settings:
    from suite.train import hf
    hf.arch_of(f"hf:{args.arch}")
    for name in ("steps", "batch", "seq_len", "lr_warmup", "max_batch_steps"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')}: must be >= 1")
    if args.repeats < 1:
        raise ValueError("--repeats: must be >= 1")
    if args.profile_steps < 0:
        raise ValueError("--profile-steps: must be >= 0")
    if args.max_batch < 0:
        raise ValueError("--max-batch: a per-rank batch cap >= 0 (0: no search)")
    if args.device == "cuda" and max(c.world for c in configs) > torch.cuda.device_count():
        raise ValueError(f"--configs: a world of {max(c.world for c in configs)} needs as many "
                         f"GPUs; {torch.cuda.device_count()} visible")
    if args.device == "cpu" and args.dtype == "bf16":
        raise ValueError("--dtype bf16: the kernel refuses bf16 on the CPU; pass --dtype fp32")
    return Settings(args.arch, args.tiny, args.device, args.dtype, args.steps, args.warmup,
                    args.batch, args.seq_len, args.lr, args.lr_warmup, args.seed,
                    max(c.world for c in configs), args.profile_steps)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m suite.train.distributed",
                                     description=__doc__.splitlines()[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    if args.rejudge:
        rows = rejudge(Path(args.out), args.tol, args.smooth)
        for row in rows:
            print(f"{row['config']}: {row['verdict']} {row['parity_ref']}")
        return 0
    try:
        configs = parse_configs(args.configs)
        s = settings_from(args, configs)
    except ValueError as err:
        parser.error(str(err))
    rows = run(configs, s, Path(args.out), budget_s=args.budget_s, tol=args.tol,
               window=args.smooth, max_batch=MaxBatchOptions(args.max_batch,
                                                             args.max_batch_budget_s,
                                                             args.max_batch_steps),
               repeats=args.repeats)
    return 0 if all(r["status"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
