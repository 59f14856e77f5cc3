"""`python -m suite kernel invariance --ranks K`: batch_invariant's forward across K ranks.

K processes (NCCL with one GPU each and NVLink multicast off, as suite/ranks.py; gloo on the
CPU) build the same seeded inputs; each holds a shard of the vocabulary (``--shards even``:
torch.chunk's split, as a DTensor Shard(0) head or an HF tensor-parallel plan gives; ``blocks``:
whole blocks of the target's plan.invariant_block, as even as that allows) and runs
linear_cross_entropy(reduction="none", return_lse, return_entropy, temperature 0.7) with
vocab_parallel and the backward of sum w loss + beta H, and the same call on one process with
the whole vocabulary. Rank 0 writes DIR/ranks<K>.json: per model, for batch_invariant and the
default, whether loss, lse and entropy are the single-process call's bits and the relative
differences of loss, lse, entropy, dE and of the gathered dC (dE is a sum over the ranks'
partials: not expected to be bitwise), and the same as a table, DIR/ranks<K>.csv. A call that
raises a ValueError (a kernel version that refuses the split) is recorded as that model's error
(listed under "refused"), and the run goes on.
"""
from __future__ import annotations

import csv
import datetime as dt
import json
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

TEMPERATURE = 0.7


def seeded_inputs(n, d, v, device, dtype, seed=0):
    """(e, c, targets (a tenth ignored), per-row weights of loss and entropy), seeded: the same
    on every rank and in every call."""
    g = torch.Generator().manual_seed(seed)
    e = (torch.randn(n, d, generator=g) * 0.5).to(device, dtype)
    c = (torch.randn(v, d, generator=g) * d ** -0.5 * 4).to(device, dtype)
    t = torch.randint(0, v, (n,), generator=g)
    t[torch.rand(n, generator=g) < 0.1] = -100
    w = (torch.rand(n, 2, generator=g) + 0.5).to(device)
    return e, c, t.to(device), w


def aligned_bounds(v: int, world: int, block: int) -> list[tuple[int, int]]:
    """[start, stop) per rank: whole blocks, split as evenly as they go (the last stops at V)."""
    blocks = -(-v // block)
    base, extra = divmod(blocks, world)
    bounds, start = [], 0
    for r in range(world):
        stop = min(v, start + (base + (r < extra)) * block)
        bounds.append((start, stop))
        start = stop
    return bounds


def even_bounds(v: int, world: int) -> list[tuple[int, int]]:
    """[start, stop) per rank as torch.chunk splits V: ceil(V / world) each, the last shorter."""
    size = -(-v // world)
    return [(min(v, r * size), min(v, (r + 1) * size)) for r in range(world)]


def shard_bounds(v: int, world: int, shards: str, block: int) -> list[tuple[int, int]]:
    if shards == "even":
        return even_bounds(v, world)
    if shards == "blocks":
        return aligned_bounds(v, world, block)
    raise ValueError(f"--shards: expected 'even' or 'blocks', got {shards!r}")


def _rows(e, c, t, w, invariant, vp=None):
    from own_kernel import linear_cross_entropy

    e = e.detach().clone().requires_grad_()
    c = c.detach().clone().requires_grad_()
    out = linear_cross_entropy(e, c, t, reduction="none", return_lse=True, return_entropy=True,
                               temperature=TEMPERATURE, batch_invariant=invariant,
                               vocab_parallel=vp)
    (out.loss * w[:, 0] + out.entropy * w[:, 1]).sum().backward()
    return {"loss": out.loss.detach(), "lse": out.lse.detach(), "entropy": out.entropy.detach(),
            "dE": e.grad, "dC": c.grad}


def _rel(a, b) -> float:
    a, b = a.double(), b.double()
    ok = torch.isfinite(b)
    return float((a[ok] - b[ok]).norm() / b[ok].norm().clamp_min(1e-300))


def _model_result(model, d, v, rows, device, rank, world, shards) -> dict:
    from own_kernel import VocabParallel
    from own_kernel.policy.config import config_for
    from own_kernel.policy.plan import invariant_block

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    e, c, t, w = seeded_inputs(rows, d, v, device, dtype)
    bounds = shard_bounds(v, world, shards, invariant_block(config_for(device, dtype)))
    start, stop = bounds[rank]
    out = {"d": d, "v": v, "shards": shards, "bounds": bounds}
    for mode, invariant in (("batch_invariant", True), ("default", False)):
        try:  # a refusal (ValueError, raised by every rank alike) is recorded, not fatal
            got = _rows(e, c[start:stop], t, w, invariant, VocabParallel(None, start, stop))
        except ValueError as err:
            out[mode] = {"error": str(err)}
            continue
        ref = _rows(e, c, t, w, invariant)
        padded = max(b - a for a, b in bounds)
        mine = got["dC"].new_zeros(padded, d)
        mine[:stop - start] = got["dC"]
        gathered = [torch.empty_like(mine) for _ in bounds]
        dist.all_gather(gathered, mine)
        dc = torch.cat([g[:b - a] for g, (a, b) in zip(gathered, bounds)])
        out[mode] = {name: {"equal": bool(torch.equal(got[name], ref[name])),
                            "rel": _rel(got[name], ref[name])}
                     for name in ("loss", "lse", "entropy", "dE")}
        out[mode]["dC"] = {"equal": bool(torch.equal(dc, ref["dC"])), "rel": _rel(dc, ref["dC"])}
    return out


def _rank_main(rank, world, port, args_dict, out_dir):
    from suite.ranks import MULTICAST_OFF

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), **MULTICAST_OFF)
    device = torch.device(args_dict["device"])
    if device.type == "cuda":
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
    cuda = device.type == "cuda"
    if not cuda:  # one thread per rank, as torchrun sets: the ranks share the host's cores
        torch.set_num_threads(1)
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world,
                            timeout=dt.timedelta(seconds=300), device_id=device if cuda else None)
    try:
        report = {"world_size": world, "rows": args_dict["rows"], "models": {}}
        for model, (d, v) in args_dict["shapes"].items():
            report["models"][model] = _model_result(model, d, v, args_dict["rows"], device,
                                                    rank, world, args_dict["shards"])
        compared = [m for m in report["models"].values() if "error" not in m["batch_invariant"]]
        report["refused"] = [k for k, m in report["models"].items()
                             if "error" in m["batch_invariant"]]
        report["forward_bitwise"] = bool(compared) and all(
            m["batch_invariant"][n]["equal"] for m in compared for n in ("loss", "lse", "entropy"))
        if rank == 0:
            with open(os.path.join(out_dir, f"ranks{world}.json"), "w") as f:
                json.dump(report, f, indent=1)
        dist.barrier()  # no rank tears the group down while another still uses it
    finally:
        dist.destroy_process_group()


