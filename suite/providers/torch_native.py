"""PyTorch's own chunked linear cross-entropy, ``F.linear_cross_entropy(..., options=...)``.

It ships with torch >= 2.13. Its implementation is two pure-Python module files, so an older
torch can run it from a newer wheel: set ``CCE_BENCH_TORCH_LCE`` to a folder holding that wheel's
``linear_cross_entropy.py``, ``linear_cross_entropy_options.py`` and ``version.py``, e.g.

    unzip -j torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl \\
        torch/nn/modules/linear_cross_entropy.py \\
        torch/nn/modules/linear_cross_entropy_options.py torch/version.py -d .torch-lce
    CCE_BENCH_TORCH_LCE=.torch-lce python -m suite bench --providers torch_native,...

When the variable is set its files are used (on any torch, so a newer torch's code can be
measured on an older one); otherwise the installed torch's own function. env.json records which
(``peers.torch_native``: version of the code, and the route).
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.util
import os
import re
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from suite.registry import register

ENV_VAR = "CCE_BENCH_TORCH_LCE"
MODULE_FILES = ("linear_cross_entropy_options.py", "linear_cross_entropy.py")
VERSION_FILE = "version.py"
MIN_VERSION = (2, 13)
# The loaded ops register under their own namespace, so they never clash with a torch that
# already has torch_nn::_linear_cross_entropy_* (torch >= 2.13).
LOADED_NAMESPACE = "cce_bench_torch_lce"


@dataclasses.dataclass(frozen=True)
class LinearCrossEntropy:
    """Where the function comes from: ``route`` "native" (the installed torch) or "loaded"
    (module files of ``folder``), the torch version of that code, and its two modules (None on
    the native route)."""
    route: str
    version: str
    folder: str | None = None
    options_module: object = None
    op_module: object = None

    def options(self, **fields):
        cls = (torch.nn.LinearCrossEntropyOptions if self.route == "native"
               else self.options_module.LinearCrossEntropyOptions)
        return cls(**fields)

    def origin(self) -> dict:
        route = ("native" if self.route == "native"
                 else f"module files of {self.folder} loaded onto torch {torch.__version__}")
        return {"version": self.version, "commit": None, "source": None, "route": route}


def _version_tuple(version: str) -> tuple[int, int]:
    found = re.match(r"(\d+)\.(\d+)", version)
    return (int(found[1]), int(found[2])) if found else (0, 0)


def _wheel_version(folder: Path) -> str:
    """torch's ``__version__`` as the wheel's version.py writes it (read, not executed)."""
    path = folder / VERSION_FILE
    if not path.is_file():
        raise ValueError(f"{ENV_VAR}={folder}: no {VERSION_FILE} there (extract torch/{VERSION_FILE} "
                         f"from the wheel too: it names the torch version of the files)")
    found = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", path.read_text(), re.M)
    if not found:
        raise ValueError(f"{path}: no __version__ = '...' line")
    return found[1]


def _load_module(path: Path, name: str, op_namespace: str | None):
    source = path.read_text()
    if op_namespace:
        source = source.replace('"torch_nn::', f'"{op_namespace}::')
    spec = importlib.util.spec_from_loader(name, loader=None, origin=str(path))
    module = importlib.util.module_from_spec(spec)
    module.__file__ = str(path)
    sys.modules[name] = module  # dataclasses and custom_op look the module up by name
    exec(compile(source, str(path), "exec"), module.__dict__)
    return module


def load_from(folder) -> LinearCrossEntropy:
    """The function from a wheel's module files in ``folder`` (see the module docstring)."""
    folder = Path(folder)
    missing = [f for f in MODULE_FILES if not (folder / f).is_file()]
    if missing:
        raise ValueError(f"{ENV_VAR}={folder}: missing {', '.join(missing)} (extract them from a "
                         f"torch >= {MIN_VERSION[0]}.{MIN_VERSION[1]} wheel's torch/nn/modules/)")
    version = _wheel_version(folder)
    if _version_tuple(version) < MIN_VERSION:
        raise ValueError(f"{ENV_VAR}={folder}: its files are torch {version}; "
                         f"F.linear_cross_entropy's options need torch >= 2.13")
    digest = hashlib.sha256(b"".join((folder / f).read_bytes() for f in MODULE_FILES)).hexdigest()
    options, ops = _modules(digest, folder)
    return LinearCrossEntropy("loaded", version, folder.as_posix(), options, ops)


