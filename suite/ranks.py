"""The ranks of ``python -m suite bench --vocab-parallel K``: the bench's cells with C sharded by
vocabulary over K ranks (own_kernel/paths/vocab_parallel.py), one process per rank. The runner
(suite/runner.py: ``run(..., world_size=K)``) runs them.

The runner writes ``plan.json``, records the providers that have no sharded path as
``unsupported`` (:func:`write_unsupported`), and spawns K ranks (:func:`run_worlds`;
torch.multiprocessing, MASTER_ADDR 127.0.0.1 and a free port): NCCL with one GPU per rank on
CUDA (NVLink multicast off: ``NCCL_NVLS_ENABLE=0``,
``TORCH_SYMM_MEM_DISABLE_MULTICAST=1`` in every rank's environment), gloo on the CPU. If the
ranks die (a crash, a collective that timed out), the (cell, provider) they were measuring
becomes ``crashed`` rows and a fresh world resumes the rest.

Every rank builds the cell's seeded inputs (suite.inputs.make_inputs) and the reference, keeps
its shard of C (and bias) only, rows [start, stop) with uneven shards where K does not divide
V, and measures each phase with suite.measure's protocol (warm-up calls, one call measured for
memory and checked against the reference, timed repetitions), with a barrier before each timed
region so no rank's time includes waiting for another to arrive. One ``VocabParallel`` per
cell serves every provider and phase. Rank 0 writes one row per (provider, phase), with
``world_size`` K: memory and time are the max over ranks, the loss and dE errors the largest
rank's (each rank holds the whole loss and dE), dC's and dbias's the relative error of the
gathered gradient (from each rank's error and reference norm on its shard).

The single-GPU rows (``python -m suite bench`` without the option, same cells) are the
comparison; the two runs go to separate folders, since rows are keyed by (cell, provider, phase).
"""
from __future__ import annotations

import datetime as dt
import json
import math
import os
import socket
from pathlib import Path

import torch
import torch.distributed as dist

from suite import catalog
from suite.inputs import make_inputs
from suite.measure import (_Leaves, _memory_run, _phase_calls, accuracy, free_memory, is_oom,
                           measure_floor, one_line, sync, time_calls, time_stats)
from suite.reference import reference
from suite.cells import INFLIGHT, PLAN, Cell
from suite.providers import liger_tp
from suite.results import ResultsWriter, device_label, done_pairs, environment
from suite.schema import PHASE_MATMULS


class OwnSharded:
    """The own kernel's call with ``vocab_parallel`` and these options: its catalog entry says
    where it cannot run; its rows name no ``ran``."""

    def __init__(self, **options):
        self.options = options

    def fn(self, name: str, vp, plan: dict, device):
        from own_kernel import linear_cross_entropy

        def call(e, c, targets, *, bias=None, softcap=None, ignore_index=-100):
            return linear_cross_entropy(e, c, targets, bias=bias, softcap=softcap,
                                        ignore_index=ignore_index, vocab_parallel=vp,
                                        **self.options)
        return call

    def cannot_run(self, name: str, cell: Cell, device):
        """(status, reason or None) pairs, in the order they are checked."""
        provider = catalog.get(name)
        yield "unavailable", provider.unavailable_reason(device)
        yield "unsupported", provider.unsupported_reason(bias=cell.bias, softcap=cell.softcap,
                                                         device=device)

    def ran(self, name: str) -> str | None:
        return None


class LigerSharded:
    """Liger's tensor-parallel function, native or its fallback (suite/providers/liger_tp.py):
    LCK configured once per rank for the plan's largest cell; ``ran`` names what ran."""

    def fn(self, name: str, vp, plan: dict, device):
        return liger_tp.sharded_fn(name, cells=[Cell(**c) for c in plan["cells"]],
                                   world=dist.get_world_size(), device=device)

    def cannot_run(self, name: str, cell: Cell, device):
        yield "unavailable", liger_tp.sharded_unavailable(name, device)
        yield "unsupported", liger_tp.sharded_unsupported(name, cell, dist.get_world_size())

    def ran(self, name: str) -> str | None:
        return liger_tp.ran(name)


