"""The runner: failures are data, a killed run resumes without losing or duplicating rows."""
import csv
import json
import math
import os
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest
import torch

from suite import runner
from suite.providers.naive import naive
from suite.results import CSV_NAME, ResultsWriter, done_pairs, read_rows
from suite.schema import PHASES, ROW_FIELDS

ROOT = Path(__file__).resolve().parent.parent
CELL = runner.Cell(dist="lm", n=32, d=16, v=60, dtype="fp32")
CELL_SC = runner.Cell(dist="uniform", n=32, d=16, v=60, dtype="fp32", softcap=30.0)


def _raw_rows(out):
    with open(Path(out) / CSV_NAME, newline="") as f:
        return list(csv.DictReader(f))


def _run(cells, providers, out, **kw):
    return runner.run(cells, providers, PHASES, out, device="cpu", reps=1, warmup=0, quiet=True,
                      **kw)


def test_injected_oom_is_recorded_and_the_run_goes_on(tmp_path, temp_providers):
    def oom(e, c, targets, **kw):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    def broken(e, c, targets, **kw):
        raise ValueError("no kernel for this shape\nsecond line of the message")

    def nan_loss(e, c, targets, **kw):
        return naive(e, c, targets, **kw) * float("nan")

    temp_providers("fake_oom", oom)
    temp_providers("fake_error", broken)
    temp_providers("fake_nan", nan_loss)
    temp_providers("fake_nosoftcap", naive, features=())
    temp_providers("fake_gpu_only", naive, requires=lambda device: "needs a CUDA device")
    names = ["fake_oom", "naive", "fake_error", "fake_nan", "fake_nosoftcap", "fake_gpu_only",
             "chunked"]
    _run([CELL_SC], names, tmp_path)

    rows = read_rows(tmp_path)
    status = {(r["provider"], r["phase"]): r for r in rows}
    assert len(rows) == len(names) * len(PHASES)
    for ph in PHASES:
        assert status["fake_oom", ph]["status"] == "oom"
        assert "out of memory" in status["fake_oom", ph]["error"]
        assert status["fake_error", ph]["status"] == "error"
        assert status["fake_error", ph]["error"] == "ValueError: no kernel for this shape"
        assert status["fake_nan", ph]["status"] == "nan"
        assert status["fake_nosoftcap", ph]["status"] == "unsupported"
        assert "softcap" in status["fake_nosoftcap", ph]["error"]
        assert status["fake_gpu_only", ph]["status"] == "unavailable"
        assert status["fake_gpu_only", ph]["error"] == "needs a CUDA device"
        # The providers after each failure ran normally.
        for good in ("naive", "chunked"):
            r = status[good, ph]
            assert r["status"] == "ok", r
            assert float(r["loss_rel_err"]) < 1e-5
            assert float(r["ms"]) > 0 and int(r["reps"]) == 1
            # the floor is measured, but a CPU time over it is no ×floor (tables show none)
            assert float(r["floor_ms"]) > 0 and r["floor_ratio"] == ""
    for good in ("naive", "chunked"):
        assert float(status[good, "loss+grad"]["de_rel_err"]) < 1e-5
        assert float(status[good, "grad"]["dc_rel_err"]) < 1e-5
        assert status[good, "fwd"]["de_rel_err"] == ""  # no gradient in a forward
    # Every row has the cell's reference statistics once inputs were built.
    assert float(status["naive", "fwd"]["entropy"]) > 0


