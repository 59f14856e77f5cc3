"""suite.report.notes: the measurement notes' tables are generated from the CSVs their table
blocks name; a stale copy (a number edited in the note or in the CSV) fails here."""
import argparse
import re
from pathlib import Path

import pytest

from suite import report
from suite.report import ncu_logs, ncu_source, notes, tune_logs
from suite.report.formatting import fmt_sig
from suite.report.notes import NOTES, NoteTableError, note_paths, render_note, rewrite_notes

# the notes whose tables are copies of a kernel tool's CSV: each keeps its table in a block
CONVERTED = {"rl-entropy.md": "../rl-h100/rl.csv",
             "autocast-fp32-weight.md": "../autocast-h100/autocast.csv",
             "accuracy-by-route.md": "../accuracy-h100/accuracy.csv"}


@pytest.mark.parametrize("path", note_paths(), ids=lambda p: str(p.relative_to(NOTES)))
def test_every_note_regenerates_byte_identical(path):
    """`python -m suite report --notes` would change nothing: no table is stale."""
    text = path.read_text()
    assert render_note(text, path) == text


@pytest.mark.parametrize("name,csv_path", CONVERTED.items())
def test_notes_copied_from_csvs_keep_their_tables_in_blocks(name, csv_path):
    text = (NOTES / name).read_text()
    assert f"<!-- table: {csv_path}\n" in text and "\n<!-- end table -->" in text


def test_an_edited_number_in_the_note_or_in_the_csv_makes_the_note_stale(tmp_path):
    (tmp_path / "data").mkdir()
    csv_path = tmp_path / "data" / "run.csv"
    csv_path.write_text(CSV)
    note = tmp_path / "note.md"
    text = render_note(NOTE, note)
    assert render_note(text, note) == text
    assert "| a | 32768 | 215.9 |" in text
    edited = text.replace("| a | 32768 | 215.9 |", "| a | 32768 | 215.8 |")
    assert render_note(edited, note) == text  # the CSV wins over the hand edit
    csv_path.write_text(CSV.replace("215.888", "216.888"))
    regenerated = render_note(text, note)
    assert regenerated != text and "| a | 32768 | 216.9 |" in regenerated


CSV = ("name,n,ms,err,status,note\n"
       "a,32768,215.888,1.292e-04,ok,\n"
       "b,8192,1.0,nan,ok,x|y\n"
       "c,2048,95040.4,0.108,failed,oom\n")
NOTE = ("# A note\n\nProse with 3.14 stays.\n\n"
        "<!-- table: data/run.csv\n"
        "     columns: name, n=N, ms=ms (median),\n"
        "       err, note\n"
        "     where: status=ok\n"
        "-->\n"
        "| stale |\n"
        "<!-- end table -->\n\n"
        "<!-- table: data/run.csv\n"
        "     columns: name, err\n"
        "     format: raw\n"
        "-->\n"
        "<!-- end table -->\n\nAfter.\n")
EXPECTED = ("# A note\n\nProse with 3.14 stays.\n\n"
            "<!-- table: data/run.csv\n"
            "     columns: name, n=N, ms=ms (median),\n"
            "       err, note\n"
            "     where: status=ok\n"
            "-->\n\n"
            "| name | N | ms (median) | err | note |\n"
            "|---|---|---|---|---|\n"
            "| a | 32768 | 215.9 | 0.0001292 | – |\n"
            "| b | 8192 | 1 | nan | x\\|y |\n\n"
            "<!-- end table -->\n\n"
            "<!-- table: data/run.csv\n"
            "     columns: name, err\n"
            "     format: raw\n"
            "-->\n\n"
            "| name | err |\n"
            "|---|---|\n"
            "| a | 1.292e-04 |\n"
            "| b | nan |\n"
            "| c | 0.108 |\n\n"
            "<!-- end table -->\n\nAfter.\n")


def _tiny_note(tmp_path: Path, text: str = NOTE) -> Path:
    (tmp_path / "notes" / "data").mkdir(parents=True)
    (tmp_path / "notes" / "data" / "run.csv").write_text(CSV)
    note = tmp_path / "notes" / "tiny.md"
    note.write_text(text)
    return note


def test_round_trip_on_a_tiny_note(tmp_path):
    note = _tiny_note(tmp_path)
    assert render_note(NOTE, note) == EXPECTED
    assert render_note(EXPECTED, note) == EXPECTED
    assert rewrite_notes(tmp_path / "notes") == [note]
    assert note.read_text() == EXPECTED
    assert rewrite_notes(tmp_path / "notes") == []