# The providers with a sharded path, each with how it is called, why it cannot run and what ran.
SHARDED = {"own": OwnSharded(filter_eps=None), "own_filter": OwnSharded(filter_eps="auto"),
           "own_low_memory": OwnSharded(filter_eps=None, low_memory=True),
           "liger_scaled_ce_tp": LigerSharded(), "liger_scaled_ce_tp_torch": LigerSharded()}
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                 "NVSHMEM_DISABLE_NVLS": "1"}
# The ranks share one host, so NVSHMEM (Liger's TP kernel) needs no network transport; its default
# InfiniBand one fails NVSHMEM's init where its library cannot load (seen on 2 x H200). A value
# set by the caller stays.
ONE_HOST = {"NVSHMEM_REMOTE_TRANSPORT": "none"}
COLLECTIVE_TIMEOUT_S = 300  # a rank stuck in a collective fails after this (then: crashed)
FAILURE_ORDER = ("crashed", "oom", "nan", "error", "unavailable", "unsupported")


def shard_bounds(v: int, world: int) -> list[tuple[int, int]]:
    """[start, stop) of each rank: V split as evenly as it goes, the first V % K one larger."""
    if not 1 <= world <= v:
        raise ValueError(f"vocab-parallel: need 1 <= world size <= V; got {world} ranks, V {v}")
    base, extra = divmod(v, world)
    stops = [0]
    for r in range(world):
        stops.append(stops[-1] + base + (r < extra))
    return list(zip(stops[:-1], stops[1:]))


def check_world_size(world: int, device) -> str | None:
    """Why ``world`` ranks cannot run on ``device`` (None: they can)."""
    if world < 2:
        return f"expected 2 or more ranks, got {world} (one rank is the plain single-GPU bench)"
    device = torch.device(device)
    if device.type == "cuda":
        gpus = torch.cuda.device_count()
        if world > gpus:
            return f"{world} ranks need {world} GPUs (one per rank); this host has {gpus}"
        if device.index not in (None, 0):
            return "the ranks take GPUs 0..K-1: pass --device cuda, not a GPU index"
    return None


def unsupported_reason(name: str) -> str | None:
    if name in SHARDED:
        return None
    return (f"{name} has no vocab-parallel path (C sharded by vocabulary): only "
            f"{', '.join(SHARDED)} have one")


def sharded_fn(name: str, vp, *, plan: dict | None = None, device=None):
    """The provider's call on this rank's shard of c (and bias): the own kernel's with
    ``vocab_parallel=vp``, or Liger's tensor-parallel function (LCK configured on first use)."""
    return SHARDED[name].fn(name, vp, plan, device)


# ---- the parent: the runner's worlds ----------------------------------------------------------

def write_unsupported(writer, cells, providers, plan: dict, done) -> None:
    """An ``unsupported`` row per phase for each provider without a sharded path."""
    for cell in cells:
        for name in providers:
            why = unsupported_reason(name)
            if why and (cell.cell_id, name) not in done:
                writer.write([_row(cell, plan, name, {"phase": ph, "status": "unsupported",
                                                      "error": why}) for ph in plan["phases"]])


def _row(cell: Cell, plan: dict, provider: str, metrics: dict, extra=None) -> dict:
    stamp = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    return {**cell.fields(), "device": device_label(plan["device"]), "run_id": plan["run_id"],
            "world_size": plan["world_size"], **(extra or {}), "provider": provider,
            **metrics, "timestamp": stamp}


def _pending(out: Path, plan: dict, done) -> list[tuple[str, str]]:
    mine = done_pairs(out, plan["phases"], run_id=plan["run_id"])
    return [(Cell(**c).cell_id, p) for c in plan["cells"] for p in plan["providers"]
            if unsupported_reason(p) is None
            and (Cell(**c).cell_id, p) not in mine | set(done)]


