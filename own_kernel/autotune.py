"""Tile shapes tuned on the user's own GPU, once, and remembered on disk.

The portable target (any CUDA GPU without Hopper's TMA path, and fp32 inputs) has no tiles
measured here for every GPU it may meet. So its kernels time a small set of candidate tiles
(config.py) on the first call of a shape bucket, keep the fastest, and store it in a JSON cache
keyed by (kernel, GPU name, dtype, shape bucket): later calls, later processes and the
benchmark's timed calls read it and pay nothing. ``python -m suite kernel tune --portable``
fills the cache ahead of time and prints it.

The cache file is ``$CCE_OWN_TUNE_CACHE`` or ``~/.cache/cce-bench/own_kernel_tiles.json``;
writes go through a temporary file and a rename, so a reader never sees half a file.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import tempfile
from pathlib import Path

import torch

from own_kernel.config import Tiles

_MEMO: dict[str, Tiles] = {}  # this process's reads of the cache (a property of the machine)


def cache_path() -> Path:
    env = os.environ.get("CCE_OWN_TUNE_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "cce-bench" / "own_kernel_tiles.json"


def shape_bucket(n: int, v: int, d: int) -> str:
    """Shapes that share tiles: N and V by powers of two (their tile counts set occupancy), D
    to the next multiple of 256 (the reduction length)."""
    def pow2(x: int) -> int:
        return 1 << max(0, math.ceil(math.log2(max(1, x))))
    return f"n{pow2(n)}-v{pow2(v)}-d{-(-d // 256) * 256}"


def tune_key(kernel: str, device: torch.device, dtype: torch.dtype, bucket: str) -> str:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return f"{kernel}|{name}|{str(dtype).removeprefix('torch.')}|{bucket}"


def read_cache(path: Path | None = None) -> dict:
    path = path or cache_path()
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def _write_entry(key: str, tiles: Tiles, ms: float, path: Path | None = None) -> None:
    path = path or cache_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    entries = read_cache(path)  # other processes may have added entries meanwhile
    entries[key] = dict(tiles=dataclasses.asdict(tiles), ms=ms)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(entries, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


def tuned_tiles(key: str, candidates: tuple[Tiles, ...], time_ms) -> Tiles:
    """The cached tiles of `key`, else the fastest candidate by time_ms(tiles) (a candidate
    that fails to compile or run is skipped), stored for next time."""
    if key in _MEMO:
        return _MEMO[key]
    entry = read_cache().get(key)
    if entry is not None:
        _MEMO[key] = Tiles(**entry["tiles"])
        return _MEMO[key]
    timed = []
    for tiles in candidates:
        try:
            timed.append((time_ms(tiles), tiles))
        except Exception:  # noqa: BLE001 - a candidate this GPU cannot run is no candidate
            continue
    if not timed:
        raise RuntimeError(f"autotune: no candidate tile ran for {key}")
    ms, best = min(timed, key=lambda t: t[0])
    _write_entry(key, best, ms)
    _MEMO[key] = best
    return best


def time_launch(launch, reps: int = 5) -> float:
    """Median ms of launch() on the current CUDA stream, after one warm-up (its compile)."""
    launch()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        launch()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]
