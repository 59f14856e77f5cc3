"""The regression gate's plugin and injections, on the CPU.

The plugin runs for real, in a nested pytest session (pytester) on pytest-benchmark, with the
gate's own flags (suite.gates.spec.gate_command), against a synthetic baseline file
(tests/fixtures/gates/: handcrafted, not a measurement): a stand-in benchmark sleeps and
reports extra_info values chosen by each test, so each check can be made to pass or fail.
"""
from __future__ import annotations

import json
import math
import shlex
from pathlib import Path

import pytest
import torch

from suite import cli
from suite.gates import checks, inject, plugin, spec

pytest_plugins = ["pytester"]

FIXTURE = Path(__file__).parent / "fixtures" / "gates" / "synthetic-h100-baseline.json"
H100, H200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"
FWD, BWD = "gemma2-2b-own-fwd", "gemma2-2b-own-loss+grad"
BASE = {b["param"]: b for b in json.loads(FIXTURE.read_text())["benchmarks"]}
BASE_MEDIAN_S = BASE[FWD]["stats"]["median"]

# A stand-in for suite/gates/test_gates.py: times a sleep, reports the extra_info it is given.
STANDIN = '''
import json, os, time, pytest
NOW = json.loads(os.environ["GATE_STANDIN"])

@pytest.mark.parametrize("case", sorted(NOW))
def test_gate(benchmark, case):
    if "skip" in NOW[case]:
        pytest.skip(NOW[case]["skip"])
    benchmark.pedantic(time.sleep, args=(NOW[case]["sleep_s"],), rounds=3, iterations=1)
    benchmark.extra_info.update(NOW[case]["extra_info"])
'''


def within_limits() -> dict:
    """Values of the current run just inside every limit of the baseline."""
    fwd, bwd = BASE[FWD]["extra_info"], BASE[BWD]["extra_info"]
    mem = bwd["peak_extra_mib"] * (1 + spec.MEM_FAIL_FRACTION) + spec.MEM_SLACK_MIB * 0.9
    return {
        FWD: {"sleep_s": 0.0, "extra_info": dict(fwd)},
        BWD: {"sleep_s": 0.0, "extra_info": {
            **bwd, "peak_extra_mib": mem, "de_rel_err": bwd["de_rel_err"] * spec.ERR_FAIL_FACTOR,
            "dc_rel_err": bwd["dc_rel_err"] * 1.01}},
    }


@pytest.fixture
def run_gate(pytester, monkeypatch):
    """run_gate(now, gpu=H100, save=None, baseline=FIXTURE) -> (exit code, output): the gate's
    pytest arguments on the stand-in benchmarks reporting ``now``, on a machine with ``gpu``."""
    pytester.makepyfile(test_synthetic=STANDIN)
    # pytest-benchmark's CPU description runs a subprocess (~1 s a run); not what is tested.
    monkeypatch.setattr("pytest_benchmark.plugin.get_cpu_info", lambda: {})
    # Under pytest-xdist the nested session would see a worker's variable and disable benchmarks.
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)

    def run(now, gpu=H100, save=None, baseline=FIXTURE):
        monkeypatch.setattr(plugin, "gate_environment",
                            lambda: {"gpu_name": gpu, "torch": "t", "git_commit": "c"})
        monkeypatch.setenv("GATE_STANDIN", json.dumps(now))
        target = Path(save) if save else baseline
        args = spec.gate_command(target, save=save is not None)
        assert args[3] == "suite/gates"
        result = pytester.runpytest("-p", "suite.gates.plugin", *args[4:])
        return int(result.ret), result.stdout.str() + result.stderr.str()

    return run


def table_rows(out: str) -> dict:
    """(benchmark, metric) -> verdict, from the gate's table."""
    rows = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[0] in (FWD, BWD):
            rows[(parts[0], parts[1])] = parts[-1]
    return rows


# ---- the plugin, end to end -----------------------------------------------------------------

def test_within_every_limit_passes(run_gate):
    code, out = run_gate(within_limits())
    assert code == 0, out
    rows = table_rows(out)
    assert rows[(FWD, "median_ms")] == "better"
    assert rows[(BWD, "peak_extra_mib")] == "ok" and rows[(BWD, "de_rel_err")] == "ok"
    assert "gate: PASS" in out


