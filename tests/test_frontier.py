"""The frontier report's verdicts: memory bounds which own points count, noise decides level."""
from pathlib import Path

import pytest

from suite.report.frontier_tables import Point, cell_table, own_front, verdict


def pt(name, mib, ms, spread=0.5):
    return Point(name, mib, ms, ms - spread, ms + spread, 1e-3)


def test_front_keeps_only_points_no_other_beats_in_memory_and_time():
    own = [pt("own_recompute", 1200, 60), pt("own_ws1024", 1500, 62), pt("own_ws3072", 3600, 46),
           pt("own_ws8192", 9000, 47)]
    assert [p.provider for p in own_front(own)] == ["own_recompute", "own_ws3072"]


def test_a_faster_own_point_over_the_peers_memory_does_not_count():
    own = [pt("own_recompute", 1200, 60), pt("own_ws8192", 9000, 40)]
    text, best = verdict(pt("torch_compile", 5000, 47), own)
    assert best.provider == "own_recompute" and text.startswith("above by")


def test_overlapping_ranges_are_level_and_apart_ranges_faster():
    own = [pt("own_ws3072", 3600, 46.4, spread=1.0)]
    assert verdict(pt("torch_compile", 5000, 46.9, spread=1.0), own)[0] == "at or below (level)"
    assert verdict(pt("naive", 28000, 90.0), own)[0] == "at or below (faster)"


def test_no_own_point_within_a_smaller_peer_memory():
    assert verdict(pt("liger_flce", 100, 140), [pt("own", 1200, 60)])[1] is None


def _row(provider, mib, ms):
    return dict(phase="loss+grad", status="ok", provider=provider, peak_extra_mib=str(mib),
                ms=str(ms), ms_p20=str(ms - 0.5), ms_p80=str(ms + 0.5), de_rel_err="1e-3")


def test_table_marks_the_filter_apart_and_gives_each_exact_peer_a_verdict():
    rows = [_row("own_low_memory", 1200, 60), _row("own_filter", 1210, 42),
            _row("torch_compile", 5000, 47), _row("naive", 28000, 90)]
    table = cell_table(rows)
    assert "filtered (not exact)" in table
    line = next(ln for ln in table.splitlines() if ln.startswith("| `torch_compile`"))
    assert "above by" in line  # the filter's 42 ms is not exact, so it does not answer for own


def test_the_plugin_registers_the_sweep_the_tables_read_as_exact():
    import suite.frontier  # noqa: F401  (registers the sweep)
    from suite import catalog
    from suite.report.frontier_tables import SWEEP, is_exact

    for name in SWEEP:
        assert catalog.get(name).exact and is_exact(name), name
    assert not is_exact("own_filter") and not is_exact("someone_unknown")


# ---- the exact call's targets (suite/report/exact_targets.py) ------------------------------

def _cell_row(provider, mib, ms, spread=0.5, phase="loss+grad", floors="", de="1e-3", dc="1e-3"):
    return dict(cell_id="lm-n8-d4-v16", n="8", d="4", v="16", softcap="", phase=phase,
                status="ok", provider=provider, peak_extra_mib=str(mib), ms=str(ms),
                ms_p20=str(ms - spread), ms_p80=str(ms + spread), floor_ratio=floors,
                de_rel_err=de, dc_rel_err=dc)


def _targets(rows, fwd_rows=()):
    from suite.report.exact_targets import cell_targets

    return cell_targets(list(rows), list(fwd_rows))


def test_targets_best_point_counts_only_within_torch_compiles_memory():
    out = _targets([_cell_row("torch_compile", 3000, 50), _cell_row("own", 2000, 49),
                    _cell_row("own_ws8192", 6000, 40), _cell_row("own_ws2048", 3000.5, 47)])
    assert out["best_provider"] == "own_ws2048"  # within the 1 MiB slack; ws8192 is over it
    assert out["best_over_compile"] == 47 / 50 and out["best_met"]


