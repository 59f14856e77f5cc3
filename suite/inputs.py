"""Seeded input generators: E (N, D), C (V, D), targets (N,) and an optional bias (V,).

Every random number comes from one CPU ``torch.Generator`` (fp32), so a cell's inputs are the
same on every machine; tensors are moved to the device and then cast to the cell's dtype.

Distributions:
- ``uniform``: E ~ N(0, 1/D), C ~ N(0, 1), targets uniform. The softmax is nearly flat.
- ``lm``: built like a trained LM head (see ``lm_inputs``). Peaked softmax with a Zipfian
  token prior carried by a hidden direction every row shares; targets drawn from the model's own
  softmax, so the loss is close to the calibrated entropy (2.2 nats by default).
- ``file``: E, C, targets (and optional bias) from a ``.pt`` dict or a ``.safetensors`` file.
"""
from __future__ import annotations

import math
from pathlib import Path

import torch

DISTS = ("uniform", "lm", "file")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}

# lm generator constants (see lm_inputs for what each one does).
ZIPF_EXPONENT = 1.1
ALPHA = 4.0         # length of the shared hidden direction in E
C_OFFSET = 2.0      # common component of every classifier row along that direction
SIGMA = 0.5         # per-row noise in E
LM_ENTROPY = 2.2    # default mean softmax entropy (nats) of the lm generator
CALIB_ROWS = 1024   # rows used to calibrate beta: per-row entropy has std ~1.5 nats, so the
                    # sample mean is within ~0.05 nats of the full set's
ROW_CHUNK_ELEMS = 1 << 28  # at most this many logits (fp32: 1 GiB) materialised at a time


def to_dtype(name: str) -> torch.dtype:
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {name!r}") from None


def apply_softcap(x: torch.Tensor, softcap: float | None) -> torch.Tensor:
    return x if softcap is None else softcap * torch.tanh(x / softcap)


def entropy_of(logits: torch.Tensor) -> torch.Tensor:
    """Softmax entropy of each row (nats), computed in the logits' dtype."""
    logp = torch.log_softmax(logits, dim=-1)
    return -(logp.exp() * logp).sum(-1)


def make_inputs(dist: str, n: int, d: int, v: int, dtype, *, seed: int, device="cpu",
                softcap: float | None = None, ignore_frac: float = 0.0, bias: bool = False,
                ignore_index: int = -100, path: str | Path | None = None,
                target_entropy: float = LM_ENTROPY) -> dict:
    """Return ``dict(e, c, targets, bias)`` on ``device``; ``bias`` is None unless asked for.

    For ``file``, ``n``, ``d``, ``v`` may be None (taken from the file); when given they must
    match it. ``dtype`` is a torch dtype or one of ``bf16|fp16|fp32``.
    """
    if isinstance(dtype, str):
        dtype = to_dtype(dtype)
    if not 0.0 <= ignore_frac < 1.0:
        raise ValueError(f"ignore_frac must be in [0, 1), got {ignore_frac}")
    if softcap is not None and softcap <= 0:
        raise ValueError(f"softcap must be positive or None, got {softcap}")
    device = torch.device(device)
    gen = torch.Generator().manual_seed(seed)

    if dist == "file":
        out = load_file(path, n=n, d=d, v=v)
        e, c, targets, b = out["e"], out["c"], out["targets"], out["bias"]
        e, c = e.to(device, torch.float32), c.to(device, torch.float32)
        targets = targets.to(device)
        if b is not None:
            b = b.to(device, torch.float32)
        if bias and b is None:
            b = 0.1 * torch.randn(c.shape[0], generator=gen).to(device)
        if not bias:
            b = None
    else:
        for name, val in (("n", n), ("d", d), ("v", v)):
            if not isinstance(val, int) or val < 1:
                raise ValueError(f"{name} must be a positive integer, got {val!r}")
        b = 0.1 * torch.randn(v, generator=gen).to(device) if bias else None
        if dist == "uniform":
            e = (torch.randn(n, d, generator=gen) / math.sqrt(d)).to(device)
            c = torch.randn(v, d, generator=gen).to(device)
            targets = torch.randint(0, v, (n,), generator=gen).to(device)
        elif dist == "lm":
            e, c = lm_hidden_and_classifier(n, d, v, gen=gen, device=device, softcap=softcap,
                                            target_entropy=target_entropy, bias=b)
            # Targets come from the softmax the providers will see: the inputs after the cast.
            e = e.to(dtype).float()
            c = c.to(dtype).float()
            targets = sample_targets(e, c, b, softcap, gen)
        else:
            raise ValueError(f"dist must be one of {', '.join(DISTS)}, got {dist!r}")

    if ignore_frac > 0:
        mask = torch.rand(targets.shape[0], generator=gen) < ignore_frac
        targets = targets.masked_fill(mask.to(targets.device), ignore_index)
    return {"e": e.to(dtype).contiguous(), "c": c.to(dtype).contiguous(),
            "targets": targets.to(torch.int64).contiguous(),
            "bias": None if b is None else b.to(dtype).contiguous()}