@functools.cache
def _modules(digest: str, folder: Path):
    """The two modules, loaded once per content: their ops register under a namespace of their
    own, and torch refuses to register one op twice."""
    name = f"{LOADED_NAMESPACE}_{digest[:12]}"
    options = _load_module(folder / MODULE_FILES[0], f"{name}.options", None)
    ops = _load_module(folder / MODULE_FILES[1], f"{name}.ops", name)
    return options, ops


@functools.cache
def resolve() -> LinearCrossEntropy:
    """The loaded files where ``CCE_BENCH_TORCH_LCE`` is set, else the installed torch's own
    function; ValueError when neither exists."""
    folder = os.environ.get(ENV_VAR)
    if folder:
        return load_from(folder)
    if hasattr(F, "linear_cross_entropy") and hasattr(torch.nn, "LinearCrossEntropyOptions"):
        return LinearCrossEntropy("native", torch.__version__)
    raise ValueError(f"torch {torch.__version__} has no F.linear_cross_entropy with options "
                     f"(needs torch >= 2.13, or {ENV_VAR}=<folder with a torch >= 2.13 wheel's "
                     f"{', '.join(MODULE_FILES)} and {VERSION_FILE}>)")


def _requires(device):
    try:
        resolve()
    except ValueError as err:
        return str(err)
    return None


def _origin() -> dict | None:
    try:
        return resolve().origin()
    except ValueError:
        return None


def _loaded_call(lce: LinearCrossEntropy, e, c, targets, bias, ignore_index, options):
    """What F.linear_cross_entropy does for 2-D inputs, int64 targets, mean reduction and
    options given: resolve the options for the shape, then call the chunked op."""
    options = options._adjust(num_batches=e.shape[0], in_features=e.shape[1],
                              num_classes=c.shape[0], dtype=e.dtype, device=e.device)
    grad = torch.is_grad_enabled()
    return lce.op_module._linear_cross_entropy_batch_chunked(
        e, c, targets, bias, None, "mean", ignore_index, 0.0, options.batch_chunk_size,
        options.acc_policy, options.acc_dtype, options.allow_retain_graph,
        e.requires_grad and grad, c.requires_grad and grad,
        bias is not None and bias.requires_grad and grad)[0]


def linear_cross_entropy(e, c, targets, *, bias=None, ignore_index=-100, **option_fields):
    lce = resolve()
    options = lce.options(**option_fields)
    if lce.route == "native":
        return F.linear_cross_entropy(e, c, targets, linear_bias=bias, ignore_index=ignore_index,
                                      options=options)
    return _loaded_call(lce, e, c, targets.long(), bias, ignore_index, options)


_COMMON = dict(features=("bias",), requires=_requires, package="torch", origin=_origin)


@register("torch_native", summary="F.linear_cross_entropy with LinearCrossEntropyOptions()",
          style=dict(color="#CC79A7", marker="<", linestyle="-"), order=4, **_COMMON)
def torch_native(e, c, targets, *, bias=None, softcap=None, ignore_index=-100):
    return linear_cross_entropy(e, c, targets, bias=bias, ignore_index=ignore_index)


@register("torch_native_accurate",
          summary='F.linear_cross_entropy with LinearCrossEntropyOptions(acc_policy="accurate")',
          style=dict(color="#CC79A7", marker="<", linestyle="--"), order=5, **_COMMON)
def torch_native_accurate(e, c, targets, *, bias=None, softcap=None, ignore_index=-100):
    return linear_cross_entropy(e, c, targets, bias=bias, ignore_index=ignore_index,
                                acc_policy="accurate")
