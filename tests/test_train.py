"""suite/train/: model, training step per backend, batch search, memory breakdown, corpus,
convergence verdicts, CLI, worker isolation (suite/isolate.py). CPU, tiny shapes."""
import argparse
import csv
import json
import math
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from suite import isolate
from suite import train as tr
from suite.measure import MIB, is_oom
from suite.results import CsvAppender
from suite.schema import TRAIN_BENCH_FIELDS
from suite.train.cli import _check_args, make_runner

TINY = tr.GPTConfig(vocab=97, seq_len=16, d_model=32, n_layer=2, n_head=2)
REPO = Path(__file__).resolve().parent.parent


def tiny_data(n_seq, seed=0, cfg=TINY):
    chain = tr.markov_chain(cfg.vocab, seed=seed)
    tokens = tr.sample_tokens(chain, n_seq, cfg.seq_len + 1, seed=seed + 1)
    return tr.instruction_batch(tokens, seed=seed + 2)


def train_losses(backend, steps=25, batch=8, lr=3e-3, cfg=TINY):
    provider = tr.get_backend(backend)
    idx, tgt = tiny_data(steps * batch, cfg=cfg)
    torch.manual_seed(0)
    model = tr.GPT(cfg)
    opt = tr.make_optimizer(model, lr, torch.device("cpu"))
    losses = []
    for s in range(steps):
        sl = slice(s * batch, (s + 1) * batch)
        losses.append(tr.train_step(model, opt, idx[sl], tgt[sl], provider.fn, amp=False).item())
    return losses


# ---- model ---------------------------------------------------------------------------------

def test_param_count_formula_and_default_size():
    v, t, d, n = TINY.vocab, TINY.seq_len, TINY.d_model, TINY.n_layer
    per_layer = 12 * d * d + 4 * d  # qkv 3d^2, proj d^2, mlp 8d^2, two LayerNorms
    total, nonemb = tr.param_counts(TINY)
    assert total == v * d + t * d + n * per_layer + 2 * d + v * d
    assert nonemb == n * per_layer + 2 * d
    total, nonemb = tr.param_counts(tr.GPTConfig())  # seed 000: "about 50M"
    assert 45e6 < total < 60e6, total
    assert 15e6 < nonemb < 25e6, nonemb


def test_model_is_causal_and_shapes():
    torch.manual_seed(0)
    model = tr.GPT(TINY)
    idx = torch.randint(0, TINY.vocab, (2, TINY.seq_len))
    h = model(idx)
    assert h.shape == (2, TINY.seq_len, TINY.d_model)
    idx2 = idx.clone()
    idx2[:, 10] = (idx2[:, 10] + 1) % TINY.vocab
    h2 = model(idx2)
    torch.testing.assert_close(h[:, :10], h2[:, :10])
    assert not torch.allclose(h[:, 10:], h2[:, 10:])
    with pytest.raises(ValueError, match="seq_len"):
        model(torch.zeros(1, TINY.seq_len + 1, dtype=torch.long))


@pytest.mark.parametrize("backend", ["naive", "chunked", "selective"])
def test_training_loss_falls(backend):
    losses = train_losses(backend)
    assert all(math.isfinite(x) for x in losses)
    assert abs(losses[0] - math.log(TINY.vocab)) < 0.3  # starts near uniform
    assert np.mean(losses[-5:]) < np.mean(losses[:5]) - 1.0, losses


def test_backends_agree_on_the_same_step():
    """Same init and data: the exact backends give the same first losses (the wiring is the
    same), and the training step is deterministic on the CPU."""
    ref = train_losses("naive", steps=3)
    for backend in ("chunked", "selective", "selective+chunked"):
        np.testing.assert_allclose(train_losses(backend, steps=3), ref, rtol=1e-5)
    assert train_losses("naive", steps=3) == ref


