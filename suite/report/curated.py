"""The curated runs: the run folders under results/ that the tables (results/RESULTS.md, the
README's generated blocks) and the figures (plots/) read, and nothing else.

A run folder not listed here does not belong in results/ (a test checks); superseded runs leave
the tree and git keeps them (results/PROVENANCE.md names the commit). Each curated run comes
from one session (``SESSION_HOURS``, checked by :func:`session_problems`), and there are at most
``MAX_CURATED``. A run recorded before a
provider was renamed lists the rename in ``provider_aliases``: readers apply it, so every table
and figure names a provider as the suite names it now.
"""
from __future__ import annotations

import csv
import dataclasses
import datetime as dt
import json
from pathlib import Path

from suite.results import read_rows

ROOT = Path(__file__).resolve().parent.parent.parent
RESULTS = ROOT / "results"
# Folders under results/ that are not run folders: measurement notes, the gate's baselines and
# its proof, the kernel tools' CSVs (accuracy, autocast, rl; their notes show them) and the GPU
# test logs (read by no table or figure).
NOT_RUNS = ("notes", "baselines", "gate-proof-h100", "accuracy-h100", "autocast-h100",
            "autocast-h200", "rl-h100", "rl-h200", "gpu-tests-h200", "gpu-tests-h100")

# `own` named the exact recompute path (workspace 0) until the API's default call took the name:
# rows recorded before then are own_recompute's.
OWN_WAS_RECOMPUTE = {"own": "own_recompute"}


@dataclasses.dataclass(frozen=True)
class CuratedRun:
    folder: str                  # under results/
    what: str                    # what it measured, in a few words
    provider_aliases: dict = dataclasses.field(default_factory=dict)  # recorded -> current name

    def __post_init__(self):
        if "/" in self.folder or not self.folder:
            raise ValueError(f"folder: a folder name directly under results/, got {self.folder!r}")


# At most this many: each one earns its place in a table or a figure; older runs live in git.
# 21: the four-GPU run joined the two two-GPU runs, whose K = 2 rows it does not repeat; 22: a
# second two-H200 session (the step after the host-sync fix, Liger's tensor-parallel kernel, the
# scaling model's inputs on the four-H200 run's GPU type), whose rows no other run holds; 23: a
# second four-H200 session (the step at K = 1, 2, 4 after that fix, its per-unit profile and
# largest batch), whose K = 4 rows the first four-GPU run measured before the fix.
MAX_CURATED = 23
# One session: the rows of a curated run were measured on one GPU model within this many hours
# (one machine's lease, resumed at most a few times), so its tables compare rows measured
# under one machine state; a run resumed on another day is a new run.
SESSION_HOURS = 2.0

CURATED: tuple[CuratedRun, ...] = (
    CuratedRun("headline-h200", "every provider at the Gemma 2 (2B) shape, one run, H200 (one "
               "of four single-GPU lanes on one host)"),
    CuratedRun("frontier-llama3-8b-h200", "time-memory frontier, Llama 3 (8B), lm inputs, H200"),
    CuratedRun("frontier-gemma2-2b-h200", "time-memory frontier, Gemma 2 (2B), lm inputs, H200"),
    CuratedRun("frontier-qwen25-7b-h200", "time-memory frontier, Qwen 2.5 (7B), lm inputs, H200"),
    CuratedRun("frontier-d5120-h200", "time-memory frontier, N 8192 D 5120 V 131072, lm inputs, "
               "H200"),
    CuratedRun("frontier-d1152-h200", "time-memory frontier, N 16384 D 1152 V 262144, lm inputs "
               "of entropy 3 nats, H200"),
    CuratedRun("multigpu-2xh100", "vocab-parallel loss and an FSDP2 training step, two H100s"),
    CuratedRun("multigpu-2xh200", "the FSDP2 training step with host syncs, and the largest "
               "batch per rank, two H200s"),
    CuratedRun("multigpu-2xh200-2", "vocab-parallel loss at K = 2 against one GPU of the host "
               "(own, and Liger's tensor-parallel kernel in tp/), the FSDP2 step at 1 and 2 "
               "GPUs after the host-sync fix, two H200s"),
    CuratedRun("multigpu-4xh200", "vocab-parallel loss at K = 4 against one GPU of the host, "
               "and the FSDP2 step at 1, 2 and 4 GPUs (plain and tensor-parallel heads, Liger), "
               "four H200s"),
    CuratedRun("multigpu-4xh200-2", "the FSDP2 step at 1, 2 and 4 GPUs after the host-sync fix "
               "at a second seed (plain and tensor-parallel heads, Liger; the tensor-parallel "
               "head also at 4 sequences per rank), the K = 4 step's profile and its largest "
               "batch, four H200s"),
    CuratedRun("peers-h100", "every peer at three model shapes, H100", OWN_WAS_RECOMPUTE),
    CuratedRun("quack-h100", "QuACK beside own and torch.compile at three model shapes, lm "
               "inputs, H100"),
    CuratedRun("peers-2026-h100", "Liger's scaled CE and CuTe backend, verl, against own: "
               "loss+grad cells and the RL step, H100 (suite/kernel/peers_gpu.sh)"),
    CuratedRun("portable-h100-2", "the portable path forced on the H100", OWN_WAS_RECOMPUTE),
    CuratedRun("fused-grid-h100-3-lm", "three-matmul path, N 8192 grid, lm inputs, H100"),
    CuratedRun("fused-grid-h100-3-uniform", "three-matmul path, N 8192 grid, uniform inputs, H100"),
    CuratedRun("fused-3gib-h100", "three-matmul path at 3 GiB, Gemma 2 (2B) shape at N 8192 and "
               "32768, H100"),
    CuratedRun("fused-n32768-h100-4", "three-matmul path, N 32768, H100"),
    CuratedRun("train-hf-llama-h100", "training step, Llama architecture, H100",
               OWN_WAS_RECOMPUTE),
    CuratedRun("train-hf-gemma2-h100", "training step, Gemma 2 architecture, H100",
               OWN_WAS_RECOMPUTE),
    CuratedRun("train-hf-llama-autocast-h100", "training step under bf16 autocast over fp32 "
               "weights with the own kernel's path per step, Llama architecture, H100"),
    CuratedRun("train-hf-gemma2-autocast-h100", "training step under bf16 autocast over fp32 "
               "weights with the own kernel's path per step, Gemma 2 architecture, H100"),
)


