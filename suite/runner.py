"""Cells, presets and the benchmark loop: for each cell make inputs, the reference and the floor,
then measure every provider and append its rows.

``run(..., isolate="cell")`` runs each cell in a child process (``suite.isolate.Worker`` on
``python -m suite.runner --worker``, reading ``plan.json``); if the child dies (segfault,
poisoned CUDA context), the provider it was running is recorded as ``crashed`` and a new child
resumes the cell.
``isolate="provider"`` gives every (cell, provider) pair its own child, so no provider's time
depends on what ran before it in the process (inputs and reference are rebuilt per child).
``run(..., world_size=K)`` (``bench --vocab-parallel K``) measures the cells with C sharded by
vocabulary over K ranks, each a process of its own (suite/ranks.py).
"""
from __future__ import annotations

import contextlib
import csv
import dataclasses
import datetime as dt
import importlib
import itertools
import json
import logging
import os
import sys
import time
import uuid
import warnings
from collections import Counter
from pathlib import Path

import torch

from suite import catalog, presets, ranks, registry
from suite.cells import INFLIGHT, PLAN, Cell
from suite.isolate import Worker, serve
from suite.inputs import LM_ENTROPY, make_inputs
from suite.measure import (free_memory, is_oom, measure_floor, measure_provider, one_line,
                           reset_compiled)
from suite.reference import reference
from suite.results import ResultsWriter, done_pairs, environment, read_rows
from suite.schema import PHASES

# Each preset is a list of axis products; command-line axes replace the preset's.
AXES = ("dist", "n", "d", "v", "dtype", "softcap", "ignore_frac", "bias", "seed", "lm_entropy")
GRID_V = [20000, 32000, 50257, 128256, 151936, 256000]
SLICE_V = [32000, 128256, 256000]
PRESETS = {
    # The CPU check (suite/smoke.py): every provider once on one tiny cell whose options all
    # of them implement (no softcap, no bias), odd V, a quarter of the targets ignored.
    "smoke": [dict(dist=["lm"], n=[32], d=[16], v=[97], dtype=["fp32"], softcap=[None],
                   ignore_frac=[0.25])],
    # The longer CPU sweep: both distributions, and one cell with every option on.
    "smoke-sweep": [
        dict(dist=["uniform", "lm"], n=[64], d=[32], v=[257], dtype=["fp32"], softcap=[None]),
        # One cell with every option on: fp16, softcap, ignored targets, bias, odd V.
        dict(dist=["lm"], n=[64], d=[32], v=[100], dtype=["fp16"], softcap=[30.0],
             ignore_frac=[0.25], bias=[True]),
    ],
    # One model's loss layer each (suite/presets.py), both input distributions, bf16; "peers"
    # is all three: the shapes every peer is measured at.
    **{s.name: [s.axes()] for s in presets.SHAPES.values()},
    "peers": [s.axes() for s in presets.PEER_SHAPES],
    # bf16: the full product at N 2048 and 8192. Longer batches (N 32768, where naive runs
    # out of memory and N*V passes 2^31) and the other dtypes are slices at Gemma 2's hidden
    # size, the paper's shape, over three vocabularies (Llama 2, Llama 3, Gemma): the full
    # product costs ~2.5 H200-hours (fp32's true-fp32 matmuls are ~14x slower than bf16's),
    # these slices ~20 minutes. Any further slice on demand: `--dtype fp32 --n 8192 ...`.
    "grid": [
        dict(dist=["uniform", "lm"], n=[2048, 8192], d=[2304, 4096], v=GRID_V, dtype=["bf16"]),
        dict(dist=["uniform", "lm"], n=[32768], d=[2304], v=SLICE_V, dtype=["bf16"]),
        dict(dist=["uniform", "lm"], n=[8192], d=[2304], v=SLICE_V, dtype=["fp16"]),
        dict(dist=["uniform", "lm"], n=[2048], d=[2304], v=SLICE_V, dtype=["fp32"]),
    ],
}
DEFAULTS = dict(softcap=[None], ignore_frac=[0.0], bias=[False], seed=[0],
                lm_entropy=[LM_ENTROPY])


