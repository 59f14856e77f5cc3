"""Per-token log-probabilities and entropy with their gradients (return_entropy, temperature,
token_logprobs), against an fp64 reference.

Tolerances: the same-dtype naive computation's error against fp64 (torch on materialised
logits: logits in the inputs' dtype, the softmax in fp32), times 2, plus a few units of the
dtype's rounding of the terms being summed (|p| |z|-sized for the values, |W| |C| and |W| |E|
for the gradients), and of the output dtype's resolution near 0: never a constant that merely
passed once. CCE_TEST_DEVICE=cuda runs the same tests with the compiled kernels, bf16 included.
"""
import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import own_kernel
from own_kernel import linear_cross_entropy, token_logprobs
from own_kernel.paths import entries as ops
from own_kernel.policy.config import HOPPER_16BIT, INTERPRETER, PORTABLE
from own_kernel.policy.route import Call, route

DEVICE = os.environ.get("CCE_TEST_DEVICE", "cpu")
ON_GPU = DEVICE == "cuda" and torch.cuda.is_available()
# The interpreter's bf16 arithmetic is wrong (the kernel refuses it on the CPU): fp16 there.
DTYPES = [torch.float32, torch.bfloat16] if ON_GPU else [torch.float32, torch.float16]
PATHS = {"recompute": {"workspace_mib": 0}, "low_memory": {"low_memory": True}}


# ---- the reference and the naive computation ----------------------------------------------------

def _head(e, c, bias, softcap, temperature):
    z = e @ c.T + (bias if bias is not None else 0)
    if softcap is not None:
        z = softcap * torch.tanh(z / softcap)
    return z / temperature


def _logp_entropy(z, t, ignore_index):
    """(log p(target), entropy) per row from logits z (fp32 or fp64 math), 0 where ignored."""
    used = t != ignore_index
    logp_all = torch.log_softmax(z, dim=-1)
    logp = logp_all.gather(1, torch.where(used, t, 0)[:, None])[:, 0]
    ent = -(logp_all.exp() * logp_all).sum(-1)
    return torch.where(used, logp, 0.0), torch.where(used, ent, 0.0)


def _run(e, c, bias, t, w_lp, w_h, how, opts):
    """(logp, H, [dE, dC, dbias]) of sum w_lp logp + w_H H: how = "ref" (fp64), "naive" (torch
    in the inputs' dtype, fp32 softmax) or a path of PATHS (the kernel)."""
    softcap, temp, ignore = opts["softcap"], opts["temperature"], opts["ignore_index"]
    cast = (lambda x: x.double()) if how == "ref" else (lambda x: x)
    leaves = [cast(x.detach()).requires_grad_() for x in (e, c, bias) if x is not None]
    b = leaves[2] if bias is not None else None
    if how in ("ref", "naive"):
        z = _head(leaves[0], leaves[1], b, softcap, temp)
        logp, ent = _logp_entropy(z if how == "ref" else z.float(), t, ignore)
    else:
        logp, ent = token_logprobs(leaves[0], leaves[1], t, bias=b, return_entropy=True,
                                   softcap=softcap, temperature=temp, ignore_index=ignore,
                                   **({"low_memory": True} if how == "low_memory" else {}))
    (logp.double() * w_lp + ent.double() * w_h).sum().backward()
    return logp.detach().double(), ent.detach().double(), [x.grad.double() for x in leaves]


def _row_bound(naive_err, floor):
    return 2 * naive_err + floor