def run_worlds(out: Path, plan: dict, done) -> None:
    """Spawn worlds of ranks until every sharded (cell, provider) pair has rows; a world that
    dies leaves ``crashed`` rows for the pair it was measuring (all pending, before any)."""
    import torch.multiprocessing as mp

    cells = {Cell(**c).cell_id: Cell(**c) for c in plan["cells"]}
    while True:
        pending = _pending(out, plan, done)
        if not pending:
            return
        (out / INFLIGHT).unlink(missing_ok=True)
        try:
            mp.start_processes(_rank_main, args=(plan["world_size"], _free_port(), str(out),
                                                 pending), nprocs=plan["world_size"],
                               start_method="spawn", join=True)
            continue
        except Exception as exc:  # noqa: BLE001 - a dead world is rows, then the rest goes on
            why = f"a rank failed: {one_line(exc)}"
        blamed = _blamed(out / INFLIGHT, _pending(out, plan, done))
        writer = ResultsWriter(out, environment(plan["device"]), plan["run_id"])
        for cell_id, prov in blamed:
            writer.write([_row(cells[cell_id], plan, prov, {
                "phase": ph, "status": "crashed", "error": f"{why} while measuring {prov}"})
                for ph in plan["phases"]])


def _blamed(inflight: Path, pending) -> list[tuple[str, str]]:
    """The pending pairs a dead world was measuring: the provider rank 0 had started (its
    cell's pending pairs if it died before one), or every pending pair (no record)."""
    if not inflight.exists():
        return pending
    cell_id, prov = json.loads(inflight.read_text())
    blamed = [(c, p) for c, p in pending if c == cell_id and prov in (None, p)]
    return blamed or pending


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- one rank ------------------------------------------------------------------------------

def _rank_main(rank: int, world: int, port: int, out_dir: str, pending) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), **MULTICAST_OFF)
    for key, value in ONE_HOST.items():
        os.environ.setdefault(key, value)
    out = Path(out_dir)
    plan = json.loads((out / PLAN).read_text())
    device = torch.device(plan["device"])
    if device.type == "cuda":
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    cuda = device.type == "cuda"
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world,
                            timeout=dt.timedelta(seconds=plan["collective_timeout_s"]),
                            device_id=device if cuda else None)
    try:
        writer = None
        if rank == 0:
            writer = ResultsWriter(out, dict(environment(plan["device"]), world_size=world),
                                   plan["run_id"])
        cells = {Cell(**c).cell_id: Cell(**c) for c in plan["cells"]}
        by_cell: dict[str, list[str]] = {}
        for cell_id, prov in pending:
            by_cell.setdefault(cell_id, []).append(prov)
        for cell_id, provs in by_cell.items():
            measure_cell(cells[cell_id], provs, plan, device=device, rank=rank, world=world,
                         writer=writer, inflight_path=out / INFLIGHT)
    finally:
        dist.destroy_process_group()


