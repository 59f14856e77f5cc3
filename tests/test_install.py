"""What the project installs and pins: the kernel needs torch, triton and (for Triton's
interpreter, the CPU path) numpy, and README's CPU install lines, the noxfile and CI install the
same pinned environment."""
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONSTRAINTS = ROOT / "tests" / "constraints-cpu.txt"


def _pins() -> dict[str, str]:
    lines = [line for line in CONSTRAINTS.read_text().splitlines()
             if line and not line.startswith("#")]
    return dict(line.split("==", 1) for line in lines)


def _name(requirement: str) -> str:
    return re.match(r"[A-Za-z0-9_.-]+", requirement).group(0).lower()


def _interpreter_imports_numpy() -> bool:
    """Whether Triton's interpreter (what runs the kernels on a CPU) imports numpy, read from its
    source without importing it."""
    import importlib.util

    spec = importlib.util.find_spec("triton.runtime.interpreter")
    source = Path(spec.origin).read_text()
    return bool(re.search(r"^\s*import numpy|^\s*from numpy", source, flags=re.M))


def test_the_kernel_installs_with_torch_triton_and_what_the_interpreter_imports():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    kernel = {_name(r) for r in project["dependencies"]}
    assert kernel <= {"torch", "triton", "numpy"} and {"torch", "triton"} <= kernel
    if _interpreter_imports_numpy():  # else: this Triton no longer needs it on the CPU
        assert "numpy" in kernel, "Triton's interpreter imports numpy: a CPU install needs it"
    extras = project["optional-dependencies"]
    assert {"bench", "hf", "test"} <= set(extras)
    for peer in ("liger-kernel", "cut-cross-entropy"):  # ranges, not exact pins
        spec = next(r for r in extras["bench"] if _name(r) == peer)
        assert "==" not in spec and ">=" in spec, spec


def test_every_test_and_bench_dependency_is_pinned_and_torch_is_the_cpu_build():
    pins = {k.lower().replace("_", "-"): v for k, v in _pins().items()}
    assert pins["torch"].endswith("+cpu")
    for name in ("triton", "numpy", "transformers", "accelerate", "hypothesis", "pytest",
                 "pytest-xdist", "pytest-benchmark", "liger-kernel", "cut-cross-entropy",
                 "pandas", "matplotlib", "nox"):
        assert name in pins, f"{name} is not pinned in {CONSTRAINTS.name}"


def test_readme_noxfile_and_ci_install_the_same_pins():
    readme = (ROOT / "README.md").read_text()
    noxfile = (ROOT / "noxfile.py").read_text()
    torch_pin = f"torch=={_pins()['torch']}"
    index = re.search(r'CPU_INDEX = "([^"]+)"', noxfile).group(1)
    # README's CPU line takes torch's pinned CPU build from the CPU index alone, never PyPI
    assert f"pip install --no-deps --index-url {index} {torch_pin}" in readme
    assert "pip install -c tests/constraints-cpu.txt -e '.[test]' nox" in readme
    # the kernel alone, on a CPU: the project and its dependencies, numpy among them
    assert re.search(r"^pip install -c tests/constraints-cpu\.txt \.(\s|$)", readme, re.M)
    assert '"--no-deps", "--index-url", CPU_INDEX' in noxfile
    ci = (ROOT / ".ci" / "run").read_text()
    assert "-c tests/constraints-cpu.txt nox" in ci and ci.rstrip().endswith("nox -s tests")
    assert "nox -s tests" in readme