def test_killed_run_resumes_without_loss_or_duplicates(tmp_path, temp_providers):
    calls = Counter()

    def counted(e, c, targets, **kw):
        calls["counted"] += 1
        return naive(e, c, targets, **kw)

    def killer(e, c, targets, **kw):
        raise KeyboardInterrupt  # not an Exception: stops the run like a kill would

    temp_providers("fake_counted", counted)
    temp_providers("fake_killer", killer)
    cells = [CELL, runner.Cell(dist="uniform", n=32, d=16, v=60, dtype="fp32")]
    with pytest.raises(KeyboardInterrupt):
        _run(cells, ["fake_counted", "chunked", "fake_killer", "naive"], tmp_path)
    before = _raw_rows(tmp_path)
    assert {(r["provider"]) for r in before} == {"fake_counted", "chunked"}
    assert len(before) == 2 * len(PHASES)  # the two pairs finished before the kill
    # A kill in the middle of a write leaves half a line.
    with open(tmp_path / CSV_NAME, "a") as f:
        f.write(",".join(ROW_FIELDS[:5]).replace("cell_id", CELL.cell_id))

    with pytest.raises(FileExistsError, match="--resume"):
        _run(cells, ["naive"], tmp_path)
    calls.clear()
    _run(cells, ["fake_counted", "chunked", "naive"], tmp_path, resume=True)
    after = _raw_rows(tmp_path)
    keys = [(r["cell_id"], r["provider"], r["phase"]) for r in after]
    assert len(keys) == len(set(keys)), "duplicate rows after resume"
    assert len(after) == 2 * 3 * len(PHASES)
    assert after[:len(before)] == before  # rows written before the kill are untouched
    # Only the second cell's fake_counted ran again (warm-up 0 + memory + 1 timed per phase).
    assert calls["counted"] == 2 * len(PHASES)
    assert done_pairs(tmp_path, PHASES) == {(c.cell_id, p) for c in cells
                                            for p in ("fake_counted", "chunked", "naive")}
    env = [p.name for p in tmp_path.glob("env*.json")]
    assert sorted(env) == ["env-2.json", "env.json"]  # one per session
    run_ids = {json.loads((tmp_path / n).read_text())["run_id"] for n in env}
    assert {r["run_id"] for r in after} == run_ids


def test_torn_tail_is_repaired_before_appending(tmp_path):
    w = ResultsWriter(tmp_path, {"x": 1}, "r1")
    w.write([{"cell_id": "a", "provider": "p", "phase": "fwd", "status": "ok", "timestamp": "t"}])
    with open(tmp_path / CSV_NAME, "a") as f:
        f.write("a,half")
    w2 = ResultsWriter(tmp_path, {"x": 1}, "r2")
    w2.write([{"cell_id": "b", "provider": "p", "phase": "fwd", "status": "ok", "timestamp": "t"}])
    rows = _raw_rows(tmp_path)
    assert [r["cell_id"] for r in rows] == ["a", "b"]
    assert all(None not in r for r in rows)


def test_preset_cells_and_overrides():
    gemma = runner.preset_cells("gemma2-2b")
    assert [(c.dist, c.n, c.d, c.v, c.dtype, c.softcap) for c in gemma] == [
        ("uniform", 8192, 2304, 256000, "bf16", 30.0), ("lm", 8192, 2304, 256000, "bf16", 30.0)]
    grid = runner.preset_cells("grid")
    # bf16 N 2048/8192: v x d x dist x n; then three slices (N 32768, fp16, fp32): 3 v x dist
    assert len(grid) == 6 * 2 * 2 * 2 + 3 * (3 * 2)
    assert {(c.dtype, c.n) for c in grid} == {("bf16", 2048), ("bf16", 8192), ("bf16", 32768),
                                              ("fp16", 8192), ("fp32", 2048)}
    assert {c.d for c in grid if c.n == 32768 or c.dtype != "bf16"} == {2304}
    assert {c.v for c in grid if c.n == 32768} == {32000, 128256, 256000}
    small = runner.preset_cells("grid", n=[2048], v=[32000], dtype=["bf16"])
    assert len(small) == 2 * 2  # d x dist; the three products collapse to one after dedup
    assert len({c.cell_id for c in grid}) == len(grid)
    with pytest.raises(ValueError, match="preset must be one of"):
        runner.preset_cells("huge")
    with pytest.raises(ValueError, match="unknown axes"):
        runner.preset_cells("smoke", vocab=[5])


