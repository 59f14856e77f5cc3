"""Apple's cut-cross-entropy (the paper's own kernels), as its README says to install it: from
the repository (version 25.6.4 and later, with accuracy presets), and the last PyPI release.

The two versions share one import name, so one process cannot import both from ``sys.path``.
``apple_cce_pypi`` therefore loads the PyPI release from a folder of its own
(``CCE_BENCH_APPLE_PYPI``, made with ``pip install --target``) under a private module table:
:func:`load_from_folder` imports it with that folder first on the path and then puts back
whatever ``cut_cross_entropy`` the process had, so the other providers keep theirs and the PyPI
functions keep their own module globals.
"""
import importlib
import os
import sys
from pathlib import Path

from suite.registry import (all_of, distribution_origin, installed_distribution, needs_cuda,
                            needs_module, register)

PACKAGE = "cut-cross-entropy"
MODULE = "cut_cross_entropy"
REPOSITORY = "https://github.com/apple/ml-cross-entropy.git"
INSTALL = f'pip install "{PACKAGE} @ git+{REPOSITORY}"'
PYPI_RELEASE = "25.1.1"
PYPI_ENV = "CCE_BENCH_APPLE_PYPI"
PYPI_INSTALL = (f"pip install --no-deps --target DIR {PACKAGE}=={PYPI_RELEASE} && "
                f"export {PYPI_ENV}=DIR")
# Figures: Apple's providers are one family (blue), told apart by marker and line style.
BLUE = "#0072B2"

_has = needs_module(MODULE, PACKAGE, INSTALL)
_source = all_of(_has, needs_cuda)


def _cce(e, c, targets, softcap, ignore_index, **kw):
    from cut_cross_entropy import linear_cross_entropy

    return linear_cross_entropy(e, c, targets, ignore_index=ignore_index, softcap=softcap, **kw)


def _peer(label, marker, linestyle, order, **kw):
    return dict(package=PACKAGE, install=INSTALL, label=label, order=order,
                style=dict(color=BLUE, marker=marker, linestyle=linestyle), **kw)


@register("apple_cce", summary="cut_cross_entropy, impl='cce', default gradient filter",
          requires=_source, exact=False, **_peer("apple_cce", "P", "-", 40))
def apple_cce(e, c, targets, *, bias=None, softcap=None, ignore_index=-100):
    return _cce(e, c, targets, softcap, ignore_index)


@register("apple_cce_nofilter", summary="cut_cross_entropy, impl='cce', filter_eps=None",
          requires=_source, **_peer("apple_cce_nofilter", "p", "--", 41))
def apple_cce_nofilter(e, c, targets, *, bias=None, softcap=None, ignore_index=-100):
    return _cce(e, c, targets, softcap, ignore_index, filter_eps=None)


def _needs_presets(device):
    """The accuracy presets (impl='cce_exact', ...) exist from 25.6 on; name the version found."""
    found = installed_distribution(PACKAGE)
    if found is not None and _year_month(found.version) < (25, 6):
        return (f"{PACKAGE} {found.version} has no accuracy presets (impl='cce_exact', "
                f"'cce_kahan_full_c'; from 25.6 on): install the source version ({INSTALL})")
    return None


def _year_month(version: str) -> tuple:
    """(25, 6) of '25.6.4' (Apple's versions are year.month.patch); (0, 0) if unreadable."""
    try:
        return tuple(int(x) for x in version.split(".")[:2])
    except ValueError:
        return (0, 0)


_presets = all_of(_has, _needs_presets, needs_cuda)  # the version problem first


@register("apple_cce_exact",
          summary="cut_cross_entropy, impl='cce_exact': no filter, fp32 dE and dC accumulation",
          requires=_presets, **_peer("apple_cce_exact", "X", "-", 42))
def apple_cce_exact(e, c, targets, *, bias=None, softcap=None, ignore_index=-100):
    return _cce(e, c, targets, softcap, ignore_index, impl="cce_exact")


@register("apple_cce_kahan",
          summary="cut_cross_entropy, impl='cce_kahan_full_c': fp32 dE and dC accumulation, "
                  "dC unfiltered, dE filtered",
          requires=_presets, exact=False, **_peer("apple_cce_kahan", "d", "--", 43))