def test_the_notes_flag_rewrites_the_notes_and_takes_no_folders(tmp_path, monkeypatch, capsys):
    note = _tiny_note(tmp_path)
    monkeypatch.setattr(notes, "NOTES", tmp_path / "notes")
    parser = argparse.ArgumentParser()
    report.add_arguments(parser)
    assert report.main(parser.parse_args(["--notes"])) == 0
    assert note.read_text() == EXPECTED and "1 note(s) rewritten" in capsys.readouterr().out
    assert report.main(parser.parse_args(["--notes", "results/x"])) == 1
    assert "give no folders" in capsys.readouterr().out


def test_four_significant_digits_integers_and_words_as_written():
    assert [fmt_sig(x) for x in ["32768", "95040.4", "0.000129", "1.0", "", "nan", "ok"]] == \
        ["32768", "9.504e+04", "0.000129", "1", "–", "nan", "ok"]


def test_a_glob_joins_its_csvs_rows_in_path_order(tmp_path):
    # one tool's runs, a CSV a shape: one table over all of them
    note = _tiny_note(tmp_path, "# A note\n\n<!-- table: data/*/r.csv\n columns: name, ms\n-->\n"
                      "<!-- end table -->\n")
    for folder, rows in (("b", "q,2.0"), ("a", "p,1.0")):
        (note.parent / "data" / folder).mkdir()
        (note.parent / "data" / folder / "r.csv").write_text(f"name,ms\n{rows}\n")
    table = render_note(note.read_text(), note)
    assert "| p | 1 |\n| q | 2 |" in table
    named = note.read_text().replace("columns: name, ms", "columns: folder, name")
    assert "| a | p |\n| b | q |" in render_note(named, note)
    (note.parent / "data" / "c").mkdir()
    (note.parent / "data" / "c" / "r.csv").write_text("name,other\nz,3\n")
    with pytest.raises(NoteTableError, match="another header"):
        render_note(note.read_text(), note)


@pytest.mark.parametrize("block,message", [
    ("<!-- table: data/missing.csv -->\n<!-- end table -->\n",
     "tiny.md: table 1 (data/missing.csv): no CSV at"),
    ("<!-- table: data/*/missing.csv -->\n<!-- end table -->\n",
     "tiny.md: table 1 (data/*/missing.csv): no CSV matches"),
    ("<!-- table: data/run.csv\n columns: name, wall_ms\n-->\n<!-- end table -->\n",
     "tiny.md: table 1 (data/run.csv): unknown column(s) wall_ms"),
    ("<!-- table: data/run.csv\n where: device=h100\n-->\n<!-- end table -->\n",
     "tiny.md: table 1 (data/run.csv): unknown column(s) device"),
    ("<!-- table: data/run.csv\n where: status\n-->\n<!-- end table -->\n",
     "'where' item 'status' is not column=value"),
    ("<!-- table: data/run.csv\n rows: 3\n-->\n<!-- end table -->\n",
     "tiny.md: table 1 (data/run.csv): unknown line 'rows: 3'"),
    ("<!-- table: data/run.csv\n format: 3g\n-->\n<!-- end table -->\n",
     "format '3g' is not one of sig4, raw"),
    ("<!-- table: data/run.csv -->\n| a |\n", "needs its own '<!-- end table -->'"),
])
def test_a_bad_block_is_an_error_naming_the_note_and_the_block(tmp_path, block, message):
    note = _tiny_note(tmp_path, "# A note\n\n" + block)
    with pytest.raises(NoteTableError, match="tiny.md") as err:
        render_note(note.read_text(), note)
    assert message in str(err.value)


def test_an_opening_without_its_end_does_not_swallow_the_next_block(tmp_path):
    text = ("<!-- table: data/run.csv -->\n\n"
            "<!-- table: data/run.csv -->\n<!-- end table -->\n")
    note = _tiny_note(tmp_path, text)
    with pytest.raises(NoteTableError, match="2 openings, 1 ends"):
        render_note(text, note)


def test_where_keeps_rows_matching_any_of_its_alternatives(tmp_path):
    note = _tiny_note(tmp_path)
    text = "<!-- table: data/run.csv\n columns: name\n where: name=a|c\n-->\n<!-- end table -->\n"
    out = render_note(text, note)
    assert "| a |" in out and "| c |" in out and "| b |" not in out


# ---- no table typed by hand -----------------------------------------------------------------

# Notes written whole by a generator from committed files (tested below to be current).
GENERATED_WHOLE = {"scaling.md", "scaling-h200.md"}
# A cell that is a number alone (what a measured table holds): 12.5, 1,024, 3e11, 1.90x, 25 %.
NUMBER_CELL = re.compile(r"^[-+~≈]?\d[\d,]*(\.\d+)?(e[-+]?\d+)?\s*(x|×|%|ms|MiB|GiB|GB)?$")


