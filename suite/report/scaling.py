"""``python -m suite.report.scaling RUN``: results/notes/scaling.md, the vocab-parallel kernel's
step time and memory per rank beyond two GPUs, predicted from one two-GPU run's measurements.

RUN is a committed two-GPU run folder holding:

- ``vp/<shape>-single`` and ``vp/<shape>-vp2``: the vocab-parallel bench's one-GPU and two-rank
  rows of a shape (``python -m suite bench --vocab-parallel 2``);
- ``train-2gpu/nccl_allreduce.csv`` (or ``train-k2/``): NCCL's all-reduce time per message size
  on the two GPUs
  (suite/train/distributed.py).

The model (every input a measured value of RUN, or an assumption named in the note):

- compute: the single-GPU ``loss+grad`` time t1 splits evenly over K ranks: t1 / K (each rank
  runs the single-GPU kernel on V / K columns and all N rows);
- communication per call: forward, an all-reduce MAX of 2N + 2 fp32 and a SUM of 4N fp32;
  backward, an all-reduce SUM of dE, N x D in fp32 (``--de-allreduce input``: in the input
  dtype, as vocab_parallel.py did before it summed in fp32). A ring all-reduce of S bytes
  over K ranks moves 2 (K - 1) / K x S per rank; its time is that over the bus bandwidth
  measured at the nearest message size on two GPUs (assumed to hold within a node of K GPUs:
  NVSwitch gives every GPU its own links), and no less than the smallest message's measured
  time x (K - 1) (a ring's 2 (K - 1) latency-bound steps);
- overhead: the two-rank run's measured time minus the model's two-rank prediction (host
  reads, barriers, the targets' checksum), carried unchanged to every K;
- memory per rank: from the single-GPU peak P1 and the two-rank peak P2 of ``loss+grad``, the
  part that does not shrink (dE, E-sized: a = 2 P2 - P1) and the part that does (C-sized:
  b = 2 (P1 - P2)), so P_K = a + b / K;
- 64 GPUs: vocab-parallel over 8 within each of 8 nodes, data parallel across nodes: the head
  as at K = 8, plus its gradient's all-reduce across nodes (V / 8 x D fp32 per rank, once per
  optimizer step, often overlapped with the backward) at an assumed inter-node bandwidth
  (``--internode-gbs``, an assumption, not a measurement).

dE's all-reduce dominates from the K where its time exceeds the compute share t1 / K: solving
2 (K - 1) / K x S_dE / B = t1 / K gives K* = 1 + t1 B / (2 S_dE).

``--measured RUN_K``: a run of more GPUs (``vp/<shape>-single``, ``vp/<shape>-vp<K>``) checks
the prediction. Its GPU may differ from RUN's, so it is compared in ratios: the measured
speed-up t1 / tK beside the predicted one, the measured peak per rank beside P_K, and the
overhead the measurement implies at K (tK - t1 / K - the model's all-reduces at K) beside the
two-rank overhead the model carries. From the largest measured K on, the model is then given
again, corrected: that implied overhead where it is the larger, and the memory line refit
through the measured run's one-GPU and K-rank peaks.
"""
from __future__ import annotations

import argparse
import csv
import json
import math
from dataclasses import dataclass
from pathlib import Path

from suite import results
from suite.report.formatting import md_table, num
from suite.report.vocab_parallel_tables import run_pairs

PHASE = "loss+grad"
PROVIDER = "own"
KS = (1, 2, 4, 8)
NODE = 8
NODES = 8
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


def read_nccl(path: Path, dtype: str = "bfloat16") -> list[tuple[int, float, float]]:
    """(bytes, bus bandwidth GB/s, ms) of the ``dtype`` rows of the two-GPU world, by size."""
    with open(path, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["dtype"] == dtype]
    if not rows:
        raise ValueError(f"{path}: no {dtype} all-reduce rows")
    return sorted((int(r["bytes"]), float(r["busbw_gbs"]), float(r["ms"])) for r in rows)


def busbw_at(nccl, size: float) -> float:
    """The measured bus bandwidth at the nearest measured size (log scale), in bytes/s."""
    nearest = min(nccl, key=lambda r: abs(math.log(max(size, 1)) - math.log(r[0])))
    return nearest[1] * 1e9


def allreduce_s(nccl, size: float, k: int) -> float:
    """A ring all-reduce of ``size`` bytes over k ranks: 2 (k - 1) / k x size / bus bandwidth,
    and no less than the smallest measured message's time (latency-bound), whose 2 ring steps
    on two GPUs become 2 (k - 1) steps on k."""
    if k == 1:
        return 0.0
    floor = nccl[0][2] / 1e3 * (k - 1)
    return max(floor, 2 * (k - 1) / k * size / busbw_at(nccl, size))


