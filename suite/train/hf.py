"""``--model hf:<arch>``: the training step on a Hugging Face architecture (transformers >= 5),
built from a config with random init (nothing is downloaded), per loss backend.

Sizes: the published model of ``suite.model_configs`` that the architecture is scaled from
(``HfArch.base``) with hidden size, MLP width and head counts halved (head size kept) and as many
layers as bring the parameter count to about ``TARGET_PARAMS`` (at most the published depth);
the vocabulary, tying and architecture settings are the published model's (Gemma 2: 256000 and
final-logit softcap 30). ``--tiny`` builds a few-thousand-parameter version for the CPU.
Attention: the model's default implementation (``--attn`` to choose another; Gemma 2 has no
SDPA path in transformers 5, so its default is eager with the attention softcap 50). The KV cache
is off (``use_cache=False``), as in training.

Backends (``HF_BACKENDS``): ``hf_loss`` the model's own forward (logits, ForCausalLMLoss, the
reference); ``hf_loss_fp32`` the same with the head's matmul in fp32 outside autocast (logits
not rounded to bf16: what the exact kernel computes, so it tells the reference's own rounding
from the kernel's; convergence only by default); ``own`` / ``own_filter`` ``own_kernel.transformers.patch(model)`` exact /
``filter_eps="auto"``; ``liger_flce`` Liger's ``apply_liger_kernel_to_<arch>(model=...)`` with
only its fused linear cross entropy on (every other bool switch, rope, norms, MLP, off: the trunk
stays the model's own, so the rows differ in the loss only); ``apple_cce`` Apple's
``cut_cross_entropy.transformers.cce_patch(model, impl="cce")`` (its default filter). Each is
first checked with the availability of the suite provider running the same kernel
(``PROVIDER_OF``); an architecture a peer does not patch is an ``unsupported`` row.

Data: the suite's synthetic corpus and prompt masking (``suite.train.data``); the labels are given
the Hugging Face way (``labels[:, t]`` is the target of position ``t - 1``; the model shifts
them), so position t is trained on the same next token as in the GPT bench, the last position
of each sequence excepted.
"""
from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass

import torch
from torch import nn

from suite import catalog
from suite.model_configs import MODELS, ModelConfig
from suite.train.data import IGNORE_INDEX, instruction_batch, markov_chain, sample_tokens
from suite.train.model import apply_step

PREFIX = "hf:"
TARGET_PARAMS = 1.0e9
REFERENCE = "hf_loss"
# Backend -> the suite provider that runs the same kernel (its availability applies), or None.
PROVIDER_OF = {"hf_loss": None, "hf_loss_fp32": None, "own": "own", "own_filter": "own_filter",
               "liger_flce": "liger_flce", "apple_cce": "apple_cce"}
HF_BACKENDS = tuple(PROVIDER_OF)
HF_BENCH_BACKENDS = tuple(b for b in HF_BACKENDS if b != "hf_loss_fp32")  # --backends' default
HF_CONV_BACKENDS = ("hf_loss", "hf_loss_fp32", "own")
TINY = dict(vocab=512, hidden=32, intermediate=64, layers=2, heads=4, kv_heads=2, head_dim=8)


@dataclass(frozen=True)
class HfArch:
    config_class: str          # transformers.<config_class>
    model_class: str           # transformers.<model_class>
    base: str                  # the suite.model_configs.MODELS entry its sizes are scaled from
    liger: str | None          # liger_kernel.transformers.apply_liger_kernel_to_<liger>
    settings: tuple = ()       # (name, value) of the config, as in the published model