# ---- lm: looks like a trained LM head ---------------------------------------------------

def lm_hidden_and_classifier(n, d, v, *, gen, device, softcap, target_entropy, bias=None):
    """E and C (fp32, on ``device``) whose softmax has mean entropy ``target_entropy``.

    u is a unit vector every hidden state shares. G ~ N(0, 1/D) gives each token a unit-norm
    identity. Token ids are shuffled with respect to frequency (rank = randperm), and the Zipf
    log-prior lp_v = -1.1 log(rank_v + 1) (centred) rides on u:
        C_v = G_v + (C_OFFSET + lp_v / ALPHA) u,
        E_i = ALPHA u + beta G_{k_i} + SIGMA noise,   k_i ~ Zipf prior (a context token),
    so logits ~ const + lp_v + beta [v == k_i] + small noise. C carries a large component all
    rows share (C_OFFSET u), which is where gradient terms must cancel across the vocabulary.
    beta is found by bisection so that the mean entropy on CALIB_ROWS rows hits the target.
    """
    u = torch.randn(d, generator=gen)
    u = u / u.norm()
    g = torch.randn(v, d, generator=gen) / math.sqrt(d)
    g.addr_(g @ u, u, alpha=-1.0)  # token identities orthogonal to the shared direction
    rank = torch.randperm(v, generator=gen)
    lp = -ZIPF_EXPONENT * torch.log(rank.double() + 1.0)
    lp = (lp - lp.mean()).float()
    prior = torch.softmax(lp.double(), 0)
    context = torch.multinomial(prior, n, replacement=True, generator=gen)
    noise = torch.randn(n, d, generator=gen) / math.sqrt(d)

    u_dev, g_dev = u.to(device), g.to(device)
    c = g_dev + (C_OFFSET + lp.to(device) / ALPHA)[:, None] * u_dev[None, :]
    del g  # keep one copy of G (on the device) at V = 256000
    base = ALPHA * u_dev[None, :] + SIGMA * noise.to(device)  # (n, d)
    context = context.to(device)

    beta = calibrate_beta(base, g_dev, context, c, softcap, target_entropy, bias)
    e = base + beta * g_dev[context]
    return e, c


def calibrate_beta(base, g, context, c, softcap, target_entropy, bias, lo=0.0, hi=64.0,
                   iters=40):
    """Bisection on beta: the mean entropy falls as the context token's logit grows."""
    rows = torch.arange(min(CALIB_ROWS, base.shape[0]), device=base.device)
    with torch.no_grad():
        a = base[rows] @ c.T          # logits = a + beta * b
        b = g[context[rows]] @ c.T
        if bias is not None:
            a = a + bias

        def mean_entropy(beta):
            return entropy_of(apply_softcap(a + beta * b, softcap)).mean().item()

        if mean_entropy(lo) < target_entropy:
            raise ValueError(f"lm inputs: target_entropy {target_entropy} is above what the Zipf "
                             f"prior alone gives ({mean_entropy(lo):.2f} nats at V={c.shape[0]})")
        if mean_entropy(hi) > target_entropy:
            raise ValueError(f"lm inputs: target_entropy {target_entropy} is below what beta<={hi} "
                             f"can reach ({mean_entropy(hi):.2f} nats): D={c.shape[1]} is too small "
                             f"for the token identities to stay apart under softcap {softcap}")
        for _ in range(iters):
            mid = 0.5 * (lo + hi)
            if mean_entropy(mid) > target_entropy:
                lo = mid
            else:
                hi = mid
    return 0.5 * (lo + hi)