@dataclass(frozen=True)
class ScalingOptions:
    internode_gbs: float   # ASSUMED inter-node bandwidth per GPU (GB/s), not measured
    de_allreduce: str      # "fp32" (dE all-reduced in fp32) or "input" (in the input dtype)

    def __post_init__(self):
        if not self.internode_gbs > 0:
            raise ValueError(f"--internode-gbs: must be > 0; got {self.internode_gbs}")
        if self.de_allreduce not in ("fp32", "input"):
            raise ValueError(f"--de-allreduce: 'fp32' or 'input'; got {self.de_allreduce!r}")

    def de_dtype(self, input_dtype: str) -> str:
        return "fp32" if self.de_allreduce == "fp32" else input_dtype


NCCL_DTYPE = {"fp32": "float32", "bf16": "bfloat16", "fp16": "bfloat16"}


def comm_s(x: dict, nccl: dict, opts: ScalingOptions, k: int) -> dict:
    """Seconds of the forward's two all-reduces (fp32 N-vectors) and of dE's (N x D)."""
    fp32 = nccl["float32"]
    fwd = allreduce_s(fp32, 4 * (2 * x["n"] + 2), k) + allreduce_s(fp32, 4 * 4 * x["n"], k)
    de = opts.de_dtype(x["dtype"])
    bwd = allreduce_s(nccl[NCCL_DTYPE[de]], x["n"] * x["d"] * DTYPE_BYTES[de], k)
    return {"fwd": fwd, "bwd": bwd}


def shape_inputs(single_dir: Path, sharded_dir: Path) -> dict:
    """The own provider's loss+grad rows of a shape: (cell, single row, two-rank row)."""
    def own_rows(run_dir):
        return {r["cell_id"]: r for r in results.read_rows(run_dir)
                if r["provider"] == PROVIDER and r["phase"] == PHASE and r["status"] == "ok"}
    singles, shardeds = own_rows(single_dir), own_rows(sharded_dir)
    both = [c for c in singles if c in shardeds]
    if not both:
        raise ValueError(f"{single_dir}, {sharded_dir}: no cell with an ok {PROVIDER} {PHASE} "
                         f"row in both")
    one, two = singles[both[0]], shardeds[both[0]]
    return {"n": int(one["n"]), "d": int(one["d"]), "v": int(one["v"]), "dtype": one["dtype"],
            "t1": num(one["ms"]) / 1e3, "t2": num(two["ms"]) / 1e3,
            "p1": num(one["peak_extra_mib"]), "p2": num(two["peak_extra_mib"])}


def predict(x: dict, nccl: dict, opts: ScalingOptions) -> dict:
    """Per-rank time (s) and memory (MiB) at each K of KS and at NODES x NODE GPUs."""
    c2 = comm_s(x, nccl, opts, 2)
    overhead = x["t2"] - (x["t1"] / 2 + c2["fwd"] + c2["bwd"])
    a, b = 2 * x["p2"] - x["p1"], 2 * (x["p1"] - x["p2"])
    out = {}
    for k in KS:
        c = comm_s(x, nccl, opts, k)
        over = overhead if k > 1 else 0.0
        out[k] = {"compute": x["t1"] / k, "fwd": c["fwd"], "bwd": c["bwd"], "overhead": over,
                  "total": x["t1"] / k + c["fwd"] + c["bwd"] + over, "mib": a + b / k}
    dc_bytes = x["v"] / NODE * x["d"] * 4
    cross = 2 * (NODES - 1) / NODES * dc_bytes / (opts.internode_gbs * 1e9)
    out["multi"] = {**out[NODE], "cross_node": cross, "total": out[NODE]["total"] + cross}
    de = opts.de_dtype(x["dtype"])
    s_de = x["n"] * x["d"] * DTYPE_BYTES[de]
    out["k_star"] = 1 + x["t1"] * busbw_at(nccl[NCCL_DTYPE[de]], s_de) / (2 * s_de)
    out["overhead"] = overhead
    return out


def _ms(s: float) -> str:
    return f"{s * 1e3:.2f}"


