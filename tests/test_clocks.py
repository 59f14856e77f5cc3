"""`suite bench --clocks`: the SM clock sampled while a row's timed calls run (suite/clocks.py).
The sampling thread, the timing it wraps, the schema's columns, and the refusals naming
--clocks where there is no GPU, no NVML module, or a results.csv without the columns."""
import csv
import sys
import time

import pytest
import torch

from suite import cli, clocks, measure, runner
from suite.schema import ROW_FIELD_DEFAULTS, ROW_FIELDS


REAL_LOG = clocks.ClockLog


def _fake_log(read):
    log = object.__new__(REAL_LOG)
    log.samples, log.read = {}, read
    return log


def test_sampling_reads_from_a_thread_until_the_block_ends():
    reads = []

    def read():
        reads.append(time.perf_counter())
        return clocks.Sample(1700, 650.0, 0x4)

    log = _fake_log(read)
    with log.sampling("fwd", period_s=0.001):
        time.sleep(0.05)
    ended = time.perf_counter()
    n = len(log.samples["fwd"])
    assert n >= 5 and all(t <= ended for t in reads)
    time.sleep(0.01)
    assert len(log.samples["fwd"]) == n     # the thread stopped with the block


def test_the_timed_calls_run_inside_the_sampling_block_and_the_columns_come_from_it():
    events = []

    class Block:
        def __enter__(self):
            events.append("enter")

        def __exit__(self, *exc):
            events.append("exit")

    times = measure.time_calls(lambda state: events.append("call"), device="cpu", reps=3,
                               sampling=Block())
    assert events == ["enter", "call", "call", "call", "exit"] and len(times) == 3
    log = _fake_log(None)
    log.samples["loss+grad"] = [clocks.Sample(1500, 690.0, 0x4), clocks.Sample(1600, 690.0, 0),
                                clocks.Sample(1650, 680.0, 0x4)]
    assert measure.clock_columns(log, "loss+grad") == {"sm_mhz": 1600, "clock_limited": 0.667}
    log.samples["fwd"] = [clocks.Sample(1755, 700.0, 0x4)] * 2   # an even count: still an int
    assert repr(measure.clock_columns(log, "fwd")["sm_mhz"]) == "1755"
    assert "loss+grad" not in log.samples     # taken out: the next phase starts empty
    assert measure.clock_columns(None, "fwd") == {}


def test_the_clock_columns_are_in_the_schema_and_empty_in_an_older_or_a_plain_row():
    assert {"sm_mhz", "clock_limited"} <= set(ROW_FIELDS)
    assert ROW_FIELD_DEFAULTS["sm_mhz"] == ROW_FIELD_DEFAULTS["clock_limited"] == ""


def test_a_bench_row_records_the_clock_where_the_run_asks(tmp_path, monkeypatch):
    # The CPU has no clock to read: the run's check is passed and its log reads a fixed
    # sample; the rest is the bench as it runs on a GPU.
    monkeypatch.setattr(runner, "_check_clocks", lambda out, device: None)
    monkeypatch.setattr(clocks, "ClockLog", lambda device: _fake_log(
        lambda: clocks.Sample(1755, 700.0, 0x4)))
    args = ["bench", "--device", "cpu", "--providers", "naive", "--n", "16", "--d", "8",
            "--v", "32", "--dtype", "fp32", "--phases", "fwd,loss+grad", "--reps", "3",
            "--quiet"]
    assert cli.main(args + ["--clocks", "--out", str(tmp_path / "run")]) == 0
    rows = list(csv.DictReader(open(tmp_path / "run" / "results.csv")))
    assert [(r["phase"], r["sm_mhz"], r["clock_limited"]) for r in rows] == [
        ("fwd", "1755", "1.0"), ("loss+grad", "1755", "1.0")]
    assert cli.main(args + ["--out", str(tmp_path / "plain")]) == 0
    rows = list(csv.DictReader(open(tmp_path / "plain" / "results.csv")))
    assert [(r["sm_mhz"], r["clock_limited"]) for r in rows] == [("", "")] * 2


def test_clocks_are_refused_naming_the_flag(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="--clocks.*CUDA"):
        runner._check_clocks(tmp_path, "cpu")
    monkeypatch.setitem(sys.modules, "pynvml", None)
    with pytest.raises(ValueError, match="nvidia-ml-py"):
        runner._check_clocks(tmp_path, "cuda")
    nvml = type(sys)("pynvml")
    nvml.NVMLError = type("NVMLError", (Exception,), {})

    def no_driver():
        raise nvml.NVMLError("NVML Shared Library Not Found")

    nvml.nvmlInit = no_driver
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    with pytest.raises(ValueError, match="--clocks: NVML does not answer.*Library Not Found"):
        runner._check_clocks(tmp_path, "cuda")
    nvml.nvmlInit = lambda: None
    old = tmp_path / "results.csv"
    old.write_text("cell_id,provider,phase,ms\nx,own,fwd,1.0\n")
    with pytest.raises(ValueError, match="--clocks.*before the clock columns"):
        runner._check_clocks(tmp_path, "cuda")
    with pytest.raises(SystemExit):
        cli.main(["bench", "--device", "cpu", "--providers", "naive", "--clocks", "--quiet",
                  "--out", str(tmp_path / "other")])


def test_clocks_on_a_gpu_read_a_real_clock(tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU: NVML reads a board's clock")
    pytest.importorskip("pynvml", reason="needs nvidia-ml-py (NVML's Python module)")
    log = clocks.ClockLog(torch.device("cuda"))
    x = torch.randn(4096, 4096, device="cuda")
    with log.sampling("mm"):
        for _ in range(50):
            x @ x
        torch.cuda.synchronize()
    got = clocks.summary(log.samples["mm"])
    assert got["sm_mhz"] > 0 and 0 <= got["clock_limited"] <= 1
