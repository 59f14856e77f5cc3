"""DTensor arguments of ``linear_cross_entropy``: what torch.distributed's own engines hand over.

    c = lm_head.weight            # a DTensor: Shard(0) under ColwiseParallel (vocab-sharded)
    loss = linear_cross_entropy(hidden, c, targets)   # the vocab-parallel path, no VocabParallel

The rules, by placement on a one-dimensional device mesh:

- ``c`` ``Shard(0)`` (vocabulary rows, as ColwiseParallel on lm_head shards it, evenly or as
  torch.chunk does where the mesh does not divide V): the vocab-parallel path of
  paths/vocab_parallel.py over the mesh's process group, this rank's rows ``c.to_local()``; the
  bias, if any, must be ``Shard(0)`` on the same mesh. The hidden states and targets are the
  whole problem's on every rank of the mesh (replicated), as in paths/vocab_parallel.py.
- ``c`` ``Replicate()``: its local tensor, like a plain tensor.
- ``e`` ``Replicate()``: its local tensor; ``e`` sharded on a token dimension (not its last,
  the hidden dimension) is gathered first (an all-gather whose backward keeps this rank's rows:
  the gradient of the gathered, replicated problem is the same on every rank), so the loss, a
  mean included, is the whole batch's: the data-parallel trunk / vocab-parallel head pattern.
- ``targets``: plain, or a DTensor gathered to the whole tensor (no gradient).
- Anything else (``Partial``, ``c`` sharded on the hidden dimension, a mesh of two or more
  dimensions, DTensors on different meshes) raises, naming the argument and its placements.

Gradients come back as autograd expects: a DTensor input gets a DTensor gradient with its own
placements (``to_local``'s backward). The outputs are DTensors (``Replicate`` on e's mesh)
when ``e`` is one, plain tensors otherwise; every rank holds the same loss.

FSDP2 (``fully_shard``) needs nothing here: inside the wrapped module's forward its parameters
are the unsharded plain tensors (with MixedPrecisionPolicy, in its param_dtype), and FSDP
reduce-scatters their gradients after the backward. Its sharded parameters outside the forward
are DTensors ``Shard(0)`` on the data-parallel mesh: passed here, they would take the
vocab-parallel path, whose targets check raises where the ranks hold different data.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from own_kernel.paths.vocab_parallel import VocabParallel, with_known_vocab_size


def is_plain(t) -> bool:
    return t is None or type(t) in (Tensor, nn.Parameter)


def _dtensor_type():
    from torch.distributed.tensor import DTensor
    return DTensor


@dataclass(frozen=True)
class Unwrapped:
    """The call's plain arguments and how its outputs go back to DTensors."""
    e: Tensor
    c: Tensor
    targets: Tensor
    bias: Tensor | None
    vocab_parallel: VocabParallel | None
    out_mesh: object  # e's mesh when e was a DTensor (outputs become Replicate DTensors), or None


def _one_dim_mesh(name: str, t):
    if t.device_mesh.ndim != 1:
        raise ValueError(f"{name}: a DTensor on a {t.device_mesh.ndim}-dimensional device mesh "
                         f"(placements {tuple(t.placements)}) is not supported; pass a DTensor "
                         f"on a one-dimensional mesh (e.g. mesh['tp']) or plain tensors")
    return t.device_mesh


def _placement(t):
    return t.placements[0]


