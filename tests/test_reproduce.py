"""suite.reproduce: table1.md and the claim checks, from the synthetic fixture run and variants
of it (no GPU, no measurement)."""
import argparse
import csv
import shutil
import sys
import types
from pathlib import Path

import pytest

from suite import reproduce
from suite.schema import ROW_FIELDS

FIXTURE_RUN = Path(__file__).parent / "fixtures" / "synthetic_run"
GEMMA = "n8192-d2304-v256000-bf16-sc30"


def parse(argv):
    parser = argparse.ArgumentParser()
    reproduce.add_arguments(parser)
    return parser.parse_args(argv)


def fixture_rows():
    with open(FIXTURE_RUN / "results.csv") as f:
        return list(csv.DictReader(f))


def write_run(run_dir: Path, rows) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy(FIXTURE_RUN / "env.json", run_dir / "env.json")
    with open(run_dir / "results.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=ROW_FIELDS)
        w.writeheader()
        w.writerows(rows)
    return run_dir


def variant(tmp_path, provider, phase, dists=("uniform", "lm"), drop=False, **changes) -> Path:
    """The fixture with the Table 1 rows of (provider, phase) changed (or dropped)."""
    rows = []
    for r in fixture_rows():
        hit = (GEMMA in r["cell_id"] and r["provider"] == provider
               and r["phase"] == phase and r["dist"] in dists)
        if hit and drop:
            continue
        if hit:
            r = {**r, **{k: str(v) for k, v in changes.items()}}
        rows.append(r)
    return write_run(tmp_path / "run", rows)


def checks_of(run_dir):
    _, checks = reproduce.write_table1(run_dir)
    return {(c.claim, c.dist, c.method): c for c in checks}


def verdict(checks, claim, method, dist="uniform"):
    return checks[(claim, dist, method)].verdict


# ---- table1.md ------------------------------------------------------------------------------

def test_table1_from_fixture(tmp_path, capsys):
    run = write_run(tmp_path / "run", fixture_rows())
    assert reproduce.main(parse(["--from-results", str(run)])) == 0
    text = (run / "table1.md").read_text()
    assert "reproduce: wrote" in capsys.readouterr().out
    for heading in ("## Hardware and software", "## Differences from the paper's setup",
                    "## Ours, `uniform` inputs", "## Ours, `lm` inputs",
                    "## The paper's Table 1", "## Ours / paper, `uniform` inputs", "## Claim checks"):
        assert heading in text
    for _, label, _ in reproduce.METHODS:
        assert label in text
    assert "A100-SXM4" in text and "Alpaca" in text  # the setup differences are stated
    assert "SYNTHETIC-FIXTURE" in text  # hardware from env.json / the rows
    assert "| baseline | 24000 / 82 | 16000 / 122 | 28000 / 208 |" in text  # the paper's row
    # Our baseline row, from the fixture's rows (made up as 12 / 8 / 14 bytes per logit).
    naive = {r["phase"]: r for r in fixture_rows()
             if GEMMA in r["cell_id"] and r["dist"] == "uniform" and r["provider"] == "naive"}
    ms = {p: reproduce.fmt_ms(float(naive[p]["ms"])) for p in reproduce.TABLE1_PHASES}
    assert (f"| baseline (naive) | 24000 / {ms['loss']} | 16000 / {ms['grad']} | "
            f"28000 / {ms['loss+grad']} |") in text
    ratio = float(naive["loss+grad"]["ms"]) / 208
    assert f"1.00x / {ratio:.2f}x" in text  # ours / paper


def test_table1_is_rewritten_identically(tmp_path):
    run = write_run(tmp_path / "run", fixture_rows())
    reproduce.write_table1(run)
    first = (run / "table1.md").read_bytes()
    reproduce.write_table1(run)
    assert (run / "table1.md").read_bytes() == first


def test_committed_table1_is_what_the_run_gives_now(tmp_path):
    """results/peers-h100/table1.md is `python -m suite reproduce --from-results
    results/peers-h100`'s output, wherever the checkout lies: a stale table fails here."""
    from suite.report.curated import ROOT

    run = ROOT / "results" / "peers-h100"
    _, checks = reproduce.write_table1(run, tmp_path / "table1.md")
    assert checks
    assert (tmp_path / "table1.md").read_text() == (run / "table1.md").read_text()


def test_failed_method_shows_its_status(tmp_path):
    run = variant(tmp_path, "naive", "loss+grad", status="oom", peak_extra_mib="", ms="",
                  error="CUDA out of memory")
    reproduce.write_table1(run)
    text = (run / "table1.md").read_text()
    assert "**oom**" in text
    checks = checks_of(run)
    assert verdict(checks, reproduce.CLAIM_HEAD, "naive") == "FAIL"
    assert "oom" in checks[(reproduce.CLAIM_HEAD, "uniform", "naive")].measured


def test_missing_results_is_a_clear_error(tmp_path, capsys):
    assert reproduce.main(parse(["--from-results", str(tmp_path)])) == 1
    assert "no results.csv" in capsys.readouterr().out
    (tmp_path / "results.csv").write_text("a,b\n1,2\n")
    assert reproduce.main(parse(["--from-results", str(tmp_path)])) == 1
    assert "missing columns" in capsys.readouterr().out


def test_lower_bound_is_the_papers():
    # dE + dC in bf16 at Gemma 2 (2B): the paper's 1161 MiB lower bound.
    assert reproduce.gradient_lower_bound_mib(8192, 2304, 256000, "bf16") == pytest.approx(1161, abs=0.5)
    with pytest.raises(ValueError, match="dtype"):
        reproduce.gradient_lower_bound_mib(8192, 2304, 256000, "int8")


# ---- claim checks ---------------------------------------------------------------------------

def test_claims_on_the_fixture(tmp_path):
    """The fixture is built so that these verdicts follow (tests/fixtures/make_fixture.py)."""
    checks = checks_of(write_run(tmp_path / "run", fixture_rows()))
    m = len(reproduce.CCE_METHODS)
    assert len(checks) == 2 * (2 + 2 * m + m + m)  # per dist: 2 baseline, 2 memory, speed, agreement per method
    for dist in ("uniform", "lm"):
        # the fixture has no own_low_memory rows: its checks are NOT RUN, never PASS
        for method in ("naive", *reproduce.CCE_METHODS):
            want = "NOT RUN" if method == "own_low_memory" else "PASS"
            assert verdict(checks, reproduce.CLAIM_LOSS, method, dist) == want
            assert verdict(checks, reproduce.CLAIM_HEAD, method, dist) == want
        # made-up times: own kernels 1.10-1.12 matmuls per phase matmul, torch.compile 1.15,
        # Apple 1.3 (and 3x slower backward on lm)
        assert verdict(checks, reproduce.CLAIM_SPEED, "own", dist) == "PASS"
        assert verdict(checks, reproduce.CLAIM_SPEED, "own_filter", dist) == "PASS"
        assert verdict(checks, reproduce.CLAIM_SPEED, "apple_cce", dist) == "FAIL"
        assert verdict(checks, reproduce.CLAIM_GRAD, "own", dist) == "PASS"
    # the made-up Apple dE error on lm inputs (0.7) must be caught
    assert verdict(checks, reproduce.CLAIM_GRAD, "apple_cce", "lm") == "FAIL"
    assert verdict(checks, reproduce.CLAIM_GRAD, "apple_cce", "uniform") == "PASS"


@pytest.mark.parametrize("mib, expected", [(24000 * 1.049, "PASS"), (24000 * 0.951, "PASS"),
                                           (24000 * 1.06, "FAIL"), (20000, "FAIL")])
def test_baseline_loss_memory_tolerance(tmp_path, mib, expected):
    checks = checks_of(variant(tmp_path, "naive", "loss", peak_extra_mib=mib))
    assert verdict(checks, reproduce.CLAIM_LOSS, "naive") == expected


@pytest.mark.parametrize("mib, expected", [(1.0, "PASS"), (1.49, "PASS"), (1.5, "FAIL"), (3, "FAIL")])
def test_cce_loss_memory_limit(tmp_path, mib, expected):
    checks = checks_of(variant(tmp_path, "own", "loss", peak_extra_mib=mib))
    assert verdict(checks, reproduce.CLAIM_LOSS, "own") == expected
    assert verdict(checks, reproduce.CLAIM_LOSS, "own_filter") == "PASS"  # untouched


@pytest.mark.parametrize("factor, expected", [(1.099, "PASS"), (1.101, "FAIL")])
def test_cce_head_memory_within_lower_bound(tmp_path, factor, expected):
    lb = reproduce.gradient_lower_bound_mib(8192, 2304, 256000, "bf16")
    checks = checks_of(variant(tmp_path, "apple_cce", "loss+grad", peak_extra_mib=factor * lb))
    assert verdict(checks, reproduce.CLAIM_HEAD, "apple_cce") == expected


def test_speed_compares_with_torch_compile(tmp_path):
    tc = next(r for r in fixture_rows() if GEMMA in r["cell_id"] and r["dist"] == "uniform"
              and r["provider"] == "torch_compile" and r["phase"] == "loss+grad")
    tc_ms, tc_p20, tc_p80 = float(tc["ms"]), float(tc["ms_p20"]), float(tc["ms_p80"])
    # slower: its whole p20-p80 range above torch.compile's (suite.report.verdict)
    above = tc_p80 - tc_p20 + 1e-3
    checks = checks_of(variant(tmp_path, "own_filter", "loss+grad", ms=tc_ms + above,
                               ms_p20=tc_p20 + above, ms_p80=tc_p80 + above))
    assert verdict(checks, reproduce.CLAIM_SPEED, "own_filter") == "FAIL"
    # a slower median whose range overlaps torch.compile's is level: not slower
    checks = checks_of(variant(tmp_path / "b", "apple_cce", "loss+grad", ms=tc_ms * 1.001,
                               ms_p20=tc_p20, ms_p80=tc_p80))
    assert verdict(checks, reproduce.CLAIM_SPEED, "apple_cce") == "PASS"
    checks = checks_of(variant(tmp_path / "c", "torch_compile", "loss+grad", drop=True))
    assert verdict(checks, reproduce.CLAIM_SPEED, "own") == "NOT RUN"


def test_gradient_agreement_is_relative_to_naive(tmp_path):
    # naive's made-up errors are 5e-3: the limit is 7.5e-3
    checks = checks_of(variant(tmp_path, "own", "loss+grad", de_rel_err=7.4e-3))
    assert verdict(checks, reproduce.CLAIM_GRAD, "own") == "PASS"
    checks = checks_of(variant(tmp_path / "b", "own", "loss+grad", dc_rel_err=7.6e-3))
    assert verdict(checks, reproduce.CLAIM_GRAD, "own") == "FAIL"
    # a worse yardstick loosens the limit: the same 2e-2 passes against a naive error of 2e-2
    checks = checks_of(variant(tmp_path / "c", "naive", "loss+grad", de_rel_err=2e-2))
    assert verdict(checks, reproduce.CLAIM_GRAD, "apple_cce") == "PASS"
    assert "dE <= 3.0e-02" in checks[(reproduce.CLAIM_GRAD, "uniform", "apple_cce")].tolerance


@pytest.mark.parametrize("status, expected", [("oom", "FAIL"), ("error", "FAIL"), ("nan", "FAIL"),
                                              ("crashed", "FAIL"), ("unavailable", "NOT RUN"),
                                              ("unsupported", "NOT RUN")])
def test_status_of_a_cce_method_decides(tmp_path, status, expected):
    checks = checks_of(variant(tmp_path, "own", "loss", status=status, peak_extra_mib="", ms=""))
    assert verdict(checks, reproduce.CLAIM_LOSS, "own") == expected


def test_missing_method_is_not_run(tmp_path):
    checks = checks_of(variant(tmp_path, "own_filter", "loss", drop=True))
    assert verdict(checks, reproduce.CLAIM_LOSS, "own_filter") == "NOT RUN"


# ---- the run: wiring to suite.runner --------------------------------------------------------

def test_run_calls_the_runner_then_writes_table1(tmp_path, monkeypatch):
    calls = {}

    def preset_cells(name):
        calls["preset"] = name
        return ["<cells>"]

    def run(cells, providers, phases, out_dir, **kw):
        calls.update(cells=cells, providers=providers, phases=phases, out=out_dir, kw=kw)
        write_run(Path(out_dir), fixture_rows())  # stands in for the measurement
        return Path(out_dir)

    monkeypatch.setitem(sys.modules, "suite.runner",
                        types.SimpleNamespace(preset_cells=preset_cells, run=run))
    import suite

    monkeypatch.setattr(suite, "runner", sys.modules["suite.runner"], raising=False)
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)  # the runner is faked
    out = tmp_path / "t1"
    assert reproduce.main(parse(["--out", str(out), "--device", "cuda", "--reps", "5"])) == 0
    assert calls["preset"] == "gemma2-2b"
    assert calls["providers"] == ["own", "own_filter", "own_low_memory", "apple_cce", "apple_cce_nofilter",
                                  "liger_flce", "chunked", "torch_compile", "naive"]
    assert calls["phases"] == ["loss", "grad", "loss+grad"]
    assert calls["kw"]["reps"] == 5 and calls["kw"]["device"] == "cuda"
    assert calls["kw"]["resume"] is True and calls["kw"]["isolate"] is True
    assert (out / "table1.md").exists()


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_without_cuda_it_refuses_before_measuring(tmp_path, monkeypatch, capsys, device):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    out = tmp_path / "t1"
    assert reproduce.main(parse(["--out", str(out), "--device", device])) == 2
    assert "CUDA device" in capsys.readouterr().out
    assert not out.exists()  # no table from nothing