INTERPRETED = ["own", "own_filter", "own_low_memory", "liger_ce"]  # the Triton backends; liger_flce is slow there
INTERPRETER_SCRIPT = textwrap.dedent("""
    import json, math, sys
    import torch
    from suite import catalog, train as tr
    cfg = tr.GPTConfig(vocab=97, seq_len=16, d_model=32, n_layer=2, n_head=2)
    STEPS = 6
    out = {}
    for name in ["naive"] + sys.argv[1:]:
        if name.startswith("own"):
            try:
                from own_kernel import linear_cross_entropy  # noqa: F401
            except Exception as err:
                out[name] = {"skip": f"own_kernel does not import: {err!r}"}
                continue
        provider = catalog.get(name)
        chain = tr.markov_chain(cfg.vocab, seed=0)
        idx, tgt = tr.instruction_batch(tr.sample_tokens(chain, 60, 17, seed=1), seed=2)
        torch.manual_seed(0)
        model = tr.GPT(cfg)
        opt = tr.make_optimizer(model, 1e-2, torch.device("cpu"))
        try:
            losses = [tr.train_step(model, opt, idx[4 * s:4 * s + 4], tgt[4 * s:4 * s + 4],
                                    provider.fn, amp=False).item() for s in range(STEPS)]
            out[name] = {"losses": losses}
        except Exception as err:  # a failing backend fails its own test only
            out[name] = {"error": repr(err)[-1500:]}
    print("@@" + json.dumps(out))
""")


@pytest.fixture(scope="module")
def interpreted_runs():
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-c", INTERPRETER_SCRIPT, *INTERPRETED], env=env,
                          capture_output=True, text=True, timeout=600, cwd=REPO)
    line = [x for x in proc.stdout.splitlines() if x.startswith("@@")]
    assert proc.returncode == 0 and line, proc.stdout[-2000:] + proc.stderr[-4000:]
    return json.loads(line[-1][2:])


@pytest.mark.parametrize("backend", INTERPRETED)
def test_training_loss_falls_triton_interpreter(interpreted_runs, backend):
    run = interpreted_runs[backend]
    if "skip" in run:
        pytest.skip(run["skip"])
    assert "error" not in run, run["error"]
    losses = run["losses"]
    assert all(math.isfinite(x) for x in losses)
    # same init and data as naive: the first step's loss is the same number
    assert losses[0] == pytest.approx(interpreted_runs["naive"]["losses"][0], rel=1e-4)
    assert np.mean(losses[-2:]) < np.mean(losses[:2]) - 0.5, losses


# ---- batch search --------------------------------------------------------------------------

def oom_above(threshold, calls):
    def step(batch):
        calls.append(batch)
        if batch > threshold:
            raise torch.cuda.OutOfMemoryError(f"fake OOM at batch {batch}")
    return step


@pytest.mark.parametrize("max_batch", [1, 7, 64, 100])
def test_largest_batch_is_exact(max_batch):
    for threshold in range(0, max_batch + 3):
        calls, cleanups = [], []
        fits = tr.fits_by_running(oom_above(threshold, calls), cleanup=lambda: cleanups.append(1))
        best, log = tr.largest_batch(fits, max_batch)
        assert best == min(threshold, max_batch), (threshold, log)
        assert len(cleanups) == len(calls) == len(log)  # cleanup after every try
        assert len(calls) <= 2 * math.ceil(math.log2(max_batch)) + 2
        assert len(set(calls)) == len(calls)  # no batch tried twice
        assert [b for b, ok in log if ok] == [b for b in calls if b <= threshold]


def test_largest_batch_other_errors_propagate():
    def step(batch):
        if batch > 3:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
    with pytest.raises(RuntimeError, match="illegal"):
        tr.largest_batch(tr.fits_by_running(step, cleanup=lambda: None), 64)
    with pytest.raises(ValueError, match="max_batch"):
        tr.largest_batch(lambda b: True, 0)


def test_is_oom():
    assert is_oom(torch.cuda.OutOfMemoryError("x"))
    assert is_oom(RuntimeError("CUDA out of memory. Tried to allocate 2 GiB"))
    assert is_oom(RuntimeError("CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate"))
    assert not is_oom(RuntimeError("shape mismatch"))


# ---- memory breakdown ----------------------------------------------------------------------