def test_a_skipped_benchmark_shows_why_and_does_not_fail(run_gate):
    now = within_limits()
    now[FWD]["skip"] = "apple_cce: cut-cross-entropy is not installed"
    code, out = run_gate(now)
    assert code == 0, out
    assert table_rows(out)[(FWD, "median_ms")] == "run"  # the last word of 'not run'
    assert "cut-cross-entropy is not installed" in out


def test_slower_median_fails(run_gate):
    now = within_limits()
    now[FWD]["sleep_s"] = BASE_MEDIAN_S * 3  # a sleep only lengthens: robust on a busy CPU
    code, out = run_gate(now)
    assert code == 1, out
    assert table_rows(out)[(FWD, "median_ms")] == "REGRESSED"
    assert "Performance has regressed" in out and "gate: FAIL" in out


def test_more_memory_fails(run_gate):
    now = within_limits()
    now[BWD]["extra_info"]["peak_extra_mib"] += 100.0
    now[FWD]["extra_info"]["peak_extra_mib"] += 100.0
    code, out = run_gate(now)
    assert code == 1, out
    rows = table_rows(out)
    assert rows[(FWD, "peak_extra_mib")] == rows[(BWD, "peak_extra_mib")] == "REGRESSED"
    assert rows[(BWD, "de_rel_err")] == "ok" and "peak_extra_mib x2" in out


@pytest.mark.parametrize("error", [2.2, math.nan, math.inf])
def test_doubled_or_non_finite_error_fails(run_gate, error):
    now = within_limits()
    now[BWD]["extra_info"]["de_rel_err"] = BASE[BWD]["extra_info"]["de_rel_err"] * error
    code, out = run_gate(now)
    assert code == 1, out
    rows = table_rows(out)
    assert rows[(BWD, "de_rel_err")] == ("REGRESSED" if math.isfinite(error) else "FAILED")
    assert rows[(BWD, "dc_rel_err")] == "ok"


def test_another_gpu_models_baseline_is_refused(run_gate):
    code, out = run_gate(within_limits(), gpu=H200)
    assert code == pytest.ExitCode.USAGE_ERROR, out
    assert f"refusing to compare: baseline {FIXTURE} was measured on {H100}, this is {H200}" in out
    code, out = run_gate(within_limits(), gpu=None)
    assert code == pytest.ExitCode.USAGE_ERROR and "no CUDA device" in out


def test_baseline_saved_with_an_injection_is_refused(run_gate, tmp_path):
    doc = json.loads(FIXTURE.read_text())
    doc["machine_info"]["cce_gate_inject"] = "slow:0.15"
    injected = tmp_path / "injected.json"
    injected.write_text(json.dumps(doc))
    code, out = run_gate(within_limits(), baseline=injected)
    assert code == pytest.ExitCode.USAGE_ERROR and "it is no baseline" in out


def test_save_records_the_gpu_and_versions_and_refuses_an_injection(run_gate, tmp_path,
                                                                    monkeypatch):
    saved = tmp_path / "nvidia-h100-80gb-hbm3.json"
    code, out = run_gate(within_limits(), save=saved)
    assert code == 0, out
    doc = json.loads(saved.read_text())
    assert doc["machine_info"]["gpu"] == {"name": H100, "slug": "nvidia-h100-80gb-hbm3"}
    assert doc["machine_info"]["versions"]["git_commit"] == "c"
    assert doc["machine_info"]["cce_gate_inject"] is None
    assert {b["param"]: b["extra_info"] for b in doc["benchmarks"]}[BWD]["de_rel_err"] == \
        within_limits()[BWD]["extra_info"]["de_rel_err"]
    saved.unlink()
    monkeypatch.setenv(spec.INJECT_ENV, "mem:100")
    code, out = run_gate(within_limits(), save=saved)
    assert code == pytest.ExitCode.USAGE_ERROR and "refusing to save a baseline" in out
    assert not saved.exists()


# ---- the pure parts -------------------------------------------------------------------

def test_checks_are_relative_to_the_baseline():
    base = {"peak_extra_mib": 100.0, "de_rel_err": 1e-3}
    limit = 100.0 * (1 + spec.MEM_FAIL_FRACTION) + spec.MEM_SLACK_MIB
    assert checks.memory_check("b", base, {"peak_extra_mib": limit}).verdict == "ok"
    assert checks.memory_check("b", base, {"peak_extra_mib": limit + 0.01}).verdict == "REGRESSED"
    assert checks.memory_check("b", {}, {"peak_extra_mib": 5.0}).verdict == "new"
    (err,) = checks.error_checks("b", base, {"de_rel_err": 2.1e-3})
    assert err.verdict == "REGRESSED" and err.change == pytest.approx(1.1)
    (new,) = checks.error_checks("b", {}, {"de_rel_err": math.nan})
    assert new.verdict == "FAILED"


