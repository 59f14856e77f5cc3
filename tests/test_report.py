"""suite.report's training-step table (render_train) and the report command's dispatch, on
the synthetic fixture runs tests/fixtures/train-fixture-{a,b} (make_train_fixture.py)."""
import argparse
import csv
import json
import shutil
from pathlib import Path

import pytest

from suite import report, results
from suite.train import BENCH_FIELDS
from suite.report.verdict import RULE_TEXT

FIXTURE = Path(__file__).parent / "fixtures"
RUN_A, RUN_B = FIXTURE / "train-fixture-a", FIXTURE / "train-fixture-b"


def _section(text: str, start: str, end: str | None = None) -> str:
    part = text[text.index(start):]
    return part[:part.index(end)] if end else part


def _table_rows(text: str) -> list[str]:
    return [line for line in text.splitlines()
            if line.startswith("| ") and not line.startswith(("| backend", "| run |"))]


def test_bench_rows_per_vocab_with_capped_failed_and_superseded_rows():
    text = report.render_train([RUN_A, RUN_B])
    v1000 = _section(text, "**V = 1000**", "**V = 5000**")
    assert _table_rows(v1000) == [
        "| naive | 20.0 | 12.0 | 1,000 | 12 |",
        "| liger_ce | 12.0 | 4.00 | 1,500 | 20 |",
        "| selective+liger_ce | 9.00 | 1.00 | 1,800 | 30 |",
        "| apple_cce | oom | – | – | 3 |",
        "| own | 8.50 | 0.50 | 900 | >= 64 (cap) |",
    ]
    assert "- apple_cce: oom: OutOfMemoryError('CUDA out of memory." in v1000
    assert "batch 8 x 128 tokens" in v1000 and f"from `{RUN_A.as_posix()}`" in v1000
    # V = 5000: the later complete run wins over the older OOM / skipped rows, which are named
    v5000 = _section(text, "**V = 5000**", "**Convergence parity**")
    assert _table_rows(v5000)[0] == "| naive | 40.0 | 30.0 | 500 | 3 |"
    assert "| apple_cce | crashed | – | – | – |" in v5000
    assert "- apple_cce: crashed: worker exited with code -11" in v5000
    assert (f"superseded by the row above of each backend: oom: naive; skipped: own "
            f"(`{RUN_A.as_posix()}`)") in v5000
    assert "| own | 10.5 | 0.50 | 400 | >= 64 (cap) |" in v5000


def test_liger_and_selection_savings_are_computed_from_the_rows():
    text = report.render_train([RUN_A, RUN_B])
    assert ("Liger CE and row selection at V = 1000, batch 8 x 128: Liger CE instead of naive CE saves "
            "8.0 GiB of the step's peak (20.0 -> 12.0 GiB); selecting the labelled rows first "
            "(selective+liger_ce) saves 3.0 GiB more (-> 9.00 GiB).") in text
    assert "Liger CE and row selection at V = 5000, batch 2 x 128: Liger CE instead of naive CE saves " \
           "20.0 GiB" in text
    rows, _ = results.train_bench_rows([RUN_A])
    v5000 = [r for r in rows if r["vocab"] == "5000"]
    assert "not measured" in report.liger_selective_comparison(v5000)  # naive OOM there


def test_convergence_verdicts():
    text = report.render_train([RUN_A, RUN_B])
    conv = _section(text, "**Convergence parity**")
    assert "within 1 % of the reference's (its range over +-0 steps) after step 5" in conv
    assert _table_rows(conv) == [
        "| naive | naive | reference | – | 2.0000 | – | 50,000 | 2.00 |",
        "| naive_rerun | naive | pass | 0.200 % (7) | 2.0000 | +0.100 % | 50,000 | 2.00 |",
        "| own | own | pass | 0.200 % (7) | 2.0000 | +0.100 % | 50,000 | 2.00 |",
        "| apple_cce | apple_cce | fail | 2.500 % (7) | 2.0000 | +1.250 % | 50,000 | 2.00 |",
        "| liger_flce | liger_flce | unavailable | – | – | – | – | – |",
    ]
    assert "- liger_flce: unavailable: liger-kernel is not installed" in conv


def test_missing_convergence_file_and_folder_without_training_csvs(tmp_path):
    text = report.render_train([RUN_B])
    assert "No train_convergence.csv in these folders: no convergence verdicts." in text
    assert "**V = 5000**" in text and "**V = 1000**" not in text
    with pytest.raises(ValueError, match="no train_bench.csv or train_convergence.csv"):
        report.render_train([RUN_B, tmp_path])