def test_the_lm_entropy_axis_names_its_cells_and_reaches_the_inputs(tmp_path):
    """--lm-entropy: a cell whose lm inputs have another mean entropy is another cell (its id
    says so; the default's id is unchanged), and the run's inputs have that entropy."""
    default, hot = runner.preset_cells("smoke", lm_entropy=[2.2, 3.0])
    assert default.cell_id == runner.preset_cells("smoke")[0].cell_id
    assert hot.cell_id.startswith("lm-h3-") and hot.lm_entropy == 3.0
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "suite", "bench", "--device", "cpu", "--preset", "smoke-sweep",
           "--dist", "lm", "--n", "512", "--v", "300", "--lm-entropy", "3", "--providers", "naive",
           "--phases", "loss", "--quiet", "--out", str(out)]
    subprocess.run(cmd, check=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    rows = read_rows(out)
    assert rows and all(r["cell_id"].startswith("lm-h3-") for r in rows)
    assert abs(float(rows[0]["entropy"]) - 3.0) < 0.15  # calibrated on 512 rows, std ~1.5/sqrt
    bad = subprocess.run(cmd[:-2] + ["--lm-entropy", "0", "--out", str(out)],
                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert bad.returncode == 2 and "--lm-entropy" in bad.stderr


def test_isolate_records_a_crashing_provider_and_goes_on(tmp_path):
    """A provider that kills its process (as a segfault would) is recorded as ``crashed``;
    the providers after it in the same cell are still measured by a fresh child."""
    plugin = tmp_path / "plugin"
    plugin.mkdir()
    (plugin / "crashing_provider.py").write_text(textwrap.dedent("""
        import os, signal
        from suite.registry import register

        @register("fake_segv", summary="kills its own process")
        def fake_segv(e, c, targets, **kw):
            os.kill(os.getpid(), signal.SIGKILL)
    """))
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "suite", "bench", "--device", "cpu", "--preset", "smoke-sweep",
           "--dist", "uniform", "--v", "60", "--n", "32", "--d", "16", "--dtype", "fp32",
           "--softcap", "none", "--ignore-frac", "0", "--no-bias",
           "--providers", "naive,fake_segv,chunked", "--plugin", "crashing_provider",
           "--reps", "1", "--warmup", "0", "--isolate", "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": f"{plugin}{os.pathsep}{ROOT}"}
    res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = read_rows(out)
    status = {(r["provider"], r["phase"]): r["status"] for r in rows}
    assert len(rows) == 3 * len(PHASES)
    for ph in PHASES:
        assert status["naive", ph] == "ok"
        assert status["fake_segv", ph] == "crashed"
        assert status["chunked", ph] == "ok"
    err = next(r["error"] for r in rows if r["provider"] == "fake_segv")
    assert "signal 9" in err and "fake_segv" in err


def test_isolate_provider_gives_each_provider_its_own_process_and_reruns(tmp_path):
    """--isolate provider: one child per (cell, provider), each a different process; with
    --resume --rerun the rerun provider gets new rows (of the new run) beside its old ones."""
    plugin = tmp_path / "plugin"
    plugin.mkdir()
    (plugin / "pid_providers.py").write_text(textwrap.dedent("""
        import os
        from pathlib import Path
        from suite.providers.naive import naive
        from suite.registry import register

        def _logged(name):
            def fn(e, c, targets, **kw):
                with open(Path(os.environ["PID_LOG"]), "a") as f:
                    f.write(f"{name} {os.getpid()}\\n")
                return naive(e, c, targets, **kw)
            return fn

        register("pid_a", summary="naive, logs its pid")(_logged("pid_a"))
        register("pid_b", summary="naive, logs its pid")(_logged("pid_b"))
    """))
    out, log = tmp_path / "run", tmp_path / "pids.txt"
    base = [sys.executable, "-m", "suite", "bench", "--device", "cpu", "--preset", "smoke-sweep",
            "--dist", "uniform", "--v", "60", "--n", "32", "--d", "16", "--dtype", "fp32",
            "--softcap", "none", "--ignore-frac", "0", "--no-bias", "--plugin", "pid_providers",
            "--reps", "1", "--warmup", "0", "--phases", "fwd", "--out", str(out), "--quiet"]
    env = {**os.environ, "PYTHONPATH": f"{plugin}{os.pathsep}{ROOT}", "PID_LOG": str(log)}

    def bench(*extra):
        res = subprocess.run(base + list(extra), cwd=ROOT, env=env, capture_output=True,
                             text=True, timeout=600)
        assert res.returncode == 0, res.stderr[-3000:]

    bench("--providers", "pid_a,pid_b", "--isolate", "provider")
    pids = {}
    for line in log.read_text().splitlines():
        name, pid = line.split()
        pids.setdefault(name, set()).add(pid)
    assert pids.keys() == {"pid_a", "pid_b"} and not pids["pid_a"] & pids["pid_b"]
    bench("--providers", "pid_a,pid_b", "--resume", "--rerun", "pid_b", "--isolate", "provider")
    raw = Counter(r["provider"] for r in _raw_rows(out))
    assert raw == {"pid_a": 1, "pid_b": 2}  # one fwd row each, pid_b measured again


def test_numbers_are_consistent():
    from suite.measure import percentile, time_stats

    s = time_stats([5.0, 1.0, 3.0, 2.0, 4.0])
    assert s["ms"] == 3.0 and s["ms_min"] == 1.0 and s["reps"] == 5
    assert s["ms_p20"] == pytest.approx(1.8) and s["ms_p80"] == pytest.approx(4.2)
    assert percentile([7.0], 0.2) == 7.0
    assert not math.isnan(s["ms_p80"])


def test_rerun_measures_again_and_keeps_the_old_rows(tmp_path):
    _run([CELL], ["naive", "chunked"], tmp_path)
    first = _raw_rows(tmp_path)
    with pytest.raises(ValueError, match="resume"):
        _run([CELL], ["naive"], tmp_path / "other", rerun=["naive"])
    _run([CELL], ["naive", "chunked"], tmp_path, resume=True, rerun=["naive"])
    after = _raw_rows(tmp_path)
    assert after[:len(first)] == first  # nothing measured is dropped
    new = after[len(first):]
    assert {r["provider"] for r in new} == {"naive"} and len(new) == len(PHASES)
    assert new[0]["run_id"] != first[0]["run_id"]


def test_commit_override_wins_over_git(monkeypatch):
    # A copy of the checkout on a GPU machine can carry a stale .git: the commit named by
    # CCE_BENCH_COMMIT must be recorded, not what git says.
    from suite.results import environment, git_commit

    monkeypatch.delenv("CCE_BENCH_COMMIT", raising=False)
    detected, _ = git_commit()
    monkeypatch.setenv("CCE_BENCH_COMMIT", "0123456789abcdef")
    assert git_commit() == ("0123456789abcdef", None)
    env = environment("cpu")
    assert env["git_commit"] == "0123456789abcdef" != detected and env["git_dirty"] is None


def test_the_own_kernels_config_overrides_are_recorded(monkeypatch):
    # A run measured under CCE_OWN_CONFIG is another configuration of the kernel: its
    # environment must say so, or its rows read as the defaults'.
    from suite.results import environment

    monkeypatch.delenv("CCE_OWN_CONFIG", raising=False)
    assert environment("cpu")["own_config_overrides"] is None
    monkeypatch.setenv("CCE_OWN_CONFIG", '{"fused": {"block": 4096}}')
    assert environment("cpu")["own_config_overrides"] == '{"fused": {"block": 4096}}'


def test_a_gpu_run_names_its_board_by_uuid_power_limit_and_clock(monkeypatch):
    # Boards of one model hold different clocks at their power limit: a run must say which ran.
    import subprocess
    from types import SimpleNamespace

    from suite import results

    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda index: SimpleNamespace(uuid="6f1c-aa"))
    asked = []

    def smi(cmd, **kw):
        asked.append(cmd)
        return SimpleNamespace(stdout="700.00, 1980\n")

    monkeypatch.setattr(subprocess, "run", smi)
    assert results.gpu_board(0) == {"gpu_uuid": "6f1c-aa", "power_limit_w": 700.0,
                                    "sm_clock_max_mhz": 1980}
    assert asked[0][:3] == ["nvidia-smi", "-i", "GPU-6f1c-aa"]

    def missing(cmd, **kw):
        raise FileNotFoundError("nvidia-smi")

    monkeypatch.setattr(subprocess, "run", missing)
    assert results.gpu_board(0) == {"gpu_uuid": "6f1c-aa", "power_limit_w": None,
                                    "sm_clock_max_mhz": None}
