"""The jobs of a training-bench session, as run in its worker process (suite.isolate)."""
from __future__ import annotations

import torch

from suite.measure import free_memory
from suite.train.backends import failure
from suite.train.bench import bench_job
from suite.train.convergence import converge_job


def env_job(job: dict) -> dict:
    """The environment, taken in the worker: the parent never touches CUDA (a context there
    would take GPU memory from the measured process)."""
    from suite.results import environment

    dev = torch.device(job["device"])
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    return {"status": "ok", "env": environment(job["device"]), "device_name": name}


JOBS = {"bench": bench_job, "converge": converge_job, "env": env_job}


def run_job(job: dict) -> dict:
    dev = torch.device(job.get("device", "cpu"))
    try:
        result = JOBS[job["kind"]](job)
    except Exception as err:  # noqa: BLE001  (a failing job is data)
        result = failure(err, dev)
    if not result.get("fatal"):  # a broken CUDA context cannot even be synchronised
        free_memory(dev)
    return result
