"""This project's own Triton CCE kernel (own_kernel/)."""
import contextlib
import json
import re

from suite.registry import PROVIDERS, needs_cuda, needs_triton_device, register

VERMILLION = "#D55E00"  # figures: the own kernel's colour


# The three-matmul path's workspace in the own_fused providers: room for dC's fp32 accumulator
# and chunks of >= 1024 rows at the Gemma 2 (2B), Llama 3 (8B) and Qwen 2.5 (7B) shapes.
FUSED_WORKSPACE_MIB = 3072


# What the last own call was, for its row's ``ran`` column (own_ran): each tensor's shape,
# dtype, device and requires_grad, the options, autocast's dtype and the config recipe in force
# (own_kernel.policy.config.config_key). No tensor is kept; the timed call only adds this tuple.
_LAST_CALL: list[tuple] = []


def _meta(t):
    return None if t is None else (tuple(t.shape), t.dtype, t.device, t.requires_grad)


def own_call(e, c, targets, bias, softcap, ignore_index, filter_eps, low_memory=False,
             workspace_mib=None, batch_invariant=False):
    """linear_cross_entropy with these arguments, as a user calls it (workspace_mib None: not
    passed, so the API's route picks the path); remembered for own_ran."""
    import torch

    from own_kernel import linear_cross_entropy
    from own_kernel.policy.config import config_key

    options = dict(softcap=softcap, ignore_index=ignore_index, filter_eps=filter_eps,
                   low_memory=low_memory)
    if workspace_mib is not None:
        options["workspace_mib"] = workspace_mib
    if batch_invariant:
        options["batch_invariant"] = True
    kind = e.device.type
    autocast = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else None
    _LAST_CALL[:] = [(_meta(e), _meta(c), _meta(targets), _meta(bias), options, autocast,
                      config_key(e.device, e.dtype))]
    return linear_cross_entropy(e, c, targets, bias=bias, **options)


def _stand_in(meta):
    """A tensor of meta's shape, dtype, device and requires_grad holding one element."""
    import torch

    if meta is None:
        return None
    shape, dtype, device, requires_grad = meta
    return torch.empty((), dtype=dtype, device=device).expand(shape).requires_grad_(requires_grad)


def own_ran() -> str:
    """The ``ran`` of every own provider: the route its last call took (own_kernel.plan under
    the same config, target and autocast), its path and the three-matmul path's row chunks
    (and target-shifted logits, config.Fused.target_shift), or the cuBLAS forward's off it; "" when there was no call or it cannot be planned (a failing
    call's row says why)."""
    import torch

    from own_kernel import plan
    from own_kernel.policy.config import TARGETS, overridden, use_target
    from own_kernel.policy.plan import cdiv

    if not _LAST_CALL:
        return ""
    e, c, targets, bias, options, autocast, key = _LAST_CALL[0]
    target, _, overrides = key.partition("\n")
    try:
        with contextlib.ExitStack() as stack:
            if target in TARGETS:
                stack.enter_context(use_target(target))
            if overrides:
                stack.enter_context(overridden(json.loads(overrides)))
            if autocast is not None:
                stack.enter_context(torch.autocast(e[2].type, dtype=autocast))
            route = plan(*map(_stand_in, (e, c, targets)), bias=_stand_in(bias), **options)
    except Exception:  # noqa: BLE001 - the row's status and error speak for a failed call
        return ""
    if route.path == "three-matmul":  # the logits' format where it is not the config's usual
        logits = "target-shifted logits, " if route.logits == "target-shifted" else ""
        return f"three-matmul, {logits}{_chunks(route.chunks, route.chunk_size)}"
    rows = route.forward_rows
    if rows is None:
        return route.path
    return f"{route.path}, cuBLAS forward, {_chunks(cdiv(route.call.n, rows.rows), rows.rows)}"


def _chunks(count: int, rows: int) -> str:
    return f"{count} chunk{'s' if count != 1 else ''} of {rows} rows"


@register("own", summary="own Triton CCE, exact gradients, the default call (the path it takes "
          "is own_kernel.plan's)", features=("bias", "softcap"), requires=needs_triton_device,
          ran=own_ran, style=dict(color=VERMILLION, marker="o", linestyle="-"), order=60)
def own(e, c, targets, *, bias=None, softcap=None, ignore_index=-100):
    return own_call(e, c, targets, bias, softcap, ignore_index, None)


# A 0 MiB budget on Hopper runs the three-matmul path where its chunks fit the recompute path's
# memory (config.Fused.zero_budget): own_ws0 is that call, own_recompute pins the recompute path.
RECOMPUTE_AT_ZERO = {"fused": {"zero_budget": "recompute"}}