def preset_cells(preset: str, file: str | None = None, **overrides) -> list[Cell]:
    """Cells of ``preset`` with any axis (a list of values) replaced by ``overrides``."""
    if preset not in PRESETS:
        raise ValueError(f"preset must be one of {', '.join(PRESETS)}, got {preset!r}")
    unknown = set(overrides) - set(AXES)
    if unknown:
        raise ValueError(f"unknown axes {sorted(unknown)}; axes are {', '.join(AXES)}")
    cells = []
    for product in PRESETS[preset]:
        axes = {**DEFAULTS, **product, **{k: v for k, v in overrides.items() if v is not None}}
        for values in itertools.product(*(axes[a] for a in AXES)):
            kw = dict(zip(AXES, values))
            if kw["dist"] == "file":
                from suite.inputs import file_shape

                kw["n"], kw["d"], kw["v"] = file_shape(file)
                kw["file"] = str(file)
            cells.append(Cell(**kw))
    return list(dict.fromkeys(cells))  # drop duplicates, keep order


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def default_reps(device) -> tuple[int, int]:
    """(reps, warmup): the protocol on a GPU; fewer on the CPU, whose numbers are smoke only."""
    return (10, 3) if torch.device(device).type == "cuda" else (3, 1)


# ---- one cell --------------------------------------------------------------------------

def measure_cell(cell: Cell, providers, phases, *, device, reps, warmup, writer, run_id,
                 progress=None, inflight_path=None, clocks=False) -> None:
    device = torch.device(device)
    from suite.clocks import ClockLog

    clock_log = ClockLog(device) if clocks else None   # run() checked the device
    label = _device_label(device)
    stamp = lambda: dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")  # noqa: E731
    base = {**cell.fields(), "device": label, "run_id": run_id}

    def emit(provider_name, metric_rows, extra=None):
        rows = [{**base, **(extra or {}), "provider": provider_name, **m, "timestamp": stamp()}
                for m in metric_rows]
        writer.write(rows)
        if progress is not None:
            progress.update(1)

    provs = [catalog.get(p) for p in providers]
    # Providers that cannot run here need no inputs: record them without building any.
    runnable = []
    for p in provs:
        reason = p.unavailable_reason(device)
        if reason:
            emit(p.name, [{"phase": ph, "status": "unavailable", "error": reason} for ph in phases])
        else:
            runnable.append(p)
    if not runnable:
        return

    reset_compiled()
    stage = "inputs"
    try:
        inputs = make_inputs(cell.dist, cell.n, cell.d, cell.v, cell.dtype, seed=cell.seed,
                             device=device, softcap=cell.softcap, ignore_frac=cell.ignore_frac,
                             bias=cell.bias, path=cell.file, target_entropy=cell.lm_entropy)
        stage = "reference"
        ref = reference(inputs["e"], inputs["c"], inputs["targets"], bias=inputs["bias"],
                        softcap=cell.softcap)
        stage = "floor"
        free_memory(device)
        floor = measure_floor(inputs["e"], inputs["c"], reps=reps, warmup=warmup)
    except Exception as exc:  # noqa: BLE001 - recorded for every provider of the cell
        status, msg = ("oom" if is_oom(exc) else "error"), f"{stage}: {one_line(exc)}"
        for p in runnable:
            emit(p.name, [{"phase": ph, "status": status, "error": msg} for ph in phases])
        inputs = ref = None
        free_memory(device)
        return
    free_memory(device)

    extra = {"mean_loss": ref["mean_loss"], "entropy": ref["entropy"]}
    for p in runnable:
        if progress is not None:
            progress.set_postfix_str(f"{cell.cell_id} {p.name}", refresh=True)
        if inflight_path is not None:
            inflight_path.write_text(json.dumps([cell.cell_id, p.name]))
        metric_rows = measure_provider(
            p, inputs, ref, phases=phases, softcap=cell.softcap, ignore_index=-100, reps=reps,
            warmup=warmup, floor_ms=floor["ms"], n=cell.n, v=cell.v, d=cell.d, clocks=clock_log)
        emit(p.name, metric_rows, extra)
    if inflight_path is not None and inflight_path.exists():
        inflight_path.unlink()
    del inputs, ref
    free_memory(device)


def _device_label(device) -> str:
    from suite.results import device_label

    return device_label(device)


# ---- the run ---------------------------------------------------------------------------

