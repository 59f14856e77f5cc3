"""The 2026 peers: Liger's scaled CE and CuTe backend, its tensor-parallel variant, verl's kernel;
what the rows record of them (the ``ran`` column, ``unsupported`` inputs), the RL tool's new
methods and gradient errors, and the tables made from a peer run folder. On the CPU the peers'
GPU kernels cannot run: stand-ins with the peers' interfaces (and verl's assertions) do."""
import csv
import importlib.util
import json
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from suite import catalog, registry
from suite.measure import measure_provider
from suite.providers import liger, liger_scaled, liger_tp, verl
from suite.providers.naive import naive
from suite.results import ResultsWriter, read_rows
from suite.schema import ROW_FIELD_DEFAULTS, ROW_FIELDS

ROOT = Path(__file__).resolve().parent.parent
LIGER = importlib.util.find_spec("liger_kernel") is not None


def _inputs(n=8, d=16, v=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, d, generator=g), torch.randn(v, d, generator=g),
            torch.randint(0, v, (n,), generator=g))


# ---- liger_flce_cute: the CuTe kernel's launches are counted --------------------------------

@pytest.fixture
def fake_cute_ce(monkeypatch):
    """A stand-in for Liger's CuTe cross-entropy module, and _flce calling it like Liger's CuTe
    per-chunk primitive does (importing the launch from the module at each call)."""
    module = types.ModuleType(liger.CUTE_CE_MODULE)
    module._launch_ce_fwd = lambda: None
    monkeypatch.setitem(sys.modules, liger.CUTE_CE_MODULE, module)
    launches_per_call = {"n": 3}

    def flce(e, c, targets, bias, softcap, ignore_index, impl):
        assert impl == liger.CUTE_IMPL
        for _ in range(launches_per_call["n"]):
            from liger_kernel.ops.cutedsl.ops.cross_entropy import _launch_ce_fwd
            _launch_ce_fwd()
        return naive(e, c, targets)

    monkeypatch.setattr(liger, "_flce", flce)
    return launches_per_call


def test_liger_flce_cute_counts_the_cute_launches_and_reports_them(fake_cute_ce):
    e, c, t = _inputs()
    loss = liger.liger_flce_cute(e, c, t)
    assert torch.isfinite(loss)
    ran = catalog.get("liger_flce_cute").ran()
    assert "3 launches per call" in ran and liger.CUTE_CE_MODULE in ran
    # the launch is the module's own again once the call is over
    assert sys.modules[liger.CUTE_CE_MODULE]._launch_ce_fwd.__name__ == "<lambda>"


def test_liger_flce_cute_without_a_cute_launch_is_an_error(fake_cute_ce):
    # e.g. a Triton kernel run under the CuTe name: no row may time it as CuTe's
    fake_cute_ce["n"] = 0
    e, c, t = _inputs()
    with pytest.raises(RuntimeError, match="launched no CuTe-DSL cross-entropy kernel"):
        liger.liger_flce_cute(e, c, t)


# ---- liger_scaled_ce -------------------------------------------------------------------------

@pytest.mark.skipif(not LIGER, reason="liger-kernel is not installed")
def test_liger_scaled_ce_reports_the_autograd_function_that_ran():
    # on the CPU Liger dispatches to its PyTorch fallback; the row says so, never "SM90"
    e, c, t = _inputs()
    e.requires_grad_()
    liger_scaled.liger_scaled_ce(e, c, t).backward()
    ran = catalog.get("liger_scaled_ce").ran()
    assert ran.startswith(liger_scaled.FALLBACK_FUNCTION) and "PyTorch" in ran
    with torch.no_grad():  # no autograd graph: Liger's dispatch says which function
        liger_scaled.liger_scaled_ce(e, c, t)
    assert catalog.get("liger_scaled_ce").ran().startswith(liger_scaled.FALLBACK_FUNCTION)


@pytest.mark.skipif(not LIGER, reason="liger-kernel is not installed")
def test_liger_scaled_ce_log_probs_and_entropy_match_fp64():
    e, c, t = _inputs()
    logp, entropy = liger_scaled.logp_entropy(e, c, t)
    ref = torch.log_softmax(e.double() @ c.double().T, -1)
    assert torch.allclose(logp.double(), ref.gather(1, t[:, None]).squeeze(1), atol=1e-5)
    assert torch.allclose(entropy.double(), -(ref.exp() * ref).sum(-1), atol=1e-5)


