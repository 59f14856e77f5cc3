"""suite.plots and suite.model_configs, on the synthetic fixture run (tests/fixtures/)."""
import argparse
import csv
import shutil
from pathlib import Path

import pytest
from PIL import Image

from suite import model_configs, plots
from suite.plots import panels, training
from suite.schema import ROW_FIELDS

FIXTURE = Path(__file__).parent / "fixtures"
FIXTURE_RUN = FIXTURE / "synthetic_run"

# What the fixture's shapes must produce (see tests/fixtures/make_fixture.py).
EXPECTED_STEMS = {
    "memory_breakdown",
    "memory_vs_v_bf16_d2304_softcap30", "memory_vs_v_bf16_d4096", "memory_vs_v_fp32_d2304",
    "time_vs_v_bf16_uniform_d2304_softcap30", "time_vs_v_bf16_lm_d2304_softcap30",
    "time_vs_v_bf16_uniform_d4096", "time_vs_v_bf16_lm_d4096", "time_vs_v_fp32_uniform_d2304",
    "pareto_bf16_uniform_d2304_softcap30", "pareto_bf16_lm_d2304_softcap30",
    "pareto_bf16_uniform_d4096", "pareto_bf16_lm_d4096", "pareto_fp32_uniform_d2304",
    "grad_error_bf16", "grad_error_fp32",
    "train_bench", "train_convergence",  # tests/fixtures/train-fixture-* (make_train_fixture.py)
}
TRAIN_RUNS = [FIXTURE / "train-fixture-a", FIXTURE / "train-fixture-b"]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Every figure of the fixture, built once; the failure markers drawn are recorded."""
    out = tmp_path_factory.mktemp("plots")
    marked = []
    real = panels.mark_failures

    def recording(ax, failures):
        marked.extend(failures)
        real(ax, failures)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(panels, "mark_failures", recording)
        written = plots.build_all(FIXTURE, out)
    return out, written, marked


def test_every_figure_is_written_as_png_and_pdf(built):
    out, written, _ = built
    stems = {p.stem for p in written}
    assert stems == EXPECTED_STEMS
    for stem in EXPECTED_STEMS:
        png, pdf = out / f"{stem}.png", out / f"{stem}.pdf"
        assert png.stat().st_size > 10_000, stem
        with Image.open(png) as im:
            im.verify()  # raises on a broken file
        with Image.open(png) as im:
            assert im.format == "PNG" and im.width > 300 and im.height > 200
            # not a blank canvas: some pixels are far from white
            assert min(im.convert("L").getextrema()) < 100, stem
        data = pdf.read_bytes()
        assert data.startswith(b"%PDF-") and b"%%EOF" in data[-64:], stem
        assert b"/CreationDate" not in data  # no timestamp: rebuilds are byte-identical


def test_training_figures_from_the_fixture(tmp_path, monkeypatch):
    """Both training figures, from the latest complete row per backend; a rebuild writes the
    same bytes; a folder without convergence files gives the bench figure only."""
    drawn = {}
    real_bench, real_conv = plots.plot_train_bench, plots.plot_train_convergence

    def bench(rows, out):
        drawn["bench"] = {(r["vocab"], r["backend"]): (r["source"], r["status"]) for r in rows}
        return real_bench(rows, out)

    def conv(summary, curves, out):
        drawn["runs"] = [r["run"] for r in summary if curves.get((r["source"], r["run"]))]
        return real_conv(summary, curves, out)

    monkeypatch.setattr(training, "plot_train_bench", bench)
    monkeypatch.setattr(training, "plot_train_convergence", conv)
    written = plots.plot_training(TRAIN_RUNS, tmp_path / "one")
    assert [p.name for p in written] == ["train_bench.png", "train_bench.pdf",
                                        "train_convergence.png", "train_convergence.pdf"]
    for path in written:
        assert path.stat().st_size > 10_000, path.name
    with Image.open(tmp_path / "one" / "train_bench.png") as im:
        assert im.width > 300 and min(im.convert("L").getextrema()) < 100
    a, b = (d.as_posix() for d in TRAIN_RUNS)
    assert drawn["bench"][("5000", "naive")] == (b, "ok")  # not a's earlier OOM
    assert drawn["bench"][("5000", "apple_cce")] == (b, "crashed")  # drawn as its status
    assert drawn["bench"][("1000", "own")] == (a, "ok")
    assert len(drawn["bench"]) == 10
    assert drawn["runs"] == ["naive", "naive_rerun", "own", "apple_cce"]  # liger_flce: no curve

    again = plots.plot_training(TRAIN_RUNS, tmp_path / "two")
    for first, second in zip(written, again):
        assert first.read_bytes() == second.read_bytes(), first.name
    only_bench = plots.plot_training(TRAIN_RUNS[1:], tmp_path / "three")
    assert [p.name for p in only_bench] == ["train_bench.png", "train_bench.pdf"]
    assert plots.plot_training([], tmp_path / "four") == []


def test_selective_backends_take_their_base_colour():
    assert plots.style_of("selective+liger_ce")["color"] == plots.style_of("liger_ce")["color"]
    assert plots.style_of("selective+own")["color"] == plots.style_of("own")["color"]
    assert plots.style_of("selective+own")["marker"] == plots.style_of("selective")["marker"]


def test_failed_cells_are_marked_not_dropped(built):
    _, _, marked = built
    # Every failed cell of the fixture's V-sweeps is drawn as a marker with its status.
    assert (256000, "naive", "oom") in marked
    assert (128256, "apple_cce", "error") in marked
    assert (32000, "liger_flce", "unavailable") in marked
    assert all(status != "ok" for _, _, status in marked)


def _fp32_subset(results_dir: Path) -> None:
    """A results folder holding only the fixture's fp32 rows."""
    (results_dir / "synthetic").mkdir(parents=True)
    shutil.copy(FIXTURE_RUN / "env.json", results_dir / "synthetic" / "env.json")
    with open(FIXTURE_RUN / "results.csv") as f:
        rows = [r for r in csv.DictReader(f) if r["dtype"] == "fp32"]
    with open(results_dir / "synthetic" / "results.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=ROW_FIELDS)
        w.writeheader()
        w.writerows(rows)


def test_cli_rebuild_is_byte_identical(built, tmp_path, capsys):
    """A second build (through main, from the fp32 rows only) writes the same bytes as the
    first build did for those figures."""
    out, _, _ = built
    parser = argparse.ArgumentParser()
    plots.add_arguments(parser)
    _fp32_subset(tmp_path / "results")
    rc = plots.main(parser.parse_args(["--results", str(tmp_path / "results"),
                                       "--out", str(tmp_path / "again")]))
    assert rc == 0
    again = sorted(p for p in (tmp_path / "again").iterdir() if p.suffix in (".png", ".pdf"))
    assert {p.stem for p in again} == {"memory_breakdown", "memory_vs_v_fp32_d2304",
                                       "time_vs_v_fp32_uniform_d2304", "pareto_fp32_uniform_d2304",
                                       "grad_error_fp32"}
    for path in again:
        assert path.read_bytes() == (out / path.name).read_bytes(), path.name


def test_other_devices_plot_into_their_own_folder_under_out(built, tmp_path):
    """A CPU run (and a second GPU's) beside the committed GPU's rows: --out gets the main
    GPU's figures, byte for byte, and no device-prefixed copies; each other device's figures go
    to --out/<device>/, its pareto panels saying memory was not measured; nothing is written
    into the run folders."""
    out, _, _ = built
    results_dir = tmp_path / "results"
    _fp32_subset(results_dir)
    with open(results_dir / "synthetic" / "results.csv") as f:
        rows = list(csv.DictReader(f))
    # The CPU run has every row; the other GPU one row fewer than the main GPU (fewer rows).
    for run, device, mine in (("smoke-cpu", "cpu", rows), ("other-gpu", "OTHER GPU", rows[:-1])):
        (results_dir / run).mkdir()
        with open(results_dir / run / "results.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=ROW_FIELDS)
            w.writeheader()
            w.writerows({**r, "device": device,
                         **({"peak_extra_mib": ""} if device == "cpu" else {})} for r in mine)
    texts = []
    real_text = plots.plt.Axes.text

    def recording(ax, x, y, s, *args, **kwargs):
        texts.append(s)
        return real_text(ax, x, y, s, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(plots.plt.Axes, "text", recording)
        written = plots.build_all(results_dir, tmp_path / "out")
    in_out = sorted(p.name for p in (tmp_path / "out").iterdir() if p.is_file()
                    and p.name != plots.MANIFEST)
    assert in_out == sorted(p.name for p in written if p.parent == tmp_path / "out")
    assert all(not name.startswith(("cpu_", "other")) for name in in_out)
    for name in in_out:
        assert (tmp_path / "out" / name).read_bytes() == (out / name).read_bytes(), name
    for device in ("cpu", "other-gpu"):
        assert (tmp_path / "out" / device / "pareto_fp32_uniform_d2304.png").exists()
    assert not any(p.is_dir() and p.name == "plots" for p in results_dir.rglob("*"))
    assert "memory not measured" in texts and "nothing ran" not in texts
    with pytest.raises(ValueError, match="no rows measured on 'H100'"):
        plots.build_all(results_dir, tmp_path / "out2", device="H100")


def test_cli_fails_clearly_without_results(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    plots.add_arguments(parser)
    rc = plots.main(parser.parse_args(["--results", str(tmp_path / "nope"),
                                       "--out", str(tmp_path / "out")]))
    assert rc == 1
    assert "not a directory" in capsys.readouterr().out


def test_pareto_front():
    pts = [(10.0, 5.0, "a"), (5.0, 20.0, "b"), (20.0, 1.0, "c"), (12.0, 6.0, "d"), (5.0, 30.0, "e")]
    assert plots.pareto_front(pts) == [(5.0, 20.0, "b"), (10.0, 5.0, "a"), (20.0, 1.0, "c")]
    assert plots.pareto_front([]) == []


def test_one_fixed_colour_blind_safe_style_per_provider():
    palette = set(plots.OKABE_ITO.values())
    combos = set()
    for name, style in plots.PROVIDER_STYLE.items():
        assert style["color"] in palette, name
        combos.add((style["color"], style["marker"], style["linestyle"]))
        assert plots.style_of(name) == style  # looked up, not generated
    assert len(combos) == len(plots.PROVIDER_STYLE)  # no two providers look the same
    with open(FIXTURE_RUN / "results.csv") as f:
        fixture_providers = {r["provider"] for r in csv.DictReader(f)}
    assert fixture_providers <= set(plots.PROVIDER_STYLE)
    assert plots.style_of("someone_new") == plots.style_of("someone_new")


def test_fixed_styles_are_the_built_in_providers_whatever_registered_first():
    # suite.providers.BUILT_IN: a plugin registered before the providers' modules (a user's
    # --plugin) or one whose functions come from them (suite.frontier's budget sweep reuses
    # own.py's) is not built in, so its style never enters the figures' fixed ones.
    import subprocess
    import sys

    code = """
from suite.registry import register
register('zz_plugin', summary='a plugin first')(lambda e, c, t, **k: None)
import suite.frontier
from suite.providers import BUILT_IN
from suite.plots.style import PROVIDER_STYLE
from suite.report.frontier_tables import BUDGETS_MIB, sweep_name
sweep = {sweep_name(mib) for mib in BUDGETS_MIB}
assert 'own' in BUILT_IN and 'zz_plugin' not in BUILT_IN and not sweep & BUILT_IN
assert set(PROVIDER_STYLE) == BUILT_IN
"""
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[1])
    assert run.returncode == 0, run.stderr


def test_load_results_keeps_latest_duplicate_and_rejects_bad_input(tmp_path):
    old = tmp_path / "a_old"
    new = tmp_path / "b_new"
    for run, stamp, ms in ((old, "2001-01-01T00:00:00", "1.0"), (new, "2002-01-01T00:00:00", "2.0")):
        run.mkdir()
        with open(FIXTURE_RUN / "results.csv") as f:
            row = next(csv.DictReader(f))
        row.update(timestamp=stamp, ms=ms)
        with open(run / "results.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=ROW_FIELDS)
            w.writeheader()
            w.writerow(row)
    df = plots.load_results(tmp_path)
    assert len(df) == 1 and df["ms"].iloc[0] == 2.0

    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "results.csv").write_text("cell_id,provider\nx,naive\n")
    with pytest.raises(ValueError, match="missing columns"):
        plots.load_results(tmp_path)
    with pytest.raises(FileNotFoundError, match="not a directory"):
        plots.load_results(tmp_path / "a_old" / "empty")
    (tmp_path / "a_old" / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no results.csv"):
        plots.load_results(tmp_path / "a_old" / "empty")


# ---- model_configs ----------------------------------------------------------------------

@pytest.mark.parametrize("model", model_configs.MODELS, ids=lambda m: m.name)
def test_param_count_matches_the_model_card(model):
    assert model.param_count() == pytest.approx(model.published_params, rel=0.01)


def test_logits_dominate_for_the_small_model():
    gemma = next(m for m in model_configs.MODELS if m.name.startswith("Gemma 2"))
    parts = model_configs.memory_breakdown(gemma, gpus=16)
    others = {k: v for k, v in parts.items() if k != "loss logits"}
    assert parts["loss logits"] > max(others.values())
    assert parts["loss logits"] > sum(others.values())
    # The paper's baseline at Gemma 2 (2B): 28000 MiB of loss+gradient for 8192 tokens.
    assert parts["loss logits"] / 2**20 == pytest.approx(28000, rel=1e-9)
    share = {m.name: model_configs.memory_breakdown(m, gpus=16)["loss logits"]
             / sum(model_configs.memory_breakdown(m, gpus=16).values())
             for m in model_configs.MODELS}
    assert max(share, key=share.get) == gemma.name


def test_cce_removes_the_logits_and_nothing_else():
    for m in model_configs.MODELS:
        base = model_configs.memory_breakdown(m, gpus=1)
        cce = model_configs.memory_breakdown(m, gpus=1, cce=True)
        assert cce["loss logits"] < 1e-3 * base["loss logits"]
        assert {k: v for k, v in cce.items() if k != "loss logits"} == \
            {k: v for k, v in base.items() if k != "loss logits"}


def test_memory_breakdown_rejects_bad_arguments():
    with pytest.raises(ValueError, match="gpus"):
        model_configs.memory_breakdown(model_configs.MODELS[0], gpus=0)
    with pytest.raises(ValueError, match="tokens"):
        model_configs.memory_breakdown(model_configs.MODELS[0], tokens=-1)


def test_convergence_deviation_is_against_the_reference_row(monkeypatch, tmp_path):
    # A Hugging Face run's reference is the model's own loss (hf_loss), not "naive": the
    # deviation panel must draw the other runs against it.
    from suite import plots

    figures = []
    monkeypatch.setattr(training, "save", lambda fig, out_dir, name: figures.append(fig) or [])
    row = dict(source="train-hf-llama", smooth="2", tol="0.01", warmup_steps="1", device="cpu")
    summary = [dict(row, run="hf_loss", backend="hf_loss", verdict="reference"),
               dict(row, run="own", backend="own", verdict="match")]
    curves = {("train-hf-llama", "hf_loss"): [3.0, 2.5, 2.0, 1.8],
              ("train-hf-llama", "own"): [3.0, 2.5, 2.01, 1.8]}
    plots.plot_train_convergence(summary, curves, tmp_path)
    deviation_axes = figures[0].axes[1]
    assert len(deviation_axes.get_lines()) == 1  # own against hf_loss


def test_committed_figures_are_in_step_with_the_curated_runs():
    """plots/MANIFEST.json names the hashes of the CSVs and of the generator the committed
    figures were drawn from: a changed run, curated list or suite/plots/ without
    `python -m suite plots` fails here, as does a figure on disk the build did not write."""
    import json

    committed = json.loads((plots.curated.ROOT / "plots" / plots.MANIFEST).read_text())
    out = plots.curated.ROOT / "plots"
    now = plots.manifest(plots.kernel_run_dirs(), plots.train_dirs(),
                         [out / f for f in committed["figures"]], out)
    assert now["generator"] == committed["generator"], "suite/plots/ changed: run python -m suite plots"
    assert now["inputs"] == committed["inputs"], "the curated runs changed: run python -m suite plots"
    on_disk = sorted(p.relative_to(out).as_posix() for p in out.rglob("*")
                     if p.suffix in (".png", ".pdf"))
    assert on_disk == committed["figures"]
    # the manifest is written as the build writes it: regenerating it is a no-op
    assert (out / plots.MANIFEST).read_text() == json.dumps(now, indent=1, sort_keys=True) + "\n"


def test_figures_regenerate_byte_identical_in_a_copy_at_another_path(tmp_path):
    """The committed breakdown, training and frontier figures (a cheap few), drawn again by a
    copy of the checkout at another path, are the same bytes: nothing in a figure depends on
    where the checkout lies (a legend that printed its run folder's absolute path failed this)."""
    import os
    import subprocess
    import sys

    root = plots.curated.ROOT
    copy = tmp_path / "elsewhere" / "cce-bench"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("suite", "own_kernel"):
        shutil.copytree(root / name, copy / name, ignore=ignore)
    runs = [d for d in plots.curated.curated_dirs()
            if d in plots.train_dirs() or d.name.startswith("frontier-")]
    for run in runs:
        shutil.copytree(run, copy / "results" / run.name)
    families = ("memory_breakdown", "training", "frontier")
    code = ("import sys; from suite import plots; "
            f"written = plots.build_all(out_dir='redrawn', families={families!r}); "
            "print('\\n'.join(p.name for p in written))")
    env = dict(os.environ, PYTHONPATH=str(copy))
    done = subprocess.run([sys.executable, "-c", code], cwd=copy, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    names = done.stdout.split()
    assert "train_convergence.png" in names and any(n.startswith("frontier_") for n in names)
    for name in names:
        redrawn = (copy / "redrawn" / name).read_bytes()
        assert redrawn == (root / "plots" / name).read_bytes(), f"{name} differs"
