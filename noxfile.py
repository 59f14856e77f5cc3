"""nox sessions: ``nox -s tests`` (CPU test suite) and ``nox -s bench`` (the benchmark).

``bench``, ``plots``, ``reproduce``, ``gate`` and ``train_bench`` pass their arguments through to
``python -m suite <command>``: ``nox -s bench -- --preset gemma2-2b --out results/x``.

Without a GPU, every session installs the pinned CPU environment of
``tests/constraints-cpu.txt`` (what CI tests): torch's CPU build from PyTorch's CPU index alone,
then the project and its extras from PyPI with every version pinned. With a GPU (``nvidia-smi``
on the PATH) it installs torch's default CUDA build and the extras' ranges. ``nox -s lock``
re-resolves the pins. On a machine with torch preinstalled and no network (the GPU box), skip
the install with ``nox --no-venv -s bench -- ...``, or run ``python -m suite bench ...``.
"""
import re
import shutil
from pathlib import Path

import nox

nox.options.sessions = ["tests"]
nox.options.reuse_existing_virtualenvs = True

CPU_INDEX = "https://download.pytorch.org/whl/cpu"
CONSTRAINTS = Path("tests/constraints-cpu.txt")
CONSTRAINTS_HEADER = f"""\
# Pinned CPU test environment: what `nox -s tests`, `nox -s bench` and CI install, and what
# README's CPU install lines install. torch is its CPU build, from PyTorch's CPU index alone:
#   pip install --no-deps --index-url {CPU_INDEX} torch==<its pin below>
#   pip install -c {CONSTRAINTS} -e '.[test]'
# Refresh it deliberately with `nox -s lock` (re-resolves, rewrites this file, runs the tests).
"""
PYTEST = ("python", "-m", "pytest", "-q", "-n", "logical", "--durations=10")


def _pinned(name: str) -> str:
    """The ``name==version`` line of the constraints file."""
    for line in CONSTRAINTS.read_text().splitlines():
        if re.match(rf"{re.escape(name)}==", line, flags=re.IGNORECASE):
            return line.strip()
    raise RuntimeError(f"{CONSTRAINTS} pins no {name}: run `nox -s lock`")


def _has_gpu() -> bool:
    return shutil.which("nvidia-smi") is not None


def _install_cpu_torch(session, spec: str) -> None:
    # --index-url: torch from the CPU index only, never PyPI's CUDA build; --no-deps: its
    # dependencies come from PyPI with the rest (the CPU index lacks some, and is slow to miss).
    session.install("--no-deps", "--index-url", CPU_INDEX, spec)


def _install(session, *extras):
    if session.venv_backend == "none":  # --no-venv: use what the machine has
        return
    target = f".[{','.join(extras)}]" if extras else "."
    if _has_gpu():
        session.install("-e", target)
        return
    _install_cpu_torch(session, _pinned("torch"))
    session.install("-c", str(CONSTRAINTS), "-e", target)


@nox.session
def tests(session):
    """CPU test suite over every core (pytest-xdist); Triton kernels run under the interpreter."""
    _install(session, "test")
    session.run(*PYTEST, *session.posargs, env={"TRITON_INTERPRET": "1"})


@nox.session(reuse_venv=False)
def lock(session):
    """Re-resolve the CPU test environment from pyproject's ranges (newest versions; torch as
    pinned, or the spec given: ``nox -s lock -- torch==2.14.0+cpu``), rewrite the constraints
    file with what was installed, and run the tests on it."""
    _install_cpu_torch(session, session.posargs[0] if session.posargs else _pinned("torch"))
    session.install("-e", ".[test]", "nox")  # nox: README installs it with the same pins
    # --all: setuptools too (torch requires it); pip itself stays the venv's own
    frozen = session.run("python", "-m", "pip", "freeze", "--all", "--exclude", "pip",
                         "--exclude-editable", silent=True)
    CONSTRAINTS.write_text(CONSTRAINTS_HEADER + frozen)
    session.log(f"wrote {CONSTRAINTS}; running the tests on it")
    session.run(*PYTEST, env={"TRITON_INTERPRET": "1"})


@nox.session
def bench(session):
    """python -m suite bench; without CUDA the CLI picks the smoke preset (every provider once
    on one tiny cell)."""
    _install(session, "bench")
    session.run("python", "-m", "suite", "bench", *session.posargs)


@nox.session
def plots(session):
    _install(session, "bench")
    session.run("python", "-m", "suite", "plots", *session.posargs)


@nox.session
def reproduce(session):
    _install(session, "bench")
    session.run("python", "-m", "suite", "reproduce", *session.posargs)


@nox.session
def gate(session):
    """Regression gates (GPU): ``pytest suite/gates`` on pytest-benchmark, each benchmark checked
    against this GPU model's baseline results/baselines/<gpu-slug>.json with limits from the
    baseline's process-to-process spread (``-- --save`` writes it from 4 fresh processes),
    through ``python -m suite gate``, which prints the pytest command it runs. No network on the
    GPU box: ``nox --no-venv -s gate``."""
    _install(session, "test")
    session.run("python", "-m", "suite", "gate", *session.posargs)


@nox.session(name="train_bench")
def train_bench(session):
    _install(session, "bench", "hf")
    session.run("python", "-m", "suite", "train-bench", *session.posargs)
