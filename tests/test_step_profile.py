"""The multi-GPU step profile's summary (suite/train/step_profile.py) on synthetic kernels, and
the training bench's own-variant configurations (suite/train/distributed.py)."""
import gzip
import json

import pytest

from suite.train.step_profile import Kernel, family, kernels_from_chrome_trace, summarise


def _kernels():
    # compute stream 7: a GEMM, an own kernel, a 50 us gap, an elementwise kernel;
    # NCCL stream 20: an all-gather half under compute, a reduce-scatter under none.
    return [Kernel("sm90_xmma_gemm_bf16", 7, 0, 100), Kernel("cce_fwd_tma_kernel", 7, 100, 50),
            Kernel("elementwise_kernel", 7, 200, 50),
            Kernel("ncclDevKernel_AllGather_RING_LL", 20, 120, 60),
            Kernel("ncclDevKernel_ReduceScatter_Sum_f32", 20, 300, 40)]


def test_families_name_nccl_own_gemm_and_the_rest():
    assert [family(k.name) for k in _kernels()] == ["gemm", "own", "other", "nccl", "nccl"]
    assert family("_shifted_to_grad_kernel") == "own" and family("nvjet_tst_128x256") == "gemm"
    assert family("triton_per_fused_add_0") == "other"


def test_summary_counts_exposed_nccl_and_the_compute_streams_gaps():
    s = summarise(_kernels(), steps=1)
    assert s["compute_stream"] == 7
    assert s["compute_busy_ms"] == pytest.approx(0.2) and s["compute_idle_ms"] == pytest.approx(0.05)
    assert s["compute_window_ms"] == pytest.approx(0.25)
    # the all-gather's last 30 us and the whole reduce-scatter ran under no compute kernel
    assert s["nccl_exposed_ms"] == pytest.approx(0.07)
    assert s["nccl_AllGather_ms"] == pytest.approx(0.06)
    assert s["nccl_ReduceScatter_ms"] == pytest.approx(0.04)
    assert s["gemm_ms"] == pytest.approx(0.1) and s["own_ms"] == pytest.approx(0.05)
    gap = s["top_gaps"][0]
    assert gap["gap_ms"] == pytest.approx(0.05) and gap["after"] == "cce_fwd_tma_kernel"
    assert gap["before"] == "elementwise_kernel"
    assert gap["nccl_during"] == ["ncclDevKernel_AllGather_RING_LL"]


def test_summary_is_per_step():
    one, two = summarise(_kernels(), steps=1), summarise(_kernels(), steps=2)
    assert two["nccl_exposed_ms"] == pytest.approx(one["nccl_exposed_ms"] / 2)
    assert summarise([], steps=3) == {"profiled_steps": 3, "kernels": 0}


def test_kernels_come_from_a_chrome_trace(tmp_path):
    trace = {"traceEvents": [
        {"cat": "kernel", "name": "cce_fwd_tma_kernel", "ts": 10.0, "dur": 5.0,
         "args": {"stream": 7}},
        {"cat": "cpu_op", "name": "aten::mm", "ts": 1.0, "dur": 3.0},
        {"cat": "kernel", "name": "ncclDevKernel_AllGather", "ts": 2.0, "dur": 4.0,
         "args": {"stream": 20}}]}
    got = kernels_from_chrome_trace(trace)
    assert got == [Kernel("ncclDevKernel_AllGather", 20, 2.0, 4.0),
                   Kernel("cce_fwd_tma_kernel", 7, 10.0, 5.0)]
    path = tmp_path / "t.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump(trace, f)
    from suite.train.step_profile import summarise_trace_file
    assert summarise_trace_file(path, 1)["kernels"] == 2


def test_own_variants_are_configurations_with_their_override():
    from suite.train.distributed import OWN_VARIANTS, parse_configs
    cfg, = parse_configs("own:recompute@4")
    assert cfg.name == "own:recompute@4" and cfg.own_config == OWN_VARIANTS["recompute"]
    assert parse_configs("own@2")[0].own_config is None
    for bad in ("hf_loss:recompute@2", "own:bogus@2"):
        with pytest.raises(ValueError, match="--configs"):
            parse_configs(bad)