def test_static_memory_matches_parameters_and_adam_state():
    torch.manual_seed(0)
    model = tr.GPT(TINY)
    total, _ = tr.param_counts(TINY)
    static = tr.static_memory(model)
    assert static == {"weights": 4 * total, "grads": 4 * total, "optim": 8 * total}
    opt = tr.make_optimizer(model, 1e-3, torch.device("cpu"))
    tr.init_optimizer_state(model, opt)
    assert all(p.grad is None for p in model.parameters())
    moments = sum(t.numel() * t.element_size() for st in opt.state.values()
                  for k, t in st.items() if k in ("exp_avg", "exp_avg_sq"))
    assert moments == static["optim"]


def test_memory_breakdown_arithmetic():
    static = {"weights": 100 * MIB, "grads": 100 * MIB, "optim": 200 * MIB}
    parts = tr.memory_breakdown_mib(1000 * MIB, static, 350 * MIB)
    assert parts == {"weights_mib": 100, "grads_mib": 100, "optim_mib": 200, "loss_mib": 350,
                     "act_mib": 250}
    assert sum(parts.values()) == 1000
    # the rest can be negative when not all gradients coexist with the peak; kept, not clipped
    assert tr.memory_breakdown_mib(500 * MIB, static, 200 * MIB)["act_mib"] == -100


# ---- corpus --------------------------------------------------------------------------------

def test_corpus_is_deterministic():
    chain = tr.markov_chain(1000, seed=3)
    a = tr.sample_tokens(chain, 8, 64, seed=5)
    b = tr.sample_tokens(tr.markov_chain(1000, seed=3), 8, 64, seed=5)
    assert torch.equal(a, b)
    assert not torch.equal(a, tr.sample_tokens(chain, 8, 64, seed=6))
    assert not torch.equal(a, tr.sample_tokens(tr.markov_chain(1000, seed=4), 8, 64, seed=5))
    assert a.dtype == torch.long and a.min() >= 0 and a.max() < 1000


def test_corpus_is_zipfian_and_learnable():
    v = 1000
    tokens = tr.sample_tokens(tr.markov_chain(v, seed=0), 400, 257, seed=1)
    counts = torch.bincount(tokens.flatten(), minlength=v).double()
    freq = counts.sort(descending=True).values
    slope = np.polyfit(np.log(np.arange(1, 51)), np.log(freq[:50].numpy()), 1)[0]
    assert -1.6 < slope < -0.7, slope  # rank-frequency of the top 50 ranks, Zipf(1.1)
    pairs = torch.bincount((tokens[:, :-1] * v + tokens[:, 1:]).flatten(), minlength=v * v)
    pairs = pairs.double().view(v, v)
    cond = pairs / pairs.sum(1, keepdim=True).clamp_min(1)
    h_cond = -(pairs * torch.where(cond > 0, cond.log(), torch.zeros_like(cond))).sum() / pairs.sum()
    uni = counts / counts.sum()
    h_uni = -(uni[uni > 0] * uni[uni > 0].log()).sum()
    assert h_cond < 0.3 * math.log(v)  # the next token is predictable from the current one
    assert h_uni < 0.7 * math.log(v)   # and the unigram frequencies are far from uniform


def test_instruction_batch_masks_the_prompt():
    tokens = tr.sample_tokens(tr.markov_chain(97, seed=0), 50, 101, seed=1)
    idx, tgt = tr.instruction_batch(tokens, prompt_frac=(0.5, 0.7), seed=2)
    assert idx.shape == tgt.shape == (50, 100)
    assert torch.equal(idx[:, 1:], tokens[:, 1:-1])
    ignored = tgt == tr.IGNORE_INDEX
    frac = ignored.float().mean(1)
    assert frac.min() >= 0.5 and frac.max() <= 0.7
    # the prompt is a prefix; the labelled rest are the next tokens
    first_label = (~ignored).float().argmax(1)
    assert torch.equal(ignored.sum(1), first_label)
    keep = ~ignored
    assert torch.equal(tgt[keep], tokens[:, 1:][keep])
    with pytest.raises(ValueError, match="prompt_frac"):
        tr.instruction_batch(tokens, prompt_frac=(0.8, 0.5), seed=0)


