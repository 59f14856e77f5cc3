"""``train-bench --model hf:<arch>`` (suite/train/hf.py): the training step and convergence on
Hugging Face architectures, per loss backend. CPU, tiny configs, fp32, the own kernel under the
Triton interpreter (conftest sets TRITON_INTERPRET)."""
import argparse
import csv
import subprocess
import sys
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers", minversion="5",
                                   reason="--model hf: needs transformers >= 5 (the test extra "
                                          "installs it)")

from suite import train as tr  # noqa: E402
from suite.schema import TRAIN_BENCH_FIELDS  # noqa: E402
from suite.train import hf  # noqa: E402
from suite.train.cli import resolve_model  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
TINY_HF_ARGS = ["--tiny", "--device", "cpu", "--in-process", "--dtype", "fp32", "--seq-len", "16",
                "--conv-seq-len", "16", "--conv-batch", "2", "--steps", "6", "--conv-warmup", "2",
                "--smooth", "3", "--conv-lr", "1e-2", "--batch", "2", "--warmup", "1",
                "--timed-steps", "1"]


def parse(argv):
    parser = argparse.ArgumentParser()
    tr.add_arguments(parser)
    return parser.parse_args(argv)


def read(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


# Liger's Gemma 2 path (its softcap) fails under the Triton interpreter: measured on llama only.
@pytest.mark.parametrize("arch, backends", [("llama", "hf_loss,own,liger_flce,apple_cce"),
                                            ("gemma2", "hf_loss,own,own_filter,apple_cce")])
def test_bench_and_convergence_on_a_tiny_hf_model(tmp_path, kernel_calls, arch, backends):
    out = tmp_path / arch
    args = parse(TINY_HF_ARGS + ["--model", f"hf:{arch}", "--out", str(out),
                                 "--backends", backends])
    assert tr.main(args) == 0
    bench = read(out / "train_bench.csv")
    assert list(bench[0]) == TRAIN_BENCH_FIELDS
    status = {r["backend"]: (r["status"], r["error"]) for r in bench}
    assert list(status) == backends.split(",")  # the reference first, then in the given order
    assert all(status[b] == ("ok", "") for b in ("hf_loss", "own", "own_filter")
               if b in status), status
    assert status["apple_cce"][0] == "unavailable" and "CUDA" in status["apple_cce"][1]
    if "liger_flce" in status:
        assert status["liger_flce"] == ("ok", ""), status
    model = hf.build_model(arch, args.hf["config"], "meta")
    for r in bench:
        assert (r["vocab"], r["seq_len"], r["batch"]) == (str(hf.TINY["vocab"]), "16",
                                                           "2" if r["status"] == "ok" else "")
        assert int(r["n_params"]) == sum(p.numel() for p in model.parameters())
        assert r["softcap"] == ("30.0" if arch == "gemma2" else "")
    assert all(float(r["tokens_per_s"]) > 0 for r in bench if r["status"] == "ok")
    conv = {r["run"]: r for r in read(out / "train_convergence.csv")}
    assert [conv[r]["verdict"] for r in ("hf_loss", "hf_loss_rerun", "hf_loss_fp32", "own")] == [
        "reference", "noise floor", "pass", "pass"], conv
    assert conv["own"]["steps_done"] == "6" and conv["own"]["exact"] == "1"
    assert float(conv["hf_loss"]["final_loss"]) < float(conv["hf_loss"]["first_loss"]) - 0.05
    # own's convergence run and the own bench jobs went through the kernel; the others did not:
    # 6 steps, then each bench job's warm-up and timed step.
    own_jobs = [b for b in status if b.startswith("own")]
    assert [c["filter_eps"] for c in kernel_calls] == [None] * 6 + [
        "auto" if b == "own_filter" else None for b in own_jobs for _ in range(2)]
    assert {c["softcap"] for c in kernel_calls} == {30.0 if arch == "gemma2" else None}


def test_the_split_step_measures_the_backends_loss_and_makes_the_plain_steps_update(kernel_calls):
    kwargs = hf.config_kwargs("llama", seq_len=16, tiny=True)
    idx, labels = hf.corpus(kwargs["vocab_size"], 3, 16, prompt_frac=(0.5, 0.7), seed=0,
                            device="cpu")
    params = {}
    for how in ("plain", "split"):
        torch.manual_seed(0)
        model = hf.build_model("llama", kwargs, "cpu")
        hf.apply_backend(model, "own", "llama")
        opt = tr.make_optimizer(model, 1e-2, torch.device("cpu"))
        trunk, init = model.model, [p.detach().clone() for p in model.parameters()]
        if how == "plain":
            loss = hf.hf_train_step(model, opt, idx, labels, amp=False)
        else:
            split = hf.hf_split_step_memory(model, opt, idx, labels, amp=False)
            torch.testing.assert_close(split["loss_value"], loss, rtol=1e-5, atol=1e-6)
            assert split["loss"] == split["peak"] == 0  # no CUDA statistics on the CPU
        assert model.model is trunk
        params[how] = [p.detach().clone() for p in model.parameters()]
        assert all(not torch.equal(a, b) for a, b in zip(init, params[how]))  # every one trained
    assert len(kernel_calls) == 2
    for a, b in zip(params["plain"], params["split"]):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)


def test_the_fp32_head_reference_gives_fp32_logits_under_bf16_autocast():
    kwargs = hf.config_kwargs("llama", seq_len=16, tiny=True)
    idx = torch.randint(0, kwargs["vocab_size"], (2, 16))
    dtypes = {}
    for backend in ("hf_loss", "hf_loss_fp32"):
        torch.manual_seed(0)
        model = hf.build_model("llama", kwargs, "cpu")
        hf.apply_backend(model, backend, "llama")
        with torch.autocast("cpu", dtype=torch.bfloat16):
            dtypes[backend] = model(input_ids=idx).logits.dtype
    assert dtypes == {"hf_loss": torch.bfloat16, "hf_loss_fp32": torch.float32}


