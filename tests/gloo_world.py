"""Gloo worlds for the multi-process CPU tests: each rank runs a module-level worker that
returns a JSON-able dict; the parent reads every rank's dict back.

    def _worker(rank, world, port, out_dir):
        with gloo_rank(rank, world, port, out_dir) as result:
            result["x"] = ...               # written to out_dir/rank<r>.json on success

    ranks = spawn_world(_worker, world, out_dir)   # [rank 0's dict, rank 1's, ...]
"""
from __future__ import annotations

import contextlib
import datetime
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from suite.ranks import _free_port


@contextlib.contextmanager
def gloo_rank(rank: int, world: int, port: int, out_dir: str):
    """One rank: the interpreter (unless the environment says otherwise), one thread, a gloo
    group whose collectives fail after 120 s instead of hanging CI when a rank never reaches
    one. Yields the dict the rank fills; it is written only when the block ends cleanly, and the
    rank then exits (nothing after the block runs)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                      TRITON_INTERPRET=os.environ.get("TRITON_INTERPRET", "1"))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    try:
        result: dict = {}
        yield result
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump(result, f)
        dist.barrier()  # every rank's result is written
    except BaseException:
        dist.destroy_process_group()
        raise
    # Leave without the group's C++ teardown: it aborts a rank now and then ("terminate called
    # without an active exception", SIGABRT) even after a barrier, which the parent reads as a
    # failed world (a two-rank world of test_distributed once; suite/train/distributed.py's
    # ranks leave the same way for the same flake).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def spawn_world(worker, world: int, out_dir: str) -> list[dict]:
    """Runs worker(rank, world, port, out_dir) in ``world`` spawned processes; their dicts."""
    mp.start_processes(worker, args=(world, _free_port(), out_dir), nprocs=world,
                       start_method="spawn", join=True)
    return [json.load(open(os.path.join(out_dir, f"rank{r}.json"))) for r in range(world)]
