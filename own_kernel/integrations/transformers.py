"""Train a Hugging Face causal LM (transformers >= 5) through ``linear_cross_entropy``.

    from own_kernel.integrations.transformers import patch, unpatch
    patch(model)          # model: a loaded LlamaForCausalLM, Gemma2ForCausalLM, ...
    loss = model(input_ids, labels=labels).loss   # no N x V logits are built
    unpatch(model)        # the model's own forward again

``patch`` replaces ``forward`` on the instance (never on the class, so other instances are
untouched) with one generic wrapper: it runs the base model (``model.model``) for the final hidden
states and computes the loss from them and ``lm_head`` (weight, bias) the way the model's own
``ForCausalLMLoss`` does: labels shifted by one (padded with ``ignore_index``) or the caller's
``shift_labels``, ``ignore_index`` (-100 by default), mean over the used targets or, when
``num_items_in_batch`` is passed (``Trainer`` with gradient accumulation), their sum divided by
it. Each architecture's logit transform is applied inside the kernel: Gemma 2 / 3
``final_logit_softcapping``, Cohere's ``logit_scale`` and Granite's ``logits_scaling`` (a scale of
the logits is a scale of the hidden states and the bias). Tied embeddings need nothing: the
kernel reads ``lm_head.weight``, the shared parameter, and its gradient reaches it.

The patched call returns ``logits=None``. The model's own forward runs, unchanged, when a call has
no ``labels``, asks for logits (``logits_to_keep`` other than 0, as ``generate`` does), or, with
``logits_in_eval=True`` (the default), when the model is in eval mode: ``Trainer``'s evaluation
reads logits for its metrics. Patching a patched model raises (``unpatch`` first to change the
options); ``unpatch`` removes the instance attribute, so ``model.forward`` is the class's again.
Patch before anything wraps the model's forward (accelerate, ``Trainer``) or compiles it.

Under torch.distributed: with FSDP2 (``fully_shard``) ``lm_head.weight`` is the unsharded tensor
during the model's forward; an lm_head given its own ``fully_shard`` computes the loss inside its
own call (its hooks unshard the weight); a tensor-parallel lm_head (ColwiseParallel, a tp_plan)
holds a vocabulary-sharded DTensor weight, which the kernel takes as it is (distributed.py).

``token_logprobs(model, input_ids, labels, return_entropy=True, temperature=T)`` gives an RL
trainer the per-token log-probabilities (and entropies) of the labels from the same hidden
states, without logits (the model need not be patched).

transformers is imported inside the functions: ``own_kernel`` needs only torch and triton.
"""
from __future__ import annotations

import functools
import inspect
import types
from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor, nn

from own_kernel.api import TokenLogprobs, linear_cross_entropy
from own_kernel.integrations.distributed import is_plain
from own_kernel.paths.targets import TargetsCheck, queue_targets_check
from own_kernel.policy.options import PatchOptions


def _no_transform(model) -> tuple[float, float | None]:
    return 1.0, None


def _gemma_softcap(model) -> tuple[float, float | None]:
    return 1.0, model.config.final_logit_softcapping  # None switches it off, as in the model


def _cohere_scale(model) -> tuple[float, float | None]:
    return float(model.logit_scale), None  # logits * logit_scale


def _granite_scale(model) -> tuple[float, float | None]:
    return 1.0 / float(model.config.logits_scaling), None  # logits / logits_scaling