def _shape_section(name: str, x: dict, p: dict) -> list[str]:
    head = ["GPUs", "compute t1/K", "fwd all-reduces", "dE all-reduce", "overhead",
            "step (per rank)", "speed-up", "peak per rank"]
    body = []
    for k in KS:
        r = p[k]
        body.append([str(k), _ms(r["compute"]), _ms(r["fwd"]), _ms(r["bwd"]), _ms(r["overhead"]),
                     _ms(r["total"]), f"{p[1]['total'] / r['total']:.2f}x", f"{r['mib']:.0f}"])
    m = p["multi"]
    body.append([f"{NODES * NODE} ({NODES} nodes x {NODE}; + dC across nodes "
                 f"{_ms(m['cross_node'])})", _ms(m["compute"]), _ms(m["fwd"]), _ms(m["bwd"]),
                 _ms(m["overhead"]), _ms(m["total"]), "(data parallel)", f"{m['mib']:.0f}"])
    share = {k: p[k]["bwd"] / p[k]["total"] for k in KS if k > 1}
    return [f"## {name}: N {x['n']}, D {x['d']}, V {x['v']}, {x['dtype']}", "",
            f"Measured: one GPU {_ms(x['t1'])} ms, peak {x['p1']:.0f} MiB; two ranks "
            f"{_ms(x['t2'])} ms, peak {x['p2']:.0f} MiB per rank (the model's two-rank "
            f"prediction misses by the overhead, {_ms(p['overhead'])} ms, carried to every K). "
            f"Times in ms per call of `{PHASE}`; memory in MiB beyond the inputs.", "",
            md_table(head, body), "",
            "dE's all-reduce as a share of the step: "
            + ", ".join(f"{k} GPUs {100 * v:.0f} %" for k, v in share.items())
            + f". It exceeds the compute share t1 / K from K* = {p['k_star']:.1f} GPUs on.",
            ""]


def measured_pairs(run: Path, shape: str) -> list[tuple[int, dict]]:
    """(K, shape_inputs of the one-GPU and K-rank rows) of each vp/<shape>-vp<K> of ``run``
    (K > 2; vocab_parallel_tables.run_pairs finds them), by K."""
    pairs = [(k, shape_inputs(single, sharded))
             for name, single, sharded, k in run_pairs(run) if name == shape and k > 2]
    return sorted(pairs, key=lambda pair: pair[0])


def _implied_overhead(m: dict, k: int, nccl: dict, opts: ScalingOptions) -> float:
    """The overhead a K-rank measurement implies: its time less t1 / K and the model's
    all-reduces at K (t2 of ``m`` is its K-rank time)."""
    return m["t2"] - m["t1"] / k - sum(comm_s(m, nccl, opts, k).values())


def _measured_section(run: Path, pairs, x: dict, p: dict, nccl: dict,
                      opts: ScalingOptions) -> list[str]:
    """The prediction beside another run's measurements at K ranks (ratios: its GPU may
    differ); t2 of a pair is its K-rank time."""
    head = ["GPUs", "one GPU ms", "K ranks ms", "speed-up measured", "predicted",
            "overhead implied ms", "carried ms", "peak per rank measured", "predicted"]
    body = []
    for k, m in pairs:
        implied = _implied_overhead(m, k, nccl, opts)
        predicted = p.get(k)
        body.append([str(k), _ms(m["t1"]), _ms(m["t2"]), f"{m['t1'] / m['t2']:.2f}x",
                     f"{p[1]['total'] / predicted['total']:.2f}x" if predicted else "–",
                     _ms(implied), _ms(p["overhead"]), f"{m['p2']:.0f}",
                     f"{predicted['mib']:.0f}" if predicted else "–"])
    misses = [f"at {k} GPUs the predicted speed-up is "
              f"{_pct(p[1]['total'] / p[k]['total'], m['t1'] / m['t2'])} the measured one, the "
              f"predicted peak {_pct(p[k]['mib'], m['p2'])} the measured one"
              for k, m in pairs if k in p]
    return [f"Measured in `{run.as_posix()}` ({env_gpu(run)}), the same shape (the all-reduces "
            f"at K as above, from the two-GPU run's NCCL table):", "", md_table(head, body), "",
            ("The model against it: " + "; ".join(misses) + ".") if misses else "", ""] \
        + _corrected(x, p, pairs[-1], nccl, opts)


def _corrected(x: dict, p: dict, pair: tuple[int, dict], nccl: dict,
               opts: ScalingOptions) -> list[str]:
    """The model again from K on, corrected by the largest measured K: its implied overhead
    where above the carried one, and the memory line refit through that run's one-GPU and
    K-rank peaks (P_K = a + b / K)."""
    km, m = pair
    implied = _implied_overhead(m, km, nccl, opts)
    overhead = max(p["overhead"], implied)
    b = (m["p1"] - m["p2"]) * km / (km - 1)
    a = m["p1"] - b
    body = []
    for k in [k for k in KS if k >= km]:
        step = x["t1"] / k + sum(comm_s(x, nccl, opts, k).values()) + overhead
        body.append([str(k), _ms(p[k]["total"]), _ms(step),
                     f"{p[1]['total'] / p[k]['total']:.2f}x", f"{x['t1'] / step:.2f}x",
                     f"{p[k]['mib']:.0f}", f"{a + b / k:.0f}"])
    head = ["GPUs", "step (model)", "corrected", "speed-up (model)", "corrected",
            "peak per rank (model)", "corrected"]
    return [f"Corrected by the {km}-rank run, from {km} GPUs on: the overhead its measurement "
            f"implies ({_ms(implied)} ms) where above the carried one, and the memory line "
            f"refit through its one-GPU and {km}-rank peaks ({a:.0f} + {b:.0f} / K MiB). Times "
            f"in the two-GPU run's units:", "", md_table(head, body), ""]


