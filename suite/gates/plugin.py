"""The gate's pytest plugin, on top of pytest-benchmark.

- ``machine_info`` of a saved or compared run gets ``gpu`` (model and slug) and ``versions``
  (torch, triton, CUDA, driver, peers, commit: the suite's env.json fields) and
  ``cce_gate_inject`` (the injected regression, if any);
- comparing with a baseline of another GPU model (or one saved with an injection, or with no
  GPU recorded) is a usage error, and so is saving a baseline while an injection is active;
- after the run, one table: each benchmark's median (pytest-benchmark's
  ``--benchmark-compare-fail`` verdict), ``peak_extra_mib`` and gradient errors from
  ``extra_info`` against the baseline's (suite.gates.checks); any failing check fails the run.

Loaded by ``suite/gates/conftest.py`` (or ``-p suite.gates.plugin``).
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from suite.gates import checks
from suite.gates.spec import INJECT_ENV, Injection, gpu_slug, parse_injection

PLUGIN_NAME = "cce-gate"
# Fields of the suite's env.json (suite.results.environment) kept in machine_info["versions"].
VERSION_FIELDS = ("torch", "triton", "cuda", "driver", "compute_capability", "liger_kernel",
                  "cut_cross_entropy", "peers", "git_commit", "git_dirty", "own_config_overrides")


def gate_environment() -> dict:
    """The suite's environment record of this machine (GPU name, versions, commit)."""
    import torch

    from suite.results import environment

    return environment("cuda" if torch.cuda.is_available() else "cpu")


def pytest_configure(config):
    if config.pluginmanager.has_plugin(PLUGIN_NAME):
        return
    try:
        injection = parse_injection(os.environ.get(INJECT_ENV))
    except ValueError as err:
        raise pytest.UsageError(str(err)) from None
    saving = [opt for opt in ("benchmark_json", "benchmark_save", "benchmark_autosave")
              if config.getoption(opt, None)]
    if injection and saving:
        raise pytest.UsageError(
            f"{INJECT_ENV}={injection.text} is set: refusing to save a baseline with a "
            f"deliberately injected regression (--{saving[0].replace('_', '-')}); unset it")
    config.pluginmanager.register(GatePlugin(injection), PLUGIN_NAME)


def _short(fullname: str) -> str:
    """'suite/gates/test_gates.py::test_gate[gemma2-2b-own-fwd]' -> 'gemma2-2b-own-fwd'."""
    return fullname[fullname.index("[") + 1:-1] if fullname.endswith("]") else fullname


