"""The frontier report's verdicts: memory bounds which own points count, noise decides level."""
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
