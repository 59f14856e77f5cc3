"""What a run folder says about where and when it was measured: env.json, and the env-<k>.json
of each session that resumed it."""
from __future__ import annotations

import json
import re
from pathlib import Path

from suite.report.curated import read_run_rows as read_rows
from suite.results import ENV_NAME


def read_envs(results_dir) -> list[dict]:
    """env.json, then env-2.json, env-3.json, ... (one per session that resumed the run)."""
    root = Path(results_dir)
    paths = [root / "env.json"] + sorted(root.glob("env-*.json"), key=lambda p: (len(p.name), p.name))
    return [json.loads(p.read_text()) for p in paths if p.is_file()]


def _session(env: dict) -> str:
    return f"commit {(env.get('git_commit') or 'unknown')[:10]}, {env.get('date', '')[:10]}"


def env_line(run_dir) -> str:
    """One sentence: the GPU (or the CPU), the versions, the commit and date of the run."""
    path = Path(run_dir) / ENV_NAME
    if not path.exists():
        return ""
    env = json.loads(path.read_text())
    where = env.get("gpu_name") or f"CPU ({env.get('cpu', '?')}), not GPU numbers"
    commit = (env.get("git_commit") or "unknown")[:10]
    line = (f"Measured on {where}, torch {env.get('torch')}, triton {env.get('triton')}, "
            f"CUDA {env.get('cuda')}; peers: {peer_versions(run_dir)}; commit {commit}, "
            f"{env.get('date', '')[:10]}.")
    later = remeasured(run_dir, env)
    return line + (f" Re-measured since: {later}." if later else "")


def remeasured(run_dir, first_env: dict) -> str:
    """Which providers' latest rows come from a later session than env.json's (a resumed run
    with --rerun), with that session's commit and date: '' when none do."""
    envs = {e.get("run_id"): e for e in read_envs(run_dir)}
    latest: dict[str, str] = {}
    for row in read_rows(run_dir):
        latest[row["provider"]] = row.get("run_id")
    by_session: dict[str, list[str]] = {}
    for provider, run_id in latest.items():
        env = envs.get(run_id)
        if env is None or run_id == first_env.get("run_id"):
            continue
        by_session.setdefault(_session(env), []).append(provider)
    return "; ".join(f"{', '.join(sorted(ps))} at {key}" for key, ps in sorted(by_session.items()))


def remeasured_train(run_dir, chosen: list[dict]) -> str:
    """' Re-measured since: ...' for the chosen training rows of run_dir that a later session
    wrote (its env-<k>.json has their run_id): '' when none did."""
    envs = read_envs(run_dir)
    later = {e.get("run_id"): e for e in envs[1:] if e.get("run_id")}
    by_session: dict[str, set] = {}
    for row in chosen:
        env = later.get(row.get("run_id"))
        if env is None or row.get("source") != Path(run_dir).as_posix():
            continue
        by_session.setdefault(_session(env), set()).add(row["backend"])
    if not by_session:
        return ""
    return " Re-measured since: " + "; ".join(
        f"{', '.join(sorted(bs))} at {key}" for key, bs in sorted(by_session.items())) + "."


def peer_versions(run_dir) -> str:
    """The peer libraries a run measured, as 'package version (commit): providers; ...', from
    its env files' `peers` entries (a later session's entry wins), or, for runs recorded before
    those entries existed, env.json's liger-kernel and cut-cross-entropy versions."""
    from suite import catalog

    envs = read_envs(run_dir)
    peers: dict = {}
    for env in envs:
        peers.update(env.get("peers") or {})
    if not peers:
        env = envs[0] if envs else {}
        return (f"liger-kernel {env.get('liger_kernel')}, cut-cross-entropy "
                f"{env.get('cut_cross_entropy')}")
    groups: dict[tuple, list[str]] = {}
    for provider, info in peers.items():
        try:
            package = catalog.get(provider).package or provider
        except ValueError:  # a provider this checkout no longer registers
            package = provider
        commit = info.get("commit")
        route = info.get("route")  # torch_native: the installed torch's, or a wheel's files
        if route:  # the folder the files were read from is the measuring machine's, not news
            route = re.sub(r"^module files of \S+ loaded", "its module files loaded", route)
        key = (package, info.get("version"), commit[:7] if commit else None,
               None if route in (None, "native") else route)
        groups.setdefault(key, []).append(provider)
    return "; ".join(
        f"{package} {version}{f' ({commit})' if commit else ''}{f' ({route})' if route else ''}: "
        f"{', '.join(sorted(ps))}"
        for (package, version, commit, route), ps in sorted(groups.items(),
                                                            key=lambda kv: kv[0][:2]))