def test_reps_must_be_positive(capsys):
    assert reproduce.main(parse(["--reps", "0"])) == 2
    assert "--reps" in capsys.readouterr().out


def test_preset_matches_table1_setting():
    runner = pytest.importorskip("suite.runner", reason="suite.runner not importable here")
    cells = runner.preset_cells(reproduce.PRESET)
    assert {c.dist for c in cells} == set(reproduce.DISTS)
    for c in cells:
        assert (c.n, c.d, c.v, c.dtype, c.softcap) == tuple(reproduce.GEMMA2_2B.values())
        assert not c.bias and not c.ignore_frac


def test_cpu_rows_say_memory_was_not_measured(tmp_path):
    run = variant(tmp_path, "naive", "loss", device="cpu", peak_extra_mib="")
    reproduce.write_table1(run)
    assert "| baseline (naive) | not measured / " in (run / "table1.md").read_text()


def test_rows_without_memory_or_time_are_not_run(tmp_path):
    """A CPU run records no CUDA memory: no verdict can be drawn from it."""
    checks = checks_of(variant(tmp_path, "own", "loss", peak_extra_mib=""))
    assert verdict(checks, reproduce.CLAIM_LOSS, "own") == "NOT RUN"
    checks = checks_of(variant(tmp_path / "b", "own", "loss+grad", ms=""))
    assert verdict(checks, reproduce.CLAIM_SPEED, "own") == "NOT RUN"