def measure_cell(cell: Cell, providers, plan: dict, *, device, rank: int, world: int, writer,
                 inflight_path=None) -> None:
    """Every rank: the cell's inputs, reference and shard; then each provider's phases, whose
    rows rank 0 writes (``writer``: rank 0's; None elsewhere)."""
    from own_kernel import VocabParallel

    phases = plan["phases"]
    _mark_inflight(inflight_path if rank == 0 else None, cell.cell_id, None)
    stage = "shard"
    try:
        start, stop = shard_bounds(cell.v, world)[rank]
        stage = "inputs"
        shard, ref = _shard_and_reference(cell, device, start, stop)
        stage = "floor"
        free_memory(device)
        floor = measure_floor(shard["e"], shard["c"], reps=plan["reps"], warmup=plan["warmup"])
        failure = None
    except Exception as exc:  # noqa: BLE001 - recorded for every provider of the cell
        failure = {"status": "oom" if is_oom(exc) else "error",
                   "error": f"rank {rank}: {stage}: {one_line(exc)}"}
        shard = ref = floor = None
    every = _gathered(failure)
    failed = next((f for f in every if f is not None), None)
    if failed is not None:
        if writer is not None:
            writer.write([_row(cell, plan, p, {"phase": ph, **failed}) for p in providers
                          for ph in phases])
        free_memory(device)
        return
    vp = VocabParallel(None, start, stop)  # one per cell: its V is gathered on the first call
    extra = {"mean_loss": ref["mean_loss"], "entropy": ref["entropy"]}
    for name in providers:
        _mark_inflight(inflight_path if rank == 0 else None, cell.cell_id, name)
        rows = measure_sharded_provider(name, vp, shard, ref, cell, plan, floor_ms=floor["ms"],
                                        device=device)
        merged = [merge_ranks(_gathered(r), cell) for r in rows]
        if writer is not None:
            writer.write([_row(cell, plan, name, m, extra) for m in merged])
    if rank == 0 and inflight_path is not None:
        inflight_path.unlink(missing_ok=True)
    del shard, ref
    free_memory(device)


def _mark_inflight(path, cell_id: str, provider) -> None:
    if path is not None:
        path.write_text(json.dumps([cell_id, provider]))


def _gathered(obj) -> list:
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, obj)
    return every


def _shard_and_reference(cell: Cell, device, start: int, stop: int):
    """(this rank's inputs with C and bias cut to [start, stop), the reference with dC and
    dbias cut alike); the whole C is freed once the reference has it."""
    inputs = make_inputs(cell.dist, cell.n, cell.d, cell.v, cell.dtype, seed=cell.seed,
                         device=device, softcap=cell.softcap, ignore_frac=cell.ignore_frac,
                         bias=cell.bias, path=cell.file, target_entropy=cell.lm_entropy)
    ref = reference(inputs["e"], inputs["c"], inputs["targets"], bias=inputs["bias"],
                    softcap=cell.softcap)
    def cut(t):  # the rows [start, stop) as their own tensor; host copies stay pinned
        if t is None:
            return None
        return torch.empty(t[start:stop].shape, dtype=t.dtype, device=t.device,
                           pin_memory=t.device.type == "cpu" and t.is_pinned()).copy_(t[start:stop])
    shard = {"e": inputs["e"], "targets": inputs["targets"], "c": cut(inputs["c"]),
             "bias": cut(inputs["bias"])}
    ref = {**ref, "dc": cut(ref["dc"]), "dbias": cut(ref["dbias"])}
    del inputs
    return shard, ref


# ---- one provider on one rank, and the ranks' rows merged -------------------------------------

def measure_sharded_provider(name, vp, shard, ref, cell: Cell, plan: dict, *, floor_ms,
                             device) -> list[dict]:
    """This rank's metrics for each phase (suite.measure's protocol, a barrier before each
    timed call), with its reference norms on the shard (``_dc_ref_sq``, ``_dbias_ref_sq``)."""
    for status, reason in SHARDED[name].cannot_run(name, cell, device):
        if reason:
            return [{"phase": p, "status": status, "error": reason} for p in plan["phases"]]
    try:
        fn = sharded_fn(name, vp, plan=plan, device=device)
    except Exception as exc:  # noqa: BLE001 - a set-up that fails is the provider's rows
        return [{"phase": p, "status": "error", "error": f"set-up: {one_line(exc)}"}
                for p in plan["phases"]]
    kwargs = {"softcap": cell.softcap, "ignore_index": -100}
    rows = []
    for phase in plan["phases"]:
        x = _Leaves(shard, grad=phase != "fwd")
        try:
            row = _measure_phase(phase, fn, x, kwargs, ref, plan, device)
            failure = None
        except Exception as exc:  # noqa: BLE001 - a failing rank is data, not a crash
            failure = {"status": "oom" if is_oom(exc) else "error", "error": one_line(exc)}
        row = {"phase": phase, **failure} if failure else row
        if failure is None and row["status"] == "ok":
            row.update(tokens_per_s=cell.n / (row["ms"] / 1e3), floor_ms=floor_ms)
        if (ran := SHARDED[name].ran(name)) is not None:
            row["ran"] = ran
        del x
        free_memory(device, collect=failure is not None)
        rows.append(row)
    for key in ("dc", "dbias"):  # for the gathered gradient's error (merge_ranks)
        norm_sq = None if ref[key] is None else float(ref[key].double().square().sum())
        for row in rows:
            row[f"_{key}_ref_sq"] = norm_sq
    return rows