@register("own_recompute", summary="own Triton CCE, exact, the recompute path (workspace_mib=0, "
          "fused.zero_budget 'recompute')", features=("bias", "softcap"),
          requires=needs_triton_device, ran=own_ran,
          style=dict(color=VERMILLION, marker="v", linestyle="-"), order=60)
def own_recompute(e, c, targets, *, bias=None, softcap=None, ignore_index=-100):
    from own_kernel.policy.config import overridden

    with overridden(RECOMPUTE_AT_ZERO):  # own_ws0's call, the recompute path pinned
        return own_ws0(e, c, targets, bias=bias, softcap=softcap, ignore_index=ignore_index)


@register("own_ws0", summary="own Triton CCE, exact, workspace_mib=0: no workspace (the "
          "recompute path, or the three-matmul path within its memory: own_kernel.plan says)",
          features=("bias", "softcap"), requires=needs_triton_device, ran=own_ran,
          style=dict(color=VERMILLION, marker="<", linestyle="-"), order=60)
def own_ws0(e, c, targets, *, bias=None, softcap=None, ignore_index=-100):
    return own_call(e, c, targets, bias, softcap, ignore_index, None, workspace_mib=0)


@register("own_invariant", summary="own Triton CCE, exact, batch_invariant=True (each row's "
          "values and dE row the same bits whatever else is in the batch)",
          features=("bias", "softcap"), requires=needs_triton_device, ran=own_ran,
          style=dict(color=VERMILLION, marker="p", linestyle="-."), order=60)
def own_invariant(e, c, targets, *, bias=None, softcap=None, ignore_index=-100):
    return own_call(e, c, targets, bias, softcap, ignore_index, None, batch_invariant=True)


@register("own_filter", summary="own Triton CCE, gradient filter (filter_eps='auto'), the "
          "default call",
          features=("bias", "softcap"), requires=needs_triton_device, ran=own_ran, exact=False,
          style=dict(color=VERMILLION, marker="s", linestyle="--"), order=61)
def own_filter(e, c, targets, *, bias=None, softcap=None, ignore_index=-100):
    return own_call(e, c, targets, bias, softcap, ignore_index, "auto")


@register("own_low_memory", summary="own Triton CCE, exact, low_memory=True (no fp32 dE copy)",
          features=("bias", "softcap"), requires=needs_triton_device, ran=own_ran,
          style=dict(color=VERMILLION, marker="^", linestyle=":"), order=62)
def own_low_memory(e, c, targets, *, bias=None, softcap=None, ignore_index=-100):
    return own_call(e, c, targets, bias, softcap, ignore_index, None, low_memory=True)


@register("own_fused", summary=f"own Triton CCE, exact, three-matmul training path "
          f"(workspace_mib={FUSED_WORKSPACE_MIB})", features=("bias", "softcap"),
          requires=needs_triton_device, ran=own_ran,
          style=dict(color=VERMILLION, marker="P", linestyle="-"), order=65)
def own_fused(e, c, targets, *, bias=None, softcap=None, ignore_index=-100):
    return own_call(e, c, targets, bias, softcap, ignore_index, None,
                    workspace_mib=FUSED_WORKSPACE_MIB)


@register("own_fused_filter", summary=f"own Triton CCE, gradient filter, three-matmul training "
          f"path (workspace_mib={FUSED_WORKSPACE_MIB})", features=("bias", "softcap"),
          requires=needs_triton_device, ran=own_ran, exact=False,
          style=dict(color=VERMILLION, marker="X", linestyle="--"), order=66)
def own_fused_filter(e, c, targets, *, bias=None, softcap=None, ignore_index=-100):
    return own_call(e, c, targets, bias, softcap, ignore_index, "auto",
                    workspace_mib=FUSED_WORKSPACE_MIB)


def own_at_budget(workspace_mib: int):
    """The default exact call at this workspace budget, as a provider function."""
    def provider(e, c, targets, *, bias=None, softcap=None, ignore_index=-100):
        return own_call(e, c, targets, bias, softcap, ignore_index, None,
                        workspace_mib=workspace_mib)
    return provider


