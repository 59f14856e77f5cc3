"""torchtune-style chunked loss: split tokens into k chunks, upcast each chunk, sum losses."""
import torch.nn.functional as F

from suite.providers.naive import logits_of
from suite.registry import register

CHUNKS = 8


@register("chunked", summary=f"torchtune-style: tokens in {CHUNKS} chunks, each upcast, losses summed",
          features=("bias", "softcap"), style=dict(color="#56B4E9", marker="^", linestyle="-"),
          order=3)
def chunked(e, c, targets, *, bias=None, softcap=None, ignore_index=-100, chunks=CHUNKS):
    total = None
    for e_k, t_k in zip(e.chunk(chunks), targets.chunk(chunks)):
        part = F.cross_entropy(logits_of(e_k, c, bias, softcap).float(), t_k,
                               ignore_index=ignore_index, reduction="sum")
        total = part if total is None else total + part
    return total / (targets != ignore_index).sum()