def run(cells, providers, phases=PHASES, out_dir="results/run", *, resume=False, reps=None,
        warmup=None, device=None, isolate=False, quiet=False, plugins=(), rerun=(),
        select=None, summary=True, world_size=None, variants=(),
        collective_timeout_s=ranks.COLLECTIVE_TIMEOUT_S, clocks=False) -> Path:
    """Measure ``providers`` (names) on ``cells`` into ``out_dir``; returns the run folder.

    ``select(cell, provider) -> bool``: only the pairs it accepts are measured (the gate runs
    the peers at one shape only); default all. ``summary``: print the report's tables at the
    end (unless ``quiet``; the gate prints its own).

    ``rerun`` (with ``resume``): providers measured again where rows exist, e.g. after a kernel
    change; the new rows are appended and every reader keeps the latest row of a (cell,
    provider, phase).

    ``plugins``: modules imported first (their providers can be measured); ``variants``:
    (base, name, overrides) triples, each the own provider ``base`` under config overrides,
    measured as ``<base>@<name>`` (suite.providers.own.register_variant).

    ``world_size`` (K >= 2): C sharded by vocabulary over K ranks, one process per rank
    launched here (suite/ranks.py; ``bench --vocab-parallel K``), into a folder of its own
    (rows of another world size there are refused); not with isolate, rerun, plugins,
    variants or select.

    ``clocks``: each row also records the SM clock its timed calls ran at (suite/clocks.py;
    needs nvidia-ml-py and a GPU; not with world_size)."""
    device = str(device or default_device())
    variants = [list(v) for v in variants]
    if world_size is not None:
        _check_sharded(world_size, device, isolate=isolate, rerun=rerun, plugins=plugins,
                       select=select, variants=variants, clocks=clocks)
    load_extras(plugins, variants)
    d_reps, d_warmup = default_reps(device)
    reps = d_reps if reps is None else reps
    warmup = d_warmup if warmup is None else warmup
    phases, providers, isolate, rerun = _checked(phases, providers, reps, warmup, isolate,
                                                 rerun, resume)
    out = Path(out_dir)
    _check_out(out, resume, world_size)
    if clocks:
        _check_clocks(out, device)
    done = {pair for pair in done_pairs(out, phases) if pair[1] not in rerun} if resume else set()
    if world_size is not None:
        sharded = dict(world_size=world_size, collective_timeout_s=collective_timeout_s)
        return _run_sharded(out, _write_plan(out, cells, providers, phases, reps, warmup,
                                             device, plugins, variants, **sharded),
                            cells, done, quiet)
    chosen = [(c, [p for p in providers if select is None or select(c, p)]) for c in cells]
    todo = [(c, [p for p in ps if (c.cell_id, p) not in done]) for c, ps in chosen]
    todo = [(c, ps) for c, ps in todo if ps]
    n_pairs = sum(len(ps) for _, ps in todo)
    skipped = sum(len(ps) for _, ps in chosen) - n_pairs
    if skipped and not quiet:
        print(f"resume: {skipped} finished (cell, provider) pairs skipped")

    plan = _write_plan(out, cells, providers, phases, reps, warmup, device, plugins, variants,
                       clocks=bool(clocks))
    t0 = time.time()
    _measure_all(out, plan, todo, isolate, quiet)
    if summary and not quiet:
        from suite.report import summary as summary_tables

        print(summary_tables(read_rows(out), cells=[c.cell_id for c in cells],
                             providers=providers))
    if not quiet:
        print(f"\n{n_pairs} (cell, provider) pairs in {time.time() - t0:.0f} s -> {out}/results.csv")
        if torch.device(device).type == "cpu":
            print("NOTE: measured on the CPU (Triton kernels interpreted): these are smoke-test "
                  "numbers, not GPU numbers.")
    return out


def _write_plan(out: Path, cells, providers, phases, reps, warmup, device, plugins, variants,
                **sharded) -> dict:
    """The run's plan (a new run id), written to the folder's plan.json for its children."""
    run_id = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ-") + uuid.uuid4().hex[:6]
    out.mkdir(parents=True, exist_ok=True)
    plan = {"run_id": run_id, "cells": [dataclasses.asdict(c) for c in cells],
            "providers": providers, "phases": phases, "reps": reps, "warmup": warmup,
            "device": device, "plugins": list(plugins), "variants": variants, **sharded}
    (out / PLAN).write_text(json.dumps(plan, indent=1) + "\n")
    return plan


def _check_out(out: Path, resume: bool, world_size) -> None:
    """The run folder: a finished run's only with resume; a sharded run's of one world size."""
    if (out / "results.csv").exists() and not resume:
        raise FileExistsError(f"{out}/results.csv exists: pass --resume to continue that run, "
                              f"or choose another --out")
    if world_size is not None:
        other = {r["world_size"] for r in read_rows(out)} - {str(world_size)}
        if other:
            raise ValueError(f"--out: {out} holds rows of world size {sorted(other)}; a "
                             f"--vocab-parallel {world_size} run needs a folder of its own")