def row_chunk(n: int, v: int) -> int:
    return max(1, min(n, ROW_CHUNK_ELEMS // max(v, 1)))


def sample_targets(e, c, bias, softcap, gen):
    """One draw per row from that row's softmax, by inverse CDF on CPU-generated uniforms.

    Rows are processed in chunks so at most ROW_CHUNK_ELEMS logits exist at once.
    """
    n, v = e.shape[0], c.shape[0]
    uniforms = torch.rand(n, 1, generator=gen, dtype=torch.float64)
    out = torch.empty(n, dtype=torch.int64, device=e.device)
    step = row_chunk(n, v)
    with torch.no_grad():
        for s in range(0, n, step):
            logits = e[s:s + step] @ c.T
            if bias is not None:
                logits += bias
            p = torch.softmax(apply_softcap(logits, softcap), dim=-1)
            del logits
            cdf = torch.cumsum(p, dim=-1, out=p)
            u = uniforms[s:s + step].to(e.device, torch.float32) * cdf[:, -1:]
            out[s:s + step] = torch.searchsorted(cdf, u).clamp_(max=v - 1).squeeze(1)
            del p, cdf
    return out


# ---- file: captured hidden states ------------------------------------------------------

def load_file(path, *, n=None, d=None, v=None) -> dict:
    """Load ``e`` (N, D), ``c`` (V, D), ``targets`` (N,) integer and optional ``bias`` (V,)."""
    if path is None:
        raise ValueError("dist 'file' needs a path (--file PATH) to a .pt or .safetensors file")
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"--file {path}: no such file")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file as st_load

        data = st_load(str(path))
    elif path.suffix in (".pt", ".pth"):
        data = torch.load(path, map_location="cpu", weights_only=True)
    else:
        raise ValueError(f"--file {path}: expected a .pt or .safetensors file")
    if not isinstance(data, dict):
        raise ValueError(f"--file {path}: expected a dict of tensors with keys e, c, targets "
                         f"(and optionally bias), got {type(data).__name__}")
    missing = [k for k in ("e", "c", "targets") if k not in data]
    if missing:
        raise ValueError(f"--file {path}: missing key(s) {missing}; found {sorted(data)}")
    e, c, t, b = data["e"], data["c"], data["targets"], data.get("bias")
    if e.dim() != 2 or c.dim() != 2 or e.shape[1] != c.shape[1]:
        raise ValueError(f"--file {path}: e must be (N, D) and c (V, D) with the same D; "
                         f"got e {tuple(e.shape)}, c {tuple(c.shape)}")
    if not (e.is_floating_point() and c.is_floating_point()):
        raise ValueError(f"--file {path}: e and c must be floating point, got {e.dtype}, {c.dtype}")
    if t.dim() != 1 or t.shape[0] != e.shape[0] or t.is_floating_point():
        raise ValueError(f"--file {path}: targets must be an integer tensor of shape "
                         f"({e.shape[0]},), got {t.dtype} {tuple(t.shape)}")
    if b is not None and (b.dim() != 1 or b.shape[0] != c.shape[0]):
        raise ValueError(f"--file {path}: bias must have shape ({c.shape[0]},), got {tuple(b.shape)}")
    for name, want, got in (("n", n, e.shape[0]), ("d", d, e.shape[1]), ("v", v, c.shape[0])):
        if want is not None and want != got:
            raise ValueError(f"--file {path}: {name}={want} was asked for but the file has {got}")
    return {"e": e, "c": c, "targets": t.long(), "bias": b}


def file_shape(path) -> tuple[int, int, int]:
    out = load_file(path)
    return out["e"].shape[0], out["e"].shape[1], out["c"].shape[0]
