"""The gate's inputs of one shape, kept on disk between the processes of one gate session.

Building a shape's ``lm`` inputs draws every random number from one CPU generator (suite.inputs):
seconds per shape at V 256000, in each fresh process of a ``--save`` or a proof. Where
``CCE_GATE_INPUTS_CACHE`` names a folder (``--save`` and prove.sh set one for their processes),
the first process writes the inputs there and the next ones read the same tensors back. The
file name holds every argument and a digest of suite/inputs.py, so changed inputs never load.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

import torch

from suite.gates.spec import INPUTS_CACHE_ENV


def cache_file(folder, shape, dist: str, dtype: str, seed: int) -> Path:
    import suite.inputs

    code = hashlib.sha256(Path(suite.inputs.__file__).read_bytes()).hexdigest()[:12]
    return Path(folder) / (f"{dist}-{dtype}-seed{seed}-n{shape.n}-d{shape.d}-v{shape.v}-"
                           f"softcap{shape.softcap}-{code}.pt")


def shape_inputs(shape, dist: str, dtype: str, seed: int, device, folder=None) -> dict:
    """suite.inputs.make_inputs of the shape on ``device``; read from, or written to, the
    cache ``folder`` (default: CCE_GATE_INPUTS_CACHE; none: built every time)."""
    from suite.inputs import make_inputs

    folder = folder or os.environ.get(INPUTS_CACHE_ENV)
    path = cache_file(folder, shape, dist, dtype, seed) if folder else None
    if path is not None and path.is_file():
        saved = torch.load(path, map_location="cpu", weights_only=True)
        return {k: None if t is None else t.to(device) for k, t in saved.items()}
    inputs = make_inputs(dist, shape.n, shape.d, shape.v, dtype, seed=seed, device=device,
                         softcap=shape.softcap)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.part")
        torch.save({k: None if t is None else t.cpu() for k, t in inputs.items()}, partial)
        partial.replace(path)  # atomic: a concurrent reader sees all of it or nothing
    return inputs