# Class name -> a function of the model giving its (logit scale, softcap), read at each call (the
# config may change). Each of these classes' forward is: base model,
# slice_logits_to_keep, lm_head, this transform, loss_function (ForCausalLMLoss); the tests
# check every one against its unpatched forward. Qwen 2.5 models are Qwen2ForCausalLM.
LOGIT_TRANSFORMS: dict[str, Callable] = {
    "LlamaForCausalLM": _no_transform,
    "MistralForCausalLM": _no_transform,
    "Qwen2ForCausalLM": _no_transform,
    "Qwen3ForCausalLM": _no_transform,
    "Phi3ForCausalLM": _no_transform,
    "PhiForCausalLM": _no_transform,  # lm_head has a bias
    "GemmaForCausalLM": _no_transform,
    "Gemma2ForCausalLM": _gemma_softcap,
    "Gemma3ForCausalLM": _gemma_softcap,  # text-only Gemma 3 (model_type gemma3_text)
    "CohereForCausalLM": _cohere_scale,
    "GraniteForCausalLM": _granite_scale,
}
SUPPORTED = tuple(sorted(LOGIT_TRANSFORMS))
# The parameters of those classes' forward in transformers 5, which the patched forward repeats;
# the cache's name is "past_key_values" up to 5.23 and "cache" from 5.24 (outputs alike).
_STOCK_PARAMETERS = ("self", "input_ids", "attention_mask", "position_ids", "past_key_values",
                     "inputs_embeds", "labels", "use_cache", "logits_to_keep", "kwargs")
_CACHE_NAMES = ("past_key_values", "cache")


@dataclass(frozen=True)
class _Head:
    """What a patched forward needs of its class, looked up once at patch time."""
    logit_transform: Callable  # model -> (logit scale, softcap)
    stock_loss: Callable  # transformers' ForCausalLMLoss, the loss the patch reproduces
    output_class: type  # transformers' CausalLMOutputWithPast


# ---- patch / unpatch -------------------------------------------------------------------------

def _stock_class(model) -> type:
    """The supported transformers class that ``model`` is, with its forward not overridden."""
    import transformers

    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected a transformers ...ForCausalLM module; got "
                        f"{type(model).__name__}")
    for cls in type(model).__mro__:
        if cls.__name__ in LOGIT_TRANSFORMS and cls is getattr(transformers, cls.__name__, None):
            break
    else:
        raise ValueError(f"model: {type(model).__name__} is not supported by "
                         f"own_kernel.transformers.patch; supported: {', '.join(SUPPORTED)}")
    if type(model).forward is not cls.forward:
        raise ValueError(f"model: {type(model).__name__} overrides {cls.__name__}.forward; patch "
                         f"supports the stock forward only (its loss semantics are checked)")
    return cls


def _patched_options(model) -> PatchOptions | None:
    """The options of the patch installed on ``model``, or None. The marker names its function:
    a wrapper of the patched forward (functools.wraps copies the marker) is not the patch."""
    installed = getattr(model.__dict__.get("forward"), "__func__", None)
    options, patched = getattr(installed, "_own_kernel_patch", (None, None))
    return options if patched is installed else None


def _check_stock_signature(cls) -> str:
    """The name of the stock forward's cache parameter, once its signature is a known one."""
    names = tuple(inspect.signature(cls.forward).parameters)
    for cache_name in _CACHE_NAMES:
        if names == tuple(cache_name if n == "past_key_values" else n for n in _STOCK_PARAMETERS):
            return cache_name
    raise ValueError(f"model: {cls.__name__}.forward takes {names}; the patch was written for "
                         f"{_STOCK_PARAMETERS} (a transformers version it does not know?)")


def patch(model, *, filter_eps: float | str | None = None, low_memory: bool = False,
          logits_in_eval: bool = True):
    """Make ``model`` (a supported ``...ForCausalLM``) compute its loss through
    ``linear_cross_entropy(hidden, lm_head.weight, ...)``; returns the model.

    ``filter_eps`` and ``low_memory`` are passed to the kernel (see its docstring).
    ``logits_in_eval=False`` uses the kernel in eval mode too (``logits=None`` there). Raises
    ValueError for an unsupported architecture, a model patched already, a forward replaced on the
    instance (patch before wrapping the model) or an ``lm_head`` that is not a plain nn.Linear.
    """
    cls = _stock_class(model)
    cache_name = _check_stock_signature(cls)
    if _patched_options(model) is not None:
        raise ValueError("model: already patched; call unpatch(model) first to change options")
    if "forward" in model.__dict__:
        raise ValueError("model: its forward was replaced on the instance (by a wrapper such as "
                         "accelerate's); patch the model before wrapping it")
    if not _is_plain_linear(getattr(model, "lm_head", None)):
        raise ValueError(f"model: lm_head must be a plain torch.nn.Linear (the kernel reads its "
                         f"weight and bias); got {type(getattr(model, 'lm_head', None)).__name__}")
    options = PatchOptions(filter_eps, low_memory, logits_in_eval)  # checked: policy/options.py
    from transformers.loss.loss_utils import ForCausalLMLoss
    from transformers.modeling_outputs import CausalLMOutputWithPast

    head = _Head(LOGIT_TRANSFORMS[cls.__name__], ForCausalLMLoss, CausalLMOutputWithPast)
    model.forward = types.MethodType(_make_forward(cls.forward, head, options, cache_name), model)
    return model


