"""plots/MANIFEST.json: which inputs the committed figures were drawn from (each input CSV's
hash, the generator's hash, the figures); a test compares it with the committed runs."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from suite import frontier, results
from suite.plots.style import PROVIDER_LABEL, PROVIDER_STYLE
from suite.report import curated, frontier_tables

MANIFEST = "MANIFEST.json"
TRAIN_CSVS = (results.TRAIN_BENCH_CSV, results.TRAIN_CONVERGENCE_CSV, results.TRAIN_CURVES_CSV)


def _sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _repo_path(path: Path) -> str:
    path = Path(path).resolve()
    return path.relative_to(curated.ROOT).as_posix() if path.is_relative_to(curated.ROOT) \
        else path.as_posix()


def generator_files() -> list[Path]:
    """The code the figures depend on: this package's modules, the curated list (and its
    renames), the frontier's tables (its points and front) and its sweep's styles."""
    package = Path(__file__).resolve().parent
    return sorted(package.glob("*.py")) + [Path(curated.__file__), Path(frontier_tables.__file__),
                                           Path(frontier.__file__)]


def manifest(run_dirs, train_run_dirs, figures, out_dir) -> dict:
    """What the figures in ``out_dir`` were drawn from: the generator's hash (its files and the
    providers' styles), each input CSV's hash, and the figures (relative to ``out_dir``). Equal
    manifests: the figures are in step with their inputs."""
    inputs = [Path(d) / results.CSV_NAME for d in run_dirs]
    inputs += [Path(d) / name for d in train_run_dirs for name in TRAIN_CSVS
               if (Path(d) / name).exists()]
    styles = json.dumps([PROVIDER_STYLE, PROVIDER_LABEL], sort_keys=True)
    generator = hashlib.sha256(("".join(_sha256(f) for f in generator_files()) + styles).encode())
    return {"generator": generator.hexdigest(),
            "inputs": {_repo_path(p): _sha256(p) for p in sorted(inputs, key=_repo_path)},
            "figures": sorted(Path(f).relative_to(out_dir).as_posix() for f in figures)}


def write_manifest(out_dir, run_dirs, train_run_dirs, figures) -> Path:
    path = Path(out_dir) / MANIFEST
    data = manifest(run_dirs, train_run_dirs, figures, Path(out_dir))
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return path