def test_hf_labels_give_the_models_shift_the_corpus_targets():
    targets = torch.tensor([[-100, -100, 5, 6, 7]])
    labels = hf.hf_labels(targets)
    assert labels.tolist() == [[-100, -100, -100, 5, 6]]
    # transformers shifts labels left by one: position t is trained on targets[t]
    assert labels[:, 1:].tolist() == targets[:, :-1].tolist()


def test_backends_a_peer_cannot_patch_are_rows_with_reasons():
    job = dict(kind="bench", backend="liger_flce", device="cpu", seq_len=16, softcap=None,
               hf={"arch": "phi", "config": hf.config_kwargs("phi", seq_len=16, tiny=True)},
               dtype="fp32", seed=0, lr=1e-4, prompt_frac=[0.5, 0.7], search=False,
               max_batch=4, warmup=1, timed_steps=1, batch=2)
    res = tr.run_job(job)
    assert res["status"] == "unsupported" and "PhiForCausalLM" in res["error"], res
    res = tr.run_job({**job, "backend": "apple_cce"})
    assert res["status"] == "unavailable" and "CUDA" in res["error"], res


def test_a_class_patched_by_an_earlier_job_gets_its_stock_forward_back(monkeypatch):
    kwargs = hf.config_kwargs("llama", seq_len=16, tiny=True)
    stock = hf.build_model("llama", kwargs, "meta")
    monkeypatch.setattr(transformers.LlamaForCausalLM, "forward", lambda self, **kw: None)
    model = hf.build_model("llama", kwargs, "meta")
    assert type(model).forward is type(stock).forward is hf._STOCK_FORWARD[type(model)]
    assert transformers.LlamaForCausalLM.forward.__name__ == "forward"


def test_the_step_bench_configs_are_the_real_vocabularies_at_about_1b_parameters():
    for arch in hf.ARCHS:
        kwargs = hf.config_kwargs(arch, seq_len=2048)
        fields = hf.shape_fields(arch, kwargs, 2048)
        assert 0.5e9 < fields["n_params"] < 1.1e9, (arch, fields)
    llama = hf.shape_fields("llama", hf.config_kwargs("llama", seq_len=2048), 2048)
    gemma2 = hf.shape_fields("gemma2", hf.config_kwargs("gemma2", seq_len=2048), 2048)
    assert (llama["vocab"], llama["softcap"], gemma2["vocab"], gemma2["softcap"]) == (
        128256, "", 256000, 30.0)
    args = parse(["--model", "hf:gemma2"])
    resolve_model(args)
    assert args.backends == list(hf.HF_BENCH_BACKENDS)
    assert args.conv_backends == ["hf_loss", "hf_loss_fp32", "own"]
    assert args.out == "runs/train-hf-gemma2" and args.seq_len == 2048  # git-ignored
    assert (args.conv_batch, args.conv_lr) == (4, 3e-4)
    assert args.hf["config"]["vocab_size"] == 256000
    args = parse([])
    resolve_model(args)
    assert (args.hf, args.out, args.conv_batch, args.conv_lr) == (None, "runs/train", 16, 1e-3)
    assert args.backends == list(tr.DEFAULT_BACKENDS)


def test_cli_errors_name_the_argument_and_the_supported_architectures():
    proc = subprocess.run([sys.executable, "-m", "suite", "train-bench", "--model", "hf:mixtral",
                           "--device", "cpu"], capture_output=True, text=True, cwd=REPO,
                          timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "--model" in proc.stderr and "hf:mixtral" in proc.stderr
    assert all(f"hf:{arch}" in proc.stderr for arch in hf.ARCHS), proc.stderr
    with pytest.raises(SystemExit, match="--backends naive: not a backend of --model hf:llama"):
        resolve_model(parse(["--model", "hf:llama", "--backends", "hf_loss,naive"]))
    with pytest.raises(SystemExit, match="--conv-backends hf_loss: not a backend of --model gpt"):
        resolve_model(parse(["--conv-backends", "naive,hf_loss"]))
    with pytest.raises(SystemExit, match="--tiny"):
        resolve_model(parse(["--tiny"]))
    with pytest.raises(SystemExit, match="--vocab, --softcap applies to --model gpt only"):
        resolve_model(parse(["--model", "hf:gemma2", "--vocab", "1000", "--softcap", "20"]))


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["hf_loss", "own"])
def test_hf_bench_job_on_cuda(backend):
    """The CUDA-only parts (batch search, peak and its breakdown, the split step's loss share)
    on a tiny Gemma 2 (softcap 30) in bf16."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    job = dict(kind="bench", backend=backend, device="cuda", seq_len=256, softcap=None,
               hf={"arch": "gemma2", "config": hf.config_kwargs("gemma2", seq_len=256, tiny=True)},
               dtype="bf16", seed=0, lr=1e-4, prompt_frac=[0.5, 0.7], search=True, max_batch=4,
               warmup=1, timed_steps=2, batch="max")
    res = tr.run_job(job)
    assert res["status"] == "ok", res
    assert res["max_batch"] == 4 and res["max_batch_capped"] == 1 and res["batch"] == 4
    parts = sum(res[k] for k in ("weights_mib", "grads_mib", "optim_mib", "act_mib", "loss_mib"))
    assert parts == pytest.approx(res["peak_mib"])
    assert res["loss_mib"] > 0 and res["saved_act_mib"] > 0 and res["tokens_per_s"] > 0