def test_injection_parsing_names_the_variable():
    assert spec.parse_injection(None) is None and spec.parse_injection(" ") is None
    assert spec.parse_injection("slow:0.15") == spec.Injection("slow", 0.15)
    assert spec.parse_injection("err:2").text == "err:2"
    for bad in ("fast:1", "mem", "mem:-5", "err:1", "slow:nan"):
        with pytest.raises(ValueError, match=spec.INJECT_ENV):
            spec.parse_injection(bad)


def test_gate_cases_cover_the_default_and_gate_peers_at_one_shape():
    by_provider = {}
    for case in spec.cases():
        by_provider.setdefault(case.provider, set()).add(case.shape)
    assert set(by_provider) == set(spec.OWN_PROVIDERS + spec.PEER_PROVIDERS)
    assert all(by_provider[p] == set(spec.GATE_SHAPES) for p in spec.OWN_PROVIDERS)
    assert all(by_provider[p] == set(spec.PEER_SHAPES) for p in spec.PEER_PROVIDERS)
    ids = [c.id for c in spec.cases()]
    assert len(ids) == len(set(ids))


def test_gate_command_and_missing_baseline(tmp_path):
    path = spec.baseline_path(tmp_path, H100)
    assert path.name == "nvidia-h100-80gb-hbm3.json"
    cmd = spec.gate_command(path, save=False, keyword="own", pytest_args=["-x"])
    assert f"--benchmark-compare={path}" in cmd and cmd[-3:] == ["-k", "own", "-x"]
    assert f"--benchmark-compare-fail=median:{spec.TIME_FAIL_PERCENT}%" in cmd
    assert f"--benchmark-json={path}" in spec.gate_command(path, save=True)
    (tmp_path / "nvidia-h200.json").write_text("{}")
    msg = spec.missing_baseline_message(path, H100)
    assert "nox -s gate -- --save" in msg and "nvidia-h200.json" in msg


def test_cli_alias_prints_the_pytest_command(capsys, tmp_path):
    target = tmp_path / "b.json"
    code = cli.main(["gate", "--save", "--baseline", str(target), "-k", "own", "--print-command",
                     "--", "-x"])
    assert code == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith("gate: ") and line.endswith(f"--benchmark-json={target} -k own -x")
    assert cli.main(["gate", "--baseline", str(target)]) == 2  # no such baseline
    assert "does not exist" in capsys.readouterr().err


# ---- the injections ---------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_err_injection_multiplies_every_deviation_at_least_by_its_factor(dtype):
    from suite.reference import rel_err

    gen = torch.Generator().manual_seed(0)
    ref = torch.randn(512, 64, generator=gen)
    ref[0, :4] = torch.tensor([0.0, -0.0, 1e-30, -1e-30])  # steps from and across zero
    # A deviation that is all rounding (nearest rounding would undo x2), and one that is not.
    for grad in (ref.to(dtype), (ref * 1.01).to(dtype)):
        for factor in (2.0, 3.0):
            scaled = grad.clone()
            inject.scale_error(scaled, ref, factor, chunk_elems=4096)
            assert scaled.dtype == dtype and torch.isfinite(scaled).all()
            before, after = (grad.float() - ref).abs(), (scaled.float() - ref).abs()
            assert (after >= factor * before).all()
            assert rel_err(scaled, ref) >= factor * rel_err(grad, ref)