def _check_clocks(out: Path, device: str) -> None:
    """clocks: NVML answering for the device, and a results.csv (if any) with the clock
    columns."""
    from suite.clocks import unavailable

    reason = unavailable(device)
    if reason:
        raise ValueError(f"--clocks: {reason}")
    path = out / "results.csv"
    if path.exists() and path.stat().st_size:
        with open(path, newline="") as f:
            if "sm_mhz" not in next(csv.reader(f), []):
                raise ValueError(f"--clocks: {path} was written before the clock columns; "
                                 f"measure into another folder")


def _check_sharded(world_size: int, device: str, **not_with) -> None:
    reason = ranks.check_world_size(world_size, device)
    if reason:
        raise ValueError(f"--vocab-parallel: {reason}")
    for name, value in not_with.items():
        if value:
            raise ValueError(f"{name} is not available with world_size (vocab-parallel)")


def _run_sharded(out: Path, plan: dict, cells, done, quiet: bool) -> Path:
    """The sharded run: ``unsupported`` rows for the providers without a sharded path, then
    worlds of ranks until every other pair has rows (suite/ranks.py)."""
    t0 = time.time()
    world = plan["world_size"]
    writer = ResultsWriter(out, dict(environment(plan["device"]), world_size=world),
                           plan["run_id"])
    ranks.write_unsupported(writer, cells, plan["providers"], plan, done)
    ranks.run_worlds(out, plan, done)
    if not quiet:
        print(f"vocab-parallel bench: {len(cells)} cell(s) over {world} ranks in "
              f"{time.time() - t0:.0f} s -> {out}/results.csv")
    return out


def _checked(phases, providers, reps, warmup, isolate, rerun, resume):
    """(phases, provider names, isolate mode, rerun names), each validated."""
    phases = list(phases)
    for ph in phases:
        if ph not in PHASES:
            raise ValueError(f"phase must be one of {', '.join(PHASES)}, got {ph!r}")
    providers = [catalog.get(p).name for p in providers]  # validates names
    if reps < 1 or warmup < 0:
        raise ValueError(f"reps must be >= 1 and warmup >= 0, got reps={reps} warmup={warmup}")
    rerun = {catalog.get(p).name for p in rerun}
    if rerun and not resume:
        raise ValueError("rerun needs resume (it re-measures providers of an existing run)")
    if isolate is True:
        isolate = "cell"
    if isolate not in (False, None, "cell", "provider"):
        raise ValueError(f"isolate must be False, 'cell' or 'provider', got {isolate!r}")
    return phases, providers, isolate, rerun


def _measure_all(out: Path, plan: dict, todo, isolate, quiet: bool) -> None:
    """Every pending (cell, providers) of ``todo``, under one progress bar; third-party
    messages are held while it runs and printed after it."""
    from tqdm.auto import tqdm

    n_pairs = sum(len(ps) for _, ps in todo)
    writer = None if isolate else ResultsWriter(out, run_environment(plan), plan["run_id"])
    bar = tqdm(total=n_pairs, unit="pair", desc="bench", disable=quiet or n_pairs == 0,
               dynamic_ncols=True)
    with held_messages() as held:
        for cell, pending in todo:
            if isolate:
                held += _run_isolated(out, cell, pending, plan["phases"], bar, plan["run_id"],
                                      isolate == "provider")
            else:
                measure_cell(cell, pending, plan["phases"], device=plan["device"],
                             reps=plan["reps"], warmup=plan["warmup"], writer=writer,
                             run_id=plan["run_id"], progress=bar,
                             clocks=plan.get("clocks", False))
    bar.close()
    print_held(held)


class _HoldingHandler(logging.Handler):
    def __init__(self, held: list):
        super().__init__(logging.WARNING)
        self.held = held

    def emit(self, record):
        self.held.append(f"{record.name}: {record.getMessage()}")


@contextlib.contextmanager
def held_messages():
    """Warnings and log records raised while measuring, held in the yielded list instead of
    written over the progress bar (Liger logs a line for each optional backend it cannot
    import, and warns when it falls back to another kernel). Log records are held unless the
    program sends its logs to the terminal itself (unconfigured, they would go to stderr)."""
    held: list[str] = []
    root = logging.getLogger()
    to_terminal = any(isinstance(h, logging.StreamHandler) and h.stream in (sys.stderr, sys.stdout)
                      for h in root.handlers)
    handler = None if to_terminal else _HoldingHandler(held)
    if handler:
        root.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("default")
            try:
                yield held
            finally:
                held += [f"{w.category.__name__}: {w.message}" for w in caught]
    finally:
        if handler:
            root.removeHandler(handler)


def print_held(held: list[str]) -> None:
    """Each distinct held message once, with how often it came."""
    if not held:
        return
    counts = Counter(held)
    print(f"{len(counts)} message(s) from the measured code during the run (held back from the "
          f"progress bar):")
    for text, k in counts.items():
        print(f"  {text}" + (f" (x{k})" if k > 1 else ""))