def test_targets_best_needs_the_ratio_and_the_noise_rule():
    def best(ms, spread):
        return _targets([_cell_row("torch_compile", 3000, 50, spread),
                         _cell_row("own", 2000, ms, spread)])["best_met"]

    assert best(48, 0.5)           # 0.96x, ranges apart
    assert not best(48, 1.5)       # 0.96x by the medians, but the ranges overlap: level
    assert not best(49, 0.2)       # faster, but 0.98x


def test_targets_default_is_met_when_level_and_missed_when_slower():
    level = _targets([_cell_row("torch_compile", 3000, 50), _cell_row("own", 2000, 50.6)])
    slower = _targets([_cell_row("torch_compile", 3000, 50), _cell_row("own", 2000, 52)])
    assert (level["default_vs_compile"], level["default_met"]) == ("level", True)
    assert (slower["default_vs_compile"], slower["default_met"]) == ("slower", False)


def test_targets_error_is_the_worst_exact_own_point_in_de_or_dc():
    out = _targets([_cell_row("torch_compile", 3000, 50, de="1e-2", dc="1e-2"),
                    _cell_row("own", 2000, 49, de="5e-3", dc="1.3e-2"),
                    _cell_row("own_ws0", 1000, 60, de="9e-3", dc="2e-3"),
                    _cell_row("own_filter", 1000, 30, de="5e-2", dc="5e-2"),  # not exact
                    _cell_row("naive", 9000, 70, de="9e-2", dc="9e-2")])
    assert out["err_provider"] == "own" and abs(out["err_over_compile"] - 1.3) < 1e-12
    assert out["err_met"] is False


def test_targets_floors_and_filter_and_a_missing_forward():
    rows = [_cell_row("torch_compile", 3000, 50), _cell_row("own", 2000, 49),
            _cell_row("own_ws0", 1000, 60, floors="4.2"), _cell_row("own_filter", 1000, 51)]
    fwd = [_cell_row("own", 0, 10, phase="fwd", floors="1.04"),
           _cell_row("own_portable", 0, 12, phase="fwd", floors="1.3")]
    out = _targets(rows, fwd)
    assert (out["ws0_floors"], out["ws0_met"]) == (4.2, False)
    assert (out["filter_vs_default"], out["filter_met"]) == ("slower", False)
    assert (out["fwd_met"], out["portable_fwd_met"]) == (True, False)
    bare = _targets(rows)
    assert bare["fwd_floors"] is None and bare["fwd_met"] is None


def _run_folder(tmp_path, name, rows):
    """A run folder of results.csv rows (every schema column, empty where rows lack it) and an
    env.json."""
    import csv as csv_mod
    import json

    from suite.schema import ROW_FIELDS

    folder = tmp_path / name
    folder.mkdir()
    with (folder / "results.csv").open("w", newline="") as f:
        writer = csv_mod.DictWriter(f, fieldnames=ROW_FIELDS)
        writer.writeheader()
        writer.writerows({**dict.fromkeys(ROW_FIELDS, ""), **r, "timestamp": "t"} for r in rows)
    (folder / "env.json").write_text(json.dumps({"gpu_name": "GPU X", "git_commit": "a" * 40}))
    return folder


def test_targets_csv_from_run_folders(tmp_path):
    import csv as csv_mod

    from suite.report.exact_targets import COLUMNS, targets, write_csv

    lg = _run_folder(tmp_path, "lg", [_cell_row("torch_compile", 3000, 50),
                                      _cell_row("own", 2000, 49)])
    fw = _run_folder(tmp_path, "fw", [_cell_row("own", 0, 10, phase="fwd", floors="1.01")])
    path = write_csv(targets([lg], [fw]), tmp_path / "t.csv")
    (row,) = list(csv_mod.DictReader(path.open()))
    assert list(row) == list(COLUMNS)
    assert (row["default_met"], row["fwd_floors"], row["gpu"], row["commit"]) == \
        ("yes", "1.01", "GPU X", "a" * 10)
    assert row["ws0_floors"] == "" and row["ws0_met"] == ""  # no own_ws0 row: not judged


