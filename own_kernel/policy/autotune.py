"""Tile shapes tuned on the user's own GPU, once, and remembered on disk.

The portable target (any CUDA GPU without Hopper's TMA path, and fp32 inputs) has no tiles
measured here for every GPU it may meet. So its kernels (the forward, the backward's pointer
dlogits and softmax_grad) time a small set of candidate launch shapes (policy/config.py:
``Tiles``, or
``SoftmaxGrad`` for softmax_grad) on the first call of a shape bucket, keep the fastest, and
store it in a JSON cache keyed by (kernel, GPU name, dtype, shape bucket, and a digest of the
candidates and the kernel's other options): later calls, later processes and the benchmark's
timed calls read it and pay nothing, and a config with other candidates or another kernel
variant tunes for itself instead of reading another's pick. ``python -m suite kernel
tune --portable`` fills the cache ahead of time and prints it.

The backward's kernels add into their sums with atomics and write W: their candidates are timed
into fresh scratch sums (``tuned_launch``), and into the real W, which the real launch then
overwrites.

The cache file is ``$CCE_OWN_TUNE_CACHE`` or ``~/.cache/cce-bench/own_kernel_tiles.json``, an
entry ``{"tiles": {field: value}, "type": "Tiles" | "SoftmaxGrad", "ms": ...}`` (entries without
a type are Tiles); writes go through a temporary file and a rename, so a reader never sees half a
file.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import tempfile
from pathlib import Path

import torch

from own_kernel.policy.config import SoftmaxGrad, Tiles
from own_kernel.kernels.rows import Sums

_MEMO: dict[str, Tiles | SoftmaxGrad] = {}  # this process's reads of the cache (per machine)


def cache_path() -> Path:
    env = os.environ.get("CCE_OWN_TUNE_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "cce-bench" / "own_kernel_tiles.json"


def shape_bucket(n: int, v: int, d: int | None = None) -> str:
    """Shapes that share tiles: N and V (or a chunk's width) by powers of two (their tile counts
    set occupancy), D to the next multiple of 256 (the reduction length; None: no reduction)."""
    def pow2(x: int) -> int:
        return 1 << max(0, math.ceil(math.log2(max(1, x))))
    return f"n{pow2(n)}-v{pow2(v)}" + (f"-d{-(-d // 256) * 256}" if d is not None else "")


def tune_key(kernel: str, device: torch.device, dtype: torch.dtype, bucket: str, *,
             candidates: tuple, variant: tuple = ()) -> str:
    """The cache key of a kernel's pick. Its last field digests the candidates and `variant`
    (the options the kernel compiles or plans with besides its launch shape, as (name, value)
    pairs): the fastest tiles of one load scheme or grid are not another's."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    digest = hashlib.sha1(repr((candidates, variant)).encode()).hexdigest()[:10]
    return f"{kernel}|{name}|{str(dtype).removeprefix('torch.')}|{bucket}|{digest}"


def read_cache(path: Path | None = None) -> dict:
    path = path or cache_path()
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def _write_entry(key: str, tiles, ms: float, path: Path | None = None) -> None:
    path = path or cache_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    entries = read_cache(path)  # other processes may have added entries meanwhile
    entries[key] = dict(tiles=dataclasses.asdict(tiles), type=type(tiles).__name__, ms=ms)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(entries, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


def _from_entry(entry: dict | None, kind: type):
    """The cache entry's launch shape if it is a `kind`, else None (then it is tuned again)."""
    if entry is None or entry.get("type", "Tiles") != kind.__name__:
        return None
    try:
        return kind(**entry["tiles"])
    except (KeyError, TypeError, ValueError):  # fields of another version of the kernel
        return None


def _cached_pick(key: str, candidates: tuple):
    """The cache's pick for key if it is one of the candidates (a file edited by hand, or
    written by another version, may name others), else None."""
    cached = _from_entry(read_cache().get(key), type(candidates[0])) if candidates else None
    return cached if cached in candidates else None


def tuned_tiles(key: str, candidates: tuple, time_ms):
    """The cached launch shape of `key` if it is one of the candidates, else the fastest
    candidate by time_ms(candidate) (a candidate that fails to compile or run is skipped),
    stored for next time. key: tune_key's, which digests the candidates."""
    if key in _MEMO:
        return _MEMO[key]
    cached = _cached_pick(key, candidates)
    if cached is not None:
        _MEMO[key] = cached
        return cached
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


def tunes(on: torch.Tensor | str, cfg, candidates: tuple) -> bool:
    """Whether a launch on a tensor's device (or a device type: "cuda", "cpu") picks its shape
    from candidates: the portable target (cfg.autotune) on a CUDA GPU. The interpreter keeps
    its one fixed config. The route asks it once per call (Route.pointer_tuned)."""
    on_cuda = on.is_cuda if isinstance(on, torch.Tensor) else on == "cuda"
    return cfg.autotune and on_cuda and bool(candidates)


def tuned_launch(key: str, candidates: tuple, launch, rows: int, cols: int, device,
                 filters: bool = False):
    """tuned_tiles for a backward kernel that adds into Sums: launch(candidate, sums) is timed
    into fresh zeroed scratch Sums (rows x cols, the filter's vectors too when filters), never
    into the real ones, which the real launch alone must add to."""
    def time_ms(candidate):
        scratch = Sums.zeros(rows, cols, device, 1 if filters else None)
        return time_launch(lambda: launch(candidate, scratch))

    return tuned_tiles(key, candidates, time_ms)
