"""Machine info for the GPU benchmarks: the gate compares only runs of the same GPU model."""
from __future__ import annotations

import subprocess
from importlib import metadata

LIBRARIES = ("torch", "triton", "liger-kernel", "cut-cross-entropy", "pytest-benchmark")


def library_versions() -> dict:
    out = {}
    for dist in LIBRARIES:
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "not installed"
    return out


def driver_version() -> str:
    try:
        import pynvml  # ships with some CUDA builds of torch; nvidia-smi otherwise

        pynvml.nvmlInit()
        version = pynvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception:
        pass
    try:
        res = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        if res.returncode == 0 and res.stdout.strip():
            return res.stdout.splitlines()[0].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown"


def gpu_info() -> dict | None:
    import torch

    if not torch.cuda.is_available():
        return None
    from suite.gate import gpu_slug

    index = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    return {
        "name": props.name,
        "slug": gpu_slug(props.name),
        "capability": f"{props.major}.{props.minor}",
        "memory_gib": round(props.total_memory / 2**30, 1),
        "multiprocessors": props.multi_processor_count,
        "driver": driver_version(),
        "cuda": torch.version.cuda,
    }


def pytest_benchmark_update_machine_info(config, machine_info):
    machine_info["gpu"] = gpu_info()
    machine_info["libraries"] = library_versions()


def pytest_benchmark_update_commit_info(config, commit_info):
    # The same precedence as the suite's env.json (suite.results.git_commit): a copy of the
    # checkout on a GPU machine may carry a .git older than its files.
    from suite.results import git_commit

    commit, dirty = git_commit()
    if commit and commit != commit_info.get("id"):
        commit_info.update(id=commit, dirty=dirty, time=None, author_time=None)