def _vocab_shard(c, bias) -> tuple[Tensor, Tensor | None, VocabParallel]:
    """c Shard(0): (this rank's rows, its bias rows, the VocabParallel of the mesh's group)."""
    mesh = _one_dim_mesh("c", c)
    if bias is not None and (is_plain(bias) or bias.device_mesh != mesh
                             or not _placement(bias).is_shard(0)):
        got = "a plain tensor" if is_plain(bias) else f"placements {tuple(bias.placements)}"
        raise ValueError(f"bias: with c sharded by vocabulary (Shard(0)), bias must be a DTensor "
                         f"Shard(0) on c's mesh; got {got}")
    local = c.to_local()
    v_total, world, rank = c.shape[0], mesh.size(), mesh.get_local_rank()
    chunk = -(-v_total // world)  # torch.chunk's split, which Shard(0) follows
    start = min(rank * chunk, v_total)
    stop = min(start + chunk, v_total)
    if local.shape[0] != stop - start or stop <= start:
        raise ValueError(f"c: a Shard(0) DTensor whose local rows ({local.shape[0]} of "
                         f"{v_total} on rank {rank} of {world}) are not torch.chunk's split or "
                         f"are empty (more ranks than vocabulary rows?)")
    vp = with_known_vocab_size(VocabParallel(mesh.get_group(), start, stop), v_total)
    return local, None if bias is None else bias.to_local(), vp


def _hidden(e):
    """e as a plain tensor: Replicate's local tensor, or gathered from a token-dim shard."""
    if is_plain(e):
        return e
    _one_dim_mesh("e", e)
    place = _placement(e)
    if place.is_replicate():
        return e.to_local()
    if place.is_shard() and place.dim % e.dim() != e.dim() - 1:
        from torch.distributed.tensor import Replicate
        return e.redistribute(placements=[Replicate()]).to_local()
    raise ValueError(f"e: a DTensor with placements {tuple(e.placements)} is not supported; "
                     f"expected Replicate() or Shard(d) on a token dimension d (not the hidden "
                     f"dimension)")


def _weight(name: str, t):
    if is_plain(t):
        return t
    _one_dim_mesh(name, t)
    if _placement(t).is_replicate():
        return t.to_local()
    raise ValueError(f"{name}: a DTensor with placements {tuple(t.placements)} is not supported "
                     f"here; expected Replicate(), or for c Shard(0) (vocabulary rows)")


def _targets(t):
    if is_plain(t):
        return t
    _one_dim_mesh("targets", t)
    return t.full_tensor()


def unwrap(e, c, targets, bias, vocab_parallel) -> Unwrapped:
    """Plain arguments for the kernels from DTensor ones (the module docstring's rules)."""
    meshes = {t.device_mesh for t in (e, c, targets, bias) if not is_plain(t)}
    if len(meshes) > 1:
        raise ValueError("e, c, targets, bias: DTensors on different device meshes; put them on "
                         "one mesh")
    vp = vocab_parallel
    if not is_plain(c) and _placement(c).is_shard(0) and c.device_mesh.ndim == 1:
        if vocab_parallel is not None:
            raise ValueError("vocab_parallel: c is a DTensor sharded by vocabulary, which sets "
                             "the shard itself; pass vocab_parallel=None")
        c, bias, vp = _vocab_shard(c, bias)
    else:
        c, bias = _weight("c", c), _weight("bias", bias)
    out_mesh = None if is_plain(e) else e.device_mesh
    return Unwrapped(_hidden(e), c, _targets(targets), bias, vp, out_mesh)


def _rewrap(out, mesh):
    from torch.distributed.tensor import DTensor, Replicate

    if isinstance(out, tuple):  # (loss, lse), or a named tuple (LossEntropy...) kept as one
        parts = [_rewrap(o, mesh) for o in out]
        return type(out)(*parts) if hasattr(out, "_fields") else tuple(parts)
    return DTensor.from_local(out, mesh, [Replicate()], run_check=False)


def accepts_dtensors(fn):
    """Decorate ``linear_cross_entropy``: DTensor arguments are unwrapped (the module's rules),
    the call runs on plain tensors, and its outputs are DTensors where ``e`` was one. Plain
    calls pass straight through (one type check per tensor)."""
    @functools.wraps(fn)
    def call(e, c, targets, *, bias=None, vocab_parallel=None, **options):
        if is_plain(e) and is_plain(c) and is_plain(targets) and is_plain(bias):
            return fn(e, c, targets, bias=bias, vocab_parallel=vocab_parallel, **options)
        return _dtensor_call(fn, e, c, targets, bias, vocab_parallel, options)
    return call


@torch.compiler.disable(recursive=True, reason="DTensor arguments are unwrapped eagerly")
def _dtensor_call(fn, e, c, targets, bias, vocab_parallel, options):
    dtensor = _dtensor_type()
    if not any(isinstance(t, dtensor) for t in (e, c, targets, bias)):
        # Another tensor subclass (a fake tensor while tracing...): the kernel's business.
        return fn(e, c, targets, bias=bias, vocab_parallel=vocab_parallel, **options)
    u = unwrap(e, c, targets, bias, vocab_parallel)
    out = fn(u.e, u.c, u.targets, bias=u.bias, vocab_parallel=u.vocab_parallel, **options)
    return out if u.out_mesh is None else _rewrap(out, u.out_mesh)
