"""The own kernel's tools (``python -m suite kernel ...``): their CPU-checkable parts, and the
rule that the kernel package does not depend on the suite."""
import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from suite import cli

ROOT = Path(__file__).resolve().parent.parent


def test_kernel_package_imports_no_suite_module():
    # The wheel's kernel must run without the benchmark: no own_kernel module imports suite.
    offenders = []
    for path in sorted((ROOT / "own_kernel").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            offenders += [f"{path.relative_to(ROOT)}: {n}" for n in names
                          if n == "suite" or n.startswith("suite.")]
    assert offenders == []


def test_kernel_help_lists_the_four_tools(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["kernel", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for tool in ("tune", "profile", "memory", "check"):
        assert tool in out


@pytest.mark.parametrize("tool", ["tune", "profile host", "memory", "rows-gemm"])
def test_gpu_tools_say_they_need_cuda(capsys, tool, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as exc:
        cli.main(["kernel", *tool.split()])
    assert "needs a CUDA device" in str(exc.value.code)


def test_rows_gemm_checks_tell_an_invariant_gemm_from_one_that_is_not():
    """suite kernel rows-gemm's bit checks: a fold over K steps, row by row, passes both; one
    whose rounding follows M (here a tiny M-scaled term) fails."""
    import torch

    from suite.kernel.rows_gemm import _checks

    def fold(acc, a, b, step=16):
        for k0 in range(0, a.shape[1], step):  # the same order for every row and any split
            acc += a[:, k0:k0 + step].double().matmul(b[k0:k0 + step].double()).float()

    def by_m(acc, a, b):
        fold(acc, a, b)
        acc += 1e-3 * a.shape[0]

    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(300, 64, generator=g), torch.randn(64, 24, generator=g)
    good = _checks(lambda o, x, y: fold(o, x, y), a, b)
    assert good["rows_equal"] and good["permuted_equal"]
    assert good["rel_err"] < 1e-6
    bad = _checks(by_m, a, b)
    assert not bad["rows_equal"] and bad["permuted_equal"]


@pytest.mark.parametrize("device", [None, "cuda"])
def test_check_refuses_what_it_cannot_do_here(capsys, monkeypatch, device):
    # No CUDA: the default (Gemma-sized) problem would run for many minutes under the CPU's
    # interpreter, and --device cuda has no device; both exit non-zero at once, saying why.
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    argv = ["kernel", "check"] + (["--device", device] if device else [])
    assert cli.main(argv) == 2
    out = capsys.readouterr().out
    assert ("too large for the CPU" if device is None else "no CUDA device") in out


def test_check_compares_gradients_on_the_cpu(capsys):
    import torch

    from own_kernel.policy.options import AUTO_EPS

    n, d, v = 8, 16, 40
    cli.main(["kernel", "check", "--n", str(n), "--d", str(d), "--v", str(v), "--device", "cpu"])
    lines = capsys.readouterr().out.splitlines()
    errors = {line.split()[0]: float(line.split()[2]) for line in lines[1:]}
    assert set(errors) == {"naive", "own", "own_filter", "own_low_memory"}
    # fp32 inputs: each provider's three reductions (over D, V and N) round at most
    # eps * (N + D + V) apart from the reference's; the filter drops entries below its fp32
    # threshold, at most V per row.
    eps = torch.finfo(torch.float32).eps
    assert max(errors.values()) < 2 * eps * (n + d + v) + AUTO_EPS[torch.float32] * v, errors


def test_check_runs_the_providers_under_a_config_override(capsys):
    # An override the config refuses proves it reached the kernel's config; a valid one is
    # named in the output.
    shape = ["--n", "8", "--d", "16", "--v", "40", "--device", "cpu", "--providers", "own"]
    with pytest.raises(ValueError, match="recompute.subtiles"):
        cli.main(["kernel", "check", *shape, "--override", '{"recompute": {"subtiles": 3}}'])
    cli.main(["kernel", "check", *shape, "--override", '{"forward": {"warp_specialize": true}}'])
    assert 'config override: {"forward": {"warp_specialize": true}}' in capsys.readouterr().out


def test_memory_peak_lists_the_blocks_alive_at_the_peak():
    from suite.kernel.memory import peak_breakdown

    frames = [{"filename": "/x/own_kernel/backward.py", "line": 7, "name": "backward"}]
    trace = [{"action": "alloc", "addr": 1, "size": 100, "frames": frames},
             {"action": "alloc", "addr": 2, "size": 50, "frames": []},
             {"action": "free_completed", "addr": 1},
             {"action": "alloc", "addr": 3, "size": 20, "frames": []}]
    peak, alive = peak_breakdown(trace)
    assert peak == 150
    assert alive == [(100, "own_kernel/backward.py:7 backward"), (50, "?")]


@pytest.mark.parametrize("softcap", [None, 30.0])
@pytest.mark.parametrize("what", ["fwd", "bwd", "bwd-filter"])
def test_profile_passes_run_at_the_softcap_asked_for(monkeypatch, what, softcap):
    # The ncu modes once ran every pass at softcap 30 whatever --softcap said, while the inputs
    # were made for the asked softcap: a profile of a plain head ran a softcapped epilogue.
    import torch

    from suite.kernel import profile
    seen = []
    monkeypatch.setattr(profile, "forward_lse", lambda e, c, t, cap: seen.append(("fwd", cap)))

    def loss(e, c, t, softcap, filter_eps):
        seen.append(("loss+grad", softcap, filter_eps))
        return (e.sum() + c.sum()) * 0
    monkeypatch.setattr(profile, "linear_cross_entropy", loss)
    e, c, t = torch.randn(4, 8), torch.randn(6, 8), torch.zeros(4, dtype=torch.long)
    profile.launch_passes(what, e, c, t, softcap)
    if what == "fwd":  # the pointer and the TMA forward
        assert seen == [("fwd", softcap), ("fwd", softcap)]
    else:
        assert seen == [("loss+grad", softcap, "auto" if what == "bwd-filter" else None)]


def test_profile_splits_gpu_time_per_call_into_floors(tmp_path, capsys):
    # A synthetic torch.profiler trace of 2 calls: the breakdown divides each family's GPU time
    # by calls x floor and counts the span not covered by any GPU operation as idle.
    from suite.kernel.profile import kernel_family, own_path_of, print_gpu_gaps

    ops = [("cce_fwd_tma_kernel", 0, 100), ("cce_dlogits_tma_kernel", 100, 150),
           ("nvjet_sm90_tss_192x192_badd", 250, 120), ("Memset (Device)", 370, 10),
           ("cce_fwd_tma_kernel", 480, 100), ("cce_dlogits_tma_kernel", 580, 150),
           ("nvjet_sm90_tst_128x192_bz", 730, 120), ("cce_finalize_de_kernel", 850, 10)]
    events = [{"ph": "X", "cat": "kernel", "name": n, "ts": ts, "dur": dur, "args": {}}
              for n, ts, dur in ops]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    floors = print_gpu_gaps(str(path), floor_ms=0.1, calls=2)
    out = capsys.readouterr().out
    lines = {line.split(None, 1)[1]: float(line.split()[0]) for line in
             out.split("Per call, in floors")[1].splitlines()[1:] if line.strip()}
    assert lines == {"forward": 1.0, "recompute + softmax gradient": 1.5,
                     "cuBLAS GEMMs (dE, dC; the three-matmul path's logits too)": 1.2, "other own kernels": 0.05,
                     "torch ops, copies, memsets": 0.05, "GPU idle": 0.5,
                     "span of the traced calls": 4.3}
    assert {k: round(x, 6) for k, x in floors.items()} == lines  # what --csv writes
    assert kernel_family("cce_lse_combine_kernel") == "forward"
    assert kernel_family("_shifted_to_grad_kernel") == kernel_family("_logits_to_grad_kernel")
    for name in ("_target_shifted_partials_kernel", "_target_shifted_grad_kernel"):
        assert kernel_family(name) == kernel_family("_logits_to_grad_kernel")
    assert own_path_of(["_target_shifted_grad_kernel"]) == "three-matmul"


def test_profile_leaves_out_what_the_first_marked_call_launched(tmp_path, capsys):
    # Two marked calls on the host; the first call's kernels (and the idle GPU while the host
    # queued it) are left out, whichever thread launched them, so the span starts at the second
    # call's first kernel.
    from suite.kernel.profile import CALL_MARK, print_gpu_gaps

    def mark(ts, dur):  # record_function's range, as torch.profiler exports it
        return {"ph": "X", "cat": "user_annotation", "name": CALL_MARK, "ts": ts, "dur": dur,
                "tid": 1, "args": {}}

    def launch(ts, corr, tid=1):  # tid 2: autograd's device thread, which launches backwards
        return {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": ts,
                "dur": 1, "tid": tid, "args": {"correlation": corr}}

    def kernel(name, ts, dur, corr):
        return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur,
                "args": {"correlation": corr}}

    events = [mark(0, 300), launch(290, 1), launch(295, 2, tid=2),
              kernel("cce_fwd_tma_kernel", 700, 100, 1), kernel("nvjet_sm90_tst", 800, 100, 2),
              mark(310, 50), launch(320, 3), launch(330, 4, tid=2),
              kernel("cce_fwd_tma_kernel", 900, 100, 3), kernel("nvjet_sm90_tst", 1030, 100, 4)]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    floors = print_gpu_gaps(str(path), floor_ms=0.1, calls=1, skip_calls=1)
    assert {k: round(x, 6) for k, x in floors.items()} == {
        "forward": 1.0, "cuBLAS GEMMs (dE, dC; the three-matmul path's logits too)": 1.0,
        "GPU idle": 0.3, "span of the traced calls": 2.3}
    assert "the first 1 call(s) left out" in capsys.readouterr().out
    with pytest.raises(ValueError, match="skip_calls"):
        print_gpu_gaps(str(path), floor_ms=0.1, calls=1, skip_calls=2)


def test_the_profile_csv_has_a_column_for_every_kernel_family(tmp_path):
    import argparse
    import csv

    from suite.kernel import profile

    names = ["cce_fwd_tma_kernel", "cce_dlogits_tma_kernel", "_logits_to_grad_kernel",
             "nvjet_sm90", "cce_finalize_de_kernel", "triton_red_fused_0", "Memset (Device)"]
    families = {profile.kernel_family(n) for n in names}
    assert families <= set(profile.FAMILY_COLUMNS)
    args = argparse.Namespace(n=8, d=4, v=16, softcap=0.0, lm_entropy=3.0, dist="lm",
                              provider=None, filter=True, low_memory=False, workspace_mib=0,
                              autocast=False)
    measured = dict(host_ms=1.0, wall_ms=9.0, floor_ms=2.0,
                    floors={"forward": 1.0, "GPU idle": 0.25, "span of the traced calls": 4.5})
    path = tmp_path / "p.csv"
    profile.append_profile_row(str(path), args, measured)
    profile.append_profile_row(str(path), argparse.Namespace(**{**vars(args), "provider":
                                                                "torch_compile"}), measured)
    rows = list(csv.DictReader(open(path)))
    assert [r["call"] for r in rows] == ["own filter", "torch_compile"]
    assert rows[0]["wall_floors"] == "4.5" and rows[0]["forward_floors"] == "1"
    assert rows[0]["cublas_floors"] == "0" and rows[0]["softcap"] == ""
    assert json.loads((tmp_path / "env.json").read_text())["torch"]  # the run's environment


def test_a_profile_row_names_the_kernel_config_it_ran_under(tmp_path, monkeypatch):
    # env.json is written once per CSV: a row profiled under another CCE_OWN_CONFIG would
    # otherwise read as the default's
    import argparse
    import csv

    from suite.kernel import profile

    args = argparse.Namespace(n=8, d=4, v=16, softcap=0.0, lm_entropy=3.0, dist="lm",
                              provider=None, filter=False, low_memory=False, workspace_mib=1024,
                              autocast=False)
    measured = dict(host_ms=1.0, wall_ms=9.0, floor_ms=2.0, floors={})
    path = tmp_path / "p.csv"
    monkeypatch.delenv("CCE_OWN_CONFIG", raising=False)
    profile.append_profile_row(str(path), args, measured)
    monkeypatch.setenv("CCE_OWN_CONFIG", '{"fused":{"tile_max_in_de":true}}')
    profile.append_profile_row(str(path), args, measured)
    assert [r["call"] for r in csv.DictReader(open(path))] == [
        "own workspace_mib=1024",
        'own workspace_mib=1024 config={"fused":{"tile_max_in_de":true}}']


def test_an_autocast_profile_runs_the_forward_under_autocast_and_says_so(tmp_path, monkeypatch):
    # The autocast target's misses are profiled as the autocast tool times them: the loss under
    # bf16 autocast, its backward outside; the CSV row says autocast and has no lm entropy.
    import argparse
    import csv

    import torch

    from suite.kernel import profile

    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    seen = []

    def loss(e, c, t, **_):
        seen.append(torch.is_autocast_enabled("cpu"))
        return (e.float().sum() + c.sum()) * 0
    e, c, t = torch.randn(4, 8).bfloat16(), torch.randn(6, 8), torch.zeros(4, dtype=torch.long)
    for autocast in (True, False):
        profile.host_profile(e, c, t, None, None, calls=1, loss_fn=loss, autocast=autocast)
        assert set(seen) == {autocast} and c.grad is not None
        seen.clear()
    args = argparse.Namespace(n=8, d=4, v=16, softcap=0.0, lm_entropy=2.2, dist=None,
                                     provider="torch_compile", filter=False, low_memory=False,
                                     workspace_mib=0, autocast=True)
    path = tmp_path / "p.csv"
    profile.append_profile_row(str(path), args, dict(host_ms=1.0, wall_ms=2.0,
                                                            floor_ms=1.0, floors={}))
    row, = csv.DictReader(open(path))
    assert (row["call"], row["lm_entropy"]) == ("torch_compile autocast", "")


def test_an_autocast_profile_calls_the_autocast_tools_providers(monkeypatch):
    # --provider under --autocast names the autocast tool's call with its config (own_recompute:
    # the zero budget's recompute path pinned); a bad name or mode is an error naming the flag.
    import argparse

    import torch

    from suite import cli
    from suite.kernel import profile
    from suite.providers.own import RECOMPUTE_AT_ZERO

    args = argparse.Namespace(provider="own_recompute", autocast=True)
    _, overrides = profile._host_loss(args)
    assert overrides == RECOMPUTE_AT_ZERO
    with pytest.raises(SystemExit, match="--provider: .*'own_bogus'"):
        profile._host_loss(argparse.Namespace(provider="own_bogus", autocast=True))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for argv in (["fwd", "--autocast"], ["host", "--autocast", "--dist", "lm"],
                 ["host", "--autocast", "--filter"]):
        with pytest.raises(SystemExit, match="--autocast"):
            cli.main(["kernel", "profile", *argv])


def test_the_step_bench_names_the_path_from_the_kernels_that_ran():
    # The kernels' names as torch.profiler reports them on an H100 (three-matmul: cuBLAS
    # logits, the Triton pass, cuBLAS dE/dC; recompute: forward, recompute, cuBLAS).
    from suite.kernel.profile import own_path_of

    three = ["nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NTT", "_logits_to_grad_kernel",
             "nvjet_sm90_tss_192x192_badd", "_scale_kernel"]
    recompute = ["cce_fwd_tma_kernel", "cce_lse_combine_kernel", "cce_dlogits_tma_kernel",
                 "nvjet_sm90_tss_192x192_badd", "cce_finalize_de_kernel"]
    portable = ["cce_fwd_kernel", "cce_softmax_grad_kernel", "sm80_xmma_gemm_bf16"]
    shifted = ["cce_fwd_tma_kernel", "cce_lse_combine_kernel", "_shifted_to_grad_kernel",
               "nvjet_sm90_tss_192x192_badd", "_scale_kernel"]
    assert own_path_of(three) == "three-matmul"
    assert own_path_of(shifted) == "three-matmul"  # the Hopper default's logits
    assert own_path_of(recompute) == "recompute"
    assert own_path_of(portable) == "recompute"
    assert own_path_of(["cce_fwd_tma_kernel", "cce_lse_combine_kernel"]) == ""  # no backward
    assert own_path_of(["ampere_bf16_s16816gemm", "triton_red_fused_0"]) == ""  # another backend


def test_version_is_the_installed_distributions():
    import importlib.metadata

    import own_kernel

    try:
        installed = importlib.metadata.version("cce-bench")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("cce-bench is not installed in this environment (a bare checkout)")
    assert own_kernel.__version__ == installed


def test_the_heads_script_runs_rounds_per_head_and_prints_each_rounds_verdict(tmp_path):
    """suite/kernel/heads_gpu.sh end to end on the CPU (a stand-in nvidia-smi names the GPU, a
    tiny head with a softcap, NxDxVxS, naive as the peer): a folder per head with a folder per
    round, packed into $OUT/heads-test.tar (named after RUN), the rows at the head's softcap,
    and the per-round verdicts of each own provider printed last."""
    import csv
    import io
    import tarfile

    out, run = tmp_path / "out", tmp_path / "run" / "heads-test"
    # fp32: the interpreter refuses the own kernel's bf16
    res = _run_device_script("heads_gpu.sh", tmp_path, out, run, HEADS="32x16x97x30",
                             ROUNDS="2", REPS="2", PEER="naive", DTYPE="fp32",
                             PROVIDERS="own,own_ws3072,naive")
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    with tarfile.open(out / "heads-test.tar") as tar:
        names = tar.getnames()
        rows = list(csv.DictReader(io.StringIO(tar.extractfile(
            "heads-test/n32-d16-v97-sc30/round-1/results.csv").read().decode())))
    assert "heads-test/n32-d16-v97-sc30/round-2/results.csv" in names
    assert {float(r["softcap"]) for r in rows} == {30.0}
    for own in ("own", "own_ws3072"):
        verdicts = [line for line in res.stdout.splitlines()
                    if line.startswith(f"- {own} against naive (loss+grad")]
        assert len(verdicts) == 2 and all(v.endswith("of 1 cells") for v in verdicts), verdicts


def test_the_heads_script_times_the_forward_alone_with_phase_fwd(tmp_path):
    """PHASE=fwd: heads_gpu.sh's rows are the forward under no_grad (phase fwd), printed last
    (report --versus judges loss+grad only)."""
    import csv
    import io
    import tarfile

    out, run = tmp_path / "out", tmp_path / "run" / "heads-test"
    res = _run_device_script("heads_gpu.sh", tmp_path, out, run, HEADS="32x16x97",
                             ROUNDS="1", REPS="2", PEER="naive", DTYPE="fp32", PHASE="fwd",
                             PROVIDERS="own,naive")
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    with tarfile.open(out / "heads-test.tar") as tar:
        rows = list(csv.DictReader(io.StringIO(tar.extractfile(
            "heads-test/n32-d16-v97/results.csv").read().decode())))
    assert {r["phase"] for r in rows} == {"fwd"} and {r["provider"] for r in rows} == {
        "own", "naive"}
    printed = [line.split() for line in res.stdout.splitlines()
               if line.startswith("n32-d16-v97 ")]
    assert sorted(p[4] for p in printed) == ["naive", "own"], res.stdout[-2000:]  # no softcap
    assert "head 32x16x97: exit 0" in res.stdout


def test_the_frontier_script_runs_each_shape_and_the_forward_and_prints_the_frontier(tmp_path):
    """suite/kernel/frontier_gpu.sh end to end on the CPU (a stand-in nvidia-smi, a tiny NxDxV
    shape and its softcapped twin, fp32, TESTS=1 on a CPU-only test file): the tests' step
    first, a frontier run folder per shape and one forward folder of phase fwd (the forward
    under no_grad, not the loss phase: on the three-matmul path that phase holds the gradients'
    work too) and the targets' CSV, packed into $OUT/frontier-test.tar, and the frontier table
    printed last."""
    import csv
    import io
    import re
    import tarfile

    out, run = tmp_path / "out", tmp_path / "run" / "frontier-test"
    res = _run_device_script("frontier_gpu.sh", tmp_path, out, run,
                             SHAPES="32x16x97 32x16x97x30", REPS="2", DTYPE="fp32",
                             PROVIDERS="naive,torch_native,own,own_ws256",
                             FORWARD_PROVIDERS="own,naive", PEER_SITE=str(tmp_path / "none"),
                             TESTS="1", GPU_TESTS="tests/test_provenance.py", TEST_WORKERS="1")
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    # TESTS=1: the GPU tests' step first, its pytest output in the log
    log = (out / "frontier.log").read_text()
    assert log.index("== gpu tests") < log.index("== frontier 32x16x97")
    assert re.search(r"\b\d+ passed", log) and "gpu tests: exit 0" in log

    def rows(tar, name):
        return list(csv.DictReader(io.StringIO(tar.extractfile(name).read().decode())))

    with tarfile.open(out / "frontier-test.tar") as tar:
        forward = rows(tar, "frontier-test/forward-test/results.csv")
        plain = rows(tar, "frontier-test/frontier-32x16x97-test/results.csv")
        capped = rows(tar, "frontier-test/frontier-32x16x97x30-test/results.csv")
        targets = rows(tar, "frontier-test/targets.csv")  # packed after the last step too
    # the targets' CSV: a row per shape's cell
    assert sorted(r["cell_id"] for r in targets) == sorted({plain[0]["cell_id"],
                                                            capped[0]["cell_id"]})
    assert {r["provider"] for r in forward} == {"own", "naive"}
    assert {r["phase"] for r in forward} == {"fwd"}
    # NxDxVxS: the softcap reaches the cells, and torch_native (no softcap) is left out there
    assert {r["provider"] for r in plain} == {"naive", "torch_native", "own", "own_ws256"}
    assert {r["provider"] for r in capped} == {"naive", "own", "own_ws256"}
    assert {float(r["softcap"]) for r in capped} == {30.0}
    # the table of the shape's cell (its rows need a GPU's peak memory: none on the CPU)
    assert "**N 32, D 16, V 97, fp32, lm inputs**" in res.stdout and "| verdict |" in res.stdout
    # then the forward step's rows, their cells whole (print_rows): both shapes, both providers
    printed = res.stdout.splitlines()
    head = printed.index("run n d v softcap provider status ms ms_p20 ms_p80 floor_ratio sm_mhz")
    assert sum(line.startswith("forward-test 32 16 97 ") for line in printed[head:]) == 4


def _run_device_script(name, tmp_path, out, run, **knobs):
    """suite/kernel/NAME run on the CPU as on the GPU machine: a stand-in nvidia-smi names the
    GPU ('NVIDIA Test GPU'), OUT and RUN as given, the knobs as its environment."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "nvidia-smi").write_text("#!/bin/sh\necho 'NVIDIA Test GPU'\n")
    (fake / "nvidia-smi").chmod(0o755)
    out.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(OUT=str(out), RUN=str(run), CCE_BENCH_COMMIT="test", PYTHON=sys.executable,
               PATH=f"{fake}{os.pathsep}{env['PATH']}", **knobs)
    return subprocess.run(["bash", str(ROOT / "suite" / "kernel" / name)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)


def test_the_gpu_run_of_test_fused_skips_its_cpu_cases_with_a_reason():
    # CCE_TEST_DEVICE=cuda without the interpreter (as on the GPU machine): a case that builds
    # CPU tensors for the interpreter's route must skip, saying why, not fail in the kernel's
    # device check
    env = {k: x for k, x in os.environ.items() if k != "TRITON_INTERPRET"}
    env["CCE_TEST_DEVICE"] = "cuda"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
         "tests/test_fused.py", "-k", "filter_skips_column_blocks or kept_runs_join"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "5 skipped" in done.stdout and "reads the CPU's route" in done.stdout, done.stdout


def test_the_headline_script_runs_the_bench_without_the_packed_peers_and_prints_it(tmp_path):
    """suite/kernel/headline_gpu.sh on the CPU (a stand-in nvidia-smi, a tiny fp32 cell, no
    packed peers: the unpack step says so and the bench goes on): the run folder packed into
    $OUT/headline-test.tar, the headline printed last."""
    import tarfile

    out, run = tmp_path / "out", tmp_path / "run" / "headline-test"
    res = _run_device_script("headline_gpu.sh", tmp_path, out, run, PEER_SITE=str(tmp_path / "x"),
                             BENCH_ARGS="--n 32 --d 16 --v 97 --dtype fp32 --softcap none "
                                        "--dist lm --providers naive,own --reps 2",
                             REPORT_ARGS="")
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    log = (out / "headline.log").read_text()
    assert "unpack the packed peers: exit 3" in log or Path("/tmp/cute/peers.tar.xz.aa").exists()
    assert "bench (1): exit 0" in log and "bench (2)" not in log  # resumed only where cut short
    with tarfile.open(out / "headline-test.tar") as tar:
        rows = tar.extractfile("headline-test/results.csv").read().decode()
    assert {"naive", "own"} <= {line.split(",")[12] for line in rows.splitlines()[1:]}
    assert "| own |" in res.stdout or "`own`" in res.stdout, res.stdout


@pytest.mark.parametrize("name, label", [("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA H200", "h200"),
                                         ("NVIDIA A100-SXM4-80GB", "a100")])
def test_the_device_scripts_label_folders_with_the_gpus_short_name(tmp_path, name, label):
    # deadline_steps.sh's gpu_label, which every device script names its folders with (through
    # start_run): results are labelled -h100, -h200, not with the full product name
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "nvidia-smi").write_text(f"#!/bin/sh\necho '{name}'\n")
    (fake / "nvidia-smi").chmod(0o755)
    script = f"source {ROOT}/suite/kernel/deadline_steps.sh; gpu_label"
    env = dict(os.environ, PATH=f"{fake}{os.pathsep}{os.environ['PATH']}")
    done = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.stdout.strip() == label, done.stdout + done.stderr
    # start_run: the log named after the script, the pack after the run folder (two runs of one
    # device call, each with its RUN, keep two packs), the folder made, and a warning where the
    # commit is not given (RUN given here: its default is /tmp/run/NAME-<label>)
    out, run = tmp_path / "out", tmp_path / "run" / "heads-a"
    env.pop("CCE_BENCH_COMMIT", None)
    script = (f"OUT={out}; RUN={run}; source {ROOT}/suite/kernel/deadline_steps.sh; "
              f'start_run heads; echo "$GPU $LOG $PACK"; RUN={run.parent}/heads-b; '
              f'CCE_BENCH_COMMIT=abc start_run heads; echo "$PACK"')
    done = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.stdout.split()[-4:] == [label, f"{out}/heads.log", f"{out}/heads-a.tar",
                                        f"{out}/heads-b.tar"], done.stdout + done.stderr
    assert run.is_dir() and "CCE_BENCH_COMMIT unset" in (out / "heads.log").read_text()
    for script_name in ("heads_gpu.sh", "frontier_gpu.sh", "headline_gpu.sh"):
        text = (ROOT / "suite" / "kernel" / script_name).read_text()
        assert "start_run " in text and "nvidia-smi" not in text, script_name


def test_print_rows_prints_every_rows_cells_whole_and_the_board(tmp_path):
    # deadline_steps.sh's print_rows, the table device scripts print last: cells as the CSV has
    # them (a rounded 1755.0 once hid a flaky median), each row named by its folder, sorted; a
    # column a CSV lacks prints empty; the first run's board last
    for name, ms in (("round-2", "12.3456789"), ("round-1", "7.25")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "interleave.csv").write_text(f"head,ms\n8192x4096x128256,{ms}\n")
    (tmp_path / "round-1" / "env.json").write_text('{"gpu_uuid": "abc", "power_limit_w": 700}')
    script = (f"source {ROOT}/suite/kernel/deadline_steps.sh; "
              f"print_rows '{tmp_path}/*/interleave.csv' head ms sm_mhz")
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)
    assert done.stdout.splitlines() == [
        "run head ms sm_mhz",
        "round-1 8192x4096x128256 7.25 ",
        "round-2 8192x4096x128256 12.3456789 ",
        "{'gpu_uuid': 'abc', 'power_limit_w': 700, 'sm_clock_max_mhz': None, "
        "'git_commit': None}"], done.stdout + done.stderr


def _steps_script(tmp_path, body: str) -> str:
    """A bash script that sources deadline_steps.sh with a 100 s deadline, its log, run folder
    and pack in tmp_path, then runs body."""
    return f"""
START=$SECONDS; DEADLINE=100; LOG={tmp_path}/log; RUN={tmp_path}/run; PACK={tmp_path}/p.tar
mkdir -p "$RUN"; STEP_MIN_S=1; PYTHON={sys.executable}
source {ROOT}/suite/kernel/deadline_steps.sh
{body}
"""


def test_a_capped_step_stops_at_its_cap_and_a_short_deadline_skips_it(tmp_path):
    # deadline_steps.sh's capped_step (peers_gpu.sh): at most CAP seconds, exit 124 when cut;
    # skipped, STEP_RC empty, where less than STEP_MIN_S is left
    script = _steps_script(tmp_path, 'capped_step cut 1 sleep 5; echo "cut=$STEP_RC"\n'
                                     'STEP_MIN_S=200 capped_step late 50 true; '
                                     'echo "late=[$STEP_RC]"')
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)
    assert "cut=124" in done.stdout and "late=[]" in done.stdout, done.stdout + done.stderr
    assert (tmp_path / "p.tar").exists() and "late: skipped" in (tmp_path / "log").read_text()


def test_a_gpu_tests_step_cut_by_its_cap_still_names_a_failure(tmp_path):
    # deadline_steps.sh's gpu_tests_step: a case that failed before the cap cut pytest off (and
    # with it pytest's summary) is named in the log. The cap leaves a loaded CPU time to start
    # the xdist worker and run the first case.
    (tmp_path / "test_cut.py").write_text(
        "import time\n\n\ndef test_fails_first():\n    assert False\n\n\n"
        "def test_sleeps_past_the_cap():\n    time.sleep(45)\n")
    script = _steps_script(tmp_path, f"GPU_TESTS={tmp_path}/test_cut.py TEST_WORKERS=1 "
                                     'TESTS_CAP_S=25 gpu_tests_step; echo "rc=$STEP_RC"')
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)
    log = (tmp_path / "log").read_text()
    assert "rc=124" in done.stdout, done.stdout + done.stderr + log
    assert "FAILED" in log and "test_fails_first" in log, log


def test_grid_tool_writes_the_plans_grid_and_its_simulated_span(tmp_path, capsys):
    # The grid is split_plan's for each variant; the span is list scheduling in the kernels'
    # launch order over the mean: the split-order model's grid at N 4096, D 3584, V 152064 (21
    # splits in groups of 7) leaves more of its last wave idle than the plan's (ncu, call36a).
    import csv
    from own_kernel.policy.config import HOPPER_16BIT, with_overrides
    from own_kernel.policy.plan import split_plan

    out = tmp_path / "grid.csv"
    old = {"forward": {"makespan_order": "split"}}
    assert cli.main(["kernel", "grid", "--heads", "4096x3584x152064,1024x64x5000",
                     "--variants", "old=" + json.dumps(old), "--out", str(out)]) == 0
    rows = {(r["head"], r["entry"]): r for r in csv.DictReader(out.open())}
    assert set(rows) == {(h, e) for h in ("4096x3584x152064", "1024x64x5000")
                         for e in ("base", "old")}
    for (head, entry), row in rows.items():
        n, d, v = map(int, head.split("x"))
        cfg = with_overrides(HOPPER_16BIT, old) if entry == "old" else HOPPER_16BIT
        grid = split_plan(n, v, d, 2, cfg, 132)
        assert (int(row["splits"]), int(row["group_rows"])) == (grid.splits, grid.group_rows)
        assert int(row["programs"]) == -(-n // cfg.forward.tiles.block_n) * grid.splits
        assert float(row["span_over_mean"]) >= 1
    head = "4096x3584x152064"
    assert (float(rows[head, "old"]["span_over_mean"])
            > float(rows[head, "base"]["span_over_mean"]) + 0.03)
    assert "span_over_mean" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="--sms"):
        cli.main(["kernel", "grid", "--heads", head, "--sms", "0"])
    with pytest.raises(SystemExit, match="--heads"):
        cli.main(["kernel", "grid", "--heads", "4096x3584"])


# nvdisasm's layout: a label line, then `/*addr*/ instruction ;` lines, addresses past 0xffff
# with five hex digits. The inner label .L_x_9 is a branch target inside the loop, not its head.
_SASS = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_2:
        /*fff0*/                   IMAD.WIDE R4, R2, 0x2, R6 ;
.L_x_9:
        /*10000*/              @P0 LDGSTS.E.BYPASS.128 [R3], desc[UR4][R4.64] ;
        /*10010*/                  HGMMA.64x256x16.F32.BF16 R24, gdesc[UR4], R24 ;
        /*10020*/              @!P1 BRA `(.L_x_9) ;
        /*10030*/                  IADD3 R2, R2, 0x40, RZ ;
        /*10040*/              @!P5 BRA `(.L_x_2) ;
        /*10050*/                  EXIT ;
"""


def test_sass_loop_is_the_innermost_loop_around_the_first_tensor_core_instruction():
    from suite.kernel.sass import mma_loop, opcode

    # .L_x_9's branch back comes first, but the loop around the MMA is the label a branch after
    # it returns to nearest before it: .L_x_9 here (the inner one), and its body is 3 lines
    assert mma_loop(_SASS) == {"LDGSTS": 1, "HGMMA": 1, "BRA": 1}
    # without the inner branch the loop is .L_x_2's, five-digit addresses included
    outer = _SASS.replace("@!P1 BRA `(.L_x_9)", "NOP")
    assert mma_loop(outer) == {"IMAD": 1, "LDGSTS": 1, "HGMMA": 1, "NOP": 1, "IADD3": 1,
                               "BRA": 1}
    assert opcode("@!P5 BRA `(.L_x_2)") == "BRA" and opcode("HGMMA.64x256x16.F32") == "HGMMA"
    with pytest.raises(ValueError, match="tensor-core"):
        mma_loop(_SASS.replace("HGMMA", "FFMA"))
    with pytest.raises(ValueError, match="no loop"):
        mma_loop(outer.replace("@!P5 BRA `(.L_x_2)", "NOP"))


def test_sass_tool_refuses_the_interpreter_naming_it(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(SystemExit, match="TRITON_INTERPRET"):
        cli.main(["kernel", "sass", "--arch", "90"])


def test_sass_tool_counts_the_forwards_k_loop_compiled_for_sm90(tmp_path):
    # Compiled in a process without the interpreter (tests.gluon_sm90's way). At 128 x 256 x 64
    # and 8 warps a k-step is 4 HGMMAs per warp (two warpgroups of 64 rows, 64 = 4 x 16 deep)
    # and (128 + 256) rows x 128 bytes in 16-byte copies over 256 threads: 12 LDGSTS each. The
    # fixed base pointers take the stepping adds out (config.Forward.fixed_base_loads).
    import csv
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    out = tmp_path / "sass.csv"
    stepped = {"forward": {"fixed_base_loads": False}}
    done = subprocess.run(
        [sys.executable, "-m", "suite", "kernel", "sass", "--arch", "90", "--tiles",
         "128x256x64x8x3", "--variants", "stepped=" + json.dumps(stepped), "--out", str(out)],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {r["entry"]: r for r in csv.DictReader(out.open())}
    assert set(rows) == {"base", "stepped"}
    for row in rows.values():
        ops = dict(item.split(":") for item in row["loop_top_ops"].split())
        assert (ops["HGMMA"], ops["LDGSTS"]) == ("4", "12"), row
        assert row["arch"] == "sm90" and row["tiles"] == "128x256x64 w8 s3"
    assert int(rows["base"]["loop_instructions"]) < int(rows["stepped"]["loop_instructions"])
