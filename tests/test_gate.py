"""CPU tests of the regression gate (suite/gate.py) on small synthetic pytest-benchmark JSONs.

The JSONs are built here, in the tests; nothing is written to results/.
"""
from __future__ import annotations

import argparse
import json
import math
import textwrap
from pathlib import Path

import pytest

from suite import gate

H100 = "NVIDIA H100 80GB HBM3"
H200 = "NVIDIA H200"


def bench(name, ms, mib=None, de=None, dc=None):
    s = ms / 1e3
    stats = {"min": s, "max": s, "mean": s, "stddev": 0.0, "rounds": 5, "median": s, "iqr": 0.0,
             "q1": s, "q3": s, "iqr_outliers": 0, "stddev_outliers": 0, "outliers": "0;0",
             "ld15iqr": s, "hd15iqr": s, "ops": 1 / s, "total": 5 * s, "iterations": 1,
             "data": [s] * 5}
    info = {k: v for k, v in (("peak_extra_mib", mib), ("de_rel_err", de), ("dc_rel_err", dc))
            if v is not None}
    return {"group": None, "name": name, "fullname": f"tests/bench/test_bench_loss.py::{name}",
            "params": None, "param": None, "extra_info": info, "options": {}, "stats": stats}


def run_json(gpu, benches):
    return {"machine_info": {"gpu": {"name": gpu, "driver": "1", "cuda": "12"}, "libraries": {}},
            "commit_info": {}, "benchmarks": benches, "datetime": "2026-11-22T00:00:00",
            "version": "5.2.3"}


FWD = "test_loss[gemma2-2b-own-fwd]"
BWD = "test_loss[gemma2-2b-own-loss+grad]"


def baseline_json(gpu=H100):
    return run_json(gpu, [bench(FWD, 20.0, mib=0.1), bench(BWD, 50.0, mib=1164.0, de=4e-3, dc=2e-3)])


def verdicts(rows):
    return {(r["benchmark"], r["metric"]): r["verdict"] for r in rows}


def test_gpu_slug():
    assert gate.gpu_slug(H100) == "nvidia-h100-80gb-hbm3"
    assert gate.gpu_slug(H200) == "nvidia-h200"
    with pytest.raises(ValueError, match="GPU name"):
        gate.gpu_slug("  ")


def test_compare_passes_within_thresholds():
    now = run_json(H100, [bench(FWD, 21.0, mib=0.6), bench(BWD, 54.0, mib=1200.0, de=5e-3, dc=2e-3)])
    rows = gate.compare(baseline_json(), now)
    assert gate.failed_rows(rows) == []
    v = verdicts(rows)
    assert v[(FWD, "median_ms")] == "ok" and v[(BWD, "peak_extra_mib")] == "ok"
    assert v[(BWD, "de_rel_err")] == "ok" and v[(BWD, "dc_rel_err")] == "ok"
    assert (FWD, "de_rel_err") not in v  # the forward has no gradient


def test_time_regression():
    now = run_json(H100, [bench(FWD, 23.0, mib=0.1), bench(BWD, 50.0, mib=1164.0, de=4e-3, dc=2e-3)])
    rows = gate.compare(baseline_json(), now, time_threshold=0.10)
    assert [(r["benchmark"], r["metric"]) for r in gate.failed_rows(rows)] == [(FWD, "median_ms")]
    row = next(r for r in rows if r["benchmark"] == FWD and r["metric"] == "median_ms")
    assert math.isclose(row["change"], 0.15)
    # A looser threshold lets the same run pass.
    assert gate.failed_rows(gate.compare(baseline_json(), now, time_threshold=0.20)) == []


def test_time_regression_flagged_by_pytest_benchmark_counts():
    now = run_json(H100, [bench(FWD, 20.0, mib=0.1)])
    rows = gate.compare(baseline_json(), now, time_flagged={FWD})
    assert verdicts(rows)[(FWD, "median_ms")] == "REGRESSED"


def test_memory_regression():
    now = run_json(H100, [bench(FWD, 20.0, mib=0.1), bench(BWD, 50.0, mib=1300.0, de=4e-3, dc=2e-3)])
    rows = gate.compare(baseline_json(), now, mem_threshold=0.05)
    assert [(r["benchmark"], r["metric"]) for r in gate.failed_rows(rows)] == [(BWD, "peak_extra_mib")]
    assert gate.failed_rows(gate.compare(baseline_json(), now, mem_threshold=0.2)) == []


def test_memory_slack_protects_near_zero_baseline_but_not_a_buffer():
    small = run_json(H100, [bench(FWD, 20.0, mib=0.9)])
    assert gate.failed_rows(gate.compare(baseline_json(), small)) == []
    buffer = run_json(H100, [bench(FWD, 20.0, mib=64.1)])
    assert verdicts(gate.compare(baseline_json(), buffer))[(FWD, "peak_extra_mib")] == "REGRESSED"


