"""``python -m suite report``: markdown tables from results folders, written into README.md
(``--update-readme``) or results/RESULTS.md (``--results-doc``) between
``<!-- results:<section>:start -->`` and ``<!-- results:<section>:end -->`` markers.

    python -m suite report results/peers-h100                     # print a run's tables
    python -m suite report results/headline-h200 --headline --update-readme   # one run per GPU
    python -m suite report results/fused-grid-h100-3-* --versus own_fused  # a table per folder
    python -m suite report results/headline-h200 --targets
    python -m suite report results/train-hf-llama-h100
    python -m suite report results/frontier-*-h100 --frontier
    python -m suite report results/multigpu-2xh100
    python -m suite report --results-doc    # results/RESULTS.md, whole, from the curated runs
    python -m suite report --notes          # the tables of results/notes/*.md, from their CSVs
    python -m suite report results/peers-2026-h100 --who-has-what   # also --rl, --peer-list
    python -m suite report --all            # all three: RESULTS.md, README's blocks, the notes

Every table that compares providers takes its rows from one run folder (several folders: a
table each); "faster" / "slower" follow suite.report.verdict's one rule.

The tables live in their modules: kernel_tables (a run folder), train_tables (training-step
folders), claims (the own kernel's targets and the paper's claims), headline (the README's
headline blocks), readme (the writers), frontier_tables (the time-memory frontier), vocab_parallel_tables
(several GPUs), document (results/RESULTS.md), curated (the runs they read), notes (the
measurement notes' tables copied from the kernel tools' CSVs). Nothing here imports the suite's
commands (runner, frontier, plots, ...): they import the report.
"""
from __future__ import annotations

from pathlib import Path

from suite.report.claims import grads_bytes, targets_table
from suite.report.document import render_document
from suite.report.envs import env_line, read_envs
from suite.report.frontier_tables import report as frontier_report
from suite.report.kernel_tables import (aggregate_table, cell_table, render, summary,
                                        versus_table)
from suite.report.headline import headline
from suite.report.readme import README, RESULTS_DOC, update_markers, update_readme
from suite.report.verdict import RULE_TEXT
from suite.report.train_tables import (is_train_run, liger_selective_comparison, render_train,
                                       train_headline)
from suite.report.curated import read_run_rows as read_rows
from suite.report.vocab_parallel_tables import is_multi_gpu_run, multi_gpu_text

__all__ = ["aggregate_table", "cell_table", "env_line", "grads_bytes", "headline", "read_envs",
           "render", "render_train", "liger_selective_comparison", "summary", "targets_table",
           "update_markers", "update_readme", "versus_table", "main", "add_arguments",
           "train_headline"]


def add_arguments(parser) -> None:
    parser.add_argument("results", nargs="*",
                        help="a run folder holding results.csv (e.g. results/headline-h200), or "
                             "one or more training-step folders (train_bench.csv, "
                             "train_convergence.csv; e.g. results/train-hf-llama-h100 ...)")
    parser.add_argument("--update-readme", action="store_true",
                        help="rewrite README.md between the results:<section> markers")
    parser.add_argument("--results-doc", action="store_true",
                        help="rewrite results/RESULTS.md whole from the curated runs "
                             "(suite/report/document.py); give no folders")
    parser.add_argument("--notes", action="store_true",
                        help="regenerate the tables of every note under results/notes from the "
                             "CSVs their table blocks name (suite/report/notes.py); give no "
                             "folders")
    parser.add_argument("--headline", action="store_true",
                        help="one compact table per run folder (one folder per GPU, its Gemma 2 "
                             "(2B) rows from one run) (section headline)")
    parser.add_argument("--versus", default=None, metavar="PROVIDER",
                        help="one comparison row per cell of PROVIDER against --peers; a table "
                             "per run folder (e.g. results/fused-grid-h100-3-*)")
    parser.add_argument("--targets", action="store_true",
                        help="the own kernel's targets, one row per bf16 cell; a table per run "
                             "folder (section targets)")
    parser.add_argument("--frontier", action="store_true",
                        help="the time-memory frontier of exact loss+grad per cell "
                             "(suite/report/frontier_tables.py)")
    parser.add_argument("--who-has-what", action="store_true",
                        help="a peer run folder (suite/kernel/peers_gpu.sh): each provider's "
                             "outputs, cells and RL step against the own kernel")
    parser.add_argument("--peer-list", action="store_true",
                        help="a peer run folder, as the README's sentence on the peers (section "
                             "peers)")
    parser.add_argument("--tensor-parallel", action="store_true",
                        help="a multi-GPU run's tp/<shape>-vp<K> folders: Liger's "
                             "tensor-parallel function beside the own kernel's sharded rows")
    parser.add_argument("--rl", action="store_true",
                        help="a peer run folder's RL rows (rl/rl.csv) and verl's probe "
                             "(section rl)")
    parser.add_argument("--all", action="store_true",
                        help="rewrite results/RESULTS.md, every generated README block (each "
                             "from its own Generated-by command) and the notes' tables; give no "
                             "folders")
    parser.add_argument("--peers", default="apple_cce,torch_compile",
                        help="comma-separated providers for --versus (default: %(default)s)")
    parser.add_argument("--section", default=None,
                        help="README marker name for --update-readme (default: headline, "
                             "train-headline)")


