"""The trained model and one training step: a small GPT-style decoder in plain PyTorch whose final
hidden states E and lm-head weight C go to a loss provider; the step's memory breakdown."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from suite.measure import MIB
from suite.train.data import IGNORE_INDEX


@dataclass(frozen=True)
class GPTConfig:
    vocab: int = 32000
    seq_len: int = 2048
    d_model: int = 512
    n_layer: int = 6
    n_head: int = 8


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        d = cfg.d_model
        self.n_head = cfg.n_head
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.attn_proj = nn.Linear(d, d, bias=False)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d, bias=False)
        self.fc_proj = nn.Linear(4 * d, d, bias=False)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.n_head, d // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn_proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.fc_proj(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    """Returns the final hidden states (B, T, D); the lm head weight C is ``self.lm_head``."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        if cfg.d_model % cfg.n_head:
            raise ValueError(f"d_model={cfg.d_model} must be divisible by n_head={cfg.n_head}")
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab, cfg.d_model)
        self.wpe = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.lm_head = nn.Parameter(torch.empty(cfg.vocab, cfg.d_model))  # C, untied
        for name, p in self.named_parameters():
            if p.dim() < 2 or p.is_meta:  # meta: counted only (param_counts), nothing to fill
                continue  # LayerNorm weights/biases keep their (1, 0) init
            std = 0.02 / math.sqrt(2 * cfg.n_layer) if name.endswith("proj.weight") else 0.02
            nn.init.normal_(p, mean=0.0, std=std)

    def forward(self, idx):
        t = idx.shape[1]
        if t > self.cfg.seq_len:
            raise ValueError(f"sequence length {t} exceeds the model's seq_len={self.cfg.seq_len}")
        x = self.wte(idx) + self.wpe(torch.arange(t, device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x)


def param_counts(cfg: GPTConfig) -> tuple[int, int]:
    """(all parameters, parameters without wte, wpe and the lm head), counted on the meta device."""
    with torch.device("meta"):
        model = GPT(cfg)
    total = sum(p.numel() for p in model.parameters())
    emb = model.wte.weight.numel() + model.wpe.weight.numel() + model.lm_head.numel()
    return total, total - emb


def make_optimizer(model, lr, device):
    # fused AdamW: one kernel for all parameters and no foreach temporaries.
    fused = device.type == "cuda"
    return torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1,
                             fused=fused or None)


def init_optimizer_state(model, opt):
    """Allocate Adam's moments before the first measured step (a zero-gradient step), so that a
    single step shows the steady-state peak (moments and activations live together)."""
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    opt.zero_grad(set_to_none=True)


# ---- one training step -----------------------------------------------------------------------

def head_loss(model, h, targets, loss_fn, *, amp, softcap=None, ignore_index=IGNORE_INDEX):
    """The loss provider on E = h (N, D) and C = lm_head (V, D), in bf16 under ``amp``."""
    e = h.reshape(-1, h.shape[-1])
    c = model.lm_head
    if amp:
        e, c = e.to(torch.bfloat16), c.to(torch.bfloat16)
    return loss_fn(e, c, targets.reshape(-1), softcap=softcap, ignore_index=ignore_index)


def train_step(model, opt, idx, targets, loss_fn, *, amp, softcap=None, clip=1.0):
    """One plain step: forward, loss, backward, clip, AdamW, zero grads. Returns the loss."""
    with torch.autocast(device_type=idx.device.type, dtype=torch.bfloat16, enabled=amp):
        h = model(idx)
    loss = head_loss(model, h, targets, loss_fn, amp=amp, softcap=softcap)
    return apply_step(model, opt, loss, clip)


def apply_step(model, opt, loss, clip):
    """Backward, clip, AdamW, zero grads; returns the loss, detached."""
    loss.backward()
    if clip:
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.detach()


def split_step_memory(model, opt, idx, targets, loss_fn, *, amp, softcap=None, clip=1.0) -> dict:
    """The same step with its backward split at E, to measure the loss's own peak (bytes).
    Numerically identical to :func:`train_step` (the chain rule applied in two calls)."""
    dev = idx.device
    torch.cuda.synchronize(dev)
    torch.cuda.reset_peak_memory_stats(dev)
    base = torch.cuda.memory_allocated(dev)
    with torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=amp):
        h = model(idx)
    torch.cuda.synchronize(dev)
    after_fwd = torch.cuda.memory_allocated(dev)
    peak = torch.cuda.max_memory_allocated(dev)
    h_cut = h.detach().requires_grad_()
    torch.cuda.reset_peak_memory_stats(dev)
    before_loss = torch.cuda.memory_allocated(dev)
    loss = head_loss(model, h_cut, targets, loss_fn, amp=amp, softcap=softcap)
    loss.backward()
    torch.cuda.synchronize(dev)
    loss_peak = torch.cuda.max_memory_allocated(dev) - before_loss
    peak = max(peak, torch.cuda.max_memory_allocated(dev))
    torch.cuda.reset_peak_memory_stats(dev)
    h.backward(h_cut.grad)
    del h, h_cut, loss
    if clip:
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    opt.step()
    opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize(dev)
    peak = max(peak, torch.cuda.max_memory_allocated(dev))
    return {"base": base, "saved_act": after_fwd - base, "loss": loss_peak, "peak": peak}


def static_memory(model) -> dict:
    """Bytes of weights, gradients and AdamW moments, from parameter counts and dtypes.
    Gradients have the parameters' dtype; AdamW keeps exp_avg and exp_avg_sq in it too (its
    per-parameter step counter, a scalar, is left out)."""
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    trained = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    return {"weights": weights, "grads": trained, "optim": 2 * trained}


def memory_breakdown_mib(peak: int, static: dict, loss: int) -> dict:
    """Split a step's peak (bytes) into components (MiB); activations are the rest."""
    parts = {"weights_mib": static["weights"], "grads_mib": static["grads"],
             "optim_mib": static["optim"], "loss_mib": loss}
    parts["act_mib"] = peak - sum(parts.values())
    return {k: v / MIB for k, v in parts.items()}