def test_the_tensor_parallel_variant_says_why_it_cannot_run_here():
    p = catalog.get("liger_scaled_ce_tp")
    for device in ("cpu", "cuda"):
        reason = p.unavailable_reason(device)
        assert "one process per GPU" in reason and "NVSHMEM" in reason
    with pytest.raises(RuntimeError, match="one process per GPU"):
        liger_tp.liger_scaled_ce_tp(*_inputs())


def test_the_tensor_parallel_variant_refuses_what_its_function_does_not_take():
    from suite.cells import Cell

    ok = Cell("lm", 64, 32, 96, "bf16")
    assert liger_tp.sharded_unsupported("liger_scaled_ce_tp", ok, 2) is None
    assert "bias" in liger_tp.sharded_unsupported(
        "liger_scaled_ce_tp", Cell("lm", 64, 32, 96, "bf16", bias=True), 2)
    assert "softcap" in liger_tp.sharded_unsupported(
        "liger_scaled_ce_tp", Cell("lm", 64, 32, 96, "bf16", softcap=30.0), 2)
    uneven = liger_tp.sharded_unsupported("liger_scaled_ce_tp", Cell("lm", 64, 32, 97, "bf16"), 2)
    assert "equal vocabulary shards" in uneven and "V 97" in uneven
    fp32 = Cell("lm", 64, 32, 96, "fp32")
    assert "bf16 only" in liger_tp.sharded_unsupported("liger_scaled_ce_tp", fp32, 2)
    assert liger_tp.sharded_unsupported("liger_scaled_ce_tp_torch", fp32, 2) is None


def test_lck_is_configured_once_per_process_at_the_largest_cell(monkeypatch):
    """configure() is collective and its capacity cannot grow: the first call takes the largest
    cell (hidden padded to 8), smaller ones reuse it, a larger one is an error naming both."""
    from suite.cells import Cell

    calls = []
    fake = types.SimpleNamespace(
        FusedLinearCrossEntropyConfig=lambda **kw: kw,
        configure=lambda device, flsce: calls.append(flsce))
    monkeypatch.setitem(sys.modules, "liger_cute_kernels", fake)
    monkeypatch.setattr(liger_tp, "_LCK", {})
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (2**30, 2**31))
    cells = [Cell("lm", 64, 30, 96, "bf16"), Cell("lm", 128, 16, 64, "bf16")]
    liger_tp._configure(cells, 2, "cuda")
    assert calls == [dict(max_tokens=128, hidden_size=32, local_vocab_size=48)]
    liger_tp._configure(cells[:1], 2, "cuda")
    assert len(calls) == 1
    with pytest.raises(RuntimeError, match=r"configured for \(128, 32, 48\)"):
        liger_tp._configure([Cell("lm", 256, 16, 64, "bf16")], 2, "cuda")


# ---- verl: loaded without its package __init__, given contiguous gradients ------------------

class _VerlLike(torch.autograd.Function):
    """verl's linear_cross_entropy's interface and its backward's assertion, in torch."""

    @staticmethod
    def forward(ctx, hidden, weight, labels, temperature=1.0, reduction="none"):
        logp_all = torch.log_softmax(hidden @ weight.T / temperature, -1)
        ctx.save_for_backward(hidden, weight, labels)
        ctx.temperature = temperature
        return (logp_all.gather(1, labels[:, None]).squeeze(1),
                -(logp_all.exp() * logp_all).sum(-1))

    @staticmethod
    def backward(ctx, dlogprobs, dentropy):
        assert dlogprobs.is_contiguous() and dentropy.is_contiguous()
        hidden, weight, labels = ctx.saved_tensors
        with torch.enable_grad():
            h, w = hidden.detach().requires_grad_(), weight.detach().requires_grad_()
            logp_all = torch.log_softmax(h @ w.T / ctx.temperature, -1)
            logp = logp_all.gather(1, labels[:, None]).squeeze(1)
            ent = -(logp_all.exp() * logp_all).sum(-1)
            dh, dw = torch.autograd.grad((logp * dlogprobs).sum() + (ent * dentropy).sum(),
                                         (h, w))
        return dh, dw, None, None, None