def _check(e, c, bias, t, w_lp, w_h, path, opts):
    """Our values and per-row gradients within twice naive's error plus the rounding floor."""
    ref = _run(e, c, bias, t, w_lp, w_h, "ref", opts)
    naive = _run(e, c, bias, t, w_lp, w_h, "naive", opts)
    ours = _run(e, c, bias, t, w_lp, w_h, path, opts)
    eps = torch.finfo(e.dtype).eps
    tiny = torch.finfo(e.dtype).tiny * torch.finfo(e.dtype).eps  # the smallest subnormal
    e64, c64 = e.double(), c.double()
    z = _head(e64, c64, bias.double() if bias is not None else None, opts["softcap"],
              opts["temperature"])
    # each row's logit scale: its largest |z|, the softcap's (its tanh is exp-based: an
    # absolute error of an ulp of the cap / T), and 1 (the values' own size)
    cap = opts["softcap"] / opts["temperature"] if opts["softcap"] is not None else 0.0
    zmax = z.abs().max(dim=1).values + cap + 1
    # values: a few fp32 roundings of the row's logits (the softmax's own arithmetic is fp32)
    for i, name in ((0, "logp"), (1, "entropy")):
        err = (ours[i] - ref[i]).abs()
        bound = _row_bound((naive[i] - ref[i]).abs(), 8 * torch.finfo(torch.float32).eps * zmax)
        assert (err <= bound).all(), (name, path, (err - bound).max().item())
    # gradients, per row of dE and dC and per dbias entry: the logits' gradient G (fp64) sets
    # the size of the terms that are summed, each probability carrying its logit's rounding
    # (eps |z| relative: fp32 exponents of logits of that size; the softcap's tanh)
    g = _logits_grad(z, t, w_lp, w_h, opts) * zmax[:, None]
    floors = (g.abs() @ c64.abs(), g.abs().T @ e64.abs(), g.abs().sum(0))
    for name, mine, nv, r, fl in zip(("dE", "dC", "dbias"), ours[2], naive[2], ref[2], floors):
        err = (mine - r).abs().amax(dim=-1) if mine.dim() > 1 else (mine - r).abs()
        nerr = (nv - r).abs().amax(dim=-1) if nv.dim() > 1 else (nv - r).abs()
        fl = fl.amax(dim=-1) if fl.dim() > 1 else fl
        bound = _row_bound(nerr, 8 * eps * fl + tiny)
        assert (err <= bound).all(), (name, path, e.dtype, (err - bound).max().item())


def _logits_grad(z, t, w_lp, w_h, opts):
    """d(sum w_lp logp + w_H H)/dx in fp64, x the raw logits (softcap and temperature's
    derivatives included: what the kernel writes as W)."""
    x = z.detach().clone().requires_grad_()
    logp, ent = _logp_entropy(x, t, opts["ignore_index"])
    (logp * w_lp + ent * w_h).sum().backward()
    return x.grad


# ---- inputs -------------------------------------------------------------------------------------

def _inputs(seed, n, d, v, dtype, *, bias=False, ignore=0.0, confident=0.0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    e = torch.randn(n, d, generator=g) * scale
    c = torch.randn(v, d, generator=g) / d**0.5
    t = torch.randint(0, v, (n,), generator=g)
    if confident:  # the target's row of C leans towards the token's hidden state
        c.index_add_(0, t, confident * e / (e.norm(dim=1, keepdim=True) ** 2 + 1e-6) * d**0.5)
    b = torch.randn(v, generator=g) if bias else None
    t = torch.where(torch.rand(n, generator=g) < ignore, -100, t)
    to = (lambda x: x.to(dtype).to(DEVICE))
    return to(e), to(c), (to(b) if b is not None else None), t.to(DEVICE)


def _weights(seed, n, spread):
    """Per-token weights of magnitude 10^[-spread, spread] and random sign."""
    g = torch.Generator().manual_seed(seed + 1000)
    mag = 10.0 ** ((torch.rand(n, generator=g, dtype=torch.float64) * 2 - 1) * spread)
    sign = torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0).double()
    return (mag * sign).to(DEVICE)


def _opts(softcap=None, temperature=1.0, ignore_index=-100):
    return {"softcap": softcap, "temperature": temperature, "ignore_index": ignore_index}


# ---- accuracy -----------------------------------------------------------------------------------

