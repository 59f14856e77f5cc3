"""``python -m suite kernel interleave``: config variants' calls timed in turn in one process.
Its parsing, its sweep order, and a whole run on the CPU (fp32 under the Triton interpreter)."""
import csv
import json
import statistics

import pytest
import torch

from suite import cli
from suite.kernel import interleave as tool


def test_heads_variants_and_budgets_parse_or_name_the_bad_argument():
    assert tool.parse_head("8192x4096x128256") == (8192, 4096, 128256, None)
    assert tool.parse_head("8192x4608x256000x30") == (8192, 4608, 256000, 30.0)
    for bad in ("8192x4096", "8192x4096x0", "axbxc", "1x2x3x-1", "1x2x3x4x5"):
        with pytest.raises(SystemExit, match="--heads"):
            tool.parse_head(bad)
    assert tool.parse_variants(['fl={"forward": {"flatten": true}}']) == [
        ("base", {}), ("fl", {"forward": {"flatten": True}})]
    for bad in ("fl", "base={}", "torch_compile={}", "cublas_floor={}", "a@b={}", "fl={",
                "fl=[1]"):
        with pytest.raises(SystemExit, match="--variants"):
            tool.parse_variants([bad])
    assert tool.parse_budgets("default,0,4096") == [None, 0, 4096]
    with pytest.raises(SystemExit, match="--budgets"):
        tool.parse_budgets("default,1GiB")


def test_entries_are_every_variant_at_every_budget_then_torch_compile():
    variants = [("base", {}), ("fl", {"forward": {"flatten": True}})]
    names = [e.name for e in tool.entries(variants, [None, 4096], with_compile=True)]
    assert names == ["base", "fl", "base@ws4096", "fl@ws4096", "torch_compile"]


def test_each_sweep_calls_every_entry_once_in_turn_reversed_every_other_sweep():
    # Interleaving is the point: a slow drift of the clocks then reaches every entry alike.
    calls = []
    runs = {name: (lambda name=name: calls.append(name)) for name in ("a", "b", "c")}
    e = torch.zeros(2, requires_grad=True)
    times = tool._sweeps(runs, {"e": e, "c": e}, reps=3, device=torch.device("cpu"))
    assert calls == ["a", "b", "c", "c", "b", "a", "a", "b", "c"]
    assert {name: len(ms) for name, ms in times.items()} == {"a": 3, "b": 3, "c": 3}


def test_blocked_calls_each_entry_back_to_back_half_in_order_half_reversed():
    # A kernel that follows itself, as in a process of its own, in the same process as the rest.
    calls = []
    runs = {name: (lambda name=name: calls.append(name)) for name in ("a", "b")}
    e = torch.zeros(2, requires_grad=True)
    times = tool._sweeps(runs, {"e": e, "c": e}, reps=3, device=torch.device("cpu"),
                         order="blocked")
    assert calls == ["a", "a", "b", "b", "b", "a"]
    assert {name: len(ms) for name, ms in times.items()} == {"a": 3, "b": 3}
    with pytest.raises(ValueError, match="order"):
        tool.call_order(["a"], 2, "random")


def test_settle_calls_each_block_untimed_first_and_only_blocked_takes_it(tmp_path):
    # At the power cap the clock lags a change of kernel: a block's first calls would run at
    # the clock the previous entry's power set.
    calls = []
    runs = {name: (lambda name=name: calls.append(name)) for name in ("a", "b")}
    e = torch.zeros(2, requires_grad=True)
    times = tool._sweeps(runs, {"e": e, "c": e}, reps=4, device=torch.device("cpu"),
                         order="blocked", settle=2)
    # a a | b b b b | a a: each run of one entry's calls after two untimed ones
    assert calls == ["a"] * 4 + ["b"] * 6 + ["a"] * 4
    assert {name: len(ms) for name, ms in times.items()} == {"a": 4, "b": 4}
    for bad in (["--settle", "2"], ["--settle", "-1", "--order", "blocked"]):
        with pytest.raises(SystemExit, match="--settle"):
            cli.main(["kernel", "interleave", "--device", "cpu", "--heads", "8x8x8",
                      "--out", str(tmp_path)] + bad)


