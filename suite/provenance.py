"""Which commits' kernel a run measured, from the own kernel's source digest.

A run's env.json names the commit it was made from: CCE_BENCH_COMMIT, else the checkout's git
HEAD. A copy of the checkout on a GPU machine can carry a stale .git (its HEAD older than the
files copied with it), and a call that forgets CCE_BENCH_COMMIT then records the wrong commit.
So env.json also records ``own_kernel_digest``: one hash over the own kernel's Python files,
each named by its git blob id. The files on disk give it whatever the git state, and a commit's
comes from ``git ls-tree`` without reading a file, so a run can be matched to the commits whose
kernel it ran:

    python -m suite provenance RUN [RUN ...] [--commits 400]

prints, for each env file of each run (env.json, env-2.json, ...), the recorded commit and
digest, then the commits (newest first, among HEAD's last --commits) whose own_kernel has it.
"""
from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import subprocess
from pathlib import Path

PACKAGE = "own_kernel"
ROOT = Path(__file__).resolve().parent.parent
SHOWN = 8  # matching commits printed per run, newest first


def blob_id(data: bytes) -> str:
    """git's object id of a file with these bytes (``git hash-object``)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def digest_of(entries) -> str:
    """One sha256 over (path, blob id) pairs, in path order."""
    text = "".join(f"{path} {blob}\n" for path, blob in sorted(entries))
    return hashlib.sha256(text.encode()).hexdigest()


def tree_digest(package_dir: Path) -> str:
    """The digest of the Python files below package_dir, as they are on disk; paths start
    with the folder's name, as git names them from the repository root."""
    package_dir = Path(package_dir)
    files = (p for p in package_dir.rglob("*.py") if "__pycache__" not in p.parts)
    return digest_of((f"{package_dir.name}/{p.relative_to(package_dir).as_posix()}",
                      blob_id(p.read_bytes())) for p in files)


def installed_digest() -> str | None:
    """The digest of the own kernel this interpreter imports (found, not imported), or None."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.origin:
        return None
    return tree_digest(Path(spec.origin).parent)


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True,
                          timeout=60).stdout


def commit_digest(commit: str, root: Path = ROOT, package: str = PACKAGE) -> str:
    """The digest of the package's Python files at a commit, from git's tree alone."""
    entries = []
    for line in _git(root, "ls-tree", "-r", "--full-tree", commit, "--", package).splitlines():
        meta, path = line.split("\t", 1)
        if path.endswith(".py"):
            entries.append((path, meta.split()[2]))
    return digest_of(entries)


def commit_digests(root: Path = ROOT, max_count: int = 400) -> list[tuple[str, str]]:
    """(commit, its own kernel's digest) of HEAD's last max_count commits, newest first."""
    commits = _git(root, "rev-list", f"--max-count={max_count}", "HEAD").split()
    return [(c, commit_digest(c, root)) for c in commits]


def matching_commits(digest: str, root: Path = ROOT, max_count: int = 400,
                     history: list[tuple[str, str]] | None = None) -> list[str]:
    """The commits among HEAD's last max_count whose own kernel has this digest, newest first
    (history: commit_digests' list, when already read)."""
    history = commit_digests(root, max_count) if history is None else history
    return [c for c, d in history if d == digest]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("runs", nargs="+", type=Path, help="run folders (each with its env.json)")
    p.add_argument("--commits", type=int, default=400,
                   help="how many of HEAD's commits to search (default 400)")


def env_files(run: Path) -> list[Path]:
    """A run folder's env files: env.json, then env-2.json, ... (a resumed run adds one per
    process that wrote rows), in that order."""
    def order(path):
        stem = path.stem.partition("-")[2]
        return int(stem) if stem.isdigit() else 1

    return sorted((p for p in run.glob("env*.json") if p.is_file()), key=order)


def describe(env_path: Path, commits: int, history: list[tuple[str, str]]) -> None:
    """Print one env file's recorded commit, its digest and the commits of history
    (commit_digests') that match it."""
    env = json.loads(env_path.read_text())
    digest = env.get("own_kernel_digest")
    dirty = {True: "dirty", False: "clean"}.get(env.get("git_dirty"), "dirty unknown")
    print(f"{env_path}: recorded commit {env.get('git_commit')} ({dirty}), "
          f"own_kernel_digest {digest}")
    if not digest:
        print("  no own_kernel_digest: written before the suite recorded one")
        return
    found = matching_commits(digest, history=history)
    shown = ", ".join(c[:12] for c in found[:SHOWN])
    more = f" and {len(found) - SHOWN} older" if len(found) > SHOWN else ""
    print(f"  its own_kernel is that of {len(found)} of HEAD's last {commits} commits"
          + (f": {shown}{more}" if found else ""))


def main(args) -> int:
    if args.commits < 1:
        raise SystemExit(f"--commits: expected a positive number, got {args.commits}")
    env_paths = []
    for run in args.runs:
        found = env_files(run)
        if not found:
            raise SystemExit(f"{run}: no env.json (a run folder the suite wrote has one)")
        env_paths += found
    history = commit_digests(ROOT, args.commits)  # read once for every env file
    for env_path in env_paths:
        describe(env_path, args.commits, history)
    return 0