@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_values_and_gradients_against_fp64(path, dtype):
    e, c, b, t = _inputs(0, 20, 32, 80, dtype, bias=True, ignore=0.2)
    _check(e, c, b, t, _weights(0, 20, 2.0), _weights(1, 20, 2.0), path,
           _opts(softcap=6.0, temperature=0.7))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_weights_spread_over_eight_decades(dtype):
    # fp16 keeps the same spread below its range's top (dC sums 10^4-weighted rows)
    e, c, b, t = _inputs(1, 16, 16, 48, dtype)
    top = 4.0 if dtype != torch.float16 else 2.0
    w_lp = _weights(2, 16, 4.0) * 10 ** (top - 4.0)
    w_h = _weights(3, 16, 4.0) * 10 ** (top - 4.0)
    _check(e, c, b, t, w_lp, w_h, "recompute", _opts())


def _confident_large_logits(seed, n=12, d=32, v=64):
    """Rows whose target has p ~ 1 - 1e-5 at logits ~ 1e3 (H ~ 1e-4, naive fp32's H is off by
    an ulp of 1e3 ~ 6e-5): logits exact in fp32 (multiples of 1/8 below 2^11), so the
    reference and the kernel see the same logits and only the entropy's arithmetic differs."""
    g = torch.Generator().manual_seed(seed)
    e = torch.randint(-2, 3, (n, d), generator=g).float() / 8
    c = torch.randint(-2, 3, (v, d), generator=g).float() / 8
    t = torch.randperm(v, generator=g)[:n]  # distinct: a target's boost is its row's alone
    bias = 1000.0 + torch.randint(-8, 9, (v,), generator=g).float() / 8
    # the target 16 above the others (dimension n + 1 is row n's own): p of each other
    # column ~ e^-16
    rows = torch.arange(n)
    e[:, 1:n + 1], c[:, 1:n + 1] = 0.0, 0.0
    e[rows, rows + 1] = 8.0
    c[t, rows + 1] = 2.0
    return e.to(DEVICE), c.to(DEVICE), bias.to(DEVICE), t.to(DEVICE)


@pytest.mark.parametrize("path", sorted(PATHS))
def test_confident_rows_entropy_keeps_its_relative_accuracy(path):
    # H = lse - sum p z of two values ~1e3 that agree to ~1e-4 is all rounding in fp32; the
    # kernel keeps H as ln S - t / S relative to the row's max (lse_combine.py).
    e, c, b, t = _confident_large_logits(3)
    z = e.double() @ c.double().T + b.double()
    ref_logp, ref_h = _logp_entropy(z, t, -100)
    assert (ref_h < 1e-3).all() and (ref_h > 0).all()
    z32 = e @ c.T + b  # exact: naive's error is its fp32 softmax's
    naive_h = -(torch.softmax(z32, -1) * (z32 - torch.logsumexp(z32, -1, keepdim=True))).sum(-1)
    naive_rel = ((naive_h.double() - ref_h).abs() / ref_h).max()
    leaves = [x.clone().requires_grad_() for x in (e, c, b)]
    logp, h = token_logprobs(leaves[0], leaves[1], t, bias=leaves[2], return_entropy=True,
                             **({"low_memory": True} if path == "low_memory" else {}))
    err = (h.double() - ref_h).abs()
    # ln S's rounding (S's fp32 ulp near 1: eps) and the terms' own (a few ulps of each
    # p (m - z), V of them, each <= H): nothing of the logits' magnitude (~1e3 eps)
    eps = torch.finfo(torch.float32).eps
    bound = 4 * eps + 4 * eps * z.shape[1] * ref_h
    assert (err <= bound).all(), (err.max().item(), naive_rel.item())
    # the regime where the formula matters: naive fp32 is off by much more than that
    assert ((naive_h.double() - ref_h).abs() > 10 * bound).any()
    assert (logp <= 0).all()
    # the gradient of H alone on these rows: -p (z - mu), its entries ~ e^-16, each to a few
    # ulps relative to the row's gradient (fp32 GEMMs of exact inputs)
    h.sum().backward()
    zr = z.clone().requires_grad_()
    _logp_entropy(zr, t, -100)[1].sum().backward()
    # each probability to a few ulps of its exponent z - lse (~16 here), as in naive fp32
    g = zr.grad.abs() * (1 - torch.log_softmax(z, -1))
    for grad, ref, floor in ((leaves[0].grad, zr.grad @ c.double(), g @ c.double().abs()),
                             (leaves[1].grad, zr.grad.T @ e.double(), g.T @ e.double().abs())):
        assert ((grad.double() - ref).abs().amax(1) <= 8 * eps * floor.amax(1)).all()


