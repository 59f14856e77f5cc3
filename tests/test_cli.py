"""The command line: the smoke preset end to end, and clear errors for bad input."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from suite import cli, report
from suite.results import read_rows

ROOT = Path(__file__).resolve().parent.parent


def _cli_error(capsys, argv):
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code != 0
    return capsys.readouterr().err


def test_smoke_preset_end_to_end(tmp_path):
    """``python -m suite bench`` without a GPU (the smoke preset) in a fresh process: one call
    per provider on one cell, the summary of what it checked, then the report of it.

    The own kernel and the compiled providers are left out: the smoke run itself covers them
    (``nox -s bench``), and test_providers checks each against fp64."""
    out = tmp_path / "smoke"
    providers = "naive,chunked,selective,liger_ce,torch_native,apple_cce"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # the CLI sets it
    res = subprocess.run(
        [sys.executable, "-m", "suite", "bench", "--device", "cpu", "--providers", providers,
         "--out", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "not GPU numbers" in res.stdout
    assert "| naive |" in res.stdout  # the summary table
    assert "smoke check: 6 providers, one loss+grad call each on one cell" in res.stdout
    agree = next(line for line in res.stdout.splitlines() if "ran and agree" in line)
    for name in ("naive", "chunked", "selective", "liger_ce", "torch_native"):
        assert name in agree
    assert "    apple_cce: needs a CUDA device" in res.stdout
    rows = read_rows(out)
    assert len({r["cell_id"] for r in rows}) == 1 and {r["phase"] for r in rows} == {"loss+grad"}
    by = {r["provider"]: r for r in rows}
    assert len(by) == 6 and by["apple_cce"]["status"] == "unavailable"
    assert all(by[p]["status"] == "ok" for p in providers.split(",") if p != "apple_cce")
    assert all(by[p]["floor_ratio"] == "" for p in by)  # no ×floor from CPU times
    assert 1.0 < float(by["naive"]["mean_loss"]) < 4.6  # ln(97): uniform predictions
    assert (out / "env.json").exists()

    # The report renders the run, and --update-readme rewrites only the marked section.
    text = report.render(out)
    assert "| naive |" in text and "not GPU numbers" in text
    readme = tmp_path / "README.md"
    readme.write_text("intro\n<!-- results:gemma2-2b:start -->\nold\n"
                      "<!-- results:gemma2-2b:end -->\noutro\n")
    report.update_readme(text, "gemma2-2b", readme=readme)
    doc = readme.read_text()
    assert doc.startswith("intro\n") and doc.endswith("outro\n")
    assert "old" not in doc and "| naive |" in doc


def _smoke_row(provider, status="ok", err="1e-7", error=""):
    return {"provider": provider, "phase": "loss+grad", "status": status, "error": error,
            "loss_rel_err": err, "de_rel_err": err, "dc_rel_err": err, "dist": "lm", "n": "32",
            "d": "16", "v": "97", "dtype": "fp32", "softcap": "", "bias": "False",
            "ignore_frac": "0.25"}


def test_smoke_summary_fails_on_an_error_or_an_inexact_exact_provider():
    from suite import smoke

    tol = smoke.tolerance(_smoke_row("naive"))
    ok = [_smoke_row("naive"), _smoke_row("gpu_only", "unavailable", error="needs a CUDA device")]
    text, failed = smoke.summarize(ok, {"naive": True, "gpu_only": True})
    assert not failed and "gpu_only: needs a CUDA device" in text
    for bad, exact in ((_smoke_row("broken", "error", error="ValueError: x"), True),
                       (_smoke_row("off", err=str(2 * tol)), True)):
        text, failed = smoke.summarize(ok + [bad], {"naive": True, bad["provider"]: exact})
        assert failed and f"{bad['provider']}:" in text.split("FAILED:")[1]
    # an approximate provider's error is shown, not held to the exact bound
    text, failed = smoke.summarize(ok + [_smoke_row("filtered", err="1e-3")],
                                   {"naive": True, "filtered": False})
    assert not failed and "filtered (1.0e-03)" in text


def test_smoke_summary_of_a_forward_only_bench_checks_its_loss():
    # `bench --phases fwd` on the CPU: its rows are checked, not reported missing (which failed
    # a forward-only run of heads_gpu.sh there)
    from suite import smoke

    fwd = [{**_smoke_row("naive"), "phase": "fwd", "de_rel_err": "", "dc_rel_err": ""}]
    text, failed = smoke.summarize(fwd, {"naive": True})
    assert not failed and "one fwd call each" in text and "the loss against" in text
    text, failed = smoke.summarize([{**fwd[0], "loss_rel_err": "1.0"}], {"naive": True})
    assert failed and "naive:" in text.split("FAILED:")[1]


@pytest.mark.parametrize("argv,expected", [
    (["bench", "--providers", "naive,fast_ce"],
     "--providers: unknown provider(s) fast_ce; known providers: "),
    (["bench", "--exclude", "nope"], "--exclude: unknown provider(s) nope"),
    (["bench", "--n", "12x"], "argument --n: expected comma-separated positive integers"),
    (["bench", "--v", "32000,,5"], "argument --v: expected a comma-separated list"),
    (["bench", "--dtype", "fp8"], "argument --dtype: expected a comma-separated subset of bf16"),
    (["bench", "--softcap", "-3"], "argument --softcap: expected comma-separated positive"),
    (["bench", "--ignore-frac", "1.5"], "argument --ignore-frac: expected comma-separated fractions"),
    (["bench", "--reps", "0"], "argument --reps: expected a positive integer"),
    (["bench", "--dist", "file"], "--dist file needs --file PATH"),
    (["bench", "--preset", "huge"], "argument --preset: invalid choice: 'huge'"),
    (["bench", "--device", "tpu"], "--device"),
    (["bench", "--plugin", "no_such_module_xyz"], "--plugin: cannot import 'no_such_module_xyz'"),
    (["bench", "--rounds", "0"], "argument --rounds: expected a positive integer"),
    (["bench", "--rounds", "2", "--isolate"], "--rounds: each round runs one process per"),
    (["bench", "--rounds", "2", "--vocab-parallel", "2"],
     "--rounds is not available with --vocab-parallel"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
])
def test_bad_input_is_a_clear_error(capsys, argv, expected):
    err = _cli_error(capsys, argv + ["--device", "cpu"] if argv[0] == "bench"
                     and "--device" not in argv else argv)
    assert expected in err, err
    if "known providers" in expected:
        assert "naive" in err.split("known providers:")[1]


def test_existing_run_folder_needs_resume(tmp_path, capsys):
    (tmp_path / "results.csv").write_text("cell_id\n")
    err = _cli_error(capsys, ["bench", "--device", "cpu", "--providers", "naive",
                              "--out", str(tmp_path), "--quiet"])
    assert "--out" in err and "--resume" in err


def test_rounds_alternate_the_provider_order_in_a_folder_each(tmp_path):
    """``bench --rounds 3``: every pair measured three times, each round in its own folder and
    in a process per pair, the order reversed in the second round; the per-round comparison
    (report --versus) reads every round folder."""
    out = tmp_path / "ab"
    assert cli.main(["bench", "--device", "cpu", "--providers", "naive,chunked", "--rounds",
                     "3", "--reps", "1", "--warmup", "0", "--out", str(out), "--quiet"]) == 0
    orders = []
    for r in (1, 2, 3):
        rows = read_rows(out / f"round-{r}")
        assert {x["status"] for x in rows} == {"ok"}
        orders.append(list(dict.fromkeys(x["provider"] for x in rows)))
        assert len({x["run_id"] for x in rows}) == 1
    assert orders == [["naive", "chunked"], ["chunked", "naive"], ["naive", "chunked"]]
    assert not (out / "results.csv").exists()
    assert len({read_rows(out / f"round-{r}")[0]["run_id"] for r in (1, 2, 3)}) == 3


def test_a_variant_is_measured_beside_its_base_in_each_round(tmp_path):
    """``bench --variant own@<name>=JSON --rounds 2`` in a fresh process: each round's child
    processes register the variant from the run's plan, so both the default call and the
    variant have rows, and env.json names the variant's overrides."""
    import json

    out = tmp_path / "variant"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    overrides = {"forward": {"l2_mib": 16}}
    res = subprocess.run(
        [sys.executable, "-m", "suite", "bench", "--device", "cpu", "--providers", "own,own@l2",
         "--variant", f"own@l2={json.dumps(overrides)}", "--rounds", "2", "--reps", "1",
         "--warmup", "0", "--phases", "loss+grad", "--out", str(out), "--quiet"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    for r in (1, 2):
        rows = read_rows(out / f"round-{r}")
        assert {(x["provider"], x["status"]) for x in rows} == {("own", "ok"), ("own@l2", "ok")}
        recorded = json.loads((out / f"round-{r}" / "env.json").read_text())["own_variants"]
        assert recorded == [["own", "l2", overrides]]


def test_list_shows_every_provider_with_reasons(capsys):
    assert cli.main(["list", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    for name in ("naive", "torch_compile", "chunked", "selective", "liger_ce", "liger_flce",
                 "apple_cce", "apple_cce_nofilter", "apple_torch_compile", "torch_native"):
        assert f"  {name} " in out
    assert "unavailable: needs a CUDA device" in out


def test_report_of_a_missing_run_fails_clearly(tmp_path, capsys):
    assert cli.main(["report", str(tmp_path)]) == 1
    assert "no results" in capsys.readouterr().out


def test_default_out_names_preset_device_and_date_outside_results():
    """A run without --out goes to git-ignored runs/, never results/ (whose curated-runs check
    a later `nox -s tests` would then fail)."""
    out = cli.default_out("smoke", "cpu", resume=True)
    assert out.parts[0] == "runs" and out.name.startswith("smoke-cpu-20")
    ignored = subprocess.run(["git", "check-ignore", "-q", f"{out.as_posix()}/results.csv"],
                             cwd=ROOT)
    if ignored.returncode == 128:
        pytest.skip("not a git checkout: git check-ignore cannot say what git ignores")
    assert ignored.returncode == 0, f"{out} is not git-ignored"


def test_help_lists_every_kernel_tool():
    from suite.kernel import TOOLS

    res = subprocess.run([sys.executable, "-m", "suite", "--help"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    # argparse wraps the line, at spaces and after hyphens (rows-gemm)
    flat = re.sub(r"(\w)- (\w)", r"\1-\2", " ".join(res.stdout.split()))
    assert f"kernel the own kernel's tools: {' | '.join(TOOLS)}" in flat, flat


def test_help_names_the_command_as_invoked():
    assert cli.invoked_name("/venv/bin/cce-bench") == "cce-bench"
    assert cli.invoked_name(str(ROOT / "suite" / "__main__.py")) == "python -m suite"
    res = subprocess.run([sys.executable, "-m", "suite", "--help"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert res.stdout.startswith("usage: python -m suite "), res.stdout[:200]
    script = Path(sys.executable).parent / "cce-bench"
    if not script.exists():
        pytest.skip("the cce-bench console script is not installed in this environment")
    res = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=120)
    assert res.stdout.startswith("usage: cce-bench "), res.stdout[:200]
