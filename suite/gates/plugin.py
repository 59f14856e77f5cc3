"""The gate's pytest plugin, on top of pytest-benchmark.

- ``--gate-baseline FILE``: the baseline (suite/gates/baseline.py) each benchmark is checked
  against as its test ends (suite/gates/checks.py): a failing check fails that test, so
  pytest's summary line and exit status are the gate's verdict. A benchmark the baseline ran
  that skips now fails too; one every baseline process skipped stays a skip (optional).
  A baseline of another GPU model, of another protocol or format, or saved with an injection,
  is a usage error (exit 4).
- ``machine_info``: pytest-benchmark's host fields without its CPU description, plus ``gpu``
  (model and slug), ``versions`` (torch, triton, CUDA, driver, peers, commit: the suite's
  env.json fields) and ``cce_gate_inject``; the JSON it writes gets a ``cce_gate`` block (the
  protocol, the benchmarks skipped and why), which ``--save`` merges (suite/gates/baseline.py).
- After the run, one section: this machine against the baseline's in one line, the limits, the
  table of every check and the verdict; ``--gate-report FILE`` writes them as JSON, and the checks as
  a CSV beside it (FILE with the suffix .csv).

Loaded by ``suite/gates/conftest.py`` (or ``-p suite.gates.plugin``).
"""
from __future__ import annotations

import csv
import json
import os
import platform
from pathlib import Path

import pytest

from suite.gates import checks
from suite.gates.baseline import Baseline, BaselineError
from suite.gates.spec import (INJECT_ENV, KERNEL_FROM_ENV, gpu_slug, injections_text,
                              parse_injections, protocol)

PLUGIN_NAME = "cce-gate"
# Fields of the suite's env.json (suite.results.environment) kept in machine_info["versions"].
VERSION_FIELDS = ("torch", "triton", "cuda", "driver", "compute_capability", "liger_kernel",
                  "cut_cross_entropy", "peers", "git_commit", "git_dirty", "own_kernel_digest",
                  "own_config_overrides")


def gate_environment() -> dict:
    """The suite's environment record of this machine (GPU name, versions, commit)."""
    import torch

    from suite.results import environment

    return environment("cuda" if torch.cuda.is_available() else "cpu")


def pytest_addoption(parser):
    group = parser.getgroup("cce-gate", "cce-bench's regression gate (suite/gates)")
    group.addoption("--gate-baseline", metavar="FILE", default=None,
                    help="check every benchmark against this baseline (written by "
                         "`python -m suite gate --save`)")
    group.addoption("--gate-report", metavar="FILE", default=None,
                    help="write the gate's checks and verdict to this JSON file")


def pytest_configure(config):
    if config.pluginmanager.has_plugin(PLUGIN_NAME):
        return
    try:
        injections = parse_injections(os.environ.get(INJECT_ENV))
        path = config.getoption("gate_baseline", None)
        baseline = Baseline.load(path) if path else None
    except (ValueError, BaselineError) as err:
        raise pytest.UsageError(str(err)) from None
    plugin = GatePlugin(injections, baseline)
    if baseline is not None:
        plugin.check_same_gpu()
    config.pluginmanager.register(plugin, PLUGIN_NAME)


def _benchmark_id(item) -> str:
    callspec = getattr(item, "callspec", None)
    return callspec.id if callspec is not None else item.name


def _skip_reason(report) -> str:
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    return reason.removeprefix("Skipped: ")


def kernel_from() -> str | None:
    """The other checkout whose own_kernel this run measures (suite/gates/conftest.py)."""
    folder = os.environ.get(KERNEL_FROM_ENV)
    return os.path.abspath(folder) if folder else None


def measured(fixture) -> dict | None:
    """This run's values of a benchmark: the minimum of its rounds (ms) and its extra_info."""
    stats = getattr(getattr(fixture, "stats", None), "stats", None)
    if not stats:
        return None
    return {**fixture.extra_info, "min_ms": stats.min * 1e3, "median_ms": stats.median * 1e3}