def apple_cce_kahan(e, c, targets, *, bias=None, softcap=None, ignore_index=-100):
    return _cce(e, c, targets, softcap, ignore_index, impl="cce_kahan_full_c")


@register("apple_torch_compile", summary="cut_cross_entropy, impl='torch_compile'",
          requires=_has, **_peer("apple_torch_compile", "h", ":", 45))
def apple_torch_compile(e, c, targets, *, bias=None, softcap=None, ignore_index=-100):
    return _cce(e, c, targets, softcap, ignore_index, impl="torch_compile")


# ---- the PyPI release, from a folder of its own ------------------------------------------

def load_from_folder(module: str, folder: str):
    """Import package ``module`` from ``folder``, leaving ``sys.modules`` as it was: the
    process's own copy of ``module`` (if any) stays importable under its name. The returned
    module's functions resolve their globals in its own namespace, so they keep working."""
    def owned():
        return [k for k in sys.modules if k == module or k.startswith(module + ".")]

    kept = {k: sys.modules.pop(k) for k in owned()}
    sys.path.insert(0, folder)
    try:
        loaded = importlib.import_module(module)
    finally:
        sys.path.remove(folder)
        for k in owned():
            del sys.modules[k]
        sys.modules.update(kept)
    where = Path(loaded.__file__).resolve()
    if Path(folder).resolve() not in where.parents:
        raise ImportError(f"{module} came from {where}, not from {folder}")
    return loaded


def _installed_is_pypi_release() -> bool:
    """True when the ``cut_cross_entropy`` this process imports is the PyPI release (a normal
    ``pip install cut-cross-entropy==25.1.1``): then no folder of its own is needed."""
    found = installed_distribution(PACKAGE)
    return found is not None and found.version == PYPI_RELEASE


def pypi_origin() -> dict | None:
    folder = os.environ.get(PYPI_ENV)
    if not folder:
        return distribution_origin(PACKAGE) if _installed_is_pypi_release() else None
    if not Path(folder).is_dir():
        return None
    info = distribution_origin(PACKAGE, path=[folder])
    return None if info is None else dict(info, source=f"{info['source']} (in {PYPI_ENV})")


def _needs_pypi_folder(device):
    folder = os.environ.get(PYPI_ENV)
    if not folder:
        if _installed_is_pypi_release():
            return None
        found = installed_distribution(PACKAGE)
        have = f"{PACKAGE} {found.version} is installed" if found else f"{PACKAGE} is not installed"
        return (f"{have} and {PYPI_ENV} is not set: install the release "
                f"(pip install {PACKAGE}=={PYPI_RELEASE}) or a folder of it ({PYPI_INSTALL})")
    if not Path(folder).is_dir():
        return f"{PYPI_ENV}={folder} is not a folder (install: {PYPI_INSTALL})"
    info = distribution_origin(PACKAGE, path=[folder])
    if info is None:
        return f"{PYPI_ENV}={folder} holds no {PACKAGE} (install: {PYPI_INSTALL})"
    if info["version"] != PYPI_RELEASE:
        return (f"{PYPI_ENV}={folder} holds {PACKAGE} {info['version']}, not the PyPI release "
                f"{PYPI_RELEASE} (install: {PYPI_INSTALL})")
    return None


_PYPI_FN = {}


def _pypi_linear_cross_entropy():
    if "fn" not in _PYPI_FN:
        folder = os.environ.get(PYPI_ENV)
        module = load_from_folder(MODULE, folder) if folder else importlib.import_module(MODULE)
        _PYPI_FN["fn"] = module.linear_cross_entropy
    return _PYPI_FN["fn"]


@register("apple_cce_pypi",
          summary=f"cut_cross_entropy {PYPI_RELEASE} (PyPI), impl='cce', default gradient "
                  f"filter; the installed release, or loaded from ${PYPI_ENV}",
          requires=all_of(_needs_pypi_folder, needs_cuda), exact=False,
          **_peer("apple_cce_pypi", "*", ":", 44, origin=pypi_origin) | {"install": PYPI_INSTALL})
def apple_cce_pypi(e, c, targets, *, bias=None, softcap=None, ignore_index=-100):
    fn = _pypi_linear_cross_entropy()
    return fn(e, c, targets, ignore_index=ignore_index, softcap=softcap)