def unpatch(model):
    """Undo ``patch``: ``model.forward`` is the class's own again. Returns the model."""
    if _patched_options(model) is None:
        raise ValueError("model: not patched by own_kernel.transformers.patch (or its forward "
                         "was wrapped again after patching)")
    del model.__dict__["forward"]
    return model


# ---- the patched forward ---------------------------------------------------------------------

def _asks_for_logits(logits_to_keep) -> bool:
    if isinstance(logits_to_keep, Tensor):
        return True  # positions to keep: the caller wants those logits
    return logits_to_keep != 0


def _make_forward(stock_forward, head: _Head, options: PatchOptions, cache_name: str):
    # An explicit signature, the stock one (_check_stock_signature), rather than binding *args
    # at each call: nothing for torch.compile to trace through. wraps: inspect.signature of the
    # patched forward stays the stock one, so Trainer still passes it num_items_in_batch.
    def run(self, base_inputs, labels, logits_to_keep, kwargs):
        if (labels is None or _asks_for_logits(logits_to_keep)
                or (options.logits_in_eval and not self.training)):
            return stock_forward(self, labels=labels, logits_to_keep=logits_to_keep,
                                 **base_inputs, **kwargs)
        return _forward_with_kernel_loss(self, base_inputs, labels, kwargs, head, options,
                                         cache_name)

    if cache_name == "cache":
        @functools.wraps(stock_forward)
        def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None,
                    inputs_embeds=None, labels=None, use_cache=None, logits_to_keep=0, **kwargs):
            return run(self, dict(input_ids=input_ids, attention_mask=attention_mask,
                                  position_ids=position_ids, cache=cache,
                                  inputs_embeds=inputs_embeds, use_cache=use_cache),
                       labels, logits_to_keep, kwargs)
    else:
        @functools.wraps(stock_forward)
        def forward(self, input_ids=None, attention_mask=None, position_ids=None,
                    past_key_values=None, inputs_embeds=None, labels=None, use_cache=None,
                    logits_to_keep=0, **kwargs):
            return run(self, dict(input_ids=input_ids, attention_mask=attention_mask,
                                  position_ids=position_ids, past_key_values=past_key_values,
                                  inputs_embeds=inputs_embeds, use_cache=use_cache),
                       labels, logits_to_keep, kwargs)

    forward._own_kernel_patch = (options, forward)
    return forward


def _forward_with_kernel_loss(model, base_inputs: dict, labels: Tensor, kwargs: dict,
                              head: _Head, options: PatchOptions, cache_name: str):
    """The stock forward's base-model call and loss, with the loss from the kernel."""
    kwargs = dict(kwargs)
    # can_return_tuple's rule (the decorator of the stock forward): the call's return_dict,
    # else the config's; it is not passed on.
    return_dict = kwargs.pop("return_dict", None)
    if return_dict is None:
        return_dict = getattr(model.config, "return_dict", True)
    # The targets and their check first: queued before the trunk, the check is long done when
    # the loss reads it (a read right after the trunk would wait for the whole forward).
    targets, check = _targets_and_check(model, labels, **kwargs)
    # The stock forward passes its **kwargs to both the base model and the loss; so do we.
    outputs = model.model(**base_inputs, **kwargs)
    loss = _causal_lm_loss(model, outputs.last_hidden_state, targets, check, head, options,
                           **kwargs)
    result = head.output_class(loss=loss, logits=None, hidden_states=outputs.hidden_states,
                               attentions=outputs.attentions,
                               **{cache_name: getattr(outputs, cache_name)})
    return result if return_dict else result.to_tuple()