def test_mem_injection_holds_its_buffer_through_the_backward():
    held_in_backward = []

    class Spy(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.view_as(x)

        @staticmethod
        def backward(ctx, grad):
            import gc
            gc.collect()
            held_in_backward.append(sum(1 for o in gc.get_objects() if type(o) is torch.Tensor
                                        and o.dtype == torch.uint8 and o.numel() == 2 ** 20))
            return grad

    def provider(e, c, targets, **kwargs):
        return torch.nn.functional.cross_entropy(Spy.apply(e @ c.T), targets)

    e, c = torch.randn(8, 4, requires_grad=True), torch.randn(16, 4, requires_grad=True)
    targets = torch.randint(0, 16, (8,))
    loss = inject.holding_memory(provider, 1)(e, c, targets)
    assert torch.equal(loss, provider(e, c, targets))
    loss.backward()
    assert held_in_backward == [1]


@pytest.mark.parametrize("added_per_cycle_ms, corrected", [(0.5e-3, True), (2e-3, False)])
def test_slow_injection_sizes_its_sleep_and_corrects_it_upwards(monkeypatch, added_per_cycle_ms,
                                                                 corrected):
    """The sleep is sized from the (stubbed) cycles per ms; when it adds less to the call than
    wanted (a higher clock inside the call), it grows to the wanted time, never shrinks."""
    slept = []
    monkeypatch.setattr(inject, "sleep_cycles_per_ms", lambda device: 1000.0)
    monkeypatch.setattr(torch.cuda, "_sleep", slept.append)
    call_ms, fraction = 10.0, 0.15

    def time_call(extra):
        slept.clear()
        extra()
        return call_ms + sum(slept) * added_per_cycle_ms

    work = inject.Injected(spec.Injection("slow", fraction)).extra_work(time_call, "cuda")
    first = int(fraction * call_ms * 1000.0)
    slept.clear()
    work()
    added_ms = first * added_per_cycle_ms
    assert slept == [int(first * fraction * call_ms / added_ms) if corrected else first]
    assert sum(slept) * added_per_cycle_ms >= fraction * call_ms * 0.999


def test_no_injection_leaves_the_call_alone():
    none = inject.Injected(None)

    def fn(*a, **k):
        return None

    assert none.provider(fn) is fn
    asked = []
    none.extra_work(lambda work: asked.append(work) or 1.0, "cpu")()
    assert asked == []


def test_prove_script_runs_the_gate_with_each_injection():
    script = (Path(spec.__file__).parent / "prove.sh").read_text()
    steps = [shlex.split(line)[1:] for line in script.splitlines() if line.startswith("step ")]
    assert [(s[0], s[1]) for s in steps] == [("1_save", "0"), ("2_pass", "0"), ("3_pass", "0"),
                                            ("4_slow", "1"), ("5_mem", "1"), ("6_err", "1")]
    injections = [s[2] for s in steps]
    assert [None if i == "-" else spec.parse_injection(i).kind for i in injections] == \
        [None, None, None, "slow", "mem", "err"]
    parser = cli.build_parser("gate")
    for name, _, _, *args in steps:
        parsed = parser.parse_args(["gate", *args])
        assert parsed.save == (name == "1_save")


class OneRound:
    """benchmark.pedantic's calling convention, one round: setup's (args, kwargs) to target."""

    def __init__(self):
        self.extra_info, self.rounds = {}, 0

    def pedantic(self, target, *, setup, rounds, warmup_rounds, iterations):
        assert rounds == spec.ROUNDS and warmup_rounds == spec.WARMUP_ROUNDS and iterations == 1
        args, kwargs = setup()
        target(*args, **kwargs)
        self.rounds += 1


def test_measure_case_wires_the_suites_protocol_and_the_injection():
    """suite/gates/test_gates.py's measuring path on the CPU (no memory numbers there): the
    suite's phase calls, the reference errors in extra_info, the err injection's scaled ones."""
    from suite import catalog
    from suite.gates import test_gates
    from suite.inputs import make_inputs
    from suite.reference import reference

    inputs = make_inputs("lm", 64, 32, 257, "bf16", seed=0, softcap=30.0)
    ref = reference(inputs["e"], inputs["c"], inputs["targets"], softcap=30.0)

    def extra_info(phase, injection=None):
        bench = OneRound()
        bad = test_gates.measure_case(bench, phase, catalog.get("naive").fn, inputs, ref, 30.0,
                                      inject.Injected(spec.parse_injection(injection)),
                                      torch.device("cpu"))
        assert bad == [] and bench.rounds == 1
        return bench.extra_info

    assert set(extra_info("fwd")) == {"peak_extra_mib", "peak_abs_mib", "loss_rel_err"}
    plain = extra_info("loss+grad")
    assert 0 < plain["de_rel_err"] < 0.1 and 0 < plain["dc_rel_err"] < 0.1
    doubled = extra_info("loss+grad", "err:2")
    for key in ("de_rel_err", "dc_rel_err"):
        assert doubled[key] >= 2 * plain[key]
    held = extra_info("loss+grad", "mem:1")  # memory is not measured on the CPU; errors unchanged
    assert held["de_rel_err"] == plain["de_rel_err"]
