"""The gate's baseline file: pytest-benchmark's JSON of several fresh processes, merged; pure.

``--save`` runs the gate's benchmarks in ``spec.SAVE_PROCESSES`` processes, each writing
pytest-benchmark's JSON with a ``cce_gate`` block (the protocol, the benchmarks it skipped and
why). ``merge`` makes one file of them:

- ``benchmarks[]``: pytest-benchmark's entries, ``stats`` over every process's rounds, and in
  ``extra_info["processes"]`` each process's gated values (``process_values``): what the
  limits are taken from;
- ``cce_gate``: format, protocol, process count, and ``not_run``: the benchmarks every process
  skipped, with the reason (optional: a check may skip them too); a benchmark skipped by some
  processes only is an error;
- ``machine_info`` / ``commit_info``: the first process's (all must agree on the GPU).
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

from suite.gates.spec import BASELINE_FORMAT, ERROR_METRICS, INJECT_ENV, PATH_METRIC, protocol

GATED_VALUES = ("peak_extra_mib",) + ERROR_METRICS


class BaselineError(ValueError):
    """A baseline that cannot be used, or processes that cannot be merged into one."""


def param(bench: dict) -> str:
    """A pytest-benchmark entry's benchmark id (``gemma2-2b-own-fwd``)."""
    if bench.get("param"):
        return str(bench["param"])
    name = bench.get("fullname") or bench.get("name", "")
    return name[name.index("[") + 1:-1] if name.endswith("]") else name


def process_values(bench: dict) -> dict:
    """One process's gated values of one benchmark: the minimum and median of its rounds (ms),
    and from extra_info the memory, the errors and the own kernel's path."""
    stats, extra = bench["stats"], bench.get("extra_info") or {}
    out = {"min_ms": stats["min"] * 1e3, "median_ms": stats["median"] * 1e3,
           "rounds": stats.get("rounds")}
    out.update({k: extra[k] for k in GATED_VALUES + (PATH_METRIC,) if extra.get(k) is not None})
    return out


def _gate_block(doc: dict, where: str) -> dict:
    block = doc.get("cce_gate")
    if not isinstance(block, dict):
        raise BaselineError(f"{where}: no cce_gate block: not written by this gate's pytest "
                            f"plugin (suite/gates/plugin.py)")
    return block


def _pooled_stats(entries: list[dict]) -> dict:
    from pytest_benchmark.stats import Stats

    pooled = Stats()
    for entry in entries:
        for x in entry["stats"].get("data") or []:
            pooled.update(x)
    if not pooled:
        return dict(entries[0]["stats"])
    return {**pooled.as_dict(), "data": list(pooled.data), "iterations": 1}


def _check_processes(docs: list[dict], names: list[str]) -> None:
    if len(docs) < 2:
        raise BaselineError(f"a baseline needs at least 2 processes (their spread sets the "
                            f"limits); got {len(docs)}")
    first = _gate_block(docs[0], names[0])
    for doc, name in zip(docs, names):
        block = _gate_block(doc, name)
        if block.get("protocol") != first.get("protocol"):
            raise BaselineError(f"{name}: protocol {block.get('protocol')} differs from "
                                f"{names[0]}'s {first.get('protocol')}")
        info = doc.get("machine_info") or {}
        if info.get("cce_gate_inject"):
            raise BaselineError(f"{name}: measured with {INJECT_ENV}={info['cce_gate_inject']}")
        if (info.get("gpu") or {}).get("slug") != \
                ((docs[0].get("machine_info") or {}).get("gpu") or {}).get("slug"):
            raise BaselineError(f"{name}: measured on another GPU than {names[0]}")


def merge(docs: list[dict], names: list[str] | None = None) -> dict:
    """One baseline from the JSON documents of several processes of the same benchmarks."""
    names = names or [f"process {i + 1}" for i in range(len(docs))]
    _check_processes(docs, names)
    runs = [{param(b): b for b in doc.get("benchmarks", [])} for doc in docs]
    skipped = [_gate_block(doc, name).get("not_run") or {} for doc, name in zip(docs, names)]
    ids = list(dict.fromkeys([i for run in runs for i in run] + [i for s in skipped for i in s]))
    benchmarks, not_run = [], {}
    for bid in ids:
        ran = [run[bid] for run in runs if bid in run]
        if len(ran) == len(runs):
            entry = {k: v for k, v in ran[0].items() if k != "stats"}
            entry["stats"] = _pooled_stats(ran)
            entry["extra_info"] = {**(ran[0].get("extra_info") or {}),
                                   "processes": [process_values(b) for b in ran]}
            benchmarks.append(entry)
        elif not ran and all(bid in s for s in skipped):
            not_run[bid] = skipped[0][bid]
        else:
            raise BaselineError(f"{bid} ran in {len(ran)} of {len(runs)} processes (skipped or "
                                f"failed in the others): a baseline needs it in all or none")
    first = docs[0]
    return {
        "machine_info": first.get("machine_info"),
        "commit_info": first.get("commit_info"),
        "datetime": first.get("datetime"),
        "version": first.get("version"),
        "cce_gate": {"format": BASELINE_FORMAT, "protocol": _gate_block(first, names[0])
                     .get("protocol"), "processes": len(docs), "not_run": not_run},
        "benchmarks": benchmarks,
    }


class Baseline:
    """A loaded, validated baseline: each benchmark's per-process values, and what was not run."""

    def __init__(self, doc: dict, where: str = "baseline"):
        block = doc.get("cce_gate") if isinstance(doc, dict) else None
        if not isinstance(block, dict) or block.get("format") != BASELINE_FORMAT:
            raise BaselineError(
                f"{where} was not saved by this version of the gate (format "
                f"{(block or {}).get('format', 1)}, this gate reads {BASELINE_FORMAT}: limits "
                f"from several processes): save it again with `nox -s gate -- --save`")
        if block.get("protocol") != protocol():
            raise BaselineError(f"{where} was measured with {block.get('protocol')}; this gate "
                                f"measures {protocol()}: save it again with "
                                f"`nox -s gate -- --save`")
        info = doc.get("machine_info") or {}
        if info.get("cce_gate_inject"):
            raise BaselineError(f"{where} was saved with {INJECT_ENV}={info['cce_gate_inject']}: "
                                f"it is no baseline; save it again")
        self.where, self.doc = where, doc
        self.machine_info = info
        self.processes = int(block.get("processes") or 0)
        self.not_run = dict(block.get("not_run") or {})
        self.benchmarks = {param(b): b for b in doc.get("benchmarks", [])}

    @classmethod
    def load(cls, path) -> "Baseline":
        path = Path(path)
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            raise BaselineError(f"cannot read baseline {path}: {err}") from None
        return cls(doc, str(path))

    @property
    def gpu_slug(self) -> str | None:
        return (self.machine_info.get("gpu") or {}).get("slug")

    def values(self, benchmark: str) -> list[dict] | None:
        """Each process's values of ``benchmark`` (process_values), or None: not in the
        baseline (new, or optional: see ``not_run``)."""
        bench = self.benchmarks.get(benchmark)
        return None if bench is None else list(bench["extra_info"]["processes"])


def center_and_spread(values: list[float]) -> tuple[float, float]:
    """(median, (max - min) / median) of the per-process values; spread 0 for one value or a
    zero median."""
    center = statistics.median(values)
    spread = (max(values) - min(values)) / abs(center) if center else 0.0
    return center, spread