def _check_stock_loss(model, head: _Head) -> None:
    if model.loss_function is not head.stock_loss:
        raise ValueError(f"model: its loss_function is {model.loss_function!r}, not transformers' "
                         f"ForCausalLMLoss, whose semantics the patch reproduces; unpatch(model) "
                         f"to use it")


def _targets_and_check(model, labels: Tensor, *, ignore_index: int = -100,
                       shift_labels: Tensor | None = None,
                       **_unused) -> tuple[Tensor, TargetsCheck | None]:
    """The loss's targets (contiguous int64, where lm_head's weight is) and, where lm_head's
    weight is a plain tensor, their check queued now (the kernel's call uses it: it depends on
    the targets alone)."""
    if shift_labels is None:
        # As ForCausalLMLoss: position i predicts labels[i + 1]; the last predicts nothing.
        shift_labels = nn.functional.pad(labels, (0, 1), value=ignore_index)[..., 1:]
    weight, bias = model.lm_head.weight, model.lm_head.bias
    targets = shift_labels.to(weight.device)
    if targets.dtype.is_floating_point or targets.dtype.is_complex or targets.dtype == torch.bool:
        return targets, None  # the call refuses them, naming their dtype
    targets = targets.to(torch.int64).contiguous()  # the kernels' layout: no copy in the call
    if not (is_plain(weight) and is_plain(bias)) or torch.compiler.is_compiling():
        return targets, None  # a sharded head (DTensor): its call checks its own targets
    return targets, queue_targets_check(targets, weight.shape[0], ignore_index)


def _causal_lm_loss(model, hidden: Tensor, targets: Tensor, targets_check: TargetsCheck | None,
                    head: _Head, options: PatchOptions, *, num_items_in_batch=None,
                    ignore_index: int = -100, **_unused) -> Tensor:
    """ForCausalLMLoss(logits=transform(lm_head(hidden)), labels, ...) without the logits;
    ``targets``: the labels shifted (_targets_and_check)."""
    _check_stock_loss(model, head)
    targets = targets.to(hidden.device)
    scale, softcap = head.logit_transform(model)
    if scale != 1.0:
        hidden = hidden * scale
    reduction = "mean" if num_items_in_batch is None else "sum"

    def loss_of(hidden, weight, bias):
        if scale != 1.0 and bias is not None:
            bias = bias * scale
        return linear_cross_entropy(hidden, weight, targets, bias=bias, ignore_index=ignore_index,
                                    softcap=softcap, reduction=reduction,
                                    filter_eps=options.filter_eps, low_memory=options.low_memory,
                                    targets_check=targets_check)

    loss = _through_head(model.lm_head, hidden, loss_of)
    if num_items_in_batch is not None:
        if isinstance(num_items_in_batch, Tensor):
            num_items_in_batch = num_items_in_batch.to(loss.device)
        loss = loss / num_items_in_batch
    return loss


# ---- per-token log-probabilities for RL trainers -----------------------------------------------