@pytest.fixture
def verl_like(monkeypatch):
    module = types.SimpleNamespace(linear_cross_entropy=_VerlLike.apply)
    monkeypatch.setattr(verl, "load_kernel", lambda: module)


def test_verl_needs_contiguous_upstream_gradients_and_the_provider_gives_them(verl_like):
    out = verl.probe_expanded_grads(n=8, d=128, v=32, device="cpu")
    for objective in ("entropy.sum()", "logp.sum()"):
        assert out[f"{objective}, bare"].startswith("AssertionError at")
        assert "is_contiguous()" in out[f"{objective}, bare"]
        assert out[f"{objective}, suite provider"] == "ok"


def test_contiguous_grads_hands_verl_a_sum_s_gradient_contiguous():
    e, c, t = _inputs(d=128)
    ee = e.clone().requires_grad_()
    _, entropy = _VerlLike.apply(ee, c, t)
    with pytest.raises(AssertionError):
        entropy.sum().backward()  # a sum's gradient is expanded (stride 0)
    ee = e.clone().requires_grad_()
    _, entropy = verl.ContiguousGrads.apply(*_VerlLike.apply(ee, c, t))
    entropy.sum().backward()
    assert ee.grad is not None and torch.isfinite(ee.grad).all()


def test_verl_provider_masks_ignored_targets_and_matches_naive(verl_like):
    e, c, t = _inputs(n=10, d=128, v=40)
    t[::3] = -100
    ee, cc = e.clone().requires_grad_(), c.clone().requires_grad_()
    verl.verl_lce(ee, cc, t).backward()
    e2, c2 = e.clone().requires_grad_(), c.clone().requires_grad_()
    naive(e2, c2, t).backward()
    assert torch.allclose(ee.grad, e2.grad, atol=1e-6) and torch.allclose(cc.grad, c2.grad,
                                                                          atol=1e-6)
    logp, entropy = verl.logp_entropy(e, c, t)
    assert (logp[::3] == 0).all() and (entropy[::3] == 0).all()


def test_verl_rejects_what_its_kernel_asserts_against_as_unsupported(verl_like, temp_providers):
    e, c, t = _inputs(d=96)
    with pytest.raises(registry.UnsupportedInput, match="% 128"):
        verl.verl_lce(e, c, t)
    # in a bench row: status unsupported with that reason, not an error
    p = catalog.get(temp_providers("fake_verl", verl.verl_lce, features=()))
    rows = measure_provider(p, {"e": e, "c": c, "targets": t, "bias": None},
                            {"loss": 1.0, "de": None, "dc": None, "dbias": None},
                            phases=["loss+grad"], softcap=None, ignore_index=-100, reps=1,
                            warmup=0, floor_ms=None, n=8, v=24, d=96)
    assert rows[0]["status"] == "unsupported" and "% 128" in rows[0]["error"]