def hand_typed_rows(text: str) -> list[str]:
    """Table rows outside the generated blocks and code fences with a cell that is a number."""
    text = notes.BLOCK.sub("", text)
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    rows = []
    for line in text.splitlines():
        if line.lstrip().startswith("|") and not re.match(r"^\s*\|[\s|:-]+\|\s*$", line):
            cells = [c.strip().strip("`*").strip() for c in line.strip().strip("|").split("|")]
            if any(NUMBER_CELL.match(c) for c in cells):
                rows.append(line)
    return rows


def test_the_hand_typed_table_finder_finds_numbers_not_words():
    typed = "| shape | ms |\n|---|---|\n| N 2048 | 11.807 |\n"
    words = "| conclusion | note |\n|---|---|\n| 24 MiB: the lowest median | [a](a.md) |\n"
    assert hand_typed_rows(typed) == ["| N 2048 | 11.807 |"]
    assert hand_typed_rows(words) == []
    fenced = "```\n| 1 | 2 |\n```\n"
    assert hand_typed_rows(fenced) == []


@pytest.mark.parametrize("path", note_paths(), ids=lambda p: str(p.relative_to(NOTES)))
def test_no_note_holds_a_hand_typed_table(path):
    """Every table of measured numbers in a note is generated from a committed CSV (a table
    block) or by a generator writing the whole note; none is typed."""
    if path.name in GENERATED_WHOLE:
        return  # checked by test_notes_generated_whole_are_current
    assert hand_typed_rows(path.read_text()) == []


@pytest.mark.parametrize("name", sorted(GENERATED_WHOLE))
def test_notes_generated_whole_are_current(tmp_path, name):
    from suite.report import scaling

    text = (NOTES / name).read_text()
    command = re.search(r"Generated by `python -m suite\.report\.scaling ([^`]+)`", text)[1]
    out = tmp_path / name
    assert scaling.main(command.split() + ["--out", str(out)]) == 0
    assert out.read_text() == text


# ---- tune and ncu logs: their CSVs, and what the notes may claim from them --------------------

LOG_CSVS = [(m, p) for m in (tune_logs, ncu_logs, ncu_source)
            for p in sorted(NOTES.rglob(m.CSV_NAME))]


@pytest.mark.parametrize("parser,csv_path", LOG_CSVS, ids=[
    str(p.relative_to(NOTES)) for _, p in LOG_CSVS])
def test_log_csvs_are_their_logs_parsed(parser, csv_path):
    """A tune.csv, ncu.csv or stalls.csv is `python -m suite.report.<parser> <folder>`'s output,
    not typed."""
    assert parser.folder_csv(csv_path.parent) == csv_path.read_text()


def test_an_ncu_log_parses_into_a_row_per_launch(tmp_path):
    (tmp_path / "ncu-a.txt").write_text(
        "==PROF== Connected to process 505\n"
        "  cce_fwd_tma_kernel (672, 1, 1)x(256, 1, 1), Context 1, Stream 7, Device 0, CC 9.0\n"
        "    Metric Name                                      Metric Unit Metric Value\n"
        "    dram__bytes_read.sum                                   Gbyte         6.68\n"
        "    gpc__cycles_elapsed.max                                cycle   10,060,546\n"
        "    launch__waves_per_multiprocessor                                     5.09\n"
        "    sm__cycles_active.avg                                  cycle 9,050,878.33\n")
    (tmp_path / "ncu-b.txt").write_text("==ERROR== the kernel filter matched nothing\n")
    assert ncu_logs.parse_log(tmp_path / "ncu-a.txt") == [dict(
        log="ncu-a", kernel="cce_fwd_tma_kernel", grid="672", **{
            "dram__bytes_read.sum": "6.68", "dram__bytes_read.sum_unit": "Gbyte",
            "gpc__cycles_elapsed.max": "10060546", "gpc__cycles_elapsed.max_unit": "cycle",
            "launch__waves_per_multiprocessor": "5.09", "sm__cycles_active.avg": "9050878.33",
            "sm__cycles_active.avg_unit": "cycle", "span_over_mean": "1.1116"})]
    with pytest.raises(ValueError, match="ncu-b.txt: no profiled launch"):
        ncu_logs.folder_csv(tmp_path)