# ---- properties over options --------------------------------------------------------------------

@st.composite
def _cases(draw):
    return dict(
        n=draw(st.integers(1, 24)), d=draw(st.sampled_from([8, 16, 32])),
        v=draw(st.integers(2, 96)), dtype=draw(st.sampled_from(DTYPES)),
        softcap=draw(st.sampled_from([None, 4.0, 30.0])), bias=draw(st.booleans()),
        temperature=draw(st.sampled_from([1.0, 0.5, 1.7])),
        ignore=draw(st.sampled_from([0.0, 0.3, 1.0])), spread=draw(st.sampled_from([0.0, 2.0])),
        seed=draw(st.integers(0, 2**16)))


@pytest.mark.parametrize("path", sorted(PATHS))  # one test per path: xdist spreads them
@settings(max_examples=13, derandomize=True, deadline=None)
@given(_cases())
def test_property_values_and_gradients(path, case):
    e, c, b, t = _inputs(case["seed"], case["n"], case["d"], case["v"], case["dtype"],
                         bias=case["bias"], ignore=case["ignore"])
    n = case["n"]
    w_lp, w_h = _weights(case["seed"], n, case["spread"]), _weights(case["seed"] + 7, n, 2.0)
    _check(e, c, b, t, w_lp, w_h, path,
           _opts(softcap=case["softcap"], temperature=case["temperature"]))


@settings(max_examples=10, derandomize=True, deadline=None)
@given(shift=st.integers(0, 3), layout=st.sampled_from(["contiguous", "c_transposed",
                                                         "e_sliced"]),
       seed=st.integers(0, 2**16))
def test_property_shift_and_layouts_match_the_plain_call(shift, layout, seed):
    # (B, T, D) with shift: position i predicts targets[:, i + shift]; any view of e and c
    g = torch.Generator().manual_seed(seed)
    e = torch.randn(2, 6, 40 if layout == "e_sliced" else 16, generator=g).to(DEVICE)
    e = e[..., 3:19] if layout == "e_sliced" else e
    c = torch.randn(16, 37, generator=g).to(DEVICE).T if layout == "c_transposed" else \
        torch.randn(37, 16, generator=g).to(DEVICE)
    t = torch.randint(0, 37, (2, 6), generator=g).to(DEVICE)
    t[0, -1] = -100
    logp, h = token_logprobs(e, c, t, return_entropy=True, shift=shift, temperature=1.3)
    assert logp.shape == h.shape == (2, 6 - shift)
    tt = t[:, shift:]
    z = (e[:, :6 - shift].double() @ c.double().T) / 1.3
    ref_logp, ref_h = _logp_entropy(z.reshape(-1, 37), tt.reshape(-1), -100)
    tol = 8 * torch.finfo(torch.float32).eps * (z.abs().max() + 1)
    assert (logp.double().reshape(-1) - ref_logp).abs().max() <= tol
    assert (h.double().reshape(-1) - ref_h).abs().max() <= tol


# ---- the API -----------------------------------------------------------------------------------

def test_one_backward_for_logprob_and_entropy(monkeypatch):
    # w logp + beta H reaches the kernel's backward as one pass (rows_backward once, with
    # both weights), not one pass per output
    calls = []
    real = ops.rows_backward

    def counting(*args, **kwargs):
        calls.append(kwargs.get("grad_ent") is not None)
        return real(*args, **kwargs)

    monkeypatch.setattr(ops, "rows_backward", counting)
    e, c, _, t = _inputs(4, 10, 16, 30, torch.float32)
    e.requires_grad_()
    logp, h = token_logprobs(e, c, t, return_entropy=True)
    (torch.randn(10, device=DEVICE) * logp + 0.1 * h).sum().backward()
    assert calls == [True]


