"""CPU tests of the regression gate (suite/gate.py): the comparison on hand-built results rows,
the refusal of a missing or foreign baseline, ``--save`` writing the baseline folder, the CLI on
run folders built here, the measurement through the runner at tiny shapes, and the degraded
variants (suite/degrade.py). Nothing is written to results/.
"""
from __future__ import annotations

import gc
import json
import math

import pytest
import torch

from suite import catalog, cli, degrade, gate, registry
from suite.results import CSV_NAME, ENV_NAME, ResultsWriter, read_rows

H100 = "NVIDIA H100 80GB HBM3"
H200 = "NVIDIA H200"
FWD = "gemma2-2b/own/fwd"
BWD = "gemma2-2b/own/loss+grad"


def row(name, ms, mib=None, de=None, dc=None, status="ok", error=None, run_id="r1"):
    """A results row (schema names) of the gate's cell for benchmark ``name``."""
    shape, provider, phase = name.split("/")
    cell = gate.gate_cells()[shape]
    return {**cell.fields(), "provider": provider, "phase": phase, "status": status,
            "error": error, "ms": ms, "peak_extra_mib": mib, "de_rel_err": de,
            "dc_rel_err": dc, "device": H100, "run_id": run_id,
            "timestamp": "2026-11-24T00:00:00+00:00"}


def by_name(*rows):
    return gate.rows_by_benchmark(list(rows))


def baseline_rows():
    return by_name(row(FWD, 20.0, mib=0.1), row(BWD, 50.0, mib=1164.0, de=4e-3, dc=2e-3))


def verdicts(rows):
    return {(r["benchmark"], r["metric"]): r["verdict"] for r in rows}


def failing(rows):
    return [(r["benchmark"], r["metric"]) for r in gate.failed_rows(rows)]


# ---- selection --------------------------------------------------------------------------

def test_gpu_slug():
    assert gate.gpu_slug(H100) == "nvidia-h100-80gb-hbm3"
    assert gate.gpu_slug(H200) == "nvidia-h200"
    with pytest.raises(ValueError, match="GPU name"):
        gate.gpu_slug("  ")


def test_keyword_selection():
    assert gate.keyword_matches("own", "small/own_filter/fwd")
    assert not gate.keyword_matches("own and not filter", "small/own_filter/fwd")
    assert gate.keyword_matches("(liger or own) and fwd", "gemma2-2b/own/fwd")
    assert not gate.keyword_matches("liger", "gemma2-2b/own/fwd")
    assert gate.keyword_matches(None, "anything")
    with pytest.raises(gate.GateError, match="-k"):
        gate.keyword_matches("own and", "gemma2-2b/own/fwd")


def test_plan_runs_peers_at_gemma_only_unless_all_shapes():
    names = {b.name for b in gate.plan(["own", "own_filter", "liger"])}
    assert "llama3-8b/own/fwd" in names and "small/own_filter/loss+grad" in names
    assert "gemma2-2b/liger/loss+grad" in names and "llama3-8b/liger/fwd" not in names
    assert len(names) == 2 * 3 * 2 + 2  # own kernel: 2 providers x 3 shapes x 2 phases
    every = {b.name for b in gate.plan(["liger"], all_shapes=True)}
    assert "small/liger/fwd" in every
    assert {b.name for b in gate.plan(["own", "liger"], keyword="own and fwd")} == {
        "gemma2-2b/own/fwd", "llama3-8b/own/fwd", "small/own/fwd"}


def test_rows_map_to_benchmarks_and_degraded_variants_to_their_provider():
    r = row(FWD, 1.0)
    other = dict(row(FWD, 1.0), cell_id="uniform-n64-d32-v257-fp32-scnone-ig0-b0-s0")
    slow = dict(row(FWD, 1.0), provider="own_slow")
    assert list(gate.rows_by_benchmark([r, other])) == [FWD]
    assert list(gate.rows_by_benchmark([slow])) == [FWD]
    assert gate.rows_by_benchmark([r], selected={BWD}) == {}


# ---- comparison -------------------------------------------------------------------------