def test_frontier_command_refuses_forward_runs_without_a_targets_csv(tmp_path):
    import argparse

    import pytest

    from suite.frontier import main

    lg = _run_folder(tmp_path, "lg", [_cell_row("own", 2000, 49)])
    args = argparse.Namespace(results=[str(lg)], forward=[str(lg)], targets_csv=None)
    with pytest.raises(SystemExit, match="--forward: needs --targets-csv"):
        main(args)


def test_the_committed_exact_targets_are_their_runs_read_again(tmp_path, capsys):
    """frontier.md's targets tables are blocks over targets-a638c7e.csv: that CSV is what the
    committed frontier, heads and forward folders give, not a file edited by hand."""
    import argparse

    from suite.frontier import main

    root = Path(__file__).resolve().parents[1]
    notes = root / "results/notes/frontier-h200"
    runs = sorted((root / "results").glob("frontier-*-h200")) + sorted(
        (notes / "heads-a638c7e").glob("frontier-*-h200"))
    forward = sorted((notes / "forward-a638c7e").glob("forward-*"))
    assert len(runs) == 8 and len(forward) == 2
    out = tmp_path / "t.csv"
    main(argparse.Namespace(results=[str(r) for r in runs], forward=[str(f) for f in forward],
                            targets_csv=str(out)))
    capsys.readouterr()

    def rows(path):  # the order of the cells follows the folders' order, not the committed one's
        return sorted(path.read_text().splitlines()[1:])

    assert out.read_text().splitlines()[0] == \
        (notes / "targets-a638c7e.csv").read_text().splitlines()[0]
    assert rows(out) == rows(notes / "targets-a638c7e.csv")


# ---- the autocast target (suite/report/autocast_targets.py) ----------------------------------

def _autocast_row(provider, mib, ms, spread=0.5):
    return dict(shape="s", n="8", d="4", v="16", provider=provider, status="ok",
                peak_mib=str(mib), ms=str(ms), ms_p20=str(ms - spread), ms_p80=str(ms + spread))


def test_autocast_target_takes_default_config_points_within_torch_compiles_memory():
    from suite.report.autocast_targets import shape_targets

    rows = [_autocast_row("torch_compile", 3000, 50), _autocast_row("own", 2000, 49),
            _autocast_row("own_ws8192", 3500, 40),       # over torch.compile's memory
            _autocast_row("own_logits16", 2000, 41),     # a logits-format variant, not a config
            _autocast_row("own_ws3072", 3000.5, 47)]     # within the 1 MiB slack
    out = shape_targets(rows)
    assert (out["best_provider"], out["best_over_compile"], out["best_met"]) == (
        "own_ws3072", 47 / 50, True)
    assert (out["default_over_compile"], out["default_vs_compile"]) == (49 / 50, "level")
    assert not shape_targets(rows[:2] + [_autocast_row("own_ws3072", 3000, 48)])["best_met"]
    assert not shape_targets(rows[:2] + [_autocast_row("own_ws3072", 3000, 47, 3)])["best_met"]


def test_the_committed_autocast_targets_are_their_runs_read_again(tmp_path):
    from suite.report import autocast_targets

    root = Path(__file__).resolve().parents[1]
    runs = [root / "results/autocast-h200/autocast.csv"] + sorted(
        (root / "results/notes/autocast-heads-h200/a638c7e").glob("round-*/autocast.csv"))
    out = tmp_path / "t.csv"
    assert autocast_targets.main([str(out), *map(str, runs)]) == 0
    assert out.read_text() == (root / "results/notes/autocast-targets-h200.csv").read_text()
    with pytest.raises(SystemExit):
        autocast_targets.main([str(out), str(tmp_path / "none.csv")])