# Larger budgets than own_fused's: fewer chunks re-read dC's fp32 accumulator, and from N V 2
# bytes on the logits fit in one chunk with no accumulator (torch.compile's memory).
for _gib, _marker in ((4, "h"), (6, "H")):
    register(f"own_fused_{_gib}g", summary=f"own Triton CCE, exact, three-matmul training path "
             f"(workspace_mib={_gib * 1024})", features=("bias", "softcap"),
             requires=needs_triton_device, ran=own_ran,
             style=dict(color=VERMILLION, marker=_marker, linestyle="-"),
             order=66 + _gib // 2)(own_at_budget(_gib * 1024))


def _portable(e, c, targets, bias, softcap, ignore_index, filter_eps, workspace_mib=None):
    # The path every GPU but Hopper takes (pointer kernels, tiles tuned on this GPU, the cuBLAS
    # recompute backward, the three-matmul path where the default budget holds it), forced
    # here so it can be measured beside the Hopper path: workspace_mib None is the API's own
    # choice, what a user of such a GPU gets. CUDA only: use_target is an error on CPU tensors.
    from own_kernel.policy.config import use_target

    with use_target("portable"):
        return own_call(e, c, targets, bias, softcap, ignore_index, filter_eps,
                        workspace_mib=workspace_mib)


@register("own_portable",
          summary="own Triton CCE, exact, the portable (non-Hopper) path forced, default budget",
          features=("bias", "softcap"), requires=needs_cuda, ran=own_ran,
          style=dict(color=VERMILLION, marker="D", linestyle="-."), order=63)
def own_portable(e, c, targets, *, bias=None, softcap=None, ignore_index=-100):
    return _portable(e, c, targets, bias, softcap, ignore_index, None)


@register("own_portable_filter",
          summary="own Triton CCE, gradient filter, the portable (non-Hopper) path forced, default "
          "budget",
          features=("bias", "softcap"), requires=needs_cuda, ran=own_ran, exact=False,
          style=dict(color=VERMILLION, marker="d", linestyle=(0, (3, 1, 1, 1))), order=64)
def own_portable_filter(e, c, targets, *, bias=None, softcap=None, ignore_index=-100):
    return _portable(e, c, targets, bias, softcap, ignore_index, "auto")


@register("own_portable_fused",
          summary=f"own Triton CCE, exact, three-matmul training path "
          f"(workspace_mib={FUSED_WORKSPACE_MIB}), the portable (non-Hopper) path forced",
          features=("bias", "softcap"), requires=needs_cuda, ran=own_ran,
          style=dict(color=VERMILLION, marker="*", linestyle="-."), order=67)
def own_portable_fused(e, c, targets, *, bias=None, softcap=None, ignore_index=-100):
    return _portable(e, c, targets, bias, softcap, ignore_index, None,
                     workspace_mib=FUSED_WORKSPACE_MIB)


# ---- variants: a provider under config overrides, measured beside it in one run -------------

# {provider name: its overrides as sorted JSON}: a name registered again must mean the same.
VARIANT_OVERRIDES: dict[str, str] = {}


def register_variant(base: str, variant: str, overrides: dict) -> str:
    """Register ``<base>@<variant>``: own provider ``base`` under the own kernel's config
    ``overrides`` (own_kernel.policy.config.overridden), so that a change behind a config field
    is measured beside the unchanged call in one run (``bench --variant``). The block covers
    the forward only: an eager call's backward keeps its forward's config. Returns the name;
    the same registration again is a no-op. Bad input is a ValueError naming what is wrong."""
    from own_kernel.policy.config import INTERPRETER, overridden, with_overrides

    own = sorted(n for n in PROVIDERS if n.startswith("own") and "@" not in n)
    if base not in own:
        raise ValueError(f"a variant's base must be an own provider (one of {', '.join(own)}), "
                         f"got {base!r}")
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", variant):
        raise ValueError(f"a variant's name takes letters, digits, '_', '.', '-'; got {variant!r}")
    if not isinstance(overrides, dict) or not overrides:
        raise ValueError(f"variant {variant!r}: expected a non-empty JSON object of config "
                         f"fields, got {overrides!r}")
    with_overrides(INTERPRETER, overrides)  # an unknown field or a bad value raises here
    name, text = f"{base}@{variant}", json.dumps(overrides, sort_keys=True)
    if name in PROVIDERS:
        if VARIANT_OVERRIDES.get(name) != text:
            raise ValueError(f"variant {name!r} is registered with other overrides")
        return name
    parent = PROVIDERS[base]

    def provider(e, c, targets, **options):
        with overridden(overrides):
            return parent.fn(e, c, targets, **options)

    VARIANT_OVERRIDES[name] = text
    register(name, summary=f"{parent.summary}; config overrides {text}",
             features=parent.features, requires=parent.requires, exact=parent.exact,
             limits=parent.limits, ran=parent.ran, order=parent.order)(provider)
    return name