def test_a_later_failure_does_not_hide_an_earlier_success_and_mixed_runs_say_so(tmp_path):
    """A newer run at V = 1000: naive times out (a's ok row stays), own ok at another batch
    (it wins): the table names each row's batch and run."""
    newer = tmp_path / "train-newer"
    newer.mkdir()
    shutil.copy(RUN_A / "env.json", newer / "env.json")
    with open(RUN_A / "train_bench.csv", newline="") as f:
        old = {r["backend"]: r for r in csv.DictReader(f) if r["vocab"] == "1000"}
    stamp = "2003-01-01T00:00:00"
    timeout = {k: "" for k in BENCH_FIELDS} | {k: old["naive"][k] for k in (
        "device", "vocab", "d_model", "n_layer", "n_head", "seq_len", "dtype", "softcap",
        "backend")} | {"timestamp": stamp, "status": "timeout", "error": "no result"}
    own = dict(old["own"], timestamp=stamp, batch="4", peak_mib="8192")
    with open(newer / "train_bench.csv", "w", newline="") as f:
        w = csv.DictWriter(f, BENCH_FIELDS)
        w.writeheader()
        w.writerows([timeout, own])
    text = report.render_train([RUN_A, newer])
    v1000 = _section(text, "**V = 1000**", "**Convergence parity**")
    assert "| backend | peak GiB | loss GiB | tokens/s | largest batch | batch | run |" in v1000
    assert f"| naive | 20.0 | 12.0 | 1,000 | 12 | 8 | `{RUN_A.as_posix()}` |" in v1000
    assert f"| own | 8.00 | 0.50 | 900 | >= 64 (cap) | 4 | `{newer.as_posix()}` |" in v1000
    assert f"timeout: naive (`{newer.as_posix()}`)" in v1000
    assert f"ok: own (`{RUN_A.as_posix()}`)" in v1000


