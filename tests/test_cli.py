"""The command line: the smoke preset end to end, and clear errors for bad input."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from suite import cli, report
from suite.results import read_rows
from suite.schema import PHASES

ROOT = Path(__file__).resolve().parent.parent


def _cli_error(capsys, argv):
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code != 0
    return capsys.readouterr().err


def test_smoke_preset_end_to_end(tmp_path):
    """``python -m suite bench --preset smoke`` in a fresh process, then the report of it.

    The own kernel and the compiled providers are left out: under the Triton interpreter /
    inductor on 2 CPU cores they cost minutes; test_providers checks each of them."""
    out = tmp_path / "smoke"
    providers = "naive,chunked,selective,liger_ce,torch_native,apple_cce"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # the CLI sets it
    res = subprocess.run(
        [sys.executable, "-m", "suite", "bench", "--preset", "smoke", "--device", "cpu",
         "--providers", providers, "--reps", "2", "--warmup", "1", "--out", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "not GPU numbers" in res.stdout
    assert "| naive |" in res.stdout  # the summary table
    rows = read_rows(out)
    cells = {r["cell_id"] for r in rows}
    assert len(cells) == 3
    assert len(rows) == len(cells) * 6 * len(PHASES)
    by = {(r["cell_id"], r["provider"], r["phase"]): r for r in rows}
    for cell in cells:
        for phase in PHASES:
            assert by[cell, "naive", phase]["status"] == "ok"
            assert by[cell, "apple_cce", phase]["status"] == "unavailable"
            assert by[cell, "liger_ce", phase]["status"] in ("ok", "error")  # softcap: interp.
    softcap_cell = next(c for c in cells if "sc30" in c)
    assert by[softcap_cell, "torch_native", "fwd"]["status"] == "unsupported"
    lm = next(r for r in rows if r["dist"] == "lm" and r["status"] == "ok")
    assert 1.0 < float(lm["mean_loss"]) < 3.5
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


def test_default_out_names_preset_device_and_date():
    out = cli.default_out("smoke", "cpu", resume=True)
    assert out.parts[0] == "results" and out.name.startswith("smoke-cpu-20")


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