# ---- convergence verdicts ------------------------------------------------------------------

def test_parity_verdict():
    ref = [5.0 * math.exp(-s / 50) + 2 + 0.05 * math.sin(s) for s in range(200)]
    kw = dict(tol=0.01, warmup=20, window=10)
    same = tr.parity_verdict(ref, ref, **kw)
    assert same["verdict"] == "pass" and same["max_rel_dev"] == 0
    near = tr.parity_verdict([x * 1.004 for x in ref], ref, **kw)
    assert near["verdict"] == "pass" and near["max_rel_dev"] == pytest.approx(0.004)
    off = tr.parity_verdict([x * 1.02 for x in ref], ref, **kw)
    assert off["verdict"] == "fail" and off["final_rel_diff"] == pytest.approx(0.02)
    # a deviation only during warm-up does not count
    early = [x * (1.5 if s < 10 else 1.0) for s, x in enumerate(ref)]
    assert tr.parity_verdict(early, ref, **kw)["verdict"] == "pass"
    # a bump after warm-up fails even when the final loss matches
    bump = [x * (1.05 if 100 <= s < 130 else 1.0) for s, x in enumerate(ref)]
    res = tr.parity_verdict(bump, ref, **kw)
    assert res["verdict"] == "fail" and 100 <= res["max_rel_dev_step"] < 140
    assert tr.parity_verdict(ref[:150] + [float("nan")] * 50, ref, **kw)["verdict"] == "diverged"
    assert tr.parity_verdict([x * 1.5 for x in ref], ref, **kw)["verdict"] == "diverged"
    assert tr.parity_verdict(ref[:100], ref, **kw)["verdict"] == "incomplete"


def test_parity_forgives_a_step_of_shift_in_the_descent_only():
    ref = [10.0 * math.exp(-s / 10) + 1.5 for s in range(200)]
    ahead = ref[1:] + ref[-1:]  # one step ahead: several per cent off in the steep descent
    kw = dict(tol=0.01, warmup=5, window=1)
    assert tr.parity_verdict(ahead, ref, **kw)["verdict"] == "fail"
    assert tr.parity_verdict(ahead, ref, shift=2, **kw)["verdict"] == "pass"
    assert tr.parity_verdict([x * 1.02 for x in ref], ref, shift=2, **kw)["verdict"] == "fail"


def test_noise_tolerance_widens_to_the_reference_rerun():
    from suite.train.convergence import noise_tolerance
    quiet = {"max_rel_dev": 0.002, "final_rel_diff": 0.0001}
    assert noise_tolerance(0.01, quiet) == 0.01
    noisy = {"max_rel_dev": 0.012, "final_rel_diff": -0.0004}
    assert noise_tolerance(0.01, noisy) == pytest.approx(0.018)
    assert noise_tolerance(0.01, {"max_rel_dev": float("nan")}) == 0.01
    ref = [5.0 * math.exp(-s / 50) + 2 for s in range(200)]
    run = [x * 1.013 for x in ref]
    kw = dict(warmup=20, window=10)
    assert tr.parity_verdict(run, ref, tol=0.01, **kw)["verdict"] == "fail"
    assert tr.parity_verdict(run, ref, tol=noise_tolerance(0.01, noisy), **kw)["verdict"] == "pass"


def test_smooth_and_lr_schedule():
    assert tr.smooth([1, 2, 3, 4, 5], 2) == [1, 1.5, 2.5, 3.5, 4.5]
    lrs = [tr.lr_at(s, steps=100, lr=1.0, warmup=10) for s in range(100)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(lrs[9:], lrs[10:]))
    assert lrs[-1] == pytest.approx(0.1, abs=1e-3)


# ---- CLI and worker isolation --------------------------------------------------------------

def parse(argv):
    parser = argparse.ArgumentParser()
    tr.add_arguments(parser)
    return parser.parse_args(argv)


TINY_ARGS = ["--device", "cpu", "--in-process", "--dtype", "fp32", "--d-model", "32",
             "--n-layer", "2", "--n-head", "2", "--seq-len", "16", "--conv-seq-len", "16",
             "--conv-vocab", "97", "--conv-batch", "8", "--conv-warmup", "5", "--smooth", "5",
             "--conv-lr", "3e-3", "--steps", "30", "--batch", "4", "--timed-steps", "2",
             "--warmup", "1"]