def test_a_run_on_the_cpu_writes_a_row_per_entry_with_ratios_and_gradient_differences(
        tmp_path, capsys):
    # fp32 under the interpreter: a config variant that only reschedules the same arithmetic
    # (the forward's flattened loops) gives the base's gradients to the last bit, and a budget
    # row is related to the base at that budget.
    out = tmp_path / "run"
    assert cli.main(["kernel", "interleave", "--device", "cpu", "--dtype", "fp32",
                     "--heads", "40x16x72x30", "--variants", 'fl={"forward": {"flatten": true}}',
                     "--budgets", "default,0", "--reps", "2", "--warmup", "0",
                     "--out", str(out)]) == 0
    rows = list(csv.DictReader(open(out / "interleave.csv")))
    assert [r["entry"] for r in rows] == ["base", "fl", "base@ws0", "fl@ws0"]
    assert all(r["status"] == "ok" and r["softcap"] == "30.0" and int(r["reps"]) == 2
               for r in rows)
    assert all(r["path"] in ("three-matmul", "recompute") for r in rows)
    assert [r["ms_over_base"] for r in rows if r["entry"].startswith("base")] == ["1.0", "1.0"]
    assert all(float(r["de_diff_vs_base"]) == 0 and float(r["dc_diff_vs_base"]) == 0
               for r in rows)
    assert json.loads(rows[1]["overrides"]) == {"forward": {"flatten": True}}
    assert json.loads((out / "env.json").read_text())["device"] == "cpu"
    assert "wrote" in capsys.readouterr().out


def test_low_memory_sends_every_own_entry_down_the_low_memory_path(tmp_path):
    out = tmp_path / "run"
    assert cli.main(["kernel", "interleave", "--device", "cpu", "--dtype", "fp32",
                     "--heads", "40x16x72", "--low-memory", "--reps", "1", "--warmup", "0",
                     "--out", str(out)]) == 0
    rows = list(csv.DictReader(open(out / "interleave.csv")))
    assert [(r["entry"], r["status"], r["path"]) for r in rows] == [("base", "ok", "low-memory")]


def test_the_floor_is_timed_in_the_same_sweeps_as_the_entries(tmp_path, monkeypatch):
    # The floors column divides times taken side by side: the floor's median of those sweeps.
    seen = {}
    sweeps = tool._sweeps

    def recording(runs, inputs, reps, device, order="interleaved", clocks=None, settle=0):
        times = sweeps(runs, inputs, reps, device, order, clocks, settle)
        seen.update({name: list(ms) for name, ms in times.items()})
        return times

    monkeypatch.setattr(tool, "_sweeps", recording)
    out = tmp_path / "run"
    assert cli.main(["kernel", "interleave", "--device", "cpu", "--dtype", "fp32",
                     "--heads", "24x16x40", "--reps", "3", "--warmup", "0", "--order",
                     "blocked", "--out", str(out)]) == 0
    (row,) = csv.DictReader(open(out / "interleave.csv"))
    assert row["order"] == "blocked"
    assert sorted(seen) == ["base", tool.FLOOR] and len(seen[tool.FLOOR]) == 3
    assert float(row["floor_ms"]) == pytest.approx(statistics.median(seen[tool.FLOOR]))
    assert float(row["floors"]) == pytest.approx(float(row["ms"]) / float(row["floor_ms"]),
                                                 rel=1e-3)


def test_each_ratio_comes_with_its_verdict_by_the_p20_p80_rule():
    # Apart ranges are faster or slower; overlapping ones level (suite/report/verdict.py), each
    # against the base at the entry's own budget and against torch.compile; a failed entry and
    # torch.compile against the base get none.
    def row(entry, budget, ms, p20, p80, status="ok"):
        return dict(entry=entry, budget=budget, ms=ms, ms_p20=p20, ms_p80=p80, status=status)

    rows = [row("base", "", 10.0, 9.8, 10.2), row("quick", "", 8.9, 8.7, 9.1),
            row("near", "", 10.1, 10.0, 10.4), row("base@ws0", "0", 20.0, 19.0, 21.0),
            row("slow@ws0", "0", 22.0, 21.5, 22.5), row("broken", "", 0.0, 0.0, 0.0, "oom"),
            row(tool.COMPILE, "", 9.4, 9.2, 9.6)]
    tool._relate(rows)
    verdicts = {r["entry"]: (r.get("vs_base"), r.get("vs_compile")) for r in rows}
    assert verdicts == {"base": ("level", "slower"), "quick": ("faster", "faster"),
                        "near": ("level", "slower"), "base@ws0": ("level", "slower"),
                        "slow@ws0": ("slower", "slower"), "broken": (None, None),
                        tool.COMPILE: (None, "level")}
    assert rows[4]["ms_over_base"] == 1.1 and rows[1]["ms_over_compile"] == round(8.9 / 9.4, 4)