def test_compare_passes_within_thresholds():
    now = by_name(row(FWD, 21.0, mib=0.6), row(BWD, 54.0, mib=1200.0, de=5e-3, dc=2e-3))
    rows = gate.compare(baseline_rows(), now)
    assert gate.failed_rows(rows) == []
    v = verdicts(rows)
    assert v[(FWD, "ms")] == "ok" and v[(BWD, "peak_extra_mib")] == "ok"
    assert v[(BWD, "de_rel_err")] == "ok" and v[(BWD, "dc_rel_err")] == "ok"
    assert (FWD, "de_rel_err") not in v  # the forward has no gradient


def test_time_regression():
    now = by_name(row(FWD, 23.0, mib=0.1), row(BWD, 50.0, mib=1164.0, de=4e-3, dc=2e-3))
    rows = gate.compare(baseline_rows(), now, gate.Thresholds(time=0.10))
    assert failing(rows) == [(FWD, "ms")]
    change = next(r["change"] for r in rows if r["benchmark"] == FWD and r["metric"] == "ms")
    assert math.isclose(change, 0.15)
    assert gate.failed_rows(gate.compare(baseline_rows(), now, gate.Thresholds(time=0.20))) == []


def test_memory_regression_and_slack():
    now = by_name(row(FWD, 20.0, mib=0.1), row(BWD, 50.0, mib=1300.0, de=4e-3, dc=2e-3))
    assert failing(gate.compare(baseline_rows(), now)) == [(BWD, "peak_extra_mib")]
    assert gate.failed_rows(gate.compare(baseline_rows(), now, gate.Thresholds(mem=0.2))) == []
    # 1 MiB of slack keeps a near-zero forward from failing; a real buffer does not hide in it.
    assert gate.failed_rows(gate.compare(baseline_rows(), by_name(row(FWD, 20.0, mib=0.9)))) == []
    buffer = by_name(row(FWD, 20.0, mib=64.1))
    assert failing(gate.compare(baseline_rows(), buffer)) == [(FWD, "peak_extra_mib")]


def test_gradient_error_regression():
    now = by_name(row(BWD, 50.0, mib=1164.0, de=1e-2, dc=2e-3))
    assert failing(gate.compare(baseline_rows(), now)) == [(BWD, "de_rel_err")]
    nan = by_name(row(BWD, 50.0, mib=1164.0, de=4e-3, dc=float("nan")))
    assert failing(gate.compare(baseline_rows(), nan)) == [(BWD, "dc_rel_err")]
    assert gate.failed_rows(gate.compare(baseline_rows(), now, gate.Thresholds(err=2.0))) == []


def test_failing_status_not_run_missing_and_new():
    new = "small/own/fwd"
    now = by_name(row(BWD, None, status="oom", error="OutOfMemoryError: CUDA out of memory"),
                  row(new, 3.0, mib=0.1))
    rows = gate.compare(baseline_rows(), now, selected={FWD, BWD, new})
    v = verdicts(rows)
    assert v[(BWD, "status")] == "FAILED"
    assert v[(FWD, "status")] == "FAILED"  # selected, in the baseline, no row now
    assert v[(new, "ms")] == "new"
    assert sorted(failing(rows)) == sorted([(BWD, "status"), (FWD, "status")])
    # Not selected: a baseline benchmark without a row is not this run's business.
    assert (FWD, "status") not in verdicts(gate.compare(baseline_rows(), now, selected={BWD}))
    # A provider that cannot run here says why and does not fail.
    absent = by_name(row(FWD, None, status="unavailable", error="liger-kernel is not installed"))
    assert verdicts(gate.compare(baseline_rows(), absent, selected={FWD})) == {
        (FWD, "status"): "not run"}


def test_thresholds_are_validated_by_name():
    with pytest.raises(gate.GateError, match="--mem-threshold"):
        gate.Thresholds(mem=-0.1)
    with pytest.raises(gate.GateError, match="--time-threshold"):
        gate.Thresholds(time=float("nan"))