def test_a_variant_reaches_the_ranks_before_they_import_the_kernel(monkeypatch, tmp_path):
    """own_kernel reads CCE_OWN_CONFIG at import, and a spawned rank imports it (through
    suite.train) before its own code runs: the override must be in the environment the ranks
    are spawned with, and the parent's restored afterwards."""
    import os

    import torch.multiprocessing as mp
    from suite.train.distributed import OWN_VARIANTS, Settings, parse_configs, run_config
    seen = {}

    def fake_start(fn, args, nprocs, start_method, join):
        seen.update({k: os.environ.get(k) for k in ("CCE_OWN_CONFIG", "OMP_NUM_THREADS",
                                                    "NCCL_NVLS_ENABLE")})
        raise RuntimeError("not started")  # a failed world is a row: run_config returns it
    monkeypatch.setattr(mp, "start_processes", fake_start)
    monkeypatch.delenv("CCE_OWN_CONFIG", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    cfg, = parse_configs("own:recompute@2")
    s = Settings("llama", True, "cuda", "bf16", 2, 1, 1, 8, 1e-3, 1, 0, max_world=2)
    assert run_config(cfg, s, tmp_path, False) == "not started"
    assert json.loads(seen["CCE_OWN_CONFIG"]) == OWN_VARIANTS["recompute"]
    assert seen["OMP_NUM_THREADS"] == "1" and seen["NCCL_NVLS_ENABLE"] == "0"
    assert "CCE_OWN_CONFIG" not in os.environ and "OMP_NUM_THREADS" not in os.environ


def _world(step_ms, peak=100.0, host=5.0):
    rank = {"ms": list(step_ms), "host_ms": [host] * len(step_ms), "peak_mib": peak,
            "losses": [2.0, 1.5], "n_params": 10, "model": {"vocab_size": 32, "hidden_size": 8,
                                                            "num_hidden_layers": 1}}
    return [rank]


def test_a_configurations_row_pools_the_steps_of_its_worlds():
    """Worlds of one configuration differ by more than their own step spread (seen at K = 4):
    the row's median and p20-p80 pool every world's timed steps, world_ms keeps each world's
    median, a failed world is named and the others still count."""
    from suite.train.distributed import Settings, _row, parse_configs
    cfg, = parse_configs("own@1")
    s = Settings("llama", True, "cuda", "bf16", 4, 1, 1, 8, 1e-3, 1, 0, max_world=1)
    fast, slow = _world([50, 10, 10, 10], peak=90), _world([50, 20, 20, 20], peak=120)
    row = _row(cfg, s, [fast, "oom: CUDA out of memory", slow], {})
    assert row["status"] == "ok" and row["worlds"] == 2 and row["world_ms"] == "10.00;20.00"
    assert row["ms"] == 15.0 and row["ms_p20"] == 10.0 and row["ms_p80"] == 20.0
    assert row["peak_mib_max"] == 120 and "oom" in row["error"]
    assert _row(cfg, s, ["boom"], {})["status"] == "error"


def _fsdp_trace():
    # Host thread 1 launches (correlations 1-3) inside FSDP annotations: a layer's all-gather
    # (inside the root's pre-forward, so the innermost annotation names the unit), the root's
    # reduce-scatter, and an all-reduce outside any FSDP hook. Compute stream 7 covers the
    # layer's all-gather only.
    ann = lambda name, ts, dur: {"cat": "user_annotation", "name": name, "ts": ts, "dur": dur,
                                 "tid": 1}
    launch = lambda corr, ts: {"cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": ts,
                               "dur": 1.0, "tid": 1, "args": {"correlation": corr}}
    kernel = lambda name, stream, ts, dur, corr: {"cat": "kernel", "name": name, "ts": ts,
                                                  "dur": dur,
                                                  "args": {"stream": stream, "correlation": corr}}
    return {"traceEvents": [
        ann("FSDP::root_pre_forward", 0.0, 50.0),
        ann("FSDP::all_gather (model.layers.0)", 5.0, 10.0),
        launch(1, 8.0), ann("FSDP::post_backward_reduce", 100.0, 20.0), launch(2, 110.0),
        launch(3, 200.0), kernel("gemm_bf16", 7, 10.0, 100.0, 9),
        kernel("ncclDevKernel_AllGather_RING_LL", 20, 20.0, 40.0, 1),
        kernel("ncclDevKernel_ReduceScatter_Sum_f32", 20, 120.0, 30.0, 2),
        kernel("ncclDevKernel_AllReduce_Sum_f32", 20, 210.0, 5.0, 3)]}


def test_each_collective_is_charged_to_the_fsdp_unit_that_launched_it():
    from suite.train.step_profile import fsdp_unit, unit_collectives
    assert fsdp_unit("FSDP::all_gather (model.layers.3)") == "model.layers.3"
    assert fsdp_unit("FSDP::post_backward_reduce") == "root"
    kernels = kernels_from_chrome_trace(_fsdp_trace())
    assert {k.name[14:23]: k.unit for k in kernels if k.unit or "nccl" in k.name} == {
        "AllGather": "model.layers.0", "ReduceSca": "root", "AllReduce": ""}
    rows = unit_collectives(kernels, steps=1)
    assert [(r["unit"], r["collective"]) for r in rows] == [
        ("root", "ReduceScatter"), ("-", "AllReduce"), ("model.layers.0", "AllGather")]
    assert rows[0]["ms"] == pytest.approx(0.03) and rows[0]["exposed_ms"] == pytest.approx(0.03)
    assert rows[2]["exposed_ms"] == 0.0 and rows[2]["calls_per_step"] == 1
    s = summarise(kernels, steps=1)
    assert s["root_nccl_ms"] == pytest.approx(0.03)
    assert s["root_nccl_exposed_ms"] == pytest.approx(0.03)


def test_a_run_folders_traces_give_its_units_csv(tmp_path):
    import csv
    from suite.train.step_profile import main
    (tmp_path / "profile.csv").write_text("config,profiled_steps\nown@2,1\n")
    with pytest.raises(FileNotFoundError, match="own@2"):
        main([str(tmp_path)])
    with gzip.open(tmp_path / "trace_own-at-2.json.gz", "wt") as f:
        json.dump(_fsdp_trace(), f)
    main([str(tmp_path)])
    rows = list(csv.DictReader(open(tmp_path / "profile_units.csv")))
    assert [(r["config"], r["unit"]) for r in rows] == [
        ("own@2", "root"), ("own@2", "-"), ("own@2", "model.layers.0")]


def test_the_sweeps_match_their_definitions_on_random_traces():
    """_launch_units' one sweep per thread and _covered's binary search give what their
    definitions say (the innermost FSDP annotation around each launch on its thread; the
    overlap with every cover interval), on random nested and overlapping spans."""
    import random

    from suite.train.step_profile import _covered, _launch_units, _union, fsdp_unit

    rng = random.Random(0)
    for _ in range(50):
        events = []
        for tid in (1, 2):
            for j in range(rng.randint(0, 8)):
                ts, dur = rng.uniform(0, 100), rng.uniform(0, 40)
                events.append({"cat": "user_annotation", "name": f"FSDP::x (u{tid}.{j})",
                               "ts": ts, "dur": dur, "tid": tid})
            for j in range(rng.randint(0, 12)):
                events.append({"cat": "cuda_runtime", "name": "cudaLaunchKernel", "tid": tid,
                               "ts": rng.uniform(0, 120), "args": {"correlation": (tid, j)}})
        rng.shuffle(events)
        want = {}
        for ev in events:
            if ev["cat"] != "cuda_runtime":
                continue
            around = [a for a in events if a["cat"] == "user_annotation"
                      and a["tid"] == ev["tid"] and a["ts"] <= ev["ts"] <= a["ts"] + a["dur"]]
            if around:
                want[ev["args"]["correlation"]] = fsdp_unit(min(around, key=lambda a: a["dur"])["name"])
        assert _launch_units(events) == want

        cover = _union([(x, x + rng.uniform(0, 10)) for x in
                        (rng.uniform(0, 100) for _ in range(rng.randint(0, 10)))])
        a = rng.uniform(0, 100)
        b = a + rng.uniform(0, 30)
        brute = sum(max(0.0, min(b, y) - max(a, x)) for x, y in cover)
        assert _covered((a, b), cover) == pytest.approx(brute)