def _rows_of(folder) -> list[dict]:
    rows = read_rows(folder)
    if not rows:
        raise ValueError(f"no results in {Path(folder).as_posix()}/results.csv")
    return rows


def _command(args, options: str) -> str:
    """The command that regenerates this text, as it was given."""
    folders = " ".join(Path(d).as_posix() for d in args.results)
    return (f"python -m suite report {folders}{options}"
            f"{f' --section {args.section}' if args.section else ''}"
            f"{' --update-readme' if args.update_readme else ''}")


def _generated_by(args, options: str) -> str:
    return f"Generated by `{_command(args, options)}`."


def _per_run(args, table) -> str:
    """``table(rows)`` of each run folder, under the folder's name and where it was measured."""
    parts = []
    for d in args.results:
        path = Path(d).as_posix()
        parts.append(f"From [`{path}`]({path}/results.csv): {env_line(d)}\n\n"
                     + table(_rows_of(d)))
    return "\n\n".join(parts)


def _versus_text(args) -> str:
    peers = [p for p in args.peers.split(",") if p]
    if not peers:
        raise ValueError("--peers: expected comma-separated provider names, got nothing")
    return (_generated_by(args, f" --versus {args.versus} --peers {','.join(peers)}")
            + f" Loss+gradient phase; a ratio below 1 means {args.versus} is faster / smaller; "
              f"{RULE_TEXT}.\n\n"
            + _per_run(args, lambda rows: versus_table(rows, args.versus, peers)))


def _targets_text(args) -> str:
    return (_generated_by(args, " --targets")
            + " bf16 cells; times over the floor (one cuBLAS E @ C.T of the cell's shape, timed in "
              "the same run); ratios are own_filter's loss+grad time or memory over the peer's, "
              f"with the verdict ({RULE_TEXT}); "
              "MiB ÷ grads is the loss+grad peak over dE + dC (+ dbias); err ÷ naive is the larger "
              "of the dE and dC errors over the naive baseline's; ✗ marks a value that misses its "
              "bound, – one not measured.\n\n"
            + _per_run(args, targets_table))


def _run_folder_text(args, train: list) -> tuple[str, str]:
    """(text, default section) of one kernel run folder or of training-step folders."""
    if train and len(train) != len(args.results):
        other = [d for d in args.results if d not in train]
        raise ValueError(f"mix of training-step folders and other folders: "
                         f"{', '.join(other)} hold no train_bench.csv / train_convergence.csv")
    if train:
        return render_train(args.results, command=_command(args, "")), "train"
    if len(args.results) > 1:
        raise ValueError("give one run folder holding results.csv (several folders: only "
                         "training-step runs, --versus, --targets or --headline)")
    return render(args.results[0], command=_command(args, "")), "run"


def compute(args) -> tuple[str, str]:
    """(text, default README section) of the parsed arguments; writes nothing."""
    if not args.results:
        raise ValueError("give one or more run folders (or --results-doc alone)")
    train = [d for d in args.results if is_train_run(d)]
    if sum(map(bool, (args.versus, args.targets, args.headline, args.frontier,
                      args.who_has_what, args.rl, args.peer_list,
                      args.tensor_parallel))) > 1:
        raise ValueError("give one of --versus, --targets, --headline, --frontier, "
                         "--who-has-what, --rl, --peer-list, --tensor-parallel")
    if args.who_has_what or args.rl or args.peer_list or args.tensor_parallel:
        return _peer_run_text(args)
    if args.versus:
        return _versus_text(args), "versus"
    if args.targets:
        return _targets_text(args), "targets"
    if args.headline and train:
        return train_headline(train, _command(args, " --headline")), "train-headline"
    if args.headline:
        return headline(args.results, _command(args, " --headline")), "headline"
    if args.frontier:
        return frontier_report(args.results, _command(args, " --frontier")), "frontier"
    if len(args.results) == 1 and is_multi_gpu_run(args.results[0]):
        return multi_gpu_text(args.results[0], _command(args, "")), "multi-gpu"
    return _run_folder_text(args, train)


