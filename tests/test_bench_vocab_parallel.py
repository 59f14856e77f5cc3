"""``python -m suite bench --vocab-parallel K`` (the runner's world_size, suite/ranks.py) on the
CPU: two gloo ranks, kernels interpreted, fp32. The rows carry world_size 2, status ok, and errors against
the reference like the single-process run's on the same cells; a peer without a sharded path
is an ``unsupported`` row saying why; a bad K is a CLI error naming --vocab-parallel. The ranks'
merge, the gathered dC error, the shard bounds and the old-CSV compatibility are checked
directly (each on a case that must fail if the rule broke)."""
from __future__ import annotations

import csv
import json
import math

import pytest
import torch

from suite import cli, ranks, runner
from suite.reference import rel_err
from suite.results import ResultsWriter, read_rows
from suite.schema import ROW_FIELD_DEFAULTS, ROW_FIELDS

ARGS = ["bench", "--device", "cpu", "--preset", "smoke-sweep", "--n", "16", "--d", "8", "--v", "37", "--dtype", "fp32",
        "--phases", "fwd,loss+grad", "--reps", "1", "--warmup", "0", "--quiet"]
ERRORS = ("loss_rel_err", "de_rel_err", "dc_rel_err", "dbias_rel_err")


def _cli_error(capsys, argv) -> str:
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2
    return capsys.readouterr().err


@pytest.fixture(scope="module")
def both_runs(tmp_path_factory):
    """(sharded rows, single-process rows) of the smoke cells at a small shape."""
    root = tmp_path_factory.mktemp("vp")
    assert cli.main(ARGS + ["--vocab-parallel", "2", "--providers",
                            "own,naive,liger_scaled_ce_tp,liger_scaled_ce_tp_torch",
                            "--out", str(root / "vp2")]) == 0
    assert cli.main(ARGS + ["--providers", "own", "--out", str(root / "single")]) == 0
    return read_rows(root / "vp2"), read_rows(root / "single")


def test_sharded_rows_have_world_size_2_and_single_process_accuracy(both_runs):
    sharded, single = both_runs
    single = {(r["cell_id"], r["phase"]): r for r in single}
    own = [r for r in sharded if r["provider"] == "own"]
    assert len(own) == len(single) == 6  # 3 smoke cells x 2 phases
    for r in own:
        assert (r["world_size"], r["status"]) == ("2", "ok"), r
        assert float(r["ms"]) > 0 and int(r["reps"]) == 1
        one = single[(r["cell_id"], r["phase"])]
        assert one["world_size"] == "1"
        for key in ERRORS:
            assert (r[key] == "") == (one[key] == ""), (key, r, one)
            if r[key]:  # fp32 against the reference: the single-process kernel's rounding
                assert float(r[key]) <= max(4 * float(one[key]), 2e-6), (key, r[key], one[key])
    assert any(r["dbias_rel_err"] for r in own)  # the bias cell's shard of dbias is checked


def test_a_peer_without_a_sharded_path_is_unsupported_with_the_reason(both_runs):
    naive = [r for r in both_runs[0] if r["provider"] == "naive"]
    assert len(naive) == 6
    for r in naive:
        assert (r["status"], r["world_size"]) == ("unsupported", "2")
        assert "no vocab-parallel path" in r["error"] and "own_low_memory" in r["error"]


def test_liger_tensor_parallel_rows_say_why_they_cannot_run_on_the_cpu(both_runs):
    """Liger's TP function has a sharded path (not 'unsupported' for lack of one), but it takes
    CUDA tensors only: each of its rows says so, and the run goes on."""
    for name in ("liger_scaled_ce_tp", "liger_scaled_ce_tp_torch"):
        rows = [r for r in both_runs[0] if r["provider"] == name]
        assert len(rows) == 6
        for r in rows:
            assert (r["status"], r["world_size"]) == ("unavailable", "2"), r
            assert "CUDA tensors only" in r["error"]


def test_bad_world_size_is_a_cli_error_naming_the_option(capsys, tmp_path, monkeypatch):
    err = _cli_error(capsys, ARGS + ["--vocab-parallel", "1", "--out", str(tmp_path / "a")])
    assert "--vocab-parallel" in err and "2 or more ranks" in err
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    cuda = [a if a != "cpu" else "cuda" for a in ARGS]
    err = _cli_error(capsys, cuda + ["--vocab-parallel", "2", "--out", str(tmp_path / "b")])
    assert "--vocab-parallel" in err and "2 ranks need 2 GPUs" in err and "has 1" in err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_a_folder_of_another_world_size_is_refused(tmp_path):
    cell = runner.Cell("uniform", 16, 8, 37, "fp32")
    writer = ResultsWriter(tmp_path, {}, "single")
    writer.write([{**cell.fields(), "provider": "own", "phase": "fwd", "status": "ok",
                   "timestamp": "t"}])
    with pytest.raises(ValueError, match="world size .*'1'.* needs a folder of its own"):
        runner.run([cell], ["own"], ["fwd"], tmp_path, world_size=2,
                                 resume=True)


def test_uneven_shards_tile_the_vocabulary():
    assert ranks.shard_bounds(37, 2) == [(0, 19), (19, 37)]
    assert ranks.shard_bounds(10, 3) == [(0, 4), (4, 7), (7, 10)]
    with pytest.raises(ValueError, match="world size <= V"):
        ranks.shard_bounds(2, 3)


