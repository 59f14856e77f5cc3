"""Input generators and the reference."""
import pytest
import torch

import suite.inputs as inputs
from suite.inputs import apply_softcap, make_inputs
from suite.providers.naive import naive
from suite.reference import reference, rel_err


def test_same_seed_same_inputs_other_seed_other_inputs():
    a = make_inputs("lm", 64, 32, 300, "bf16", seed=1, softcap=30.0, bias=True, ignore_frac=0.2)
    b = make_inputs("lm", 64, 32, 300, "bf16", seed=1, softcap=30.0, bias=True, ignore_frac=0.2)
    c = make_inputs("lm", 64, 32, 300, "bf16", seed=2, softcap=30.0, bias=True, ignore_frac=0.2)
    for k in ("e", "c", "targets", "bias"):
        assert torch.equal(a[k], b[k]), k
    assert not torch.equal(a["e"], c["e"])


@pytest.mark.parametrize("dist", ["uniform", "lm"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_shapes_dtypes_and_options(dist, dtype):
    x = make_inputs(dist, 200, 16, 50, dtype, seed=0, bias=True, ignore_frac=0.5)
    assert x["e"].shape == (200, 16) and x["e"].dtype == dtype
    assert x["c"].shape == (50, 16) and x["c"].dtype == dtype
    assert x["bias"].shape == (50,) and x["bias"].dtype == dtype
    t = x["targets"]
    assert t.dtype == torch.int64 and t.shape == (200,)
    ignored = (t == -100).float().mean().item()
    assert 0.35 < ignored < 0.65  # binomial(200, 0.5): std 0.035
    kept = t[t != -100]
    assert kept.min() >= 0 and kept.max() < 50


def test_uniform_statistics():
    x = make_inputs("uniform", 4096, 64, 512, "fp32", seed=0)
    # E ~ N(0, 1/D): rows have norm ~1; C ~ N(0, 1).
    assert abs(x["e"].norm(dim=1).pow(2).mean().item() - 1.0) < 0.05
    assert abs(x["c"].std().item() - 1.0) < 0.02
    assert x["targets"].unique().numel() > 500  # 4096 uniform draws cover nearly all 512


# Calibration uses 1024 rows; per-row entropy has std ~1.5 nats, so over 2048 rows the
# achieved mean is within ~0.035 nats (one std) of the calibrated value. 0.15 nats is > 4 std.
ENTROPY_TOL = 0.15


@pytest.mark.parametrize("softcap,target", [(None, 2.2), (30.0, 2.2), (30.0, 1.6), (None, 3.0)])
def test_lm_reaches_target_entropy_and_loss(softcap, target):
    x = make_inputs("lm", 2048, 64, 1000, "bf16", seed=5, softcap=softcap, target_entropy=target)
    ref = reference(x["e"].double(), x["c"].double(), x["targets"], softcap=softcap)
    assert abs(ref["entropy"] - target) < ENTROPY_TOL
    # Targets are drawn from the softmax, so the expected loss is the entropy.
    assert abs(ref["mean_loss"] - ref["entropy"]) < 0.2
    if target == 2.2:
        assert 1.5 < ref["mean_loss"] < 3.0


def test_lm_looks_like_an_lm_head():
    x = make_inputs("lm", 2048, 64, 1000, "fp32", seed=0, softcap=30.0)
    e, c = x["e"], x["c"]
    # A large hidden component all rows share: the mean row carries most of each row's norm.
    cos = torch.nn.functional.cosine_similarity(e, e.mean(0, keepdim=True), dim=1)
    assert cos.mean() > 0.3
    # Zipfian targets: the 1% most frequent tokens take a large share of all targets.
    counts = torch.bincount(x["targets"], minlength=1000).sort(descending=True).values
    assert counts[:10].sum() / counts.sum() > 0.15
    # Peaked softmax: the top token often holds most of the mass.
    p = torch.softmax(apply_softcap(e @ c.T, 30.0), dim=1)
    assert p.max(1).values.median() > 0.4


def test_lm_target_sampling_does_not_depend_on_chunking(monkeypatch):
    whole = make_inputs("lm", 300, 32, 257, "fp32", seed=4)
    monkeypatch.setattr(inputs, "ROW_CHUNK_ELEMS", 257 * 7)  # 7 rows at a time
    chunked = make_inputs("lm", 300, 32, 257, "fp32", seed=4)
    assert torch.equal(whole["targets"], chunked["targets"])


def test_lm_unreachable_entropy_is_a_clear_error():
    with pytest.raises(ValueError, match="target_entropy"):
        make_inputs("lm", 64, 32, 20, "fp32", seed=0, target_entropy=5.0)  # log(20) < 5


@pytest.mark.parametrize("suffix", [".pt", ".safetensors"])
def test_file_round_trip(tmp_path, suffix):
    src = make_inputs("lm", 40, 16, 70, "fp32", seed=0, bias=True)
    path = tmp_path / f"capture{suffix}"
    data = {k: v for k, v in src.items()}
    if suffix == ".pt":
        torch.save(data, path)
    else:
        from safetensors.torch import save_file

        save_file(data, str(path))
    got = make_inputs("file", None, None, None, "fp32", seed=0, path=path, bias=True)
    for k in ("e", "c", "targets", "bias"):
        assert torch.equal(got[k], src[k]), k
    half = make_inputs("file", 40, 16, 70, "bf16", seed=0, path=path)
    assert half["e"].dtype == torch.bfloat16 and half["bias"] is None
    assert inputs.file_shape(path) == (40, 16, 70)


def test_file_errors_name_the_problem(tmp_path):
    good = {"e": torch.randn(8, 4), "c": torch.randn(10, 4), "targets": torch.zeros(8).long()}
    cases = {
        "missing key": ({k: v for k, v in good.items() if k != "c"}, "missing key"),
        "D mismatch": ({**good, "c": torch.randn(10, 5)}, "same D"),
        "float targets": ({**good, "targets": torch.zeros(8)}, "targets must be an integer"),
        "bias shape": ({**good, "bias": torch.zeros(3)}, "bias must have shape"),
    }
    for label, (data, msg) in cases.items():
        path = tmp_path / f"{label.replace(' ', '_')}.pt"
        torch.save(data, path)
        with pytest.raises(ValueError, match=msg):
            make_inputs("file", None, None, None, "fp32", seed=0, path=path)
    torch.save(good, tmp_path / "good.pt")
    with pytest.raises(ValueError, match="v=11 was asked for but the file has 10"):
        make_inputs("file", 8, 4, 11, "fp32", seed=0, path=tmp_path / "good.pt")
    with pytest.raises(ValueError, match="needs a path"):
        make_inputs("file", 8, 4, 10, "fp32", seed=0)
    with pytest.raises(ValueError, match="dist must be one of"):
        make_inputs("gaussian", 8, 4, 10, "fp32", seed=0)


@pytest.mark.parametrize("softcap,bias,ignore", [(None, False, 0.0), (30.0, True, 0.3)])
def test_reference_matches_fp64_autograd_and_chunking(monkeypatch, softcap, bias, ignore):
    x = make_inputs("lm", 90, 32, 130, "fp32", seed=7, softcap=softcap, bias=bias,
                    ignore_frac=ignore)
    e = x["e"].double().requires_grad_()
    c = x["c"].double().requires_grad_()
    b = None if x["bias"] is None else x["bias"].double().requires_grad_()
    logits = e @ c.T + (0 if b is None else b)
    logits = apply_softcap(logits, softcap)
    loss = torch.nn.functional.cross_entropy(logits, x["targets"])
    loss.backward()
    monkeypatch.setattr(inputs, "ROW_CHUNK_ELEMS", 130 * 16)  # 16 rows per chunk: 6 chunks
    ref = reference(e.detach(), c.detach(), x["targets"], bias=None if b is None else b.detach(),
                    softcap=softcap)
    assert abs(ref["loss"] - loss.item()) < 1e-12
    assert rel_err(e.grad, ref["de"]) < 1e-12
    assert rel_err(c.grad, ref["dc"]) < 1e-12
    if b is not None:
        assert rel_err(b.grad, ref["dbias"]) < 1e-12
    # And it is the naive provider's math (which rounds its logits to fp32).
    assert abs(naive(x["e"], x["c"], x["targets"], bias=x["bias"], softcap=softcap).item()
               - ref["loss"]) < 1e-5


def test_rel_err():
    ref = torch.ones(5, 3, dtype=torch.float64)
    assert rel_err(ref.float(), ref) == 0.0
    assert abs(rel_err(ref * 1.1, ref) - 0.1) < 1e-12
    assert rel_err(ref * float("nan"), ref) != rel_err(ref * float("nan"), ref)  # NaN
    assert rel_err(None, ref) != rel_err(None, ref)