def test_table_has_one_line_per_row():
    rows = gate.compare(baseline_rows(), by_name(row(FWD, 30.0, mib=0.1)))
    lines = gate.format_table(rows).splitlines()
    assert lines[0].split() == ["benchmark", "metric", "baseline", "now", "change", "verdict"]
    assert len(lines) == 2 + len(rows)
    assert "+50.0%" in lines[2] and "REGRESSED" in lines[2]


# ---- baseline folders -------------------------------------------------------------------

def write_run(folder, gpu, rows):
    env = {"gpu_name": gpu, "date": "2026-11-24T00:00:00+00:00", "git_commit": "abc"}
    ResultsWriter(folder, env, rows[0]["run_id"]).write(rows)
    return folder


def test_missing_baseline_says_how_to_create_it(tmp_path):
    write_run(tmp_path / "nvidia-h200", H200, [row(FWD, 1.0)])
    with pytest.raises(gate.GateError) as err:
        gate.load_baseline(gate.baseline_folder(tmp_path, H100), H100)
    assert "python -m suite gate --save" in str(err.value)
    assert "nvidia-h200" in str(err.value)


def test_foreign_or_anonymous_baseline_refused(tmp_path):
    folder = write_run(tmp_path / "b", H200, [row(FWD, 1.0)])
    with pytest.raises(gate.GateError, match="refusing to compare.*H200"):
        gate.load_baseline(folder, H100)
    (folder / ENV_NAME).write_text(json.dumps({"gpu_name": None}))
    with pytest.raises(gate.GateError, match="records no GPU"):
        gate.load_baseline(folder, H100)


def test_save_writes_the_folder_and_merges(tmp_path):
    run = write_run(tmp_path / "run", H100, [row(FWD, 20.0, mib=0.1),
                                            row(BWD, None, status="error", error="boom")])
    folder = tmp_path / "base"
    now = gate.rows_by_benchmark(read_rows(run))
    assert gate.save_baseline(folder, run, now, merge=False) == (1, 1)
    assert json.loads((folder / ENV_NAME).read_text())["gpu_name"] == H100
    assert list(gate.rows_by_benchmark(read_rows(folder))) == [FWD]  # the failure left out
    # Merging a later run of another benchmark keeps FWD; a full save replaces everything.
    later = write_run(tmp_path / "later", H100, [row(BWD, 50.0, mib=9.0, run_id="r2")])
    now2 = gate.rows_by_benchmark(read_rows(later))
    assert gate.save_baseline(folder, later, now2, merge=True) == (2, 0)
    assert sorted(gate.rows_by_benchmark(read_rows(folder))) == sorted([FWD, BWD])
    gate.save_baseline(folder, later, now2, merge=False)
    assert list(gate.rows_by_benchmark(read_rows(folder))) == [BWD]
    assert sorted(p.name for p in folder.iterdir()) == sorted([CSV_NAME, ENV_NAME])


# ---- the CLI ----------------------------------------------------------------------------

def gate_cli(*args):
    return cli.main(["gate", *map(str, args)])


def test_cli_save_pass_fail_and_refuse(tmp_path, capsys):
    base_dir = tmp_path / "baselines"
    good = write_run(tmp_path / "good", H100, [row(FWD, 20.0, mib=0.1),
                                              row(BWD, 50.0, mib=1164.0, de=4e-3, dc=2e-3)])
    common = ["--baseline-dir", base_dir, "-k", "gemma2-2b and own and not filter"]
    assert gate_cli("--run", good, *common) == 2  # no baseline yet
    assert "python -m suite gate --save" in capsys.readouterr().err
    assert gate_cli("--save", "--run", good, *common) == 0
    assert (base_dir / "nvidia-h100-80gb-hbm3" / CSV_NAME).is_file()
    assert gate_cli("--run", good, *common) == 0
    assert "gate: PASS" in capsys.readouterr().out
    slow = write_run(tmp_path / "slow", H100, [row(FWD, 30.0, mib=0.1),
                                              row(BWD, 50.0, mib=1164.0, de=4e-3, dc=2e-3)])
    assert gate_cli("--run", slow, *common) == 1
    out = capsys.readouterr().out
    assert "gate: FAIL" in out and "REGRESSED" in out
    assert gate_cli("--run", slow, *common, "--time-threshold", "0.6") == 0
    foreign = write_run(tmp_path / "h200", H200, [row(FWD, 20.0, mib=0.1)])
    assert gate_cli("--run", foreign, "--baseline", base_dir / "nvidia-h100-80gb-hbm3") == 2
    assert "refusing to compare" in capsys.readouterr().err