def test_gradient_error_regression():
    now = run_json(H100, [bench(BWD, 50.0, mib=1164.0, de=1e-2, dc=2e-3)])
    rows = gate.compare(baseline_json(), now, err_threshold=1.0)
    assert [(r["benchmark"], r["metric"]) for r in gate.failed_rows(rows)] == [(BWD, "de_rel_err")]
    nan = run_json(H100, [bench(BWD, 50.0, mib=1164.0, de=4e-3, dc=float("nan"))])
    assert verdicts(gate.compare(baseline_json(), nan))[(BWD, "dc_rel_err")] == "REGRESSED"


def test_failed_new_and_not_run_benchmarks():
    other = "test_loss[small-own-fwd]"
    now = run_json(H100, [bench(BWD, 50.0, mib=1164.0, de=4e-3, dc=2e-3), bench(other, 3.0, mib=0.1)])
    outcomes = {FWD: "skipped", BWD: "failed", other: "passed"}
    rows = gate.compare(baseline_json(), now, outcomes=outcomes)
    v = verdicts(rows)
    assert v[(BWD, "test")] == "FAILED"
    assert v[(FWD, "test")] == "not run"  # in the baseline, skipped now: shown, does not fail
    assert v[(other, "median_ms")] == "new"
    assert [r["verdict"] for r in gate.failed_rows(rows)] == ["FAILED"]


def test_table_has_one_line_per_row():
    now = run_json(H100, [bench(FWD, 30.0, mib=0.1)])
    rows = gate.compare(baseline_json(), now)
    table = gate.format_table(rows)
    lines = table.splitlines()
    assert lines[0].split() == ["benchmark", "metric", "baseline", "now", "change", "verdict"]
    assert len(lines) == 2 + len(rows)
    assert "+50.0%" in table and "REGRESSED" in table


def test_wrong_gpu_baseline_refused(tmp_path):
    path = tmp_path / "nvidia-h100-80gb-hbm3.json"
    path.write_text(json.dumps(baseline_json(gpu=H200)))
    with pytest.raises(gate.GateError, match="refusing to compare") as err:
        gate.load_baseline(path, H100)
    assert H200 in str(err.value) and H100 in str(err.value)
    assert gate.load_baseline(path, H200)["benchmarks"]


def test_missing_baseline_says_how_to_create_it(tmp_path):
    (tmp_path / "nvidia-h200.json").write_text(json.dumps(baseline_json(gpu=H200)))
    with pytest.raises(gate.GateError, match="--save") as err:
        gate.load_baseline(gate.baseline_path(tmp_path, H100), H100)
    assert "nvidia-h200" in str(err.value)


def test_baseline_without_gpu_refused(tmp_path):
    path = tmp_path / "x.json"
    data = baseline_json()
    data["machine_info"] = {}
    path.write_text(json.dumps(data))
    with pytest.raises(gate.GateError, match="records no GPU"):
        gate.load_baseline(path, H100)


def test_parse_time_regressions():
    output = textwrap.dedent("""\
        ..
        --------------------------------------------------------------------------------
        Performance has regressed:
        \ttest_loss[gemma2-2b-own-fwd] (/tmp/base.json) - Field 'median' has failed PercentageRegressionCheck: 35.1 > 10.0
        \ttest_loss[small-own-loss+grad] (/tmp/base.json) - Field 'median' has failed PercentageRegressionCheck: 12.0 > 10.0
        --------------------------------------------------------------------------------
        """)
    assert gate.parse_time_regressions(output) == {FWD, "test_loss[small-own-loss+grad]"}
    assert gate.parse_time_regressions("2 passed") == set()


def test_merge_baseline_keeps_unselected():
    old = baseline_json()
    new = run_json(H100, [bench(FWD, 25.0, mib=0.1)])
    merged = gate.merge_baseline(old, new)
    got = {b["name"]: b["stats"]["median"] for b in merged["benchmarks"]}
    assert got == {FWD: 0.025, BWD: 0.05}


def parse_args(argv):
    parser = argparse.ArgumentParser()
    gate.add_arguments(parser)
    return parser.parse_args(argv)


def test_threshold_must_be_whole_percent(monkeypatch, capsys):
    monkeypatch.setattr(gate, "current_gpu_name", lambda: H100)
    assert gate.main(parse_args(["--time-threshold", "0.125"])) == 2
    assert "whole percentage" in capsys.readouterr().err


def test_no_cuda_device(monkeypatch, capsys):
    monkeypatch.setattr(gate, "current_gpu_name", lambda: None)
    assert gate.main(parse_args([])) == 2
    assert "no CUDA device" in capsys.readouterr().err


