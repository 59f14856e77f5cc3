"""Published configurations of five LMs and the training-memory breakdown drawn in the
paper-style Figure 1 (``suite.plots.memory.plot_memory_breakdown``).

Every number in ``MODELS`` is copied from the model's ``config.json`` on the Hugging Face Hub
(the repository is named in ``source``); ``published_params`` is the total the model card states,
used only by the tests as a check on ``param_count``.

The breakdown is an analytic estimate, not a measurement. Assumptions (all in one place):
- ``TOKENS`` = 8192 tokens per GPU per step, the batch of the paper's Table 1.
- Mixed-precision AdamW: bf16 weights (2 B/param) and bf16 gradients (2 B/param); the optimizer
  keeps an fp32 master copy plus fp32 first and second moments (12 B/param, "Adam states").
- Weights, gradients and Adam states are sharded over ``gpus`` GPUs (FSDP / ZeRO-3); activations
  and the loss layer are per GPU and do not shrink with sharding. ``gpus=1`` is a single GPU.
- Activation checkpointing at every transformer layer: each layer keeps its bf16 input
  (tokens x hidden), and during the backward one layer is recomputed at a time, whose saved
  tensors are counted by ``layer_saved_elems_per_token`` (flash attention, so no tokens^2 term).
- Loss layer without CCE: the paper's baseline keeps bf16 logits (2 B), their fp32 upcast (4 B),
  the fp32 log-softmax saved for backward (4 B) and, in the backward, the fp32 gradient of the
  logits (4 B): ``BASELINE_LOGIT_BYTES`` = 14 B per token per vocabulary entry. (At Gemma 2 (2B)
  this is 14 * 8192 * 256000 B = 28000 MiB, the baseline's loss+gradient in the paper's Table 1.)
- Loss layer with CCE: only the fp32 log-sum-exp per token (4 B per token).
"""
from __future__ import annotations

from dataclasses import dataclass

TOKENS = 8192
BYTES_WEIGHT = 2          # bf16
BYTES_GRAD = 2            # bf16
BYTES_ADAM = 4 + 4 + 4    # fp32 master copy, first moment, second moment
BYTES_ACT = 2             # bf16 activations
BASELINE_LOGIT_BYTES = 2 + 4 + 4 + 4
CCE_BYTES_PER_TOKEN = 4   # fp32 log-sum-exp

COMPONENTS = ("weights", "gradients", "Adam states", "activations", "loss logits")


@dataclass(frozen=True)
class ModelConfig:
    name: str
    source: str               # Hugging Face repository whose config.json the numbers are from
    vocab: int
    hidden: int
    layers: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    tied_embeddings: bool
    qkv_bias: bool = False
    norms_per_layer: int = 2  # RMSNorm weight vectors per layer
    published_params: float = 0.0  # total parameters stated on the model card

    def param_count(self) -> int:
        d, hd = self.hidden, self.head_dim
        attn = d * self.heads * hd + 2 * d * self.kv_heads * hd + self.heads * hd * d
        if self.qkv_bias:
            attn += self.heads * hd + 2 * self.kv_heads * hd
        mlp = 3 * d * self.intermediate  # gated MLP: gate, up, down
        per_layer = attn + mlp + self.norms_per_layer * d
        embed = self.vocab * d
        head = 0 if self.tied_embeddings else self.vocab * d
        return embed + self.layers * per_layer + d + head  # + final norm

    def layer_saved_elems_per_token(self) -> int:
        """Elements one recomputed layer saves per token for its backward (bf16): the inputs and
        outputs of both norms (4 * hidden), q and the attention output (2 * heads * head_dim),
        k and v (2 * kv_heads * head_dim), and gate, up, act(gate), act(gate) * up
        (4 * intermediate)."""
        return (4 * self.hidden + 2 * self.heads * self.head_dim
                + 2 * self.kv_heads * self.head_dim + 4 * self.intermediate)


MODELS = [
    ModelConfig("Gemma 2 (2B)", "google/gemma-2-2b", vocab=256000, hidden=2304, layers=26,
                intermediate=9216, heads=8, kv_heads=4, head_dim=256, tied_embeddings=True,
                norms_per_layer=4, published_params=2.61e9),
    ModelConfig("Phi 3.5 Mini", "microsoft/Phi-3.5-mini-instruct", vocab=32064, hidden=3072,
                layers=32, intermediate=8192, heads=32, kv_heads=32, head_dim=96,
                tied_embeddings=False, published_params=3.82e9),
    ModelConfig("Qwen 2.5 (7B)", "Qwen/Qwen2.5-7B", vocab=152064, hidden=3584, layers=28,
                intermediate=18944, heads=28, kv_heads=4, head_dim=128, tied_embeddings=False,
                qkv_bias=True, published_params=7.61e9),
    ModelConfig("Llama 3 (8B)", "meta-llama/Meta-Llama-3-8B", vocab=128256, hidden=4096,
                layers=32, intermediate=14336, heads=32, kv_heads=8, head_dim=128,
                tied_embeddings=False, published_params=8.03e9),
    ModelConfig("Mistral NeMo (12B)", "mistralai/Mistral-Nemo-Base-2407", vocab=131072,
                hidden=5120, layers=40, intermediate=14336, heads=32, kv_heads=8, head_dim=128,
                tied_embeddings=False, published_params=12.2e9),
]


def memory_breakdown(model: ModelConfig, *, tokens: int = TOKENS, gpus: int = 16,
                     cce: bool = False) -> dict[str, float]:
    """Per-GPU training memory (bytes) of each component in ``COMPONENTS``."""
    if tokens <= 0:
        raise ValueError(f"tokens must be a positive integer, got {tokens!r}")
    if gpus <= 0:
        raise ValueError(f"gpus must be a positive integer, got {gpus!r}")
    params = model.param_count()
    checkpoints = model.layers * tokens * model.hidden * BYTES_ACT
    recompute = tokens * model.layer_saved_elems_per_token() * BYTES_ACT
    if cce:
        logits = tokens * CCE_BYTES_PER_TOKEN
    else:
        logits = tokens * model.vocab * BASELINE_LOGIT_BYTES
    return {
        "weights": params * BYTES_WEIGHT / gpus,
        "gradients": params * BYTES_GRAD / gpus,
        "Adam states": params * BYTES_ADAM / gpus,
        "activations": checkpoints + recompute,
        "loss logits": logits,
    }