def test_cli_bad_input_names_the_argument(tmp_path, capsys):
    run = write_run(tmp_path / "run", H100, [row(FWD, 20.0)])
    assert gate_cli("--run", run, "--providers", "nope") == 2
    assert "--providers" in capsys.readouterr().err
    assert gate_cli("--run", run, "-k", "nothing-matches-this") == 2
    assert "no benchmark selected" in capsys.readouterr().err
    assert gate_cli("--run", run, "--err-threshold", "-1") == 2
    assert "--err-threshold" in capsys.readouterr().err
    assert gate_cli("--save", "--degrade", "slow") == 2
    assert "degraded baseline" in capsys.readouterr().err
    assert gate_cli("--run", tmp_path / "none") == 2
    assert "--run" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a CUDA device")
def test_cli_without_cuda_refuses(tmp_path, capsys):
    assert gate_cli("--baseline-dir", tmp_path) == 2
    assert "no CUDA device" in capsys.readouterr().err


# ---- measuring through the runner, degraded variants ----------------------------------------

@pytest.fixture
def tiny_gate(monkeypatch):
    """The gate's cells at a tiny shape, in fp32 (the CPU's interpreter refuses bf16: its bf16
    arithmetic is wrong), and the degraded providers removed afterwards."""
    tiny = gate.Shape("gemma2-2b", "tiny", n=64, d=32, v=257, softcap=30.0)
    monkeypatch.setattr(gate, "GATE_SHAPES", {"gemma2-2b": tiny})
    monkeypatch.setattr(gate, "DTYPE", "fp32")
    yield
    for name in list(registry.PROVIDERS):
        if degrade.base_provider(name) != name:
            registry.PROVIDERS.pop(name)


def test_measure_goes_through_the_runner(tiny_gate, tmp_path):
    benchmarks = gate.plan(["own", "naive"], keyword="fwd or naive")
    out = gate.measure(benchmarks, tmp_path / "run", degrade="slow", reps=1, warmup=0,
                       device="cpu")
    rows = read_rows(out)
    # The runner measures the union of the selected phases; the gate keeps the selected ones.
    assert sorted((r["provider"], r["phase"]) for r in rows) == [
        ("naive", "fwd"), ("naive", "loss+grad"), ("own_slow", "fwd"), ("own_slow", "loss+grad")]
    assert all(r["status"] == "ok" and float(r["ms"]) > 0 for r in rows)
    selected = {b.name for b in benchmarks}
    assert sorted(gate.rows_by_benchmark(rows, selected)) == [
        "gemma2-2b/naive/fwd", "gemma2-2b/naive/loss+grad", "gemma2-2b/own/fwd"]


def counting_provider(calls):
    def fn(e, c, targets, **kwargs):
        calls.append(torch.is_grad_enabled())
        return torch.nn.functional.cross_entropy((e @ c.T).float(), targets)

    return fn


def test_slow_runs_one_extra_forward_without_autograd():
    calls = []
    e, c = torch.randn(8, 4, requires_grad=True), torch.randn(16, 4, requires_grad=True)
    targets = torch.randint(0, 16, (8,))
    loss = degrade.slow(counting_provider(calls))(e, c, targets)
    assert calls == [False, True]
    ref = counting_provider([])(e, c, targets)
    assert torch.equal(loss, ref)