RANKS_FIELDS = ["world_size", "model", "d", "v", "shards", "bounds", "mode", "output", "equal",
                "rel", "error"]


def write_ranks_csv(report: dict, path: str) -> None:
    """ranks<K>.json as one row per (model, mode, output): its bits against the single process
    (equal) and relative difference, or the refusal (error)."""
    rows = []
    for model, m in report["models"].items():
        common = {"world_size": report["world_size"], "model": model, "d": m["d"], "v": m["v"],
                  "shards": m.get("shards", "blocks"),
                  "bounds": " ".join(f"{a}-{b}" for a, b in m["bounds"])}
        for mode in ("batch_invariant", "default"):
            if "error" in m[mode]:
                rows.append({**common, "mode": mode, "error": m[mode]["error"]})
                continue
            rows += [{**common, "mode": mode, "output": name, "equal": x["equal"],
                      "rel": x["rel"]} for name, x in m[mode].items()]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=RANKS_FIELDS)
        w.writeheader()
        w.writerows(rows)


def run(args, shapes: dict) -> int:
    """Spawn args.ranks ranks; 0 when every model whose shards the invariant call took has
    bitwise forward rows (and at least one did)."""
    from suite.ranks import _free_port

    world = args.ranks
    if args.device == "cuda" and torch.cuda.device_count() < world:
        raise SystemExit(f"--ranks {world}: needs {world} GPUs; this machine has "
                         f"{torch.cuda.device_count()}")
    os.makedirs(args.out, exist_ok=True)
    args_dict = {"device": args.device, "rows": args.rows, "shapes": shapes,
                 "shards": args.shards}
    mp.start_processes(_rank_main, args=(world, _free_port(), args_dict, args.out),
                       nprocs=world, start_method="spawn", join=True)
    with open(os.path.join(args.out, f"ranks{world}.json")) as f:
        report = json.load(f)
    write_ranks_csv(report, os.path.join(args.out, f"ranks{world}.csv"))
    from suite.results import environment
    with open(os.path.join(args.out, f"env-ranks{world}.json"), "w") as f:
        json.dump(environment(), f, indent=1)
    print(f"ranks {world}: batch_invariant forward rows bitwise: {report['forward_bitwise']}"
          + (f" (shards refused, not compared: {', '.join(report['refused'])})"
             if report["refused"] else ""))
    return 0 if report["forward_bitwise"] else 1