def test_cli_end_to_end_cpu(tmp_path):
    out = tmp_path / "run"
    args = parse(TINY_ARGS + ["--out", str(out), "--vocab", "97,211",
                              "--backends", "naive,selective,apple_cce",
                              "--conv-backends", "naive,chunked,apple_cce"])
    assert tr.main(args) == 0
    files = sorted(p.name for p in out.iterdir())
    assert files == ["env.json", "train_bench.csv", "train_bench.pdf", "train_bench.png",
                     "train_convergence.csv", "train_convergence.pdf", "train_convergence.png",
                     "train_curves.csv"]
    bench = list(csv.DictReader(open(out / "train_bench.csv")))
    assert list(bench[0]) == TRAIN_BENCH_FIELDS
    assert [(r["vocab"], r["backend"], r["status"]) for r in bench] == [
        ("97", "naive", "ok"), ("97", "selective", "ok"), ("97", "apple_cce", "unavailable"),
        ("211", "naive", "ok"), ("211", "selective", "ok"), ("211", "apple_cce", "unavailable")]
    assert all(float(r["tokens_per_s"]) > 0 for r in bench if r["status"] == "ok")
    assert 0.5 <= float(bench[0]["ignored_frac"]) <= 0.7
    conv = {r["run"]: r for r in csv.DictReader(open(out / "train_convergence.csv"))}
    assert conv["naive"]["verdict"] == "reference"
    assert conv[tr.RERUN_LABEL]["verdict"] == "noise floor"
    assert conv["chunked"]["verdict"] == "pass"
    assert conv["apple_cce"]["verdict"] == "unavailable"
    assert float(conv["naive"]["final_loss"]) < float(conv["naive"]["first_loss"]) - 1.0
    curves = list(csv.DictReader(open(out / "train_curves.csv")))
    assert len(curves) == 3 * 30  # naive, its rerun, chunked
    env = json.loads((out / "env.json").read_text())
    assert env["train_args"]["steps"] == 30
    # Measured again into the same folder: earlier rows and env.json stay, the new rows are
    # appended, the session's environment is env-2.json, and the report says who was re-measured.
    assert tr.main(parse(TINY_ARGS + ["--out", str(out), "--vocab", "97", "--mode", "bench",
                                      "--backends", "naive"])) == 0
    again = list(csv.DictReader(open(out / "train_bench.csv")))
    assert again[:6] == bench and len(again) == 7 and again[6]["backend"] == "naive"
    env2 = json.loads((out / "env-2.json").read_text())
    assert env2["run_id"] == again[6]["run_id"] != bench[0]["run_id"]
    assert json.loads((out / "env.json").read_text()) == env
    from suite.report import render_train
    assert "Re-measured since: naive at commit" in render_train([out])


def test_train_csv_with_other_columns_is_not_overwritten(tmp_path):
    path = tmp_path / "train_bench.csv"
    path.write_text("run_id,backend\nold,naive\n")
    with pytest.raises(ValueError, match="columns"):
        CsvAppender(path, TRAIN_BENCH_FIELDS)
    assert path.read_text() == "run_id,backend\nold,naive\n"


def test_replot_draws_from_the_csvs_through_suite_plots(tmp_path):
    out = tmp_path / "run"
    shutil.copytree(REPO / "tests" / "fixtures" / "train-fixture-a", out)
    assert tr.main(parse(["--replot", "--out", str(out)])) == 0
    for name in ("train_bench.png", "train_bench.pdf", "train_convergence.png",
                 "train_convergence.pdf"):
        assert (out / name).stat().st_size > 10_000, name