def test_the_own_kernels_path_is_a_column_where_the_step_bench_recorded_it(tmp_path):
    run = tmp_path / "train-paths"
    run.mkdir()
    shutil.copy(RUN_A / "env.json", run / "env.json")
    with open(RUN_A / "train_bench.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["vocab"] == "1000"]
    for r in rows:
        r["loss_path"] = "three-matmul" if r["backend"] == "own" else ""
    with open(run / "train_bench.csv", "w", newline="") as f:
        w = csv.DictWriter(f, BENCH_FIELDS, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    text = report.render_train([run])
    assert "| backend | peak GiB | loss GiB | tokens/s | largest batch | own kernel's path |" in text
    assert "| own | 8.50 | 0.50 | 900 | >= 64 (cap) | three-matmul |" in text
    assert "| naive | 20.0 | 12.0 | 1,000 | 12 | – |" in text
    assert "own kernel's path" not in report.render_train([RUN_A])  # runs before the column


def _main(argv):
    parser = argparse.ArgumentParser()
    report.add_arguments(parser)
    return report.main(parser.parse_args(argv))


def test_report_command_picks_the_training_table(tmp_path, capsys):
    assert _main([str(RUN_A), str(RUN_B)]) == 0
    assert "**Convergence parity**" in capsys.readouterr().out
    assert _main([str(RUN_A), str(FIXTURE / "synthetic_run")]) == 1
    assert "mix of training-step folders" in capsys.readouterr().out
    assert _main([str(FIXTURE / "synthetic_run"), str(FIXTURE / "synthetic_run")]) == 1
    assert "give one run folder" in capsys.readouterr().out


def test_update_readme_rewrites_only_the_train_section(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("intro\n<!-- results:gemma2-2b:start -->\nkeep\n<!-- results:gemma2-2b:end -->\n"
                      "<!-- results:train:start -->\nold\n<!-- results:train:end -->\noutro\n")
    report.update_readme(report.render_train([RUN_A, RUN_B]), "train", readme=readme)
    doc = readme.read_text()
    assert "keep" in doc and "old" not in doc and doc.endswith("outro\n")
    assert "| naive | 40.0 | 30.0 | 500 | 3 |" in doc


def _lg_row(cell, provider, ms, mib, de, *, status="ok", ts="2026-01-01T00:00:00", floor=1.0,
            spread=0.02):
    """A loss+grad row whose timed calls' p20 and p80 lie ``spread`` below and above ``ms``."""
    n, v = cell
    return {"cell_id": f"lm-n{n}-v{v}", "dtype": "bf16", "dist": "lm", "n": str(n), "d": "64",
            "v": str(v), "provider": provider, "phase": "loss+grad", "status": status,
            "ms": str(ms), "ms_p20": str(ms * (1 - spread)), "ms_p80": str(ms * (1 + spread)),
            "floor_ratio": str(ms / floor), "peak_extra_mib": str(mib),
            "de_rel_err": str(de), "timestamp": ts}


def test_versus_table_ratios_statuses_and_latest_rows():
    rows = [
        _lg_row((8, 100), "own_filter", 2.0, 10.0, 1e-3, floor=0.5),
        _lg_row((8, 100), "apple_cce", 4.0, 5.0, 0.5),
        _lg_row((8, 100), "apple_cce", 1.0, 5.0, 0.5, ts="2025-01-01T00:00:00"),  # older: ignored
        _lg_row((8, 50), "own_filter", 3.0, 0.0075, 2e-3, floor=1.0),  # 1.06x dE + dC's 7424 bytes
        _lg_row((8, 50), "apple_cce", 0, 0, 0, status="error"),
        _lg_row((8, 50), "own", 1.0, 1.0, 0.0, status="ok"),  # not asked for
    ]
    text = report.versus_table(rows, "own_filter", ["apple_cce"])
    lines = [line for line in text.splitlines() if line.startswith("| bf16")]
    # sorted by V; the failed peer shows its status, no ratio
    assert lines == ["| bf16 | lm | 8 | 64 | 50 | 3.00 | 1.059 | error | – | 2.0e-03 | – |",
                     "| bf16 | lm | 8 | 64 | 100 | 4.00 | 758.519 | 0.50 faster | 2.00 | 1.0e-03 "
                     "| 5.0e-01 |"]
    assert text.endswith(f"- own_filter against apple_cce (loss+grad; {RULE_TEXT}): faster in 1, "
                         f"level in 0, slower in 0 of 1 cells\n"
                         "- own_filter loss+grad memory within 1.10× the gradients in 1 of 2 cells")
    with pytest.raises(ValueError, match="no loss\\+grad rows of provider 'missing'"):
        report.versus_table(rows, "missing", ["apple_cce"])


def test_versus_table_shows_ignored_fraction_where_any_cell_has_one():
    rows = [_lg_row((8, 100), "own", 2.0, 10.0, 1e-3), _lg_row((8, 100), "apple_cce", 4.0, 5.0, 0.5)]
    masked = [{**r, "cell_id": r["cell_id"] + "-ig0.6", "ignore_frac": "0.6"} for r in rows]
    plain = report.versus_table(rows, "own", ["apple_cce"])
    assert "ignored" not in plain
    lines = [line for line in report.versus_table(rows + masked, "own", ["apple_cce"]).splitlines()
             if line.startswith("| ")]
    assert lines[0].startswith("| dtype | dist | N | D | V | ignored | own ×floor |")
    assert lines[1].startswith("| bf16 | lm | 8 | 64 | 100 | 0 | 2.00 | 758.519 | 0.50 faster |")
    assert lines[2].startswith("| bf16 | lm | 8 | 64 | 100 | 0.6 | 2.00 | 758.519 | 0.50 faster |")


def test_versus_command_over_a_run_folder(capsys):
    parser = argparse.ArgumentParser()
    report.add_arguments(parser)
    run = FIXTURE / "synthetic_run"
    assert report.main(parser.parse_args([str(run), "--versus", "own_filter"])) == 0
    out = capsys.readouterr().out
    assert "--versus own_filter --peers apple_cce,torch_compile" in out
    assert report.main(parser.parse_args([str(run), "--versus", "own_filter", "--section", "x"])) == 0
    assert "--versus own_filter --peers apple_cce,torch_compile --section x`" in capsys.readouterr().out
    assert f"own_filter against torch_compile (loss+grad; {RULE_TEXT}): faster in" in out
    assert report.main(parser.parse_args([str(run), "--versus", "own_filter", "--peers", ""])) == 1
    assert "--peers: expected comma-separated provider names" in capsys.readouterr().out


def _target_row(dist, n, v, provider, phase, *, ratio=1.0, mib=1.0, de=1e-3, dc=1e-3,
                softcap="", status="ok"):
    return {"cell_id": f"{dist}-n{n}-v{v}-s{softcap}", "dtype": "bf16", "dist": dist,
            "n": str(n), "d": "2304", "v": str(v), "softcap": softcap, "provider": provider,
            "phase": phase, "status": status, "ms": str(ratio), "ms_p20": str(0.98 * ratio),
            "ms_p80": str(1.02 * ratio), "floor_ratio": str(ratio),
            "peak_extra_mib": str(mib), "de_rel_err": str(de), "dc_rel_err": str(dc),
            "timestamp": "2026-01-01T00:00:00"}


def test_targets_table_marks_each_miss_and_counts_cells():
    gemma = dict(dist="lm", n=8192, v=256000, softcap="30.0")
    grads_mib = (8192 + 256000) * 2304 * 2 / 2**20
    rows = [_target_row(**gemma, provider="own_recompute", phase="fwd", ratio=1.05),
            _target_row(**gemma, provider="own_recompute", phase="loss", mib=0.4),
            _target_row(**gemma, provider="own_recompute", phase="loss+grad", ratio=4.7,
                        mib=1.2 * grads_mib, de=2e-3, dc=1e-3),
            _target_row(**gemma, provider="own_low_memory", phase="loss+grad", ratio=5.5,
                        mib=1.05 * grads_mib, de=2e-3, dc=1e-3),
            _target_row(**gemma, provider="own_filter", phase="loss+grad", ratio=3.0,
                        mib=1.2 * grads_mib, de=1e-3, dc=5e-3),
            _target_row(**gemma, provider="apple_cce", phase="loss+grad", ratio=4.0),
            _target_row(**gemma, provider="torch_compile", phase="loss+grad", ratio=3.5,
                        mib=6 * grads_mib),
            _target_row(**gemma, provider="naive", phase="loss+grad", de=1e-3, dc=1e-3),
            # uniform, no softcap: the loss memory target does not apply, nor the torch.compile one
            _target_row("uniform", 2048, 32000, "own_recompute", "fwd", ratio=2.0),
            _target_row("uniform", 2048, 32000, "own_recompute", "loss", mib=2.0),
            _target_row("uniform", 2048, 32000, "own_filter", "loss+grad", ratio=5.0),
            _target_row("uniform", 2048, 32000, "apple_cce", "loss+grad", status="oom"),
            _target_row("uniform", 2048, 32000, "torch_compile", "loss+grad", ratio=1.0)]
    rows.append({**rows[0], "dtype": "fp16", "cell_id": "fp16-cell"})  # bf16 cells only
    text = report.targets_table(rows)
    lines = [line for line in text.splitlines() if line.startswith("| ") and "---" not in line]
    assert len(lines) == 3
    assert lines[1] == ("| lm | 8192 | 2304 | 256000 | 30 | 1.05 | 4.70 ✗ | 0.75 faster "
                        "| 0.86 faster / 0.20 | "
                        "1.200 ✗ / 1.050 | 2.00 ✗ / 5.00 ✗ / 2.00 ✗ | 0.40 |")
    assert lines[2] == ("| uniform | 2048 | 2304 | 32000 | – | 2.00 ✗ | – | – | – | – / – | "
                        "– / – / – | 2.00 |")
    assert text.endswith("- forward ≤ 1.10× floor (own_recompute): 1 of 2 cells\n"
                         "- loss+grad, exact, ≤ 4.60 floors (own_recompute): 0 of 1 cells\n"
                         "- own_filter no slower than torch_compile (faster or level) at ≤ 0.25× "
                         "its memory (lm inputs): 1 of 1 cells\n"
                         "- own_filter faster than apple_cce: 1 of 1 cells\n"
                         "- loss+grad memory ≤ 1.10× the gradients (own_recompute): 0 of 1 cells\n"
                         "- loss+grad memory ≤ 1.10× the gradients (own_low_memory): 1 of 1 cells\n"
                         "- dE and dC errors ≤ 1.5× naive's (own_recompute): 0 of 1 cells\n"
                         "- dE and dC errors ≤ 3× naive's (own_filter): 0 of 1 cells\n"
                         "- dE and dC errors ≤ 1.5× naive's (own_low_memory): 0 of 1 cells\n"
                         "- loss memory ≤ 1 MiB (own_recompute, Gemma 2 (2B) shape): 1 of 1 cells")


def test_targets_command_and_its_errors(capsys):
    parser = argparse.ArgumentParser()
    report.add_arguments(parser)
    run = FIXTURE / "synthetic_run"
    assert report.main(parser.parse_args([str(run), "--targets"])) == 0
    assert f"Generated by `python -m suite report {run.as_posix()} --targets`" in capsys.readouterr().out
    assert report.main(parser.parse_args([str(run), "--targets", "--versus", "own"])) == 1
    assert "give one of --versus, --targets, --headline" in capsys.readouterr().out


def test_env_line_names_the_session_that_re_measured_a_provider(tmp_path):
    # A resumed run with --rerun appends a provider's new rows and an env-2.json: the header
    # must say which commit measured the rows it shows, not only env.json's.
    import json

    run = tmp_path / "run"
    shutil.copytree(FIXTURE / "synthetic_run", run)
    assert "Re-measured" not in report.env_line(run)
    env = json.loads((run / "env.json").read_text())
    (run / "env-2.json").write_text(json.dumps(dict(env, run_id="LATER", git_commit="abc1234",
                                                    date="2030-01-02T00:00:00")))
    with open(run / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    with open(run / "results.csv", "a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writerows(dict(r, run_id="LATER") for r in rows if r["provider"] == "own")
    line = report.env_line(run)
    assert line.endswith("Re-measured since: own at commit abc1234, 2030-01-02."), line


def test_links_are_rebased_into_the_results_document():
    from suite.report.readme import README, RESULTS_DOC, rebase_links

    text = "from [`results/x/results.csv`](results/x/results.csv); [p](https://a.b/c) [s](#t)"
    assert rebase_links(text, RESULTS_DOC) == \
        "from [`results/x/results.csv`](x/results.csv); [p](https://a.b/c) [s](#t)"
    assert rebase_links(text, README) == text


def _cpu_copy(run: Path, tmp_path: Path) -> Path:
    """The fixture run as a CPU run records it: device cpu, no memory."""
    out = tmp_path / "cpu-run"
    out.mkdir()
    with open(run / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    with open(out / "results.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(dict(r, device="cpu", peak_extra_mib="", peak_abs_mib="") for r in rows)
    return out


def test_headline_is_one_compact_block_per_run_folder(tmp_path):
    from suite.report.headline import headline, headline_table

    run = FIXTURE / "synthetic_run"
    table = headline_table(run)
    rows = _table_rows(table)
    lines = table.splitlines()
    assert ("Peers measured: liger-kernel 0.0.0+synthetic, cut-cross-entropy "
            "0.0.0+synthetic.") in lines  # a run from before env.json named each peer
    assert ("| provider | loss MiB | loss+grad MiB | loss+grad ms, uniform "
            "| loss+grad ms, lm | vs torch_compile, lm | ×floor, lm | dE err, lm |") in lines
    assert any(r.startswith("| `naive` | ") for r in rows)
    assert all(" – | – | – |" not in r for r in rows)  # providers that ran show numbers
    cpu = headline_table(_cpu_copy(run, tmp_path))
    naive = next(r for r in _table_rows(cpu) if r.startswith("| `naive` |"))
    assert naive.startswith("| `naive` | not measured | not measured | ")
    assert "CPU (not GPU numbers)" in cpu
    both = headline([run, tmp_path / "cpu-run"], "python -m suite report x --headline")
    assert both.count("**Exact methods**") == 2


def _headline_run(tmp_path, **env):
    run = tmp_path / "run"
    shutil.copytree(FIXTURE / "synthetic_run", run)
    data = json.loads((run / "env.json").read_text())
    (run / "env.json").write_text(json.dumps({**data, **env}))
    return run


def test_headline_names_the_runs_gpu_commit_and_date(tmp_path):
    from suite.report.headline import headline_table

    run = _headline_run(tmp_path, git_commit="0123456789abcdef", date="2026-11-27T10:00:00+00:00")
    title = headline_table(run).splitlines()[0]
    assert title.startswith("**SYNTHETIC-FIXTURE**, one run at commit `0123456` (2026-11-27)")


def test_headline_prose_keeps_exact_and_approximate_methods_apart(tmp_path):
    """The prose is generated from the verdict column: each provider is named in its own kind's
    paragraph under the verdict the table gives it, and no superlative appears."""
    import re

    from suite.report.headline import headline_table, is_exact

    text = headline_table(FIXTURE / "synthetic_run")
    exact_par, approx_par = (p for p in text.split("\n\n") if p.startswith("**Exact methods**")
                             or p.startswith("**Approximate methods**"))
    exact_table, approx_table = text.split("Exact:\n\n")[1].split("Approximate (a gradient filter):")
    for table, paragraph in ((exact_table, exact_par), (approx_table, approx_par)):
        for row in _table_rows(table)[1:]:  # under the header
            cells = [c.strip() for c in row.strip("|").split("|")]
            provider, verdict = cells[0].strip("`"), cells[5]
            if verdict == "–":
                continue
            said = re.search(rf"{verdict}: ([^;.]*)", paragraph)[1]
            assert f"`{provider}`" in said, (provider, verdict, paragraph)
            assert is_exact(provider) == (paragraph is exact_par)
    assert "`own_filter`" in approx_par and "`own_filter`" not in exact_par
    assert "`apple_cce`" in approx_par and "`apple_cce`" not in exact_par
    assert not re.search(r"\b(fastest|best|smallest|least|most|lowest|highest)\b", exact_par + approx_par)


def test_headline_names_the_peer_versions_each_session_measured(tmp_path):
    import json
    import shutil

    from suite.report.envs import peer_versions

    run = tmp_path / "run"
    shutil.copytree(FIXTURE / "synthetic_run", run)
    source = {"version": "25.6.4", "commit": "d42911f9b1a1f98289bb601c35c8151562603d74"}
    env = json.loads((run / "env.json").read_text())
    loaded = {"version": "2.13.0+cpu", "commit": None, "source": None,
              "route": "module files of /home/me/work/torch-lce loaded onto torch 2.11.0+cu130"}
    env["peers"] = {"apple_cce": source, "apple_cce_exact": source,
                    "apple_cce_pypi": {"version": "25.1.1", "commit": None},
                    "torch_native": loaded}
    (run / "env.json").write_text(json.dumps(env))
    later = dict(env, peers={"apple_cce_pypi": {"version": "25.1.2", "commit": None}})
    (run / "env-2.json").write_text(json.dumps(later))
    # the folder the wheel's files were read from is the measuring machine's: not shown
    assert peer_versions(run) == ("cut-cross-entropy 25.1.2: apple_cce_pypi; cut-cross-entropy "
                                  "25.6.4 (d42911f): apple_cce, apple_cce_exact; torch 2.13.0+cpu "
                                  "(its module files loaded onto torch 2.11.0+cu130): torch_native")


def test_cpu_cells_say_memory_was_not_measured(tmp_path):
    rows = results.read_rows(_cpu_copy(FIXTURE / "synthetic_run", tmp_path))
    text = report.summary(rows, cells=[rows[0]["cell_id"]])  # one cell: the per-cell table
    assert "| naive | " in text and "not measured / " in text


def test_readme_is_the_users_document():
    # Short, generated where it shows numbers, and free of the project's history and internals.
    import re

    root = Path(__file__).resolve().parent.parent
    text = (root / "README.md").read_text()
    assert len(text.splitlines()) <= 300
    for pattern in (r"issue \d", r"[Ss]ince (commit )?[0-9a-f]{7}", r"seed 0\d\d", r"\bv\d\d\b",
                    r"session \d", "measurements/", r"/(work|home|tmp)/"):
        assert not re.search(pattern, text), pattern
    assert "<!-- results:headline:start -->\nGenerated by `python -m suite report" in text
    # the first screen is for a user: what it is, how to install it, how to use it; results after
    first = text[:text.index("\n## The two commands")]
    assert first.index("## Install") < first.index("## Use it") < text.index("## Results")
    for jargon in ("floor", "three-matmul", "W slot", "TMA", "recompute path", "own_filter"):
        assert jargon not in first, jargon
    for link in re.findall(r"\]\(([^)#:]+)\)", text):
        assert (root / link).exists(), link


def test_the_readmes_library_example_runs_and_matches_cross_entropy():
    """README's first example, as a user would paste it (on the CPU: under the interpreter)."""
    import os
    import re

    import torch

    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the CPU runs Triton kernels only under TRITON_INTERPRET=1 (nox -s tests sets it)")
    text = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    use = text[text.index("## Use it"):]
    code = re.search(r"```python\n(.*?)```", use, re.S)[1]
    scope: dict = {}
    torch.manual_seed(0)
    exec(compile(code, "README.md", "exec"), scope)  # noqa: S102  (the README's own code)
    hidden, weight, labels = scope["hidden"], scope["weight"], scope["labels"]
    expected = torch.nn.functional.cross_entropy(hidden.detach() @ weight.detach().T, labels)
    # fp32, a sum over 1000 columns: a few ulps of the result
    assert scope["loss"].item() == pytest.approx(expected.item(), rel=1e-5)
    assert hidden.grad is not None and weight.grad is not None


def test_training_rows_of_two_architectures_of_one_shape_stay_apart(tmp_path):
    # Scaled Cohere and Llama share every size: only the model column tells their rows apart.
    from suite.results import train_bench_rows

    run = tmp_path / "train-hf"
    run.mkdir()
    base = {k: "" for k in BENCH_FIELDS} | dict(
        device="cuda", vocab="1000", d_model="64", n_layer="2", n_head="2", seq_len="128",
        dtype="bf16", softcap="", backend="own", status="ok", timestamp="2026-01-01T00:00:00")
    with open(run / "train_bench.csv", "w", newline="") as f:
        w = csv.DictWriter(f, BENCH_FIELDS)
        w.writeheader()
        w.writerows([dict(base, model="hf:llama"), dict(base, model="hf:cohere")])
    chosen, superseded = train_bench_rows([run])
    assert sorted(r["model"] for r in chosen) == ["hf:cohere", "hf:llama"] and not superseded
    old = tmp_path / "train-old"  # a CSV from before the column: the suite's own GPT
    old.mkdir()
    with open(old / "train_bench.csv", "w", newline="") as f:
        fields = [k for k in BENCH_FIELDS if k != "model"]
        w = csv.DictWriter(f, fields)
        w.writeheader()
        w.writerow({k: base[k] for k in fields})
    assert [r["model"] for r in train_bench_rows([old])[0]] == ["gpt"]


def test_train_headline_gives_each_backends_saving_over_the_reference():
    text = report.train_headline([RUN_A, RUN_B], command="python -m suite report x --headline")
    rows = _table_rows(text)
    v1000 = [r for r in rows if "(V 1000," in r]
    assert v1000[0].startswith("| gpt (V 1000, batch 8) |") and "| `naive` | 20.0 | – |" in v1000[0]
    assert "| `own` | 8.50 | 11.5 | >= 64 (cap) x 128 |" in next(r for r in v1000 if "`own`" in r)
    assert not any("`apple_cce`" in r for r in v1000)  # oom there: named below, not a row
    assert "Not run: " in text and "apple_cce (oom)" in text


# ---- one verdict rule, one run per table, the curated runs and the generated documents ------

def test_verdict_needs_the_p20_p80_ranges_apart():
    from suite.report.verdict import FASTER, LEVEL, SLOWER, time_verdict

    cell = (8, 100)
    base = _lg_row(cell, "torch_compile", 10.0, 1.0, 0.0, spread=0.02)  # 9.8 .. 10.2
    assert time_verdict(_lg_row(cell, "own", 9.0, 1.0, 0.0, spread=0.02), base) == FASTER
    assert time_verdict(_lg_row(cell, "own", 11.0, 1.0, 0.0, spread=0.02), base) == SLOWER
    # a lower median whose range overlaps the other's is level, however close to 1 the ratio
    assert time_verdict(_lg_row(cell, "own", 9.999, 1.0, 0.0, spread=0.02), base) == LEVEL
    assert time_verdict(_lg_row(cell, "own", 9.7, 1.0, 0.0, spread=0.02), base) == LEVEL
    assert time_verdict(dict(base, ms_p20=""), base) is None  # no range: not compared
    assert time_verdict(_lg_row(cell, "own", 9.0, 1.0, 0.0, status="oom"), base) is None


def test_versus_counts_a_ratio_below_1_within_the_noise_as_level():
    rows = [_lg_row((8, 100), "own_filter", 9.999, 10.0, 1e-3),
            _lg_row((8, 100), "torch_compile", 10.0, 5.0, 1e-3),
            _lg_row((8, 50), "own_filter", 5.0, 10.0, 1e-3),
            _lg_row((8, 50), "torch_compile", 10.0, 5.0, 1e-3)]
    text = report.versus_table(rows, "own_filter", ["torch_compile"])
    assert "| 1.00 level |" in text and "| 0.50 faster |" in text
    assert "faster in 1, level in 1, slower in 0 of 2 cells" in text


def test_speed_claim_passes_level_and_fails_slower():
    from suite.report.claims import CLAIM_SPEED, claim_checks

    def row(provider, ms):
        return dict(_lg_row((8192, 256000), provider, ms, 1.0, 1e-3), dist="lm")

    rows = [row("torch_compile", 10.0), row("apple_cce", 10.05), row("own_filter", 13.0)]
    verdicts = {c.method: c.verdict for c in claim_checks(rows, methods=("apple_cce", "own_filter"),
                                                          dists=("lm",))
                if c.claim == CLAIM_SPEED}
    assert verdicts == {"apple_cce": "PASS", "own_filter": "FAIL"}


def test_headline_takes_one_run_per_gpu(tmp_path):
    from suite.report.headline import headline, headline_table

    run = tmp_path / "run"
    shutil.copytree(FIXTURE / "synthetic_run", run)
    with open(run / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    # a later session re-measured one provider: the floor of its rows is another run's
    rows = [dict(r, run_id="LATER") if r["provider"] == "own_filter" else r for r in rows]
    with open(run / "results.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    with pytest.raises(ValueError, match="rows from 2 runs .*LATER"):
        headline_table(run)
    same_gpu = FIXTURE / "synthetic_run"
    with pytest.raises(ValueError, match="give one run folder per GPU"):
        headline([same_gpu, same_gpu], "python -m suite report x --headline")


def test_results_holds_the_curated_runs_and_nothing_else():
    from suite.report import curated

    assert curated.stray_folders() == []
    missing = [d.name for d in curated.curated_dirs() if not d.is_dir()]
    assert missing == []


def test_at_most_twenty_three_curated_runs_each_from_one_session():
    """A curated run's tables compare its rows as one run: they come from one GPU model within
    one session's hours (a run resumed days later, beside rows of another day, is not one)."""
    from suite.report import curated

    assert len(curated.CURATED) <= curated.MAX_CURATED == 23
    problems = {d.name: p for d in curated.curated_dirs() if (p := curated.session_problems(d))}
    assert problems == {}


def test_a_run_resumed_on_another_day_or_another_gpu_is_not_one_session(tmp_path):
    from suite.report import curated

    def env(name, date, gpu="NVIDIA H100 80GB HBM3"):
        (tmp_path / name).write_text(json.dumps({"date": date, "gpu_name": gpu}))

    env("env.json", "2026-11-22T03:00:00+00:00")
    (tmp_path / "results.csv").write_text("cell_id,timestamp\nc,2026-11-22T03:10:00+00:00\n")
    assert curated.session_problems(tmp_path) == []
    env("env-2.json", "2026-11-23T16:00:00+00:00")
    assert "more than 2 h" in curated.session_problems(tmp_path)[0]
    env("env-2.json", "2026-11-22T03:20:00+00:00", gpu="NVIDIA H200")
    assert "2 GPU models" in curated.session_problems(tmp_path)[0]
    (tmp_path / "env.json").unlink()
    (tmp_path / "env-2.json").unlink()
    (tmp_path / "results.csv").write_text("cell_id\nc\n")
    assert curated.session_problems(tmp_path) == ["no env file names its GPU",
                                                  "no date or timestamp says when it was measured"]


def test_curated_runs_name_providers_as_the_suite_does_now():
    from suite.report import curated

    peers = curated.read_run_rows(curated.RESULTS / "peers-h100")
    recorded = results.read_rows(curated.RESULTS / "peers-h100")
    assert any(r["provider"] == "own" for r in recorded)
    assert not any(r["provider"] == "own" for r in peers)
    assert sum(r["provider"] == "own_recompute" for r in peers) == \
        sum(r["provider"] == "own" for r in recorded)
    # a run folder outside results/ is read as recorded
    fixture = curated.read_run_rows(FIXTURE / "synthetic_run")
    assert fixture == results.read_rows(FIXTURE / "synthetic_run")


def test_every_results_table_names_its_command_folders_commit_and_gpu():
    """RESULTS.md promises each table under the command that prints it, with the folder, commit
    and GPU it was measured at (the frontier and multi-GPU tables once lacked them)."""
    import re

    from suite.report import table_text
    from suite.report.document import SECTIONS

    for section in SECTIONS:
        for arguments in section.tables:
            text = table_text(arguments)
            assert text.startswith("Generated by `python -m suite report "), arguments
            for folder in (a for a in arguments.split() if a.startswith("results/")):
                assert any(f"`{folder}" in line and "Measured on NVIDIA" in line
                           and re.search(r"commit [0-9a-f]{7}", line)
                           for line in text.splitlines()), (arguments, folder)


def test_results_doc_regenerates_byte_identical():
    """results/RESULTS.md is what `python -m suite report --results-doc` writes from the
    curated runs: a stale or hand-edited table fails here."""
    from suite.report.document import SECTIONS
    from suite.report.readme import RESULTS_DOC

    text = RESULTS_DOC.read_text()
    assert report.results_doc_text() == text
    for s in SECTIONS:  # the table of contents lists every section
        assert f"\n## {s.title}\n" in text and f"- [{s.title}](#" in text


def test_readme_blocks_regenerate_byte_identical():
    """Each generated README block is what its own `Generated by` command prints now."""
    import re

    from suite.report.readme import README, rebase_links

    doc = README.read_text()
    blocks = re.findall(r"<!-- results:([\w-]+):start -->\n(.*?)\n<!-- results:\1:end -->", doc,
                        re.S)
    assert {name for name, _ in blocks} >= {"headline", "train-headline"}
    parser = argparse.ArgumentParser()
    report.add_arguments(parser)
    for name, block in blocks:
        command = re.match(r"Generated by `python -m suite report ([^`]+)`", block)
        assert command, name
        args = parser.parse_args(command[1].split())
        text, section = report.compute(args)
        assert (args.section or section) == name
        assert rebase_links(text, README) == block, name


def test_versus_marks_comparisons_across_sessions_of_a_resumed_run():
    rows = [dict(_lg_row((8, 100), "own_filter", 5.0, 10.0, 1e-3), run_id="later"),
            dict(_lg_row((8, 100), "torch_compile", 10.0, 5.0, 1e-3), run_id="first"),
            dict(_lg_row((8, 50), "own_filter", 5.0, 10.0, 1e-3), run_id="first"),
            dict(_lg_row((8, 50), "torch_compile", 10.0, 5.0, 1e-3), run_id="first")]
    lines = report.versus_table(rows, "own_filter", ["torch_compile"]).splitlines()
    assert "| 0.50 faster † |" in next(line for line in lines if "| 100 |" in line)
    assert "| 0.50 faster |" in next(line for line in lines if "| 50 |" in line)
    assert any(line.startswith("- †: the two rows come from different sessions") for line in lines)


def test_multi_gpu_training_tables_show_syncs_and_the_largest_batch_where_recorded():
    """A multi-GPU run's training tables: each train-2gpu* folder a table titled with its GPU;
    the host-sync and largest-batch columns only where the run recorded them."""
    from suite.report.vocab_parallel_tables import multi_gpu_text, training_table

    results_dir = Path(__file__).resolve().parent.parent / "results"

    old = training_table(results_dir / "multigpu-2xh100")
    assert "(NVIDIA H100 80GB HBM3)" in old and "host syncs" not in old
    text = multi_gpu_text(results_dir / "multigpu-2xh200")
    step, search = text.split("\n\n### ")
    assert "(NVIDIA H200)" in step and "host syncs / step (wait ms)" in step
    assert "largest batch" not in step
    assert "largest-batch search" in search and "largest batch per rank" in search
    assert "stop: oom@" in search or "stop: cap" in search


def test_a_not_installed_peer_says_when_it_could_not_run_the_cell_anyway():
    from suite.report.headline import _not_run_text

    row = {"status": "unavailable", "error": "quack-kernels is not installed", "softcap": "30.0",
           "bias": "0"}
    assert _not_run_text("quack", row).endswith(
        "; installed, it could not run this cell either: quack has no softcap option")
    assert "either" not in _not_run_text("quack", dict(row, softcap=""))
    assert "either" not in _not_run_text("own", row)  # own has a softcap