def test_hungry_holds_a_quarter_classifier_buffer_until_the_backward():
    shape = degrade.hungry_buffer_shape(16, 4)
    assert shape == (4, 4)
    seen_in_backward = []

    def fn(e, c, targets, **kwargs):
        class Spy(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x.view_as(x)

            @staticmethod
            def backward(ctx, grad):
                gc.collect()
                seen_in_backward.append(sum(
                    1 for o in gc.get_objects()
                    if type(o) is torch.Tensor and tuple(o.shape) == shape))
                return grad

        return torch.nn.functional.cross_entropy(Spy.apply(e @ c.T), targets)

    e, c = torch.randn(8, 4, requires_grad=True), torch.randn(16, 4, requires_grad=True)
    targets = torch.randint(0, 16, (8,))
    degrade.hungry(fn)(e, c, targets).backward()
    assert seen_in_backward == [1]
    grads = (e.grad.clone(), c.grad.clone())
    e.grad = c.grad = None
    fn(e, c, targets).backward()
    assert torch.equal(grads[0], e.grad) and torch.equal(grads[1], c.grad)


def test_degraded_variants_registered_under_their_own_names(tiny_gate):
    names = degrade.register_degraded("hungry")
    assert names == ["own_hungry", "own_filter_hungry"]
    assert catalog.get("own_hungry").exact and not catalog.get("own_filter_hungry").exact
    assert degrade.base_provider("own_filter_hungry") == "own_filter"
    with pytest.raises(ValueError, match="degrade mode"):
        degrade.degraded_name("own", "fast")


def test_cli_measures_saves_passes_and_fails_on_degraded(monkeypatch, tmp_path, capsys):
    """The measuring entry (no --run) with the GPU and the runner replaced by a fake that
    writes a run folder: 'save, pass, slow fails, hungry fails' as on the GPU."""
    def fake_measure(benchmarks, out, *, degrade=None, reps=None, warmup=None, device="cuda"):
        ms, mib = (2.0, 10.0) if degrade == "slow" else (1.0, 10.0)
        rows = []
        for b in benchmarks:
            provider = degrade and b.provider in gate.OWN_PROVIDERS and f"{b.provider}_{degrade}"
            hungry = degrade == "hungry" and b.phase == "loss+grad"
            rows.append(row(b.name, ms, mib=mib + 100 * hungry, de=1e-3, dc=1e-3))
            rows[-1]["provider"] = provider or b.provider
        return write_run(out, H100, rows)

    monkeypatch.setattr(gate, "current_gpu_name", lambda: H100)
    monkeypatch.setattr(gate, "measure", fake_measure)
    common = ["--baseline-dir", tmp_path / "b", "--providers", "own,own_filter"]
    assert gate_cli(*common, "--save", "--out", tmp_path / "1") == 0
    assert gate_cli(*common, "--out", tmp_path / "2") == 0
    assert gate_cli(*common, "--degrade", "slow", "--out", tmp_path / "3") == 1
    slow = capsys.readouterr().out
    assert "DEGRADED" in slow and "small/own_filter/fwd" in slow
    assert gate_cli(*common, "--degrade", "hungry", "--out", tmp_path / "4") == 1
    hungry = capsys.readouterr().out.splitlines()
    regressed = [line.split()[:2] for line in hungry if line.endswith("REGRESSED")]
    assert {metric for _, metric in regressed} == {"peak_extra_mib"}
    assert len(regressed) == 2 * 3  # own, own_filter x 3 shapes, loss+grad only


def test_prove_gate_script_steps_parse():
    """tests/bench/prove_gate.sh's steps are valid gate arguments, expecting the right exits."""
    from pathlib import Path

    script = Path(__file__).parent / "bench" / "prove_gate.sh"
    steps = [line.split()[1:] for line in script.read_text().splitlines()
             if line.startswith("step ")]
    assert [s[:2] for s in steps] == [["1_save", "0"], ["2_pass", "0"], ["3_slow", "1"],
                                      ["4_hungry", "1"]]
    parser = cli.build_parser("gate")
    for _, _, *args in steps:
        parsed = parser.parse_args(["gate", "--out", "x", *args])
        assert parsed.save == (args == ["--save"])
    assert {parser.parse_args(["gate", *s[2:]]).degrade for s in steps} == {None, "slow", "hungry"}