def test_an_ncu_log_gives_each_launch_its_mean_clock(tmp_path):
    """clock_ghz is the launch's cycles over its time, in the unit ncu printed the time in."""
    def log(name, duration, unit):
        (tmp_path / name).write_text(
            "  nvjet_sm90_tst (2, 66, 1)x(384, 1, 1), Context 1, Stream 7, Device 0, CC 9.0\n"
            "    gpc__cycles_elapsed.max                                cycle   16,000,000\n"
            f"    gpu__time_duration.sum                                    {unit}  {duration}\n")
        return ncu_logs.parse_log(tmp_path / name)[0]
    assert log("ncu-ms.txt", "10.00", "ms")["clock_ghz"] == "1.6"
    assert log("ncu-us.txt", "8,000", "us")["clock_ghz"] == "2.0"
    with pytest.raises(ValueError, match="ncu-h: gpu__time_duration.sum in 'h'"):
        log("ncu-h.txt", "1", "h")


def test_an_ncu_source_export_parses_into_rows_by_opcode(tmp_path):
    cols = ('"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed",'
            '"stall_wait","stall_barrier","stall_wait (Not Issued)"\n')
    (tmp_path / "sass-a.csv").write_text(
        '"Kernel Name","cce_fwd_kernel",\n' + cols
        + '"0x1","      LDGSTS.E.BYPASS.128 desc[UR18][R198.64], P6, [R243]","6","10","5","1","9"\n'
        + '"0x2","  @!PT  LDS RZ, [RZ]","3","10","0","3","0"\n'
        + '"0x3","      LDGSTS.E.BYPASS.128 desc[UR18][R244.64], P6, [R243]","1","10","1","0","0"\n'
        + "".join(f'"0x{i}","      NOP","0","1","0","0","0"\n' for i in range(4, 6))
        + '"0x6","      EXIT","0","2","0","0","0"\n')
    (tmp_path / "sass-b.csv").write_text('"Kernel Name","x",\n' + cols)
    assert ncu_source.parse_export(tmp_path / "sass-a.csv") == [
        dict(export="sass-a", opcode="LDGSTS", stall_share=0.7, executed=20, top_reason="wait"),
        dict(export="sass-a", opcode="LDS", stall_share=0.3, executed=10, top_reason="barrier"),
        dict(export="sass-a", opcode="other", stall_share=0.0, executed=4, top_reason="")]
    with pytest.raises(ValueError, match="sass-b.csv: no instruction"):
        ncu_source.folder_csv(tmp_path)


def test_a_tune_log_parses_into_rows(tmp_path):
    (tmp_path / "tune-x.txt").write_text(
        "NVIDIA H200 N=2048 D=2304 V=128256 softcap=None commit abc, torch 2.11\n"
        "floor (cuBLAS E@C.T) 1.757 ms = 689 TFLOP/s\n"
        "fwd+bwd filter auto, lm inputs {'filter_min_flops': 6e11}: 8.028 ms = 4.569 floors\n")
    (tmp_path / "ncu.txt").write_text("dram__bytes_read.sum  Gbyte  1.72\n")
    rows = tune_logs.parse_log(tmp_path / "tune-x.txt")
    assert rows == [dict(log="tune-x.txt", gpu="NVIDIA H200", n="2048", d="2304", v="128256",
                         softcap="None", measured="fwd+bwd filter auto; lm inputs",
                         config="{'filter_min_flops': 6e11}", ms="8.028", floors="4.569")]
    assert tune_logs.folder_csv(tmp_path).count("\n") == 2  # the ncu log is skipped
    with pytest.raises(ValueError, match="not a tune log"):
        tune_logs.parse_log(tmp_path / "ncu.txt")


CLAIM = re.compile(r"\b(fastest|faster|slower|slowest|beats?|quicker)\b", re.I)


def unsupported_tune_claims(text: str) -> list[str]:
    """Sentences (and table rows) of a note that call a variant faster, fastest or slower
    without a p20–p80 spread and without saying 'level'."""
    text = notes.BLOCK.sub("", re.sub(r"^```.*?^```", "", text, flags=re.S | re.M))
    pieces = re.split(r"(?<=[.;])\s+(?=[A-Z(`*])|\n\n|\n(?=\|)", text)
    return [" ".join(p.split()) for p in pieces if CLAIM.search(p) and not re.search(r"p20|level", p)]


@pytest.mark.parametrize("path", note_paths(), ids=lambda p: str(p.relative_to(NOTES)))
def test_tune_claims_carry_a_spread_or_say_level(path):
    """`suite kernel tune` logs print one median per variant: a note citing them calls nothing
    faster unless it gives a p20–p80 spread; else it says level."""
    text = path.read_text()
    if not re.search(r"kernel tune|tune-[\w.-]*\.txt", text):
        return  # no tune evidence: bench claims follow the tables' verdicts
    assert unsupported_tune_claims(text) == []