def test_a_failing_entry_is_its_rows_status_and_the_run_goes_on(tmp_path):
    # An override the kernel's config refuses fails that entry only.
    out = tmp_path / "run"
    assert cli.main(["kernel", "interleave", "--device", "cpu", "--dtype", "fp32",
                     "--heads", "24x16x40", "--variants", 'bad={"forward": {"nonsense": 1}}',
                     "--reps", "1", "--warmup", "0", "--out", str(out)]) == 0
    rows = {r["entry"]: r for r in csv.DictReader(open(out / "interleave.csv"))}
    assert rows["base"]["status"] == "ok" and float(rows["base"]["ms"]) > 0
    assert rows["bad"]["status"].startswith("error:") and "nonsense" in rows["bad"]["status"]
    assert rows["bad"]["ms"] == ""


def test_cuda_is_asked_for_by_name_where_there_is_none(monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="needs a CUDA device"):
        cli.main(["kernel", "interleave", "--heads", "8x8x8", "--out", str(tmp_path)])


# ---- --clocks: the SM clock and power while each entry's calls run -----------------------------

def test_clock_samples_summarise_to_medians_and_the_limiting_reasons_by_name():
    from suite.clocks import Sample, summary
    power_cap, idle = 0x4, 0x1   # NVML's SwPowerCap and GpuIdle bits
    got = summary([Sample(1980, 500.0, 0), Sample(1755, 700.0, power_cap),
                   Sample(1830, 690.0, power_cap | 0x20), Sample(1980, 120.0, idle)])
    assert got == {"sm_mhz": 1905, "power_w": 595.0, "clock_limited": 0.5,
                   "clock_reasons": "power_cap+sw_thermal"}
    assert summary([]) == {}


def test_the_log_reads_while_the_stream_has_work_and_once_after_a_call_too_short_for_that(
        monkeypatch):
    from suite import clocks
    busy = iter([False, False, True, True])
    monkeypatch.setattr(torch.cuda, "current_stream",
                        lambda device: type("S", (), {"query": lambda self: next(busy)})())
    log = object.__new__(clocks.ClockLog)
    log.samples, reads = {}, iter(range(1, 10))
    log.read = lambda: clocks.Sample(next(reads), 0.0, 0)
    log.during("a", "cuda")     # two queries with work, then idle: two reads
    log.during("b", "cuda")     # idle at once: the one read after
    assert [s.sm_mhz for s in log.samples["a"]] == [1, 2]
    assert [s.sm_mhz for s in log.samples["b"]] == [3]


def test_each_calls_clock_samples_go_to_the_entry_that_made_it():
    calls, logged = [], []
    runs = {name: (lambda name=name: calls.append(name)) for name in ("a", "b")}
    log = type("Log", (), {"during": lambda self, name, device: logged.append(name)})()
    e = torch.zeros(2, requires_grad=True)
    tool._sweeps(runs, {"e": e, "c": e}, reps=2, device=torch.device("cpu"), clocks=log)
    assert logged == calls == ["a", "b", "b", "a"]


def test_clocks_are_refused_by_name_without_nvml_or_a_gpu(monkeypatch, tmp_path):
    import sys
    from suite import clocks
    monkeypatch.setitem(sys.modules, "pynvml", None)    # import pynvml raises ImportError
    with pytest.raises(SystemExit, match="nvidia-ml-py"):
        clocks.ClockLog(torch.device("cuda"))   # refused before any device is asked
    with pytest.raises(SystemExit, match="--clocks"):
        cli.main(["kernel", "interleave", "--device", "cpu", "--heads", "8x8x8", "--clocks",
                  "--out", str(tmp_path)])


def test_each_heads_torch_compile_is_compiled_for_its_own_static_shapes(tmp_path, monkeypatch):
    # Dynamo recompiles a second shape with dynamic sizes (automatic dynamic): without a fresh
    # compile per head, every head after the first timed torch.compile's generic graph (a
    # head's ratio to it moved from 0.97x to 0.90x with its place in the process).
    import suite.providers.naive as naive_mod

    graphs = []

    def recording(gm, example_inputs):
        graphs.append(any(isinstance(s, torch.SymInt) for x in example_inputs
                          if isinstance(x, torch.Tensor) for s in x.shape)
                      or any(isinstance(x, torch.SymInt) for x in example_inputs))
        return gm.forward

    monkeypatch.setattr(naive_mod, "_compiled",
                        lambda: torch.compile(naive_mod.naive, backend=recording))
    out = tmp_path / "run"
    assert cli.main(["kernel", "interleave", "--device", "cpu", "--dtype", "fp32",
                     "--heads", "24x16x40,32x8x56", "--compile", "--reps", "1", "--warmup",
                     "0", "--out", str(out)]) == 0
    rows = list(csv.DictReader(open(out / "interleave.csv")))
    assert [(r["head"], r["entry"], r["status"]) for r in rows] == [
        (h, e, "ok") for h in ("24x16x40", "32x8x56") for e in ("base", tool.COMPILE)]
    assert len(graphs) >= 2 and not any(graphs)  # a static graph per head, none dynamic