def fake_runner(now_json, outcomes=None, rc=0, output=""):
    """Stands in for the pytest run: writes ``now_json`` where --benchmark-json points."""
    calls = []

    def run(pytest_args, env):
        calls.append(pytest_args)
        path = next(a.split("=", 1)[1] for a in pytest_args if a.startswith("--benchmark-json="))
        # pytest-benchmark leaves the file empty when no benchmark ran.
        Path(path).write_text("" if now_json is None else json.dumps(now_json))
        if outcomes:
            junit = next(a.split("=", 1)[1] for a in pytest_args if a.startswith("--junitxml="))
            cases = "".join(f'<testcase classname="x" name="{n}">'
                            + ("<failure/>" if o == "failed" else "") + "</testcase>"
                            for n, o in outcomes.items())
            Path(junit).write_text(f"<testsuites><testsuite>{cases}</testsuite></testsuites>")
        return rc, output

    run.calls = calls
    return run


def test_main_save_then_pass_then_fail(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(gate, "current_gpu_name", lambda: H100)
    bdir = tmp_path / "baselines"
    # No baseline yet: refused with instructions.
    assert gate.main(parse_args(["--baseline-dir", str(bdir)])) == 2
    assert "--save" in capsys.readouterr().err

    runner = fake_runner(baseline_json())
    monkeypatch.setattr(gate, "run_benchmarks", runner)
    assert gate.main(parse_args(["--baseline-dir", str(bdir), "--save"])) == 0
    saved = json.loads((bdir / "nvidia-h100-80gb-hbm3.json").read_text())
    assert {b["name"] for b in saved["benchmarks"]} == {FWD, BWD}
    assert not any(a.startswith("--benchmark-compare") for a in runner.calls[0])

    runner = fake_runner(baseline_json())
    monkeypatch.setattr(gate, "run_benchmarks", runner)
    assert gate.main(parse_args(["--baseline-dir", str(bdir)])) == 0
    out = capsys.readouterr().out
    assert "gate: PASS" in out and "verdict" in out
    args = runner.calls[0]
    assert f"--benchmark-compare={bdir / 'nvidia-h100-80gb-hbm3.json'}" in args
    assert "--benchmark-compare-fail=median:10%" in args

    hungry = run_json(H100, [bench(FWD, 20.0, mib=0.1), bench(BWD, 50.0, mib=1460.0, de=4e-3, dc=2e-3)])
    monkeypatch.setattr(gate, "run_benchmarks", fake_runner(hungry))
    assert gate.main(parse_args(["--baseline-dir", str(bdir), "-k", "own"])) == 1
    out = capsys.readouterr().out
    assert "gate: FAIL" in out and "peak_extra_mib" in out

    # pytest-benchmark's time verdict arrives as exit status 1 plus its report.
    report = f"Performance has regressed:\n\t{FWD} (base) - Field 'median' has failed Percentage\n"
    runner = fake_runner(baseline_json(), rc=1, output=report)
    monkeypatch.setattr(gate, "run_benchmarks", runner)
    assert gate.main(parse_args(["--baseline-dir", str(bdir), "--time-threshold", "0.2"])) == 1
    assert "--benchmark-compare-fail=median:20%" in runner.calls[0]
    rows = [ln.split() for ln in capsys.readouterr().out.splitlines() if ln.startswith(FWD)]
    assert ["median_ms", "REGRESSED"] == [rows[0][1], rows[0][-1]]


def test_main_all_tests_failed_is_a_gate_failure(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(gate, "current_gpu_name", lambda: H100)
    path = tmp_path / "h100.json"
    path.write_text(json.dumps(baseline_json()))
    outcomes = {FWD: "failed", BWD: "failed"}
    monkeypatch.setattr(gate, "run_benchmarks", fake_runner(None, outcomes=outcomes, rc=1))
    assert gate.main(parse_args(["--baseline", str(path)])) == 1
    out = capsys.readouterr().out
    assert sum(ln.rstrip().endswith("FAILED") for ln in out.splitlines()) == 2
    monkeypatch.setattr(gate, "run_benchmarks", fake_runner(None, outcomes=outcomes, rc=1))
    assert gate.main(parse_args(["--baseline", str(path), "--save"])) == 1
    assert json.loads(path.read_text()) == baseline_json()  # untouched


def test_main_nothing_ran(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(gate, "current_gpu_name", lambda: H100)
    path = tmp_path / "h100.json"
    path.write_text(json.dumps(baseline_json()))
    monkeypatch.setattr(gate, "run_benchmarks", fake_runner(None, outcomes={FWD: "skipped"}))
    assert gate.main(parse_args(["--baseline", str(path)])) == 2
    assert "no benchmark produced a measurement" in capsys.readouterr().err


def test_main_save_leaves_out_failed_tests_and_merges_with_k(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(gate, "current_gpu_name", lambda: H100)
    path = tmp_path / "h100.json"
    path.write_text(json.dumps(baseline_json()))
    now = run_json(H100, [bench(FWD, 25.0, mib=0.1), bench(BWD, 99.0, mib=1.0, de=1.0, dc=1.0)])
    monkeypatch.setattr(gate, "run_benchmarks", fake_runner(now, outcomes={FWD: "passed", BWD: "failed"}, rc=1))
    assert gate.main(parse_args(["--baseline", str(path), "--save", "-k", "own"])) == 1
    saved = {b["name"]: b["stats"]["median"] for b in json.loads(path.read_text())["benchmarks"]}
    assert saved == {FWD: 0.025, BWD: 0.05}  # BWD failed now: the old entry stays
    assert "left out" in capsys.readouterr().out


def test_main_save_refuses_to_overwrite_another_gpus_baseline(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(gate, "current_gpu_name", lambda: H100)
    path = tmp_path / "x.json"
    path.write_text(json.dumps(baseline_json(gpu=H200)))
    monkeypatch.setattr(gate, "run_benchmarks", fake_runner(baseline_json()))
    assert gate.main(parse_args(["--baseline", str(path), "--save"])) == 2
    assert "refusing" in capsys.readouterr().err


# ---- the real pytest + pytest-benchmark path, on dummy CPU benchmarks -------------------------

DUMMY_TEST = '''
import os, time
import pytest

@pytest.mark.parametrize("name", ["alpha", "beta"])  # -k words that no folder name contains
def test_loss(benchmark, name):
    delay = float(os.environ.get("DUMMY_DELAY_" + name.upper(), "0.004"))
    benchmark.extra_info["peak_extra_mib"] = float(os.environ.get("DUMMY_MIB", "100"))
    benchmark.pedantic(time.sleep, args=(delay,), rounds=3, warmup_rounds=1)
'''
DUMMY_CONFTEST = f'''
def pytest_benchmark_update_machine_info(config, machine_info):
    machine_info["gpu"] = {{"name": "{H100}"}}
'''


def test_gate_end_to_end_with_pytest_benchmark(monkeypatch, tmp_path, capsys):
    """Save, pass, then a time and a memory regression through real pytest subprocesses."""
    bench_dir = tmp_path / "bench"
    bench_dir.mkdir()
    (bench_dir / "test_dummy.py").write_text(DUMMY_TEST)
    (bench_dir / "conftest.py").write_text(DUMMY_CONFTEST)
    monkeypatch.setattr(gate, "BENCH_DIR", bench_dir)
    monkeypatch.setattr(gate, "current_gpu_name", lambda: H100)
    base = ["--baseline", str(tmp_path / "base.json")]

    assert gate.main(parse_args(base + ["--save"])) == 0
    assert len(json.loads((tmp_path / "base.json").read_text())["benchmarks"]) == 2
    capsys.readouterr()

    assert gate.main(parse_args(base + ["--time-threshold", "1.0"])) == 0
    assert "gate: PASS" in capsys.readouterr().out

    monkeypatch.setenv("DUMMY_DELAY_ALPHA", "0.05")  # 12x slower: pytest-benchmark must flag it
    assert gate.main(parse_args(base + ["--time-threshold", "1.0"])) == 1
    out = capsys.readouterr().out
    assert "Performance has regressed" in out and "PerformanceRegression" in out
    lines = [ln for ln in out.splitlines() if ln.startswith("test_loss[alpha]") and "median_ms" in ln]
    assert lines and lines[0].endswith("REGRESSED")
    assert "Traceback" not in out

    monkeypatch.delenv("DUMMY_DELAY_ALPHA")
    monkeypatch.setenv("DUMMY_MIB", "200")
    assert gate.main(parse_args(base + ["--time-threshold", "1.0", "-k", "beta"])) == 1
    out = capsys.readouterr().out
    assert [ln.split()[1] for ln in out.splitlines() if "REGRESSED" in ln] == ["peak_extra_mib"]


def test_baseline_records_the_commit_override(monkeypatch):
    # pytest-benchmark reads the commit from git itself; the bench conftest makes it follow
    # CCE_BENCH_COMMIT like env.json does.
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parent / "bench" / "conftest.py"
    spec = importlib.util.spec_from_file_location("bench_conftest", path)
    conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conftest)
    monkeypatch.setenv("CCE_BENCH_COMMIT", "feedface00")
    info = {"id": "a499307", "dirty": True, "time": "t", "author_time": "t", "branch": "main"}
    conftest.pytest_benchmark_update_commit_info(None, info)
    assert info["id"] == "feedface00" and info["dirty"] is None and info["branch"] == "main"