class GatePlugin:
    def __init__(self, injection: Injection | None):
        self.injection = injection
        self.session = None
        self.env = None
        self.baseline = None  # (where, machine_info) of the compared run
        self.outcomes = {}    # nodeid -> (outcome, reason) of tests that did not pass

    # ---- machine info ----------------------------------------------------------------

    def _env(self) -> dict:
        if self.env is None:
            self.env = gate_environment()
        return self.env

    def pytest_benchmark_update_machine_info(self, config, machine_info):
        env = self._env()
        name = env.get("gpu_name")
        machine_info["gpu"] = {"name": name, "slug": gpu_slug(name)} if name else None
        machine_info["versions"] = {k: env.get(k) for k in VERSION_FIELDS}
        machine_info["cce_gate_inject"] = self.injection.text if self.injection else None

    def pytest_benchmark_update_commit_info(self, config, commit_info):
        # The suite's commit (CCE_BENCH_COMMIT wins): a copy of the checkout on a GPU machine
        # may carry a .git older than its files.
        env = self._env()
        if env.get("git_commit") and env["git_commit"] != commit_info.get("id"):
            commit_info.update(id=env["git_commit"], dirty=env.get("git_dirty"), time=None,
                               author_time=None)

    def pytest_benchmark_compare_machine_info(self, config, benchmarksession, machine_info,
                                              compared_benchmark):
        where = config.getoption("benchmark_compare")
        base = compared_benchmark.get("machine_info") or {}
        self.baseline = (where, base)
        base_gpu, now_gpu = base.get("gpu") or {}, machine_info.get("gpu") or {}
        if base.get("cce_gate_inject"):
            raise pytest.UsageError(f"baseline {where} was saved with {INJECT_ENV}="
                                    f"{base['cce_gate_inject']}: it is no baseline; save it again")
        if not base_gpu.get("slug"):
            raise pytest.UsageError(f"baseline {where} records no GPU in machine_info: it was "
                                    f"not saved by this gate; save one with "
                                    f"`nox -s gate -- --save`")
        if not now_gpu.get("slug"):
            raise pytest.UsageError(f"baseline {where} was measured on {base_gpu.get('name')}; "
                                    f"this machine has no CUDA device to compare with it")
        if base_gpu["slug"] != now_gpu["slug"]:
            raise pytest.UsageError(
                f"refusing to compare: baseline {where} was measured on {base_gpu.get('name')}, "
                f"this is {now_gpu.get('name')}. Times and memory compare only on the same GPU "
                f"model: save this GPU's baseline with `nox -s gate -- --save`.")

    # ---- outcomes, the table -------------------------------------------------------------

    def pytest_sessionstart(self, session):
        self.session = session

    def pytest_runtest_logreport(self, report):
        if report.skipped and report.nodeid not in self.outcomes:
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else "skipped"
            self.outcomes[report.nodeid] = ("not run", reason.removeprefix("Skipped: "))
        elif report.failed:
            self.outcomes[report.nodeid] = ("FAILED", f"test {report.when} failed")

    def rows(self, config) -> list[checks.Check]:
        bs = config._benchmarksession
        compared = {}
        for mapping in (bs.compared_mapping or {}).values():
            compared.update(mapping)
        fail_checks = config.getoption("benchmark_compare_fail") or []
        rows, seen = [], set()
        for bench in bs.benchmarks:
            if not bench:  # no timed round (the test failed before measuring)
                continue
            seen.add(bench.fullname)
            base = compared.get(bench.fullname)
            regressed = base is not None and any(c.fails(bench, base["stats"]) for c in fail_checks)
            name = _short(bench.fullname)
            rows.append(checks.time_check(name, base and base["stats"]["median"],
                                          bench["median"], regressed))
            rows += checks.extra_checks(name, base and base.get("extra_info"), bench.extra_info)
        for fullname, base in compared.items():
            outcome = self.outcomes.get(fullname)
            if fullname not in seen and outcome:
                base_ms = base["stats"]["median"] * 1e3
                rows.append(checks.Check(_short(fullname), "median_ms", base_ms, outcome[1], None,
                                         outcome[0]))
        return rows

    @pytest.hookimpl(wrapper=True)
    def pytest_terminal_summary(self, terminalreporter, exitstatus, config):
        from pytest_benchmark.session import PerformanceRegression

        try:
            yield
        except PerformanceRegression:
            pass  # logged by pytest-benchmark above; its verdicts are in the table's medians
        rows = self.rows(config)
        if not rows:
            return
        tr = terminalreporter
        tr.section("cce-bench gate", sep="=")
        self._write_header(tr)
        tr.write_line(checks.format_table(rows))
        bad = [r for r in rows if r.failed]
        if bad:
            counts = {}
            for r in bad:
                counts[r.metric] = counts.get(r.metric, 0) + 1
            what = ", ".join(f"{metric} x{k}" for metric, k in sorted(counts.items()))
            tr.write_line(f"gate: FAIL: {len(bad)} failing check(s): {what}", red=True, bold=True)
            self.session.exitstatus = pytest.ExitCode.TESTS_FAILED
        else:
            tr.write_line(f"gate: PASS ({len(rows)} checks)", green=True, bold=True)

    def _write_header(self, tr) -> None:
        env = self._env()
        tr.write_line(f"GPU: {env.get('gpu_name')}; torch {env.get('torch')}, triton "
                      f"{env.get('triton')}, CUDA {env.get('cuda')}, driver {env.get('driver')}; "
                      f"commit {env.get('git_commit')}{' (dirty)' if env.get('git_dirty') else ''}")
        if self.baseline:
            where, info = self.baseline
            v = info.get("versions") or {}
            gpu = (info.get("gpu") or {}).get("name")
            tr.write_line(f"baseline: {Path(str(where)).name} ({gpu}; torch {v.get('torch')}, "
                          f"triton {v.get('triton')}, commit {v.get('git_commit')})")
        else:
            tr.write_line("baseline: none (no --benchmark-compare): values of this run only")
        if self.injection:
            tr.write_line(f"INJECTED: {INJECT_ENV}={self.injection.text} (suite/gates/inject.py)",
                          yellow=True, bold=True)
        tr.write_line(checks.thresholds_line())