def _measure_phase(phase, fn, x, kwargs, ref, plan: dict, device) -> dict:
    prepare, run = _phase_calls(phase, fn, x, kwargs)
    for _ in range(plan["warmup"]):
        run(prepare())
    row = {"phase": phase}
    loss, row["peak_extra_mib"], row["peak_abs_mib"] = _memory_run(phase, fn, x, kwargs, device)
    errors, bad = accuracy(phase, loss, x, ref)
    row.update(errors)
    x.clear_grads()
    if bad:
        return {**row, "status": "nan", "error": "non-finite " + ", ".join(bad)}

    def synced():  # untimed: every rank enters the timed call together
        state = prepare()
        sync(device)
        dist.barrier()
        sync(device)
        return state

    stats = time_stats(time_calls(run, device=device, reps=plan["reps"], prepare=synced))
    return {**row, **stats, "status": "ok"}


def merge_ranks(rows: list[dict], cell: Cell) -> dict:
    """One row from every rank's row of a phase: a failure on any rank is the row's status
    (naming the ranks); else the max over ranks of memory, time and the loss and dE errors,
    and the gathered dC's and dbias's relative errors."""
    failed = [(r, row) for r, row in enumerate(rows) if row["status"] != "ok"]
    if failed:
        failed.sort(key=lambda f: FAILURE_ORDER.index(f[1]["status"])
                    if f[1]["status"] in FAILURE_ORDER else len(FAILURE_ORDER))
        status = failed[0][1]["status"]
        texts = "; ".join(f"rank {r}: {row.get('error') or row['status']}" for r, row in failed)
        return {"phase": rows[0]["phase"], "status": status, "error": texts,
                "ran": rows[0].get("ran", "")}
    merged = {"phase": rows[0]["phase"], "status": "ok", "reps": min(r["reps"] for r in rows),
              "ran": rows[0].get("ran", "")}
    for key in ("peak_extra_mib", "peak_abs_mib", "ms", "ms_p20", "ms_p80", "ms_min",
                "floor_ms", "loss_rel_err", "de_rel_err"):
        merged[key] = _max(r.get(key) for r in rows)
    for key in ("dc", "dbias"):
        merged[f"{key}_rel_err"] = _gathered_rel_err(rows, key)
    merged["tokens_per_s"] = cell.n / (merged["ms"] / 1e3)
    merged["tflops"] = (PHASE_MATMULS[merged["phase"]] * 2 * cell.n * cell.v * cell.d
                        / (merged["ms"] / 1e3) / 1e12)
    if merged["floor_ms"]:
        merged["floor_ratio"] = merged["ms"] / merged["floor_ms"]
    return merged


def _max(values):
    values = [v for v in values if v is not None and not math.isnan(v)]
    return max(values) if values else None


def _gathered_rel_err(rows: list[dict], key: str):
    """||got - ref|| / ||ref|| over the gathered gradient, from each shard's error and norm."""
    errs = [r.get(f"{key}_rel_err") for r in rows]
    norms = [r.get(f"_{key}_ref_sq") for r in rows]
    if any(e is None for e in errs) or any(n is None for n in norms):
        return None
    den = sum(norms)
    num = sum(e * e * n if n and math.isfinite(e) else (0.0 if e == 0 else math.inf)
              for e, n in zip(errs, norms))
    return math.sqrt(num / den) if den else (0.0 if num == 0 else math.inf)