def _run_isolated(out: Path, cell: Cell, pending, phases, bar, run_id: str,
                  per_provider: bool = False) -> list[str]:
    """Run one cell in child processes (suite.isolate) until every pending provider has rows
    of this run (``run_id``: a rerun's providers have older rows already); every job gets a
    fresh child, so no provider's time depends on what ran before it in the process;
    ``per_provider``: one job per provider. Returns the messages the children held."""
    plan = json.loads((out / PLAN).read_text())
    env = dict(os.environ)
    if plan["device"].startswith("cpu"):
        env.setdefault("TRITON_INTERPRET", "1")  # before the child imports triton
    worker = Worker([sys.executable, "-m", "suite.runner", "--worker"], env=env)
    inflight, held = out / INFLIGHT, []
    while True:
        left = [p for p in pending if (cell.cell_id, p) not in done_pairs(out, phases, run_id=run_id)]
        if not left:
            return held
        inflight.unlink(missing_ok=True)
        batch = left[:1] if per_provider else left
        result = worker.run({"run_dir": str(out), "cell": cell.cell_id, "providers": batch})
        worker.close()
        held += result.get("messages", [])
        done = done_pairs(out, phases, run_id=run_id)
        left_after = [p for p in pending if (cell.cell_id, p) not in done]
        bar.update(len(left) - len(left_after))
        if result.get("status") == "ok":
            if not left_after or (per_provider and len(left_after) < len(left)):
                continue  # done, or this child's provider is: the next one gets a fresh child
        # The child died (or failed outside any provider). Blame the provider it was measuring,
        # or every pair it was given if it died before reaching one (inputs, reference).
        blamed = [p for p in batch if p in left_after]
        if inflight.exists():
            cell_id, prov = json.loads(inflight.read_text())
            if cell_id == cell.cell_id and prov in left_after:
                blamed = [prov]
        why = result.get("error") or f"child process ended with {result.get('status')}"
        _record_crash(out, plan, cell, blamed, phases, why)
        bar.update(len(blamed))
        if len(blamed) == len(left_after):
            return held


def _record_crash(out: Path, plan: dict, cell: Cell, blamed, phases, why: str) -> None:
    writer = ResultsWriter(out, run_environment(plan), plan["run_id"])
    base = {**cell.fields(), "device": _device_label(plan["device"]), "run_id": plan["run_id"]}
    stamp = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    for prov in blamed:
        writer.write([{**base, "provider": prov, "phase": ph, "status": "crashed",
                       "error": f"{why} while measuring {prov}", "timestamp": stamp}
                      for ph in phases])


def load_extras(plugins, variants) -> None:
    """Import the plugin modules (providers registered outside suite/providers), then register
    the variants (whose base may be a plugin's provider); both are idempotent."""
    from suite.providers.own import register_variant

    for module in plugins:
        importlib.import_module(module)
    for base, name, overrides in variants:
        register_variant(base, name, overrides)


def run_environment(plan: dict) -> dict:
    """env.json of a run: the machine and versions, and the variants' config overrides."""
    return dict(environment(plan["device"]), own_variants=plan.get("variants") or None)


def measure_job(job: dict) -> dict:
    """One isolated job (``--worker``): the ``providers`` of cell ``cell`` of the planned run
    ``run_dir``; its rows go to the run's results.csv."""
    out = Path(job["run_dir"])
    plan = json.loads((out / PLAN).read_text())
    load_extras(plan.get("plugins", []), plan.get("variants", []))
    cells = {Cell(**c).cell_id: Cell(**c) for c in plan["cells"]}
    if job["cell"] not in cells:
        return {"status": "error", "error": f"cell {job['cell']!r} is not in {out / PLAN}"}
    writer = ResultsWriter(out, run_environment(plan), plan["run_id"])
    with held_messages() as held:  # handed to the parent, which prints them after its bar
        measure_cell(cells[job["cell"]], job["providers"], plan["phases"], device=plan["device"],
                     reps=plan["reps"], warmup=plan["warmup"], writer=writer,
                     run_id=plan["run_id"], inflight_path=out / INFLIGHT,
                     clocks=plan.get("clocks", False))
    return {"status": "ok", "messages": held}


if __name__ == "__main__":
    if sys.argv[1:] != ["--worker"]:
        raise SystemExit("python -m suite.runner --worker: internal, the child of --isolate "
                         "(suite.isolate); measure with `python -m suite bench`")
    serve(measure_job)