_LLAMA3, _GEMMA2 = "Llama 3 (8B)", "Gemma 2 (2B)"
# Every architecture own_kernel.transformers.patch supports. Cohere and Granite have no entry in
# suite.model_configs: scaled from Llama 3's sizes. Gemma 1 and Gemma 3 text from Gemma 2's.
ARCHS = {
    "llama": HfArch("LlamaConfig", "LlamaForCausalLM", _LLAMA3, "llama"),
    "mistral": HfArch("MistralConfig", "MistralForCausalLM", "Mistral NeMo (12B)", "mistral"),
    "qwen2": HfArch("Qwen2Config", "Qwen2ForCausalLM", "Qwen 2.5 (7B)", "qwen2"),
    "qwen3": HfArch("Qwen3Config", "Qwen3ForCausalLM", "Qwen 2.5 (7B)", "qwen3"),
    "phi3": HfArch("Phi3Config", "Phi3ForCausalLM", "Phi 3.5 Mini", "phi3"),
    "phi": HfArch("PhiConfig", "PhiForCausalLM", "Phi 3.5 Mini", None),
    "gemma": HfArch("GemmaConfig", "GemmaForCausalLM", _GEMMA2, "gemma"),
    "gemma2": HfArch("Gemma2Config", "Gemma2ForCausalLM", _GEMMA2, "gemma2",
                     (("final_logit_softcapping", 30.0),)),
    "gemma3": HfArch("Gemma3TextConfig", "Gemma3ForCausalLM", _GEMMA2, "gemma3_text"),
    "cohere": HfArch("CohereConfig", "CohereForCausalLM", _LLAMA3, None),
    "granite": HfArch("GraniteConfig", "GraniteForCausalLM", _LLAMA3, "granite"),
}
SUPPORTED = tuple(PREFIX + name for name in ARCHS)


class Unsupported(Exception):
    """A backend that cannot patch this architecture (a row with status ``unsupported``)."""


def reference_backend(args) -> str:
    """The backend the others are compared with: naive for the GPT, hf_loss for ``args.hf``."""
    return REFERENCE if getattr(args, "hf", None) else "naive"


def arch_of(model: str) -> str:
    """``hf:<arch>`` -> ``<arch>``; a clear error naming the supported ones otherwise."""
    name = model[len(PREFIX):] if model.startswith(PREFIX) else None
    if name not in ARCHS:
        raise ValueError(f"unknown model {model!r}; supported: gpt, {', '.join(SUPPORTED)}")
    return name


# ---- the configuration -----------------------------------------------------------------------