def test_selective_composition():
    backend = tr.get_backend("selective+naive")
    assert backend.name == "selective+naive" and backend.exact
    e, c = torch.randn(12, 8, requires_grad=True), torch.randn(30, 8)
    t = torch.randint(0, 30, (12,))
    t[:5] = tr.IGNORE_INDEX
    loss = backend.fn(e, c, t, ignore_index=tr.IGNORE_INDEX)
    torch.testing.assert_close(loss, torch.nn.functional.cross_entropy(e @ c.T, t))
    loss.backward()
    assert torch.all(e.grad[:5] == 0) and torch.any(e.grad[5:] != 0)
    assert tr.get_backend("selective+apple_cce").unavailable_reason("cpu")
    assert parse(["--backends", "naive,selective+liger_ce"]).backends == ["naive", "selective+liger_ce"]


def test_cli_rejects_bad_input(capsys):
    with pytest.raises(SystemExit):
        parse(["--backends", "naive,nonsense"])
    assert "nonsense" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse(["--backends", "selective+nonsense"])
    with pytest.raises(SystemExit):
        parse(["--vocab", "32k"])
    with pytest.raises(SystemExit):
        parse(["--prompt-frac", "0.7,0.5"])
    with pytest.raises(SystemExit, match="n-head"):
        _check_args(parse(["--device", "cpu", "--d-model", "30", "--n-head", "4"]))
    with pytest.raises(SystemExit, match="warm-up"):
        _check_args(parse(["--device", "cpu", "--steps", "20"]))


FAKE_WORKER = textwrap.dedent("""
    import json, sys, time
    for line in sys.stdin:
        job = json.loads(line)
        print("library chatter", flush=True)
        if job["what"] == "crash":
            sys.exit(7)
        if job["what"] == "hang":
            time.sleep(60)
        print("@@RESULT " + json.dumps({"status": "ok", "echo": job["n"]}), flush=True)
""")


def test_isolated_runner_survives_crash_and_timeout():
    runner = isolate.Worker([sys.executable, "-c", FAKE_WORKER])
    try:
        assert runner.run({"what": "ok", "n": 1}) == {"status": "ok", "echo": 1}
        first = runner.pid
        assert runner.run({"what": "ok", "n": 2})["echo"] == 2
        assert runner.pid == first  # one worker for consecutive jobs
        crashed = runner.run({"what": "crash", "n": 3})
        assert crashed["status"] == "crashed" and "code 7" in crashed["error"]
        assert runner.run({"what": "ok", "n": 4})["echo"] == 4  # a fresh worker took over
        hung = runner.run({"what": "hang", "n": 5}, timeout_s=1)
        assert hung["status"] == "timeout"
        assert runner.run({"what": "ok", "n": 6})["echo"] == 6
    finally:
        runner.close()


def test_real_worker_runs_a_bench_job():
    runner = make_runner(in_process=False)
    job = dict(kind="bench", backend="naive", device="cpu",
               model=dict(vocab=97, seq_len=16, d_model=32, n_layer=2, n_head=2), dtype="fp32",
               softcap=None, seed=0, lr=1e-4, prompt_frac=[0.5, 0.7], search=False, max_batch=8,
               warmup=1, timed_steps=2, batch=2)
    try:
        res = runner.run(job, timeout_s=120)
        bad = runner.run({**job, "backend": "apple_cce"}, timeout_s=60)
    finally:
        runner.close()
    assert res["status"] == "ok" and res["batch"] == 2 and res["tokens_per_s"] > 0, res
    assert bad["status"] == "unavailable" and "CUDA" in bad["error"]


@pytest.mark.gpu
def test_bench_job_on_cuda():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    job = dict(kind="bench", backend="naive", device="cuda",
               model=dict(vocab=4096, seq_len=256, d_model=64, n_layer=2, n_head=2), dtype="bf16",
               softcap=None, seed=0, lr=1e-4, prompt_frac=[0.5, 0.7], search=True, max_batch=4,
               warmup=1, timed_steps=2, batch="max")
    res = tr.run_job(job)
    assert res["status"] == "ok", res
    assert res["max_batch"] == 4 and res["max_batch_capped"] == 1
    parts = sum(res[k] for k in ("weights_mib", "grads_mib", "optim_mib", "act_mib", "loss_mib"))
    assert parts == pytest.approx(res["peak_mib"])
    assert res["loss_mib"] > 0 and res["saved_act_mib"] > 0