class GatePlugin:
    def __init__(self, injections=(), baseline: Baseline | None = None):
        self.injections = tuple(injections)
        self.baseline = baseline
        self.env = None
        self.rows: list[checks.Check] = []
        self.not_run: dict[str, str] = {}   # benchmark -> why it skipped (the JSON's record)
        self.seen: set[str] = set()          # benchmarks that ran or skipped
        self.deselected: set[str] = set()    # benchmarks -k left out

    def _env(self) -> dict:
        if self.env is None:
            self.env = gate_environment()
        return self.env

    def check_same_gpu(self) -> None:
        where, base = self.baseline.where, self.baseline.machine_info.get("gpu") or {}
        now = self._env().get("gpu_name")
        if not base.get("slug"):
            raise pytest.UsageError(f"baseline {where} records no GPU in machine_info: it was "
                                    f"not saved by this gate; save one with "
                                    f"`nox -s gate -- --save`")
        if not now:
            raise pytest.UsageError(f"baseline {where} was measured on {base.get('name')}; this "
                                    f"machine has no CUDA device to compare with it")
        if base["slug"] != gpu_slug(now):
            raise pytest.UsageError(
                f"refusing to compare: baseline {where} was measured on {base.get('name')}, this "
                f"is {now}. Times and memory compare only on the same GPU model: save this "
                f"GPU's baseline with `nox -s gate -- --save`.")

    # ---- pytest-benchmark's records ---------------------------------------------------

    @pytest.hookimpl(tryfirst=True)
    def pytest_benchmark_generate_machine_info(self, config):
        # pytest-benchmark's own adds the CPU's description (its flags, hundreds of words):
        # not what a GPU benchmark depends on, and slow to gather.
        return {"node": platform.node(), "machine": platform.machine(),
                "system": platform.system(), "release": platform.release(),
                "python_version": platform.python_version()}

    def pytest_benchmark_update_machine_info(self, config, machine_info):
        env = self._env()
        name = env.get("gpu_name")
        machine_info["gpu"] = {"name": name, "slug": gpu_slug(name)} if name else None
        machine_info["versions"] = {k: env.get(k) for k in VERSION_FIELDS}
        machine_info["cce_gate_inject"] = injections_text(self.injections)
        machine_info["own_kernel_from"] = kernel_from()

    def pytest_benchmark_update_commit_info(self, config, commit_info):
        # The suite's commit (CCE_BENCH_COMMIT wins): a copy of the checkout on a GPU machine
        # may carry a .git older than its files.
        env = self._env()
        if env.get("git_commit") and env["git_commit"] != commit_info.get("id"):
            commit_info.update(id=env["git_commit"], dirty=env.get("git_dirty"), time=None,
                               author_time=None)

    def pytest_benchmark_update_json(self, config, benchmarks, output_json):
        output_json["cce_gate"] = {"protocol": protocol(), "not_run": dict(self.not_run)}

    # ---- each benchmark's verdict, as its test ends ------------------------------------

    def _base(self, benchmark: str):
        return self.baseline.values(benchmark) if self.baseline else None

    def judge(self, item, report) -> list[checks.Check]:
        """The checks of one test phase's report (none for a passing setup or teardown)."""
        bid = _benchmark_id(item)
        if report.skipped and report.when in ("setup", "call"):
            reason = _skip_reason(report)
            self.not_run[bid] = reason
            optional = self.baseline.not_run.get(bid) if self.baseline else None
            return [checks.skipped_check(bid, reason, self._base(bid), optional)]
        if report.failed:
            crash = getattr(getattr(report.longrepr, "reprcrash", None), "message", "")
            return [checks.failed_check(bid, f"the test's {report.when} failed"
                                             + (f": {crash.splitlines()[0]}" if crash else ""))]
        if report.when != "call":
            return []
        now = measured(item.funcargs.get("benchmark"))
        if now is None:
            return [checks.failed_check(bid, "no timed round")]
        return checks.benchmark_checks(bid, self._base(bid), now)

    # Outermost: pytest-benchmark's own wrapper sees the skip as a skip (else it warns that the
    # fixture went unused), then the verdict replaces it.
    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_makereport(self, item, call):
        report = yield
        rows = self.judge(item, report)
        self.seen.add(_benchmark_id(item))
        self.rows += rows
        if any(r.failed for r in rows) and not report.failed:
            report.outcome = "failed"
            report.longrepr = checks.failure_text(rows)
        return report

    # ---- the section after the run -----------------------------------------------------

    def verdict(self) -> str:
        bad = [r for r in self.rows if r.failed]
        if not bad:
            return f"gate: PASS ({len(self.rows)} checks)"
        counts = {}
        for r in bad:
            counts[r.metric] = counts.get(r.metric, 0) + 1
        what = ", ".join(f"{metric} x{k}" for metric, k in sorted(counts.items()))
        failing = len({r.benchmark for r in bad})
        return f"gate: FAIL: {failing} failing benchmark(s), {len(bad)} failing check(s): {what}"

    def header(self) -> list[str]:
        env = self._env()
        lines = [f"GPU: {env.get('gpu_name')}; torch {env.get('torch')}, triton "
                 f"{env.get('triton')}, CUDA {env.get('cuda')}, driver {env.get('driver')}; "
                 f"commit {env.get('git_commit')}{' (dirty)' if env.get('git_dirty') else ''}"]
        b = self.baseline
        if b is None:
            lines.append("baseline: none (--gate-baseline not given): values of this run only")
        else:
            lines.append(f"baseline: {b.where} ({b.processes} processes, commit "
                         f"{(b.machine_info.get('versions') or {}).get('git_commit')}, "
                         f"{b.doc.get('datetime')})")
            now_info = {"gpu": {"name": env.get("gpu_name")}, "own_kernel_from": kernel_from(),
                        "versions": {k: env.get(k) for k in VERSION_FIELDS}}
            lines.append(checks.machine_line(b.machine_info, now_info))
            dropped = sorted(set(b.benchmarks) - self.seen - self.deselected)
            if dropped:
                lines.append(f"in the baseline, not in this gate: {', '.join(dropped)}")
        if kernel_from():
            lines.append(f"own_kernel: from {kernel_from()} ({KERNEL_FROM_ENV})")
        if self.injections:
            lines.append(f"INJECTED: {INJECT_ENV}={injections_text(self.injections)} "
                         f"(suite/gates/inject.py)")
        return lines + [checks.limits_line()]

    def pytest_deselected(self, items):
        self.deselected |= {_benchmark_id(i) for i in items}

    @pytest.hookimpl(trylast=True)  # after pytest-benchmark's table: the verdict comes last
    def pytest_terminal_summary(self, terminalreporter, exitstatus, config):
        if not self.rows:
            return
        tr = terminalreporter
        tr.section("cce-bench gate", sep="=")
        header = self.header()
        for line in header:
            tr.write_line(line, yellow=line.startswith("INJECTED"), bold=line.startswith("INJ"))
        tr.write_line(checks.format_table(self.rows))
        verdict = self.verdict()
        failed = any(r.failed for r in self.rows)
        tr.write_line(verdict, red=failed, green=not failed, bold=True)
        report = config.getoption("gate_report", None)
        if report:
            self.write_report(Path(report), header, verdict)

    def write_report(self, path: Path, header: list[str], verdict: str) -> None:
        env = self._env()
        b = self.baseline
        doc = {"verdict": verdict, "passed": not any(r.failed for r in self.rows),
               "commit": env.get("git_commit"), "gpu": env.get("gpu_name"),
               "baseline": b.where if b else None,
               "baseline_commit": (b.machine_info.get("versions") or {}).get("git_commit")
               if b else None,
               "inject": injections_text(self.injections),
               "own_config_overrides": env.get("own_config_overrides"),
               "header": header, "checks": [r.as_dict() for r in self.rows]}
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(doc, indent=1, default=str) + "\n")
        write_checks_csv(doc, path.with_suffix(".csv"))


CHECK_COLUMNS = ("benchmark", "metric", "baseline", "now", "change", "threshold", "verdict",
                 "note")


def write_checks_csv(report: dict, path: Path) -> None:
    """The report's checks as a CSV beside its JSON: the table a measurement note's block
    reads (suite/report/notes.py), with the commits compared in every row."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(CHECK_COLUMNS + ("commit", "baseline_commit", "gpu"))
        for check in report["checks"]:
            w.writerow([check.get(k, "") for k in CHECK_COLUMNS]
                       + [report.get("commit"), report.get("baseline_commit"), report.get("gpu")])