def _scaled(base: ModelConfig) -> ModelConfig:
    """Half the width, the head size kept, the depth that brings it to ~TARGET_PARAMS."""
    half = dataclasses.replace(base, hidden=base.hidden // 2, intermediate=base.intermediate // 2,
                               heads=max(1, base.heads // 2), kv_heads=max(1, base.kv_heads // 2),
                               layers=1)
    per_layer = dataclasses.replace(half, layers=2).param_count() - half.param_count()
    outside = half.param_count() - per_layer
    layers = int((TARGET_PARAMS - outside) // per_layer)
    return dataclasses.replace(half, layers=max(2, min(base.layers, layers)))


def config_kwargs(arch: str, *, seq_len: int, tiny: bool = False, attn: str | None = None) -> dict:
    """The keyword arguments of ``transformers.<config_class>`` for the bench (JSON-able)."""
    spec = ARCHS[arch]
    base = next(m for m in MODELS if m.name == spec.base)
    if tiny:
        sizes = dict(TINY)
    else:
        m = _scaled(base)
        sizes = dict(vocab=m.vocab, hidden=m.hidden, intermediate=m.intermediate,
                     layers=m.layers, heads=m.heads, kv_heads=m.kv_heads, head_dim=m.head_dim)
    kwargs = dict(vocab_size=sizes["vocab"], hidden_size=sizes["hidden"],
                  intermediate_size=sizes["intermediate"], num_hidden_layers=sizes["layers"],
                  num_attention_heads=sizes["heads"], num_key_value_heads=sizes["kv_heads"],
                  head_dim=sizes["head_dim"], tie_word_embeddings=base.tied_embeddings,
                  max_position_embeddings=max(seq_len, 4096), pad_token_id=0, bos_token_id=1,
                  eos_token_id=2, use_cache=False, **dict(spec.settings))
    if attn:
        kwargs["attn_implementation"] = attn
    return kwargs


def _classes(arch: str):
    import transformers

    spec = ARCHS[arch]
    return getattr(transformers, spec.config_class), getattr(transformers, spec.model_class)


_STOCK_FORWARD: dict[type, object] = {}


def build_model(arch: str, kwargs: dict, device) -> nn.Module:
    """The model in fp32, training mode, on ``device`` (``meta``: counted only). The class's
    stock forward is put back first: a peer that patched the class in an earlier job of this
    process does not reach this one."""
    config_cls, model_cls = _classes(arch)
    stock = _STOCK_FORWARD.setdefault(model_cls, model_cls.forward)
    model_cls.forward = stock
    with torch.device(device):
        model = model_cls(config_cls(**kwargs))
    return model.float().train()


def shape_fields(arch: str, kwargs: dict, seq_len: int) -> dict:
    """The bench row's model columns: sizes and parameter counts (all, and without the
    embedding and an untied head), counted on the meta device."""
    model = build_model(arch, kwargs, "meta")
    total = sum(p.numel() for p in model.parameters())
    emb = model.get_input_embeddings().weight
    head = model.lm_head.weight
    outside = emb.numel() + (0 if head is emb else head.numel())
    softcap = getattr(model.config, "final_logit_softcapping", None)
    return dict(model=f"hf:{arch}", vocab=kwargs["vocab_size"], d_model=kwargs["hidden_size"],
                n_layer=kwargs["num_hidden_layers"], n_head=kwargs["num_attention_heads"],
                seq_len=seq_len, n_params=total, n_params_nonemb=total - outside,
                softcap=softcap if softcap is not None else "")


# ---- backends --------------------------------------------------------------------------------

def backend_problem(backend: str, device) -> tuple[int, str | None, str | None]:
    """(exact, status, reason) of ``backend`` here, before any model is built."""
    name = PROVIDER_OF[backend]
    if name is None:
        return 1, None, None
    provider = catalog.get(name)
    reason = provider.unavailable_reason(device)
    return int(provider.exact), ("unavailable" if reason else None), reason


def apply_backend(model: nn.Module, backend: str, arch: str) -> None:
    """Patch ``model`` (an instance) to compute its loss with ``backend``."""
    if backend == "hf_loss":
        return
    if backend == "hf_loss_fp32":
        _fp32_head(model)
        return
    if backend in ("own", "own_filter"):
        from own_kernel.transformers import patch

        patch(model, filter_eps="auto" if backend == "own_filter" else None)
    elif backend == "liger_flce":
        _apply_liger(model, arch)
    elif backend == "apple_cce":
        _apply_apple(model)
    else:
        raise ValueError(f"backend: unknown HF backend {backend!r}; known: {', '.join(HF_BACKENDS)}")


def _fp32_head(model: nn.Module) -> None:
    """The output layer's matmul in fp32 with autocast off (fp32 logits), the rest unchanged."""
    head = model.get_output_embeddings()

    def forward(x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(x.device.type, enabled=False):
            bias = None if head.bias is None else head.bias.float()
            return nn.functional.linear(x.float(), head.weight.float(), bias)

    head.forward = forward


def _apply_liger(model: nn.Module, arch: str) -> None:
    import liger_kernel.transformers as liger

    name = ARCHS[arch].liger
    fn = getattr(liger, f"apply_liger_kernel_to_{name}", None) if name else None
    if fn is None:
        raise Unsupported(f"liger_kernel has no apply_liger_kernel_to_* for "
                          f"{ARCHS[arch].model_class}")
    switches = {k: False for k, p in inspect.signature(fn).parameters.items()
                if isinstance(p.default, bool)}
    fn(**{**switches, "fused_linear_cross_entropy": True}, model=model)
    if "forward" not in model.__dict__:
        raise Unsupported("Liger did not patch the instance's forward (its fused linear cross "
                          "entropy would not run)")


def _apply_apple(model: nn.Module) -> None:
    from cut_cross_entropy.transformers import cce_patch

    try:
        cce_patch(model, impl="cce", reduction="mean")
    except RuntimeError as err:
        if "Unknown model type" in str(err):
            raise Unsupported(f"cut_cross_entropy's cce_patch: {err}") from None
        raise


# ---- data and the training step ----------------------------------------------------------------

def hf_labels(targets: torch.Tensor) -> torch.Tensor:
    """Next-token targets (B, T) as Hugging Face labels: the model shifts ``labels`` left by one,
    so ``labels[:, t] = targets[:, t - 1]`` (the first column is never a target)."""
    first = targets.new_full((targets.shape[0], 1), IGNORE_INDEX)
    return torch.cat([first, targets[:, :-1]], dim=1)


def corpus(vocab: int, n_seq: int, seq_len: int, *, prompt_frac, seed: int, device):
    """(input ids, labels) of ``n_seq`` sequences of the synthetic corpus."""
    chain = markov_chain(vocab, seed=seed)
    idx, targets = instruction_batch(
        sample_tokens(chain, n_seq, seq_len + 1, seed=seed + 1, device=device),
        prompt_frac=tuple(prompt_frac), seed=seed + 2)
    return idx, hf_labels(targets)


def hf_train_step(model, opt, idx, labels, *, amp: bool, clip: float = 1.0):
    """One plain step, as suite.train.model.train_step: forward with labels (bf16 autocast under
    ``amp``), backward, clip, AdamW, zero grads. Returns the loss."""
    with torch.autocast(device_type=idx.device.type, dtype=torch.bfloat16, enabled=amp):
        loss = model(input_ids=idx, labels=labels).loss
    return apply_step(model, opt, loss, clip)


# ---- the step split at the final hidden states (the loss's own memory) ------------------------

class _CutTrunk(nn.Module):
    """Stands in for ``model.model`` in the loss half of a split step: whatever it is called
    with, it returns the detached final hidden states (every backend's forward reads them from
    ``self.model(...)``, as the stock forward does)."""

    def __init__(self, hidden: torch.Tensor, output_class):
        super().__init__()
        self.hidden, self.output_class = hidden, output_class

    def forward(self, *args, **kwargs):
        return self.output_class(last_hidden_state=self.hidden)


class _Memory:
    """CUDA allocator statistics of ``dev`` (bytes); zeros on the CPU, so that the split step's
    arithmetic runs there too."""

    def __init__(self, dev: torch.device):
        self.cuda = dev.type == "cuda"
        self.dev = dev

    def reset(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.dev)
            torch.cuda.reset_peak_memory_stats(self.dev)

    def allocated(self) -> int:
        return torch.cuda.memory_allocated(self.dev) if self.cuda else 0

    def peak(self) -> int:
        if not self.cuda:
            return 0
        torch.cuda.synchronize(self.dev)
        return torch.cuda.max_memory_allocated(self.dev)


def hf_split_step_memory(model, opt, idx, labels, *, amp: bool, clip: float = 1.0) -> dict:
    """:func:`hf_train_step` with its backward split at the final hidden states, to measure the
    loss's own peak (bytes), as suite.train.model.split_step_memory does for the GPT: the trunk
    forward, then the model's forward (the backend's loss) on the cut hidden states with
    ``model.model`` stood in for, its backward, then the trunk's backward. Same update."""
    from transformers.modeling_outputs import BaseModelOutputWithPast

    mem = _Memory(idx.device)
    mem.reset()
    base = mem.allocated()
    autocast = torch.autocast(device_type=idx.device.type, dtype=torch.bfloat16, enabled=amp)
    with autocast:
        hidden = model.model(input_ids=idx).last_hidden_state
    after_fwd, peak = mem.allocated(), mem.peak()
    cut = hidden.detach().requires_grad_()
    trunk = model.model
    mem.reset()
    before_loss = mem.allocated()
    model.model = _CutTrunk(cut, BaseModelOutputWithPast)
    try:
        with autocast:
            loss = model(input_ids=idx, labels=labels).loss
        loss.backward()
    finally:
        model.model = trunk
    loss_peak = mem.peak() - before_loss
    peak = max(peak, mem.peak())
    mem.reset()
    hidden.backward(cut.grad)
    del hidden, cut
    if clip:
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    opt.step()
    opt.zero_grad(set_to_none=True)
    peak = max(peak, mem.peak())
    return {"base": base, "saved_act": after_fwd - base, "loss": loss_peak, "peak": peak,
            "loss_value": loss.detach()}