def token_logprobs(model, input_ids: Tensor, labels: Tensor, attention_mask: Tensor | None = None,
                   *, return_entropy: bool = False, temperature: float = 1.0,
                   ignore_index: int = -100, low_memory: bool = False,
                   batch_invariant: bool = False, **model_kwargs):
    """Per-token log p(labels[:, j] | tokens before j) of a supported ``...ForCausalLM``
    (patched or not), and with ``return_entropy=True`` the entropy of that next-token
    distribution, without the N x V logits: the base model's hidden states and ``lm_head``
    through ``own_kernel.token_logprobs``, with the model's logit transform (Gemma's softcap,
    Cohere's and Granite's scales) and ``temperature`` dividing the transformed logits.

    Shape ``labels.shape``, aligned with labels (entry j scores labels[:, j]); 0 at position 0
    and wherever labels is ignore_index (e.g. the prompt and padding). Differentiable: e.g.
    ``-(adv * (logp - old_logp).exp()).mean() - beta * entropy.mean()`` backpropagates into the
    model in one backward. Returns a tensor, or ``TokenLogprobs(logprobs, entropy)``.
    ``batch_invariant=True``: each token's values the same bits whatever else is in the batch
    (``own_kernel.linear_cross_entropy``; the head only, not the model's trunk).
    ``model_kwargs`` go to the base model (``model.model``)."""
    cls = _stock_class(model)
    if not _is_plain_linear(getattr(model, "lm_head", None)):
        raise ValueError(f"model: lm_head must be a plain torch.nn.Linear; got "
                         f"{type(getattr(model, 'lm_head', None)).__name__}")
    if tuple(labels.shape) != tuple(input_ids.shape):
        raise ValueError(f"labels: shape {tuple(labels.shape)} must equal input_ids' "
                         f"{tuple(input_ids.shape)}")
    hidden = model.model(input_ids=input_ids, attention_mask=attention_mask,
                         **model_kwargs).last_hidden_state
    # Position i predicts labels[:, i + 1] (the last predicts nothing), as ForCausalLMLoss.
    targets = nn.functional.pad(labels, (0, 1), value=ignore_index)[..., 1:].to(hidden.device)
    scale, softcap = LOGIT_TRANSFORMS[cls.__name__](model)
    if scale != 1.0:
        hidden = hidden * scale

    def per_token(hidden, weight, bias):
        if scale != 1.0 and bias is not None:
            bias = bias * scale
        return linear_cross_entropy(hidden, weight, targets, bias=bias, softcap=softcap,
                                    ignore_index=ignore_index, reduction="none",
                                    temperature=temperature, low_memory=low_memory,
                                    return_entropy=return_entropy,
                                    batch_invariant=batch_invariant)

    out = _through_head(model.lm_head, hidden, per_token)

    def aligned(x):  # entry j scores labels[:, j]: the prediction made at position j - 1
        return nn.functional.pad(x[..., :-1], (1, 0))

    if return_entropy:
        return TokenLogprobs(aligned(out.loss.neg()), aligned(out.entropy))
    return aligned(out.neg())


# ---- lm_head under torch.distributed ---------------------------------------------------------
# A tensor-parallel lm_head (ColwiseParallel, transformers' tp_plan) holds its weight as a
# DTensor sharded by vocabulary: the kernel takes it as it is (integrations/distributed.py), and
# the logits the plan would gather are never built. Under FSDP2, lm_head.weight is the unsharded
# plain tensor during the wrapping module's forward; an lm_head given its own fully_shard is
# unsharded only during its own call, so the loss runs inside one.

def _is_fsdp_module(module) -> bool:
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # a torch without distributed
        return False
    return isinstance(module, FSDPModule)


def _is_plain_linear(module) -> bool:
    """nn.Linear, or the subclass fully_shard makes of it (its forward unchanged)."""
    return type(module) is nn.Linear or (isinstance(module, nn.Linear) and _is_fsdp_module(module)
                                         and type(module).forward is nn.Linear.forward)


def _through_head(head: nn.Module, hidden: Tensor, loss_of: Callable) -> Tensor:
    """loss_of(hidden, head.weight, head.bias): inside a call of ``head`` when FSDP2 manages it
    (its hooks unshard the weight for the call, reduce-scatter its gradient after the
    backward), directly otherwise."""
    if type(head) is nn.Linear or not _is_fsdp_module(head):
        return loss_of(hidden, head.weight, head.bias)
    head.forward = lambda h: loss_of(h, head.weight, head.bias)  # this call only
    try:
        return head(hidden)
    finally:
        del head.forward
