"""nox sessions: ``nox -s tests`` (CPU test suite) and ``nox -s bench`` (the benchmark).

``bench``, ``plots``, ``reproduce``, ``gate`` and ``train_bench`` pass their arguments through to
``python -m suite <command>``: ``nox -s bench -- --preset gemma2-2b --out results/x``.

On a machine with torch preinstalled and no network (the GPU box), skip the install step with
``nox --no-venv -s bench -- ...``, or run the CLI directly: ``python -m suite bench ...``.
"""
import nox

nox.options.sessions = ["tests"]
nox.options.reuse_existing_virtualenvs = True

# Pin torch before the project: an unpinned resolve may pull a multi-GB CUDA build, while
# 2.13.0 is the CPU wheel available locally on this project's machines.
TORCH = "torch==2.13.0"


def _install(session, *extras):
    if session.venv_backend == "none":  # --no-venv: use what the machine has
        return
    session.install(TORCH)
    session.install("-e", f".[{','.join(extras)}]" if extras else ".")


@nox.session
def tests(session):
    """CPU test suite; Triton kernels run under the interpreter."""
    _install(session, "test")
    session.run("python", "-m", "pytest", "-q", *session.posargs,
                env={"TRITON_INTERPRET": "1"})


@nox.session
def bench(session):
    """python -m suite bench; without CUDA the CLI picks the small CPU preset (smoke)."""
    _install(session)
    session.run("python", "-m", "suite", "bench", *session.posargs)


@nox.session
def plots(session):
    _install(session)
    session.run("python", "-m", "suite", "plots", *session.posargs)


@nox.session
def reproduce(session):
    _install(session)
    session.run("python", "-m", "suite", "reproduce", *session.posargs)


@nox.session
def gate(session):
    """Regression gates (GPU): ``pytest suite/gates`` on pytest-benchmark against this GPU
    model's baseline results/baselines/<gpu-slug>.json (``-- --save`` writes it), through
    ``python -m suite gate``, which prints the pytest command it runs. No network on the GPU
    box: ``nox --no-venv -s gate``."""
    _install(session, "test")
    session.run("python", "-m", "suite", "gate", *session.posargs)


@nox.session(name="train_bench")
def train_bench(session):
    _install(session)
    session.run("python", "-m", "suite", "train-bench", *session.posargs)