def test_verl_kernel_loads_without_running_verls_package_inits(tmp_path, monkeypatch):
    root = tmp_path / "verl"
    for folder, init in ((root, "raise ImportError('ray and hydra')"),
                         (root / "utils", "raise ImportError('transformers')"),
                         (root / "utils" / "kernel", "raise ImportError('kernel init')")):
        folder.mkdir(parents=True)
        (folder / "__init__.py").write_text(init + "\n")
    (root / "utils" / "device.py").write_text("NAME = 'device'\n")
    (root / "utils" / "kernel" / "kernels.py").write_text(
        "from verl.utils.device import NAME\n")
    (root / "utils" / "kernel" / "linear_cross_entropy.py").write_text(
        "def linear_cross_entropy(*args):\n    from . import kernels\n    return kernels.NAME\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [k for k in sys.modules if k == "verl" or k.startswith("verl.")]:
        monkeypatch.delitem(sys.modules, name)
    try:
        module = verl.load_kernel()
        assert module.linear_cross_entropy() == "device"  # its lazy sibling import works too
        assert Path(module.__file__).parent == root / "utils" / "kernel"
    finally:
        for name in [k for k in sys.modules if k == "verl" or k.startswith("verl.")]:
            del sys.modules[name]


# ---- the ran column and older results ---------------------------------------------------------

def test_the_ran_column_records_what_a_provider_reports(tmp_path, temp_providers):
    from suite import runner

    temp_providers("fake_reports", naive, ran=lambda: "kernel X, 2 launches")
    cell = runner.Cell("lm", 16, 8, 37, "fp32")
    runner.run([cell], ["fake_reports", "naive"], ["loss+grad"], tmp_path, reps=1, warmup=0,
               device="cpu", quiet=True)
    by = {r["provider"]: r for r in read_rows(tmp_path)}
    assert by["fake_reports"]["ran"] == "kernel X, 2 launches"
    assert by["naive"]["ran"] == ""


def test_a_results_csv_from_before_the_ran_column_stays_resumable(tmp_path):
    from suite import runner

    before = [k for k in ROW_FIELDS if k != "ran"]  # has world_size, lacks ran
    cell = runner.Cell("uniform", 16, 8, 37, "fp32")
    with open(tmp_path / "results.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=before)
        w.writeheader()
        w.writerow({**dict.fromkeys(before, ""), **cell.fields(), "provider": "own",
                    "phase": "fwd", "status": "ok", "timestamp": "t", "world_size": "1"})
    assert [r["ran"] for r in read_rows(tmp_path)] == [ROW_FIELD_DEFAULTS["ran"]]
    writer = ResultsWriter(tmp_path, {}, "later")
    writer.write([{**cell.fields(), "provider": "own", "phase": "loss", "status": "ok",
                   "timestamp": "t"}])
    with pytest.raises(ValueError, match="before the ran column"):
        writer.write([{**cell.fields(), "provider": "own", "phase": "grad", "status": "ok",
                       "timestamp": "t", "ran": "something"}])


# ---- the RL tool: the peers' methods and gradient errors --------------------------------------

def test_reference_grads_are_the_gradients_of_both_objectives():
    from suite.kernel import rl

    e, c, t = _inputs(n=9, d=6, v=11)
    g = torch.Generator().manual_seed(5)
    w, beta = torch.randn(9, generator=g), torch.randn(9, generator=g)
    ref = rl.reference_grads(e, c, t, w, beta, rows_per_chunk=4)  # chunks with a ragged end
    for key, with_h in (("logp", False), ("logp+H", True)):
        ee, cc = e.double().requires_grad_(), c.double().requires_grad_()
        logp_all = torch.log_softmax(ee @ cc.T, -1)
        objective = (w.double() * logp_all.gather(1, t[:, None]).squeeze(1)).sum()
        if with_h:
            objective = objective + (beta.double() * -(logp_all.exp() * logp_all).sum(-1)).sum()
        objective.backward()
        assert torch.allclose(ref[key][0].double(), ee.grad, rtol=1e-5, atol=1e-7), key
        assert torch.allclose(ref[key][1].double(), cc.grad, rtol=1e-5, atol=1e-7), key


def test_the_rl_tool_knows_liger_s_published_shape():
    import argparse

    from suite.kernel import rl

    ap = argparse.ArgumentParser()
    rl.add_arguments(ap)
    args = ap.parse_args(["--out", "x", "--n", "64"])
    assert rl._shape("liger-readme", args) == (16384, 4096, 131072)  # --n does not change it
    with pytest.raises(SystemExit, match="liger-readme"):
        rl._shape("no-such-model", args)


def test_the_rl_tool_rows_of_the_peers_and_their_gradient_errors(tmp_path):
    from suite.kernel import rl

    import argparse

    ap = argparse.ArgumentParser()
    rl.add_arguments(ap)
    args = ap.parse_args(["--out", str(tmp_path), "--device", "cpu", "--models", "llama3-8b",
                          "--n", "12", "--d", "16", "--v", "48", "--check-rows", "6", "--reps",
                          "1", "--methods", "own_logp_entropy,own_loss_grad,naive,"
                          "liger_scaled_ce,verl_lce,liger_scaled_ce_tp"])
    assert rl.main(args) == 0
    by = {r["method"]: r for r in csv.DictReader(open(tmp_path / "rl.csv"))}
    # fp32 on the CPU against fp64: a few fp32 roundings of the sums over V and N
    tol = 64 * torch.finfo(torch.float32).eps
    for method in ("own_logp_entropy", "own_loss_grad", "naive"):
        assert float(by[method]["de_rel_err"]) < tol and float(by[method]["dc_rel_err"]) < tol
    assert by["verl_lce"]["status"] == "unavailable"  # no verl here, or no CUDA
    tp = by["liger_scaled_ce_tp"]
    assert tp["status"] == "unavailable" and "one process per GPU" in tp["note"]
    if LIGER:
        scaled = by["liger_scaled_ce"]
        assert scaled["status"] == "ok" and scaled["ran"].startswith(
            liger_scaled.FALLBACK_FUNCTION)
        assert float(scaled["entropy_max_abs_err"]) < 1e-4 and float(scaled["de_rel_err"]) < tol


def test_the_gpu_script_names_providers_and_methods_that_exist():
    from suite.kernel import rl

    script = (ROOT / "suite" / "kernel" / "peers_gpu.sh").read_text()
    providers = re.search(r"^PROVIDERS=(\S+)$", script, re.M)[1].split(",")
    methods = re.search(r"^RL_METHODS=(\S+)$", script, re.M)[1].split(",")
    assert all(p in catalog.names() for p in providers), providers
    assert all(m in rl.METHODS for m in methods), methods
    for path in ("peers_gpu.sh", "peers_pack.sh"):
        subprocess.run(["bash", "-n", str(ROOT / "suite" / "kernel" / path)], check=True)


# ---- the tables of a peer run folder -----------------------------------------------------------

CELL_GEMMA = dict(cell_id="lm-gemma", dist="lm", n="8192", d="2304", v="256000", dtype="bf16",
                  softcap="30.0")
CELL_LIGER = dict(cell_id="lm-liger", dist="lm", n="16384", d="4096", v="131072", dtype="bf16",
                  softcap="")


def _bench_row(cell, provider, ms=None, p20=None, p80=None, mib="1200", status="ok", error="",
               ran=""):
    row = dict.fromkeys(ROW_FIELDS, "")
    row.update(cell, provider=provider, phase="loss+grad", status=status, error=error, ran=ran,
               run_id="r1", timestamp="2026-11-28T00:00:00", device="NVIDIA H100 80GB HBM3",
               world_size="1")
    if status == "ok":
        row.update(ms=str(ms), ms_p20=str(p20), ms_p80=str(p80), peak_extra_mib=mib)
    return row


def _rl_row(model, method, ms=None, p20=None, p80=None, status="ok", note="", ran="",
            logp="1e-4", h="2e-4"):
    n, d, v = {"liger-readme": (16384, 4096, 131072), "llama3-8b": (8192, 4096, 128256)}[model]
    nan = "nan"
    ok = status == "ok"
    return dict(model=model, n=n, d=d, v=v, dtype="bfloat16", method=method, status=status,
                ms_median=ms if ok else nan, ms_p20=p20 if ok else nan,
                ms_p80=p80 if ok else nan, ms_min=p20 if ok else nan, reps=7,
                peak_extra_mib="1700" if ok else nan, logp_max_abs_err=logp if ok else nan,
                entropy_max_abs_err=h if ok else nan, de_rel_err="2e-3" if ok else nan,
                dc_rel_err="3e-3" if ok else nan, device="NVIDIA H100 80GB HBM3", ran=ran,
                note=note)


@pytest.fixture
def peer_run(tmp_path):
    """A synthetic peer run folder, as suite/kernel/peers_gpu.sh lays it out."""
    bench = [
        _bench_row(CELL_GEMMA, "own", 60, 59, 61),
        _bench_row(CELL_GEMMA, "liger_flce_cute", 144, 143, 145,
                   ran="inner CE liger_kernel.ops.cutedsl.ops.cross_entropy._launch_ce_fwd "
                       "(CuTe DSL 4.8.1): 8 launches per call"),
        _bench_row(CELL_GEMMA, "verl_lce", status="unsupported",
                   error="verl_lce has no softcap option"),
        _bench_row(CELL_LIGER, "own", 100, 99, 101),
        _bench_row(CELL_LIGER, "liger_scaled_ce", 90, 89, 91,
                   ran="LigerFusedScaledCrossEntropySM90Function (CuTe-DSL SM90 kernel)"),
        _bench_row(CELL_LIGER, "verl_lce", 100.5, 98, 103,
                   ran="verl.utils.kernel.linear_cross_entropy (Triton) from "
                       "/tmp/peers/site-packages/verl/utils/kernel"),
    ]
    with open(tmp_path / "results.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=ROW_FIELDS)
        w.writeheader()
        w.writerows(bench)
    (tmp_path / "env.json").write_text(json.dumps({"run_id": "r1", "peers": {
        "liger_flce_cute": {"version": "0.8.5"}, "verl_lce": {"version": "0.9.1"}}}))
    (tmp_path / "rl").mkdir()
    rl_rows = [_rl_row("liger-readme", "own_logp_entropy", 100, 99, 101),
               _rl_row("liger-readme", "liger_scaled_ce", 104, 103, 105),
               _rl_row("liger-readme", "verl_lce", 150, 149, 151),
               _rl_row("liger-readme", "liger_scaled_ce_tp", status="unavailable",
                       note="needs one process per GPU"),
               _rl_row("liger-readme", "liger_flce_logp", 120, 119, 121, h="nan")]
    with open(tmp_path / "rl" / "rl.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rl_rows[0]))
        w.writeheader()
        w.writerows(rl_rows)
    (tmp_path / "verl-probe.json").write_text(json.dumps(
        {"entropy.sum(), bare": "AssertionError at kernels.py:1553: assert x",
         "entropy.sum(), suite provider": "ok"}))
    return tmp_path


def test_who_has_what_gives_each_peer_its_outputs_cells_and_verdicts(peer_run):
    from suite.report.peer_tables import who_has_what

    text = who_has_what(peer_run, "python -m suite report RUN --who-has-what")
    line = {m[1]: m[0] for m in re.finditer(r"^\| `(\w+)` \|.*$", text, re.M)}
    assert "| log-prob + entropy | 60 ms, 1200 MiB | 100 ms, 1200 MiB | 100 ms, 1700 MiB |" \
        in line["own"]  # the reference: no verdict against itself
    assert "| 144 ms, 1200 MiB, slower |" in line["liger_flce_cute"]
    assert "| unsupported |" in line["verl_lce"] and "| 100 ms, 1200 MiB, level |" in line[
        "verl_lce"]
    assert "| 90 ms, 1200 MiB, faster |" in line["liger_scaled_ce"]
    assert "| log-prob |" in line["liger_flce"]  # its RL method has no entropy
    assert "| unavailable |" in line["liger_scaled_ce_tp"]
    # a faster peer is named with by how much; a level one is not
    faster = text.split("Faster than the own kernel:")[1].split("\n\n")[0]
    assert "`liger_scaled_ce` is faster than `own` at loss+grad, N 16384" in faster
    assert "takes 1.11x its time" in faster and "verl_lce" not in faster
    assert "8 launches per call" in text and "SM90 kernel" in text  # what ran
    assert "(Triton) from verl/utils/kernel" in text and "site-packages" not in text
    assert "`verl_lce` at loss+grad, N 8192 D 2304 V 256000, softcap 30: unsupported" in text
    assert "liger-kernel 0.8.5" in text and "verl 0.9.1" in text


def test_the_rl_table_lists_every_row_with_its_errors_and_verl_s_probe(peer_run):
    from suite.report.peer_tables import rl_table

    text = rl_table(peer_run, "python -m suite report RUN --rl")
    rows = [line for line in text.splitlines() if line.startswith("| liger-readme")]
    assert len(rows) == 5
    scaled = next(r for r in rows if "`liger_scaled_ce`" in r)
    assert "104 (103–105)" in scaled and "| 2.0e-03 | 3.0e-03 | slower |" in scaled
    assert "kernels.py:1553" in text and "suite provider: ok" in text


def test_the_readme_s_peer_sentence_names_versions_outputs_and_who_is_faster(peer_run):
    from suite.report.peer_tables import peer_list

    text = peer_list(peer_run, "python -m suite report RUN --peer-list")
    assert len(text.splitlines()) == 1  # one paragraph: the README has no room for a table
    assert "liger-kernel 0.8.5" in text and "verl 0.9.1" in text
    assert "entropy with their backward: `own`, `liger_scaled_ce`, `verl_lce`;" in text
    assert "`liger_scaled_ce` is faster than `own` at loss+grad" in text


def test_the_peer_tables_say_how_to_measure_an_empty_folder(tmp_path):
    from suite.report.peer_tables import peer_list, rl_table, who_has_what

    for table in (who_has_what, rl_table, peer_list):
        assert "bash suite/kernel/peers_gpu.sh" in table(tmp_path, "cmd")


def test_report_all_rewrites_every_generated_text_and_changes_nothing_when_current(
        tmp_path, monkeypatch):
    import argparse

    import suite.report as report
    from suite.report import notes

    readme, doc = tmp_path / "README.md", tmp_path / "RESULTS.md"
    readme.write_text((ROOT / "README.md").read_text())
    doc.write_text("stale\n")
    monkeypatch.setattr(report, "README", readme)
    monkeypatch.setattr(report, "RESULTS_DOC", doc)
    monkeypatch.setattr(notes, "NOTES", tmp_path / "notes")
    (tmp_path / "notes").mkdir()
    parser = argparse.ArgumentParser()
    report.add_arguments(parser)
    assert report.main(parser.parse_args(["--all"])) == 0
    assert readme.read_text() == (ROOT / "README.md").read_text()
    assert doc.read_text() == report.results_doc_text()
    assert report.main(parser.parse_args(["--all", "results/x"])) == 1


# ---- Liger's tensor-parallel kernel beside the own vocab-parallel path ------------------------

def _tp_run(root, rows):
    folder = root / "tp" / "liger-shape-vp2"
    folder.mkdir(parents=True)
    with open(folder / "results.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=ROW_FIELDS)
        w.writeheader()
        w.writerows(dict(r, world_size="2") for r in rows)
    (folder / "env.json").write_text(json.dumps({"run_id": "r1", "gpu_name": "NVIDIA H200"}))
    return root


def test_the_tensor_parallel_table_gives_verdicts_and_the_memory_outside_torch(tmp_path):
    from suite.report.peer_tables import tensor_parallel, tensor_parallel_line

    run = _tp_run(tmp_path, [
        _bench_row(CELL_LIGER, "own", 55, 54, 56),
        _bench_row(CELL_LIGER, "liger_scaled_ce_tp", 59, 58.5, 60, mib="640",
                   ran="LigerFusedLinearScaledCrossEntropyNativeTPFunction (CUTLASS + NVSHMEM); "
                       "configure() took 4040 MiB of device memory outside torch's allocator"),
        _bench_row(CELL_LIGER, "liger_scaled_ce_tp_torch", 55.5, 53, 57),
        _bench_row(CELL_LIGER, "naive", 40, 39, 41)])
    text = tensor_parallel(run, "cmd")
    lines = {ln.split("|")[1].strip(): ln for ln in text.splitlines() if ln.startswith("| `")}
    assert set(lines) == {"`own`", "`liger_scaled_ce_tp`", "`liger_scaled_ce_tp_torch`"}
    assert "| 4040 |" in lines["`liger_scaled_ce_tp`"] and lines["`liger_scaled_ce_tp`"].endswith(
        "| slower |")
    assert lines["`liger_scaled_ce_tp_torch`"].endswith("| level |")  # p20-p80 ranges overlap
    assert "| – |" in lines["`own`"]
    line = tensor_parallel_line(run)
    assert "on 2 x NVIDIA H200: slower, 59 ms against the own kernel's 55" in line


def test_a_failed_tensor_parallel_row_shows_its_status_and_the_readme_line_says_so(tmp_path):
    from suite.report.peer_tables import tensor_parallel, tensor_parallel_line

    run = _tp_run(tmp_path, [_bench_row(CELL_LIGER, "own", 55, 54, 56),
                             _bench_row(CELL_LIGER, "liger_scaled_ce_tp", status="crashed",
                                        error="a rank failed")])
    assert "| `liger_scaled_ce_tp` | loss+grad | crashed |" in tensor_parallel(run, "cmd")
    assert "crashed (the own kernel: ok)" in tensor_parallel_line(run)