def _pct(predicted: float, measured: float) -> str:
    """How far a prediction lies from the measurement: '4 % above', '1 % below', 'equal to'."""
    off = round(100 * (predicted / measured - 1))
    return "equal to" if off == 0 else f"{abs(off)} % {'above' if off > 0 else 'below'}"


def env_gpu(run: Path) -> str:
    """The GPU a run's vocab-parallel rows were measured on (its first env.json that says)."""
    for env in sorted((run / "vp").glob("*/env.json")):
        name = json.loads(env.read_text()).get("gpu_name")
        if name:
            return name
    return "GPU not recorded"


NCCL_TABLES = ("train-2gpu", "train-k2")  # the two-GPU step folders that time NCCL's all-reduce


def nccl_path(run: Path) -> Path:
    """The run's two-GPU NCCL table: the first of NCCL_TABLES's folders that holds one."""
    for folder in NCCL_TABLES:
        if (path := run / folder / "nccl_allreduce.csv").is_file():
            return path
    raise ValueError(f"{run}: no nccl_allreduce.csv in {' or '.join(NCCL_TABLES)}")


def render(run: Path, opts: ScalingOptions, command: str, measured: Path | None = None) -> str:
    path = nccl_path(run)
    nccl = {dtype: read_nccl(path, dtype) for dtype in ("float32", "bfloat16")}
    lines = ["# Vocab-parallel CCE beyond two GPUs (generated)", "",
             f"Generated by `{command}` from `{run.as_posix()}`"
             f"{f' and `{measured.as_posix()}`' if measured else ''}; every number below is "
             f"computed from those runs' files, except the assumed inter-node bandwidth "
             f"({opts.internode_gbs:g} GB/s per GPU, `--internode-gbs`). dE is all-reduced "
             f"in {'fp32' if opts.de_allreduce == 'fp32' else 'the input dtype'} "
             f"(`--de-allreduce`). The model and its assumptions: `suite/report/scaling.py`'s "
             f"docstring.", "",
             "## NCCL all-reduce on the two GPUs", "",
             md_table(["bytes", "bus bandwidth GB/s, fp32", "bf16"],
                      [[f"{b:,}", f"{bw:.1f}", f"{bf:.1f}"] for (b, bw, _), (_, bf, _)
                       in zip(nccl["float32"], nccl["bfloat16"])]), ""]
    shapes = sorted(p.name[:-len("-single")] for p in (run / "vp").glob("*-single"))
    if not shapes:
        raise ValueError(f"{run}/vp: no <shape>-single run folders")
    for shape in shapes:
        x = shape_inputs(run / "vp" / f"{shape}-single", run / "vp" / f"{shape}-vp2")
        p = predict(x, nccl, opts)
        lines += _shape_section(shape, x, p)
        pairs = measured_pairs(measured, shape) if measured else []
        if pairs:
            lines += _measured_section(measured, pairs, x, p, nccl, opts)
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m suite.report.scaling",
                                description=__doc__.splitlines()[0])
    p.add_argument("run", help="the two-GPU run folder (vp/<shape>-single, vp/<shape>-vp2, "
                               "train-2gpu/ or train-k2/nccl_allreduce.csv)")
    p.add_argument("--out", default="results/notes/scaling.md")
    p.add_argument("--internode-gbs", type=float, default=50.0,
                   help="ASSUMED inter-node bandwidth per GPU, GB/s (default 50: 400 Gb/s "
                        "InfiniBand per GPU)")
    p.add_argument("--de-allreduce", default="fp32", choices=("fp32", "input"),
                   help="the dtype vocab_parallel.py all-reduces dE in (default fp32)")
    p.add_argument("--measured", metavar="RUN_K",
                   help="a run of more GPUs (vp/<shape>-single, vp/<shape>-vp<K>): its "
                        "measurements beside the prediction at K")
    args = p.parse_args(argv)
    try:
        opts = ScalingOptions(args.internode_gbs, args.de_allreduce)
    except ValueError as err:
        p.error(str(err))
    command = " ".join(["python -m suite.report.scaling", args.run]
                       + (["--internode-gbs", f"{args.internode_gbs:g}"]
                          if args.internode_gbs != 50.0 else [])
                       + (["--de-allreduce", "input"] if args.de_allreduce == "input" else [])
                       + (["--measured", args.measured] if args.measured else []))
    text = render(Path(args.run), opts, command, Path(args.measured) if args.measured else None)
    Path(args.out).write_text(text + "\n")
    print(f"scaling: wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