def test_return_types_and_reductions():
    e, c, _, t = _inputs(5, 12, 16, 30, torch.float32, ignore=0.25)
    t[0] = 3  # at least one used row
    none = linear_cross_entropy(e, c, t, reduction="none", return_entropy=True)
    assert isinstance(none, own_kernel.LossEntropy) and none.entropy.shape == t.shape
    used = t != -100
    assert (none.entropy[~used] == 0).all() and (none.entropy[used] > 0).all()
    mean = linear_cross_entropy(e, c, t, return_entropy=True)
    assert torch.allclose(mean.entropy, none.entropy.sum() / used.sum())
    assert torch.allclose(mean.loss, none.loss.sum() / used.sum())
    total = linear_cross_entropy(e, c, t, reduction="sum", return_entropy=True)
    assert torch.allclose(total.entropy, none.entropy.sum())
    both = linear_cross_entropy(e, c, t, reduction="none", return_entropy=True,
                                return_lse=True)
    assert isinstance(both, own_kernel.LossEntropyLse)
    z = e.double() @ c.double().T
    assert torch.allclose(both.lse[used].double(), torch.logsumexp(z, -1)[used])
    logp = token_logprobs(e, c, t)
    assert torch.equal(logp, -none.loss) and (logp <= 0).all()


def test_logprob_is_never_positive_on_confident_rows():
    e, c, b, t = _confident_large_logits(6)
    logp = token_logprobs(e, c, t, bias=b)
    assert (logp <= 0).all()


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf"), True, "1"])
def test_temperature_is_validated(bad):
    e, c, _, t = _inputs(7, 4, 8, 10, torch.float32)
    with pytest.raises(ValueError, match="temperature"):
        linear_cross_entropy(e, c, t, temperature=bad)


def test_entropy_refuses_the_filter_by_name():
    e, c, _, t = _inputs(8, 4, 8, 10, torch.float32)
    with pytest.raises(ValueError, match="filter_eps"):
        linear_cross_entropy(e, c, t, return_entropy=True, filter_eps="auto")
    with pytest.raises(TypeError, match="return_entropy"):
        linear_cross_entropy(e, c, t, return_entropy=1)


def test_the_route_keeps_entropy_and_temperature_off_the_three_matmul_path():
    # at a real shape whose plain mean takes the three-matmul path, on every target's config
    base = dict(n=4096, v=32000, d=1024, dtype=torch.bfloat16, workspace_mib=4096)
    assert route(Call(**base), INTERPRETER).path == "three-matmul"
    for cfg in (INTERPRETER, HOPPER_16BIT, PORTABLE):
        for flag in ("entropy", "temperature"):
            r = route(Call(**base, **{flag: True}), cfg)
            assert r.path == "recompute" and flag in r.note, (cfg.name, r)
    e, c, _, t = _inputs(9, 8, 16, 30, torch.float32)
    e.requires_grad_()
    plan = own_kernel.plan(e, c, t, return_entropy=True, workspace_mib=64)
    assert plan.path == "recompute" and "return_entropy" in plan.note


def test_no_grad_gives_the_same_values():
    e, c, b, t = _inputs(10, 9, 16, 30, torch.float32, bias=True, ignore=0.3)
    with torch.no_grad():
        logp, h = token_logprobs(e, c, t, bias=b, return_entropy=True, softcap=5.0)
    e.requires_grad_()
    logp2, h2 = token_logprobs(e, c, t, bias=b, return_entropy=True, softcap=5.0)
    # (a call with gradients may differ in the last bit: the interpreter's GEMM)
    for x, y in ((logp, logp2), (h, h2)):
        assert (x - y.detach()).abs().max() <= 4 * torch.finfo(torch.float32).eps * y.abs().max()


def test_works_inside_torch_compile():
    # the custom ops carry the entropy and its gradient (aot_eager: no code generation)
    e, c, _, t = _inputs(11, 10, 16, 30, torch.float32, ignore=0.2)
    w = torch.randn(10, device=DEVICE)

    def step(e, c):
        logp, h = token_logprobs(e, c, t, return_entropy=True, temperature=0.8)
        return (w * logp).sum() + 0.3 * h.sum()

    e1, c1 = e.clone().requires_grad_(), c.clone().requires_grad_()
    step(e1, c1).backward()
    e2, c2 = e.clone().requires_grad_(), c.clone().requires_grad_()
    out = torch.compile(step, backend="aot_eager", fullgraph=True)(e2, c2)
    out.backward()
    # the same kernels either way (to the last bits of the interpreter's GEMMs)
    for x, y in ((e2.grad, e1.grad), (c2.grad, c1.grad)):
        assert (x - y).abs().max() <= 16 * torch.finfo(torch.float32).eps * y.abs().max()