def test_merge_takes_the_max_over_ranks_and_a_failing_rank_is_the_status():
    cell = runner.Cell("uniform", 16, 8, 37, "fp32")
    ok = dict(phase="fwd", status="ok", reps=3, ms=2.0, ms_p20=1.0, ms_p80=3.0, ms_min=1.0,
              peak_extra_mib=5.0, peak_abs_mib=9.0, floor_ms=1.0, loss_rel_err=1e-7)
    slow = dict(ok, ms=4.0, peak_abs_mib=7.0, loss_rel_err=3e-7)
    merged = ranks.merge_ranks([ok, slow], cell)
    assert (merged["ms"], merged["peak_abs_mib"], merged["loss_rel_err"]) == (4.0, 9.0, 3e-7)
    assert merged["floor_ratio"] == 4.0 and merged["tokens_per_s"] == 16 / 4e-3
    oom = {"phase": "fwd", "status": "oom", "error": "OutOfMemoryError: x"}
    failed = ranks.merge_ranks([ok, oom], cell)
    assert failed["status"] == "oom" and failed["error"] == "rank 1: OutOfMemoryError: x"


def test_gathered_dc_error_equals_the_error_of_the_gathered_gradient():
    g = torch.Generator().manual_seed(0)
    ref = torch.randn(37, 8, generator=g, dtype=torch.float64)
    noise = torch.randn(37, 8, generator=g, dtype=torch.float64) * torch.arange(37)[:, None]
    got = ref + 1e-3 * noise  # larger errors on the second shard
    rows = [{"dc_rel_err": rel_err(got[a:b], ref[a:b]),
             "_dc_ref_sq": float(ref[a:b].square().sum())} for a, b in [(0, 19), (19, 37)]]
    gathered = ranks._gathered_rel_err(rows, "dc")
    assert math.isclose(gathered, rel_err(got, ref), rel_tol=1e-12)
    assert not math.isclose(gathered, max(r["dc_rel_err"] for r in rows), rel_tol=1e-3)


def test_an_old_results_csv_reads_as_world_size_1_and_takes_single_rows(tmp_path):
    legacy = [k for k in ROW_FIELDS if k not in ROW_FIELD_DEFAULTS]
    cell = runner.Cell("uniform", 16, 8, 37, "fp32")
    with open(tmp_path / "results.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=legacy)
        w.writeheader()
        w.writerow({**dict.fromkeys(legacy, ""), **cell.fields(), "provider": "own",
                    "phase": "fwd", "status": "ok", "timestamp": "t"})
    assert [r["world_size"] for r in read_rows(tmp_path)] == ["1"]
    writer = ResultsWriter(tmp_path, {}, "later")
    writer.write([{**cell.fields(), "provider": "own", "phase": "loss", "status": "ok",
                   "timestamp": "t"}])
    with pytest.raises(ValueError, match="before the world_size column"):
        writer.write([{**cell.fields(), "provider": "own", "phase": "grad", "status": "ok",
                       "timestamp": "t", "world_size": 2}])
    assert sorted(r["phase"] for r in read_rows(tmp_path)) == ["fwd", "loss"]
    with open(tmp_path / "results.csv", newline="") as f:
        assert next(csv.reader(f)) == legacy  # appended in the file's own layout


def test_a_vocabulary_smaller_than_the_world_is_an_error_row(tmp_path):
    cells = [runner.Cell("uniform", 4, 8, 1, "fp32")]
    runner.run(cells, ["own"], ["fwd"], tmp_path, world_size=2, reps=1,
                             warmup=0, quiet=True)
    (row,) = read_rows(tmp_path)
    assert (row["status"], row["world_size"]) == ("error", "2")
    assert "shard" in row["error"] and "world size <= V" in row["error"]


def test_a_dead_world_leaves_crashed_rows_and_a_fresh_world_goes_on(tmp_path, monkeypatch):
    """The parent's loop, with the worlds faked: the first dies while rank 0 measures the
    first cell's `own`; the second writes every pair it is given."""
    import torch.multiprocessing as mp

    cells = [runner.Cell("uniform", 16, 8, 37, "fp32"), runner.Cell("lm", 16, 8, 37, "fp32")]
    given = []

    def fake_world(fn, args, nprocs, start_method, join):
        world, _, out, pending = args
        given.append(list(pending))
        plan = json.loads((tmp_path / "plan.json").read_text())
        if len(given) == 1:
            (tmp_path / ".inflight").write_text(json.dumps(
                [cells[0].cell_id, "own"]))
            raise mp.ProcessExitedException("process 1 terminated with signal SIGSEGV",
                                            error_index=1, error_pid=1, exit_code=-11)
        writer = ResultsWriter(tmp_path, {}, plan["run_id"])
        by_id = {c.cell_id: c for c in cells}
        writer.write([ranks._row(by_id[c], plan, p, {"phase": "fwd",
                                                                    "status": "ok"})
                      for c, p in pending])

    monkeypatch.setattr(mp, "start_processes", fake_world)
    runner.run(cells, ["own", "own_filter"], ["fwd"], tmp_path, world_size=2,
                             quiet=True)
    rows = {(r["cell_id"], r["provider"]): r for r in read_rows(tmp_path)}
    crashed = rows[(cells[0].cell_id, "own")]
    assert crashed["status"] == "crashed" and "SIGSEGV" in crashed["error"]
    assert len(given) == 2 and (cells[0].cell_id, "own") not in given[1]
    assert sorted(r["status"] for r in rows.values()) == ["crashed", "ok", "ok", "ok"]