def _by_folder() -> dict[str, CuratedRun]:
    return {r.folder: r for r in CURATED}


def curated_dirs(root=RESULTS) -> list[Path]:
    """The curated run folders under ``root``, in CURATED's order."""
    return [Path(root) / r.folder for r in CURATED]


def find(run_dir) -> CuratedRun | None:
    """The curated entry of ``run_dir`` (a folder directly under the repository's results/),
    or None: a run folder elsewhere is read as recorded."""
    path = Path(run_dir).resolve()
    if path.parent != RESULTS.resolve():
        return None
    return _by_folder().get(path.name)


def aliases_of(run_dir) -> dict:
    run = find(run_dir)
    return dict(run.provider_aliases) if run else {}


def read_run_rows(run_dir) -> list[dict]:
    """results.csv's rows (suite.results.read_rows) with the run's provider renames applied."""
    aliases = aliases_of(run_dir)
    rows = read_rows(run_dir)
    if aliases:
        rows = [dict(r, provider=aliases.get(r["provider"], r["provider"])) for r in rows]
    return rows


def stray_folders(root=RESULTS) -> list[str]:
    """Folders under ``root`` that are neither curated runs nor NOT_RUNS (they do not belong)."""
    known = set(_by_folder()) | set(NOT_RUNS)
    return sorted(p.name for p in Path(root).iterdir() if p.is_dir() and p.name not in known)


def _when(text: str) -> dt.datetime:
    """An ISO time as the suite writes it (env.json's date, a row's timestamp), in UTC."""
    t = dt.datetime.fromisoformat(text)
    return t if t.tzinfo else t.replace(tzinfo=dt.timezone.utc)


def session_of(run_dir) -> tuple[set[str], list[dt.datetime]]:
    """(the GPU models, the times) that a run folder records anywhere below it: every env file's
    gpu_name and date, every CSV row's timestamp."""
    gpus, times = set(), []
    for env in Path(run_dir).rglob("env*.json"):
        data = json.loads(env.read_text())
        gpus.add(data.get("gpu_name") or "CPU")
        if data.get("date"):
            times.append(_when(data["date"]))
    for table in Path(run_dir).rglob("*.csv"):
        with open(table, newline="") as f:
            times += [_when(r["timestamp"]) for r in csv.DictReader(f) if r.get("timestamp")]
    return gpus, times


def session_problems(run_dir, hours: float = SESSION_HOURS) -> list[str]:
    """Why ``run_dir`` is not one session (one GPU model, every record within ``hours``); []
    when it is."""
    gpus, times = session_of(run_dir)
    problems = []
    if len(gpus) != 1:
        problems.append(f"measured on {len(gpus)} GPU models ({', '.join(sorted(gpus))})"
                        if gpus else "no env file names its GPU")
    if not times:
        problems.append("no date or timestamp says when it was measured")
    elif max(times) - min(times) > dt.timedelta(hours=hours):
        problems.append(f"measured from {min(times):%Y-%m-%d %H:%M} to "
                        f"{max(times):%Y-%m-%d %H:%M} UTC, more than {hours:g} h: rows of "
                        f"different sessions would be compared as one run")
    return problems


def rename_train_rows(rows: list[dict]) -> list[dict]:
    """Training rows (suite.results.train_*_rows: each names its folder in ``source``) with their
    run's provider renames applied to the backend and the run name."""
    out = []
    for r in rows:
        aliases = aliases_of(r["source"]) if r.get("source") else {}
        if aliases:
            r = dict(r, **{k: aliases.get(r[k], r[k]) for k in ("backend", "run") if k in r})
        out.append(r)
    return out