def _peer_run_text(args) -> tuple[str, str]:
    from suite.report.peer_tables import peer_list, rl_table, tensor_parallel, who_has_what

    if args.peer_list and len(args.results) == 2:  # the peer run, then the TP run
        return (peer_list(args.results[0], _command(args, " --peer-list"), args.results[1]),
                "peers")
    if len(args.results) != 1:
        raise ValueError("--who-has-what / --rl / --peer-list / --tensor-parallel: give one "
                         "peer run folder (--peer-list: and a tensor-parallel one)")
    if args.tensor_parallel:
        return (tensor_parallel(args.results[0], _command(args, " --tensor-parallel")),
                "tensor-parallel")
    if args.who_has_what:
        return who_has_what(args.results[0], _command(args, " --who-has-what")), "who-has-what"
    if args.peer_list:
        return peer_list(args.results[0], _command(args, " --peer-list")), "peers"
    return rl_table(args.results[0], _command(args, " --rl")), "rl"


def table_text(arguments: str) -> str:
    """What `python -m suite report <arguments>` prints (nothing written)."""
    import argparse
    import shlex

    parser = argparse.ArgumentParser(prog="python -m suite report")
    add_arguments(parser)
    return compute(parser.parse_args(shlex.split(arguments)))[0]


def results_doc_text() -> str:
    """results/RESULTS.md as `--results-doc` writes it (suite/report/document.py)."""
    return render_document(table_text)


def _rewrite_notes(args) -> int:
    """`--notes`: every note under results/notes with its table blocks regenerated in place."""
    from suite.report import notes

    if args.results or args.update_readme or args.results_doc:
        raise ValueError("--notes rewrites the notes under results/notes from their CSVs: give "
                         "no folders, no --update-readme and no --results-doc")
    changed = notes.rewrite_notes(notes.NOTES)  # read now: a test points NOTES elsewhere
    for path in changed:
        print(f"report: {notes.shown(path)} rewritten")
    print(f"report: {len(changed)} note(s) rewritten" if changed
          else "report: every note's tables were up to date")
    return 0


def _rewrite_all(args) -> int:
    """`--all`: results/RESULTS.md, each generated README block from its own Generated-by
    command, and the notes' tables: every generated text after a new run, in one command."""
    import argparse

    from suite.report.readme import readme_blocks

    if args.results or args.update_readme or args.results_doc or args.notes:
        raise ValueError("--all rewrites every generated text: give it alone")
    RESULTS_DOC.write_text(results_doc_text())
    print(f"report: {RESULTS_DOC} written")
    for section, command in readme_blocks(README):
        parser = argparse.ArgumentParser(prog="python -m suite report")
        add_arguments(parser)
        text, _ = compute(parser.parse_args(command.split()))
        update_markers(text, section, README)
        print(f"report: {README.name} section '{section}' rewritten")
    code = _rewrite_notes(argparse.Namespace(results=[], update_readme=False, results_doc=False))
    print("report: the figures read the same runs: python -m suite plots")
    return code


def main(args) -> int:
    try:
        if getattr(args, "all", False):
            return _rewrite_all(args)
        if args.notes:
            return _rewrite_notes(args)
        if args.results_doc:
            if args.results or args.update_readme:
                raise ValueError("--results-doc writes results/RESULTS.md whole from the curated "
                                 "runs (suite/report/document.py): give no folders and no "
                                 "--update-readme")
            RESULTS_DOC.write_text(results_doc_text())
            print(f"report: {RESULTS_DOC} written")
            return 0
        text, section = compute(args)
        section = args.section or section
        print(text)
        if args.update_readme:
            update_markers(text, section, README)
            print(f"\nreport: {README.name} section '{section}' updated")
        return 0
    except (ValueError, FileNotFoundError) as err:
        print(f"report: {err}")
        return 1