# ---- Hugging Face models (own_kernel.transformers.token_logprobs) ------------------------------

HF_TINY = dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, head_dim=8,
               max_position_embeddings=64, bos_token_id=1, eos_token_id=2, pad_token_id=0,
               initializer_range=0.3)  # logits of order 1-10 (tests/test_hf.py)
HF_ARCHS = {"llama": ("LlamaConfig", "LlamaForCausalLM", {}),
            "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", {"final_logit_softcapping": 2.0})}


def _grpo_loss(logp, old_logp, adv, entropy, mask, beta=0.01):
    """A GRPO-style objective over the completion tokens (mask)."""
    ratio = (logp - old_logp).exp()
    return -(adv * ratio * mask).sum() / mask.sum() - beta * (entropy * mask).sum() / mask.sum()


def _hf_logprobs_from_logits(model, input_ids, labels, attention_mask, temperature):
    """The trainers' way: the model's logits (its own transform), / T, log_softmax."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits / temperature
    logp_all = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    used = labels[:, 1:] != -100
    logp = logp_all.gather(-1, torch.where(used, labels[:, 1:], 0)[..., None])[..., 0]
    ent = -(logp_all.exp() * logp_all).sum(-1)
    pad = torch.nn.functional.pad
    return pad(torch.where(used, logp, 0.0), (1, 0)), pad(torch.where(used, ent, 0.0), (1, 0))


@pytest.mark.parametrize("arch", sorted(HF_ARCHS))
def test_hf_token_logprobs_match_the_models_logits(arch):
    transformers = pytest.importorskip("transformers", minversion="5",
                                       reason="own_kernel.transformers needs transformers >= 5")
    from own_kernel.transformers import token_logprobs as hf_token_logprobs
    config_name, model_name, specific = HF_ARCHS[arch]
    torch.manual_seed(0)
    config = getattr(transformers, config_name)(**{**HF_TINY, **specific})
    model = getattr(transformers, model_name)(config).float().train().to(DEVICE)
    g = torch.Generator().manual_seed(1)
    input_ids = torch.randint(3, 96, (2, 10), generator=g).to(DEVICE)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, -2:] = 0
    labels = input_ids.clone()
    labels[:, :4] = -100  # the prompt
    labels[1, -2:] = -100  # padding
    mask = (labels != -100).float()
    adv = torch.randn(2, 10, generator=g).to(DEVICE)
    old_logp = -torch.rand(2, 10, generator=g).to(DEVICE)
    temperature = 0.8

    def objective_and_grads(net, compute):
        net.zero_grad(set_to_none=True)
        logp, ent = compute(net)
        loss = _grpo_loss(logp.double(), old_logp.double(), adv.double(), ent.double(),
                          mask.double())
        loss.backward()
        return logp.detach().double(), ent.detach().double(), {
            name: p.grad.double() for name, p in net.named_parameters() if p.grad is not None}

    ours = objective_and_grads(model, lambda m: hf_token_logprobs(
        m, input_ids, labels, attention_mask, return_entropy=True, temperature=temperature))
    naive = objective_and_grads(model, lambda m: _hf_logprobs_from_logits(
        m, input_ids, labels, attention_mask, temperature))
    ref = objective_and_grads(model.double(), lambda m: _hf_logprobs_from_logits(
        m, input_ids, labels, attention_mask, temperature))
    assert ours[0].shape == labels.shape and (ours[0] <= 0).all()
    assert (ours[0][labels == -100] == 0).all() and (ours[1][labels == -100] == 0).all()
    eps = torch.finfo(torch.float32).eps
    for i in (0, 1):  # values: within twice naive fp32's error, plus a few ulps of the values
        err, nerr = (ours[i] - ref[i]).abs(), (naive[i] - ref[i]).abs()
        assert (err <= 2 * nerr + 8 * eps * (ref[i].abs() + 1)).all(), i
    assert ours[2].keys() == ref[2].keys()
    for name, r in ref[2].items():  # gradients: per parameter, as naive fp32, plus its rounding
        err, nerr = (ours[2][name] - r).abs().max(), (naive[2][name] - r).abs().max()
        assert err <= 2 * nerr + 8 * eps * r.abs().max(), (name, err.item(), nerr.item())


# ---- the GPU measuring tool's CPU-checkable part ------------------------------------------------

def _run_rl_tool(tmp_path, *extra):
    """The rl tool at a tiny shape on DEVICE; its rows by method."""
    import argparse
    import csv

    from suite.kernel import rl

    ap = argparse.ArgumentParser()
    rl.add_arguments(ap)
    args = ap.parse_args(["--out", str(tmp_path), "--device", DEVICE, "--models", "llama3-8b",
                          "--n", "12", "--d", "16", "--v", "48", "--check-rows", "6",
                          "--no-compiled", *extra])
    assert rl.main(args) == 0
    rows = list(csv.DictReader(open(tmp_path / "rl.csv")))
    return {r["method"]: r for r in rows}, [r["method"] for r in rows]


def _liger_installed():
    import importlib.util

    return importlib.util.find_spec("liger_kernel") is not None


def test_the_rl_tool_writes_every_method_and_its_errors(tmp_path):
    from suite.kernel import rl

    by, order = _run_rl_tool(tmp_path, "--reps", "1")
    assert order == ["own_loss_grad", "own_logp_entropy", "own_invariant", "naive",
                     "liger_flce_logp",
                     "liger_scaled_ce", "verl_lce", "liger_scaled_ce_tp", "liger_grpo"]
    own_rows = ("own_loss_grad", "own_logp_entropy", "own_invariant", "naive")
    assert all(by[m]["status"] == "ok" for m in own_rows)
    # fp32 on the CPU (bf16 on CUDA): within twice naive same-dtype's error of fp64, plus a
    # few fp32 roundings of the logits' size
    dtype = torch.bfloat16 if DEVICE == "cuda" else torch.float32
    e, c, _, _, _ = rl.make_call_inputs(12, 16, 48, dtype, DEVICE)
    floor = 8 * torch.finfo(torch.float32).eps * (float((e.float() @ c.float().T).abs().max()) + 1)
    for col in ("logp_max_abs_err", "entropy_max_abs_err"):
        assert float(by["own_logp_entropy"][col]) <= 2 * float(by["naive"][col]) + floor, col
    assert (tmp_path / "env.json").exists()


def test_the_rl_tool_records_the_p20_p80_range_of_each_method(tmp_path):
    import argparse

    from suite.kernel import rl

    ap = argparse.ArgumentParser()
    rl.add_arguments(ap)
    assert ap.parse_args(["--out", "x"]).reps == 7  # enough calls for p20 and p80 to differ
    by, _ = _run_rl_tool(tmp_path, "--reps", "3", "--methods", "own_loss_grad,naive")
    for method, row in by.items():
        assert row["status"] == "ok" and row["reps"] == "3", method
        p20, med, p80, fastest = (float(row[k]) for k in ("ms_p20", "ms_median", "ms_p80",
                                                          "ms_min"))
        assert 0 < fastest <= p20 <= med <= p80, (method, row)


def test_the_rl_tool_liger_rows_say_what_they_measure(tmp_path):
    # Liger's fused linear CE is Triton: it runs on CUDA and, under TRITON_INTERPRET=1, on the
    # CPU; its GRPO head is torch. Neither exposes an entropy, and the GRPO head no logp either.
    by, _ = _run_rl_tool(tmp_path, "--reps", "1", "--methods", "naive,liger_flce_logp,liger_grpo")
    if not _liger_installed():
        for m in ("liger_flce_logp", "liger_grpo"):
            assert by[m]["status"] == "not installed" and "pip install" in by[m]["note"]
        return
    flce, grpo = by["liger_flce_logp"], by["liger_grpo"]
    assert flce["status"] == "ok" and grpo["status"] == "ok", (flce["note"], grpo["note"])
    assert float(flce["logp_max_abs_err"]) <= 2 * float(by["naive"]["logp_max_abs_err"]) + 1e-4
    assert flce["entropy_max_abs_err"] == "nan" and "no entropy" in flce["note"]
    assert grpo["logp_max_abs_err"] == "nan" and grpo["entropy_max_abs_err"] == "nan"
    assert "GRPO" in grpo["note"] and float(grpo["ms_median"]) > 0


@pytest.mark.skipif(DEVICE != "cpu", reason="the CPU's reason: Triton needs the interpreter")
def test_the_rl_tool_liger_flce_row_says_why_it_cannot_run_on_the_cpu(tmp_path, monkeypatch):
    if not _liger_installed():
        pytest.skip("liger-kernel is not installed (the row's status then says so)")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    by, _ = _run_rl_tool(tmp_path, "--reps", "1", "--methods", "liger_flce_logp,liger_grpo")
    row = by["liger_flce_logp"]
    assert row["status"] == "unsupported" and "TRITON_INTERPRET=1" in row["note"]
    assert row["ms_median"] == "nan" and row["logp_max_abs_err"] == "nan"
    assert by["liger_grpo"]["status"] == "ok"  # torch only: no Triton kernel


def test_the_rl_tool_liger_rows_say_when_liger_is_missing(tmp_path, monkeypatch):
    from suite.kernel import rl

    monkeypatch.setattr(rl, "LIGER_MODULE", "liger_kernel_not_here")
    by, order = _run_rl_tool(tmp_path, "--reps", "1", "--methods", "liger_flce_logp,liger_grpo")
    assert order == ["liger_flce_logp", "liger_grpo"]
    for row in by.values():
        assert row["status"] == "not installed" and "pip install liger-kernel" in row["note"]
        assert row["ms_p20"] == "nan" and row["ms_p80"] == "nan"


def test_grpo_extras_split_the_tokens_into_whole_sequences():
    from suite.kernel import rl

    e, c, t, _, _ = rl.make_call_inputs(12, 16, 48, torch.float32, DEVICE)
    batch, seq_len, advantages, ref = rl.grpo_extras(e, c, t)
    assert (batch, seq_len) == (3, 4) and advantages.shape == (3,) and ref.shape == (3, 4)
    logp = torch.log_softmax(e.double() @ c.double().T, -1).gather(1, t[:, None]).squeeze(1)
    assert (ref.flatten().double() - logp).abs().max() < 0.1  # near the policy: small KL
    again = rl.grpo_extras(e, c, t)
    assert torch.equal(again[2], advantages) and torch.equal(again[3], ref)  # seeded


def test_the_custom_ops_schema_fake_and_autograd_with_the_entropy():
    # what torch.compile relies on: the sixth output (the entropy) and its gradient's inputs
    from own_kernel.paths.entries import lce_rows, lce_rows_backward
    from own_kernel.policy.options import Options

    e, c, _, t = _inputs(12, 9, 16, 23, torch.float32, ignore=0.2)
    e.requires_grad_()
    options = Options(temperature=0.9, entropy=True).op_args()
    torch.library.opcheck(lce_rows, (e, c, t, None, *options),
                          test_utils=("test_schema", "test_faketensor",
                                      "test_autograd_registration"))
    loss, lse, p_max, nll, lse_lo, ent = lce_rows(e, c, t, None, *options)
    assert ent.shape == (9,) and (ent[t == -100] == 0).all()
    assert lce_rows(e, c, t, None, *Options().op_args())[5].numel() == 0  # not asked for
    torch.library.opcheck(lce_rows_backward,
                          (e.detach(), c, t, None, lse, nll, p_max, lse_lo, torch.ones(9, device=DEVICE), None,
                           *options),
                          {"ent": ent.detach(), "grad_ent": torch.ones(9, device=DEVICE)},
                          test_utils=("test_schema", "test_faketensor"))
