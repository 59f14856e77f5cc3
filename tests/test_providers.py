"""Every provider that can run here agrees with the fp64 reference on tiny fp32 inputs."""
import os

import pytest
import torch

from suite import registry

from suite import catalog
from suite.inputs import make_inputs
from suite.reference import reference, rel_err

# fp32 inputs, fp64 reference. An exact provider differs from it only by fp32 rounding in its
# three reductions: the logits' dot products over D, the softmax's sum over V and dC's sum over N;
# their worst-case relative error is eps * (D + V + N). A wrong softcap derivative, bias or
# ignore mask gives errors of 1e-2 or more.
N, D, V = 48, 32, 100
EXACT_TOL = torch.finfo(torch.float32).eps * (D + V + N)
# Approximate providers (gradient filtering) may drop gradient entries below their threshold,
# at most 2**-12 (the largest default: Apple's and own's for 16-bit inputs), V of them per row.
FILTER_TOL = EXACT_TOL + 2.0**-12 * V

CASES = {
    "plain": dict(softcap=None, bias=False, ignore_frac=0.0),
    "softcap-bias-ignore": dict(softcap=30.0, bias=True, ignore_frac=0.25),
}


def _device():
    return "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("name", catalog.names())
def test_provider_matches_reference(name, case):
    opts = CASES[case]
    p = catalog.get(name)
    device = _device()
    reason = p.unavailable_reason(device)
    if reason:
        pytest.skip(f"{name} unavailable on {device}: {reason}")
    # Ask only for the options the provider implements; the rest of the case still applies.
    bias = opts["bias"] and "bias" in p.features
    softcap = opts["softcap"] if "softcap" in p.features else None
    if opts != CASES["plain"] and not bias and softcap is None:
        pytest.skip(f"{name} implements neither bias nor softcap")
    reason = p.unsupported_reason(bias=bias, softcap=softcap, device=device)
    if reason:
        pytest.skip(f"{name} cannot run this case on {device}: {reason}")

    x = make_inputs("lm", N, D, V, "fp32", seed=3, device=device, softcap=softcap,
                    bias=bias, ignore_frac=opts["ignore_frac"])
    ref = reference(x["e"].double(), x["c"].double(), x["targets"],
                    bias=None if x["bias"] is None else x["bias"].double(), softcap=softcap)
    e = x["e"].clone().requires_grad_()
    c = x["c"].clone().requires_grad_()
    b = None if x["bias"] is None else x["bias"].clone().requires_grad_()
    loss = p.fn(e, c, x["targets"], bias=b, softcap=softcap)
    loss.backward()

    tol = EXACT_TOL if p.exact else FILTER_TOL
    assert abs(loss.item() - ref["loss"]) / ref["loss"] < EXACT_TOL
    assert rel_err(e.grad, ref["de"]) < tol
    assert rel_err(c.grad, ref["dc"]) < tol
    if b is not None:
        assert rel_err(b.grad, ref["dbias"]) < tol


def test_every_provider_is_listed_with_a_reason_when_unavailable():
    for name in catalog.names():
        p = catalog.get(name)
        for device in ("cpu", "cuda"):
            reason = p.unavailable_reason(device)
            assert reason is None or (isinstance(reason, str) and reason.strip()), name


def test_liger_softcap_is_unsupported_on_the_cpu_and_the_reason_is_true(monkeypatch):
    # The reason the rows give must be the interpreter's failure, not a guess: the call fails.
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    for name in ("liger_ce", "liger_flce"):
        p = catalog.get(name)
        if p.unavailable_reason("cpu"):
            pytest.skip(f"{name}: {p.unavailable_reason('cpu')}")
        assert "interpreter" in p.unsupported_reason(bias=False, softcap=30.0, device="cpu")
        assert p.unsupported_reason(bias=True, softcap=None, device="cpu") is None
        assert p.unsupported_reason(bias=False, softcap=30.0, device="cuda") is None
    x = make_inputs("lm", 8, 16, 33, "fp32", seed=0, device="cpu", softcap=30.0)
    with pytest.raises(Exception, match="has no attribute 'to'"):
        catalog.get("liger_ce").fn(x["e"], x["c"], x["targets"], softcap=30.0)


def test_unknown_provider_names_the_known_ones():
    with pytest.raises(ValueError, match="known providers: .*naive"):
        catalog.get("nope")


# ---- the peers of issue 26: registration, availability reasons, options ------------------

from suite import presets  # noqa: E402
from suite.providers import apple, liger, quack  # noqa: E402

NEW_PEERS = ("apple_cce_exact", "apple_cce_kahan", "apple_cce_pypi", "liger_flce_cute", "quack",
             "quack_chunked")


def test_new_peers_are_registered_with_their_package_and_install_line():
    for name in NEW_PEERS:
        p = catalog.get(name)
        assert p.package in (apple.PACKAGE, liger.PACKAGE, quack.PACKAGE), name
        assert p.install and p.install.startswith("pip install"), name
    assert catalog.get("quack").install == quack.INSTALL
    assert catalog.get("liger_flce_cute").install == liger.CUTE_INSTALL
    assert "git+https://github.com/apple/ml-cross-entropy" in catalog.get("apple_cce_exact").install
    # exactness as the presets define it: cce_exact filters nothing, cce_kahan_full_c filters dE
    assert catalog.get("apple_cce_exact").exact and not catalog.get("apple_cce_kahan").exact


def test_quack_has_no_softcap_or_bias_so_such_cells_are_unsupported():
    for name in ("quack", "quack_chunked"):
        p = catalog.get(name)
        assert p.features == frozenset()
        assert p.unsupported_reason(bias=False, softcap=30.0) == f"{name} has no softcap option"
        assert p.unsupported_reason(bias=True, softcap=None) == f"{name} has no bias input"
        assert p.unsupported_reason(bias=False, softcap=None) is None


def test_an_uninstalled_peer_names_its_install_line(monkeypatch):
    real = registry.importlib.util.find_spec
    monkeypatch.setattr(registry.importlib.util, "find_spec",
                        lambda name, *a: None if name in ("quack", "liger_kernel") else real(name, *a))
    assert catalog.get("quack").unavailable_reason("cuda") == \
        f"quack-kernels is not installed (install: {quack.INSTALL})"
    assert catalog.get("liger_flce_cute").unavailable_reason("cpu") == \
        f"liger-kernel is not installed (install: {liger.INSTALL})"


def test_apple_presets_need_the_source_version(monkeypatch):
    class Dist:
        version = "25.1.1"

    monkeypatch.setattr(apple, "installed_distribution", lambda dist: Dist())
    reason = apple._needs_presets(torch.device("cuda"))
    assert "25.1.1 has no accuracy presets" in reason and apple.INSTALL in reason
    Dist.version = "25.6.4"
    assert apple._needs_presets(torch.device("cuda")) is None


def _fake_dist(folder, dist, version, *, package=None, direct_url=None):
    """A folder as `pip install --target` leaves it: DIST-VERSION.dist-info (and the package)."""
    info = folder / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    if direct_url is not None:
        (info / "direct_url.json").write_text(direct_url)
    if package:
        (folder / package).mkdir()
        (folder / package / "__init__.py").write_text(f"VERSION = {version!r}\n")


class _Dist:
    def __init__(self, version):
        self.version = version


def test_apple_pypi_is_the_normally_installed_release_without_a_folder(monkeypatch):
    # `pip install cut-cross-entropy==25.1.1` is the release itself: available, recorded as it.
    monkeypatch.delenv(apple.PYPI_ENV, raising=False)
    monkeypatch.setattr(apple, "installed_distribution", lambda dist: _Dist(apple.PYPI_RELEASE))
    monkeypatch.setattr(apple, "distribution_origin", lambda dist, path=None: {
        "version": apple.PYPI_RELEASE, "commit": None, "source": "index"})
    assert apple._needs_pypi_folder(None) is None
    assert catalog.get("apple_cce_pypi").installed()["version"] == apple.PYPI_RELEASE
    # another version installed (the repository's): a folder of the release is needed
    monkeypatch.setattr(apple, "installed_distribution", lambda dist: _Dist("25.6.4"))
    reason = apple._needs_pypi_folder(None)
    assert "cut-cross-entropy 25.6.4 is installed" in reason and apple.PYPI_INSTALL in reason
    assert catalog.get("apple_cce_pypi").installed() is None
    monkeypatch.setattr(apple, "installed_distribution", lambda dist: None)
    assert "cut-cross-entropy is not installed" in apple._needs_pypi_folder(None)


def test_apple_pypi_folder_reasons_name_the_problem_and_the_install_line(tmp_path, monkeypatch):
    monkeypatch.setenv(apple.PYPI_ENV, str(tmp_path / "missing"))
    assert "is not a folder" in apple._needs_pypi_folder(None)
    monkeypatch.setenv(apple.PYPI_ENV, str(tmp_path))
    assert "holds no cut-cross-entropy" in apple._needs_pypi_folder(None)
    _fake_dist(tmp_path, "cut-cross-entropy", "25.6.4")
    assert "holds cut-cross-entropy 25.6.4, not the PyPI release 25.1.1" in \
        apple._needs_pypi_folder(None)


def test_apple_pypi_folder_with_the_release_is_available_and_recorded(tmp_path, monkeypatch):
    _fake_dist(tmp_path, "cut-cross-entropy", apple.PYPI_RELEASE)
    monkeypatch.setenv(apple.PYPI_ENV, str(tmp_path))
    assert apple._needs_pypi_folder(None) is None
    origin = catalog.get("apple_cce_pypi").installed()
    assert origin["version"] == apple.PYPI_RELEASE and apple.PYPI_ENV in origin["source"]
    assert catalog.peer_origins()["apple_cce_pypi"] == origin


def test_a_source_install_records_its_commit(tmp_path):
    commit = "d42911f9b1a1f98289bb601c35c8151562603d74"
    _fake_dist(tmp_path, "cut-cross-entropy", "25.6.4", direct_url=(
        '{"url": "https://github.com/apple/ml-cross-entropy.git", "vcs_info": '
        f'{{"vcs": "git", "commit_id": "{commit}"}}}}'))
    origin = registry.distribution_origin("cut-cross-entropy", path=[str(tmp_path)])
    assert origin == {"version": "25.6.4", "commit": commit,
                      "source": "https://github.com/apple/ml-cross-entropy.git"}
    assert registry.distribution_origin("no-such-dist", path=[str(tmp_path)]) is None


def test_load_from_folder_leaves_the_process_copy_in_place(tmp_path, monkeypatch):
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    _fake_dist(ours, "twin-pkg", "2.0", package="ccebench_twin")
    _fake_dist(theirs, "twin-pkg", "1.0", package="ccebench_twin")
    (theirs / "ccebench_twin" / "inner.py").write_text("def version():\n    return VERSION\n")
    (theirs / "ccebench_twin" / "__init__.py").write_text(
        "VERSION = '1.0'\nfrom ccebench_twin.inner import version\n")
    monkeypatch.syspath_prepend(str(ours))
    import importlib
    import sys

    process_copy = importlib.import_module("ccebench_twin")
    loaded = apple.load_from_folder("ccebench_twin", str(theirs))
    try:
        assert loaded.VERSION == "1.0" and process_copy.VERSION == "2.0"
        assert sys.modules["ccebench_twin"] is process_copy
        assert "ccebench_twin.inner" not in sys.modules  # the folder's submodules left no trace
        assert importlib.import_module("ccebench_twin").VERSION == "2.0"
        assert str(theirs) not in sys.path
    finally:
        for k in [k for k in sys.modules if k.startswith("ccebench_twin")]:
            del sys.modules[k]
    with pytest.raises(ImportError, match="not from"):  # found elsewhere on the path: refused
        apple.load_from_folder("json", str(tmp_path))


def test_liger_flce_cute_runs_strict_and_restores_the_environment(monkeypatch):
    seen = {}

    def fake_flce(e, c, targets, bias, softcap, ignore_index, impl):
        seen["impl"], seen["strict"] = impl, os.environ.get(liger.STRICT_ENV)
        raise RuntimeError("stop")

    monkeypatch.setattr(liger, "_flce", fake_flce)
    monkeypatch.delenv(liger.STRICT_ENV, raising=False)
    with pytest.raises(RuntimeError, match="stop"):
        liger.liger_flce_cute(None, None, None)
    assert seen == {"impl": liger.CUTE_IMPL, "strict": "1"}
    assert liger.STRICT_ENV not in os.environ
    monkeypatch.setenv(liger.STRICT_ENV, "0")
    with pytest.raises(RuntimeError):
        liger.liger_flce_cute(None, None, None)
    assert os.environ[liger.STRICT_ENV] == "0"


def test_liger_flce_is_pinned_to_triton(monkeypatch):
    seen = {}
    monkeypatch.setattr(liger, "_flce", lambda *a: seen.setdefault("impl", a[-1]))
    liger.liger_flce(None, None, None)
    assert seen["impl"] == liger.TRITON_IMPL == "nvidia-triton"


def test_registration_carries_the_figure_style_label_and_order():
    styles = [catalog.get(n).style for n in catalog.names()]
    assert all(set(s) == {"color", "marker", "linestyle"} for s in styles)
    combos = {(s["color"], s["marker"], s["linestyle"]) for s in styles}
    assert len(combos) == len(styles)  # no two providers look alike
    order = [p.name for p in catalog.in_figure_order()]
    assert order.index("naive") < order.index("apple_cce") < order.index("quack") < order.index("own")
    with pytest.raises(ValueError, match="style needs exactly"):
        registry.register("bad_style", summary="x", style=dict(color="#000000"))
    with pytest.raises(ValueError, match="features must be among"):
        registry.register("bad_feature", summary="x", features=("temperature",))


def test_peer_presets_are_defined_once():
    from suite import runner

    cells = runner.preset_cells("peers")
    shapes = {(c.n, c.d, c.v, c.softcap) for c in cells}
    assert shapes == {(8192, 2304, 256000, 30.0), (8192, 4096, 128256, None),
                      (16384, 3584, 152064, None)}
    assert {c.dist for c in cells} == {"uniform", "lm"} and {c.dtype for c in cells} == {"bf16"}
    for s in presets.PEER_SHAPES:
        assert runner.preset_cells(s.name) == [c for c in cells if (c.n, c.d, c.v) == (s.n, s.d, s.v)]
    with pytest.raises(ValueError, match="shapes: gemma2-2b"):
        presets.shape("gemma-7b")


def test_list_shows_peer_versions_and_the_install_line_of_a_missing_one(monkeypatch, capsys):
    from suite import cli, runner

    assert set(cli.PRESET_NAMES) == set(runner.PRESETS)  # --preset offers every preset
    real_find, real_dist = registry.importlib.util.find_spec, registry.installed_distribution

    class Liger:
        version = "0.8.5"

        @staticmethod
        def read_text(name):
            return None

    monkeypatch.setattr(registry.importlib.util, "find_spec",
                        lambda name, *a: None if name == "quack" else real_find(name, *a))
    monkeypatch.setattr(registry, "installed_distribution",
                        lambda dist: {"quack-kernels": None, "liger-kernel": Liger}.get(
                            dist, real_dist(dist)))
    assert cli.main(["list", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert f"quack-kernels: not installed; install: {quack.INSTALL}" in out
    assert "liger-kernel 0.8.5\n" in out
    assert f"unavailable: quack-kernels is not installed (install: {quack.INSTALL})" in out


def test_an_own_rows_ran_names_the_route_its_call_took(monkeypatch):
    """Every own provider's ``ran`` (its rows' column) is the route its last call took, planned
    under the config in force during that call: a variant's overrides too, though ran() is
    asked after the call, outside them."""
    import own_kernel
    import suite.frontier  # noqa: F401 - registers own_ws256
    from suite.providers.own import register_variant

    monkeypatch.setattr(own_kernel, "linear_cross_entropy", lambda *a, **k: torch.zeros(()))
    monkeypatch.delitem(registry.PROVIDERS, "own_ws256@rows8", raising=False)
    e = torch.zeros(64, 16, requires_grad=True)
    c = torch.zeros(40, 16, requires_grad=True)
    t = torch.zeros(64, dtype=torch.long)
    name = register_variant("own_ws256", "rows8", {"fused": {"max_rows": 8, "min_rows": 1}})
    try:
        ran = {}
        for provider in ("own_low_memory", "own_ws256", name):
            catalog.get(provider).fn(e, c, t)
            ran[provider] = catalog.get(provider).ran()
        assert ran == {"own_low_memory": "low-memory",
                       "own_ws256": "three-matmul, 1 chunk of 64 rows",
                       name: "three-matmul, 8 chunks of 8 rows"}
    finally:
        registry.PROVIDERS.pop(name, None)


def test_an_own_rows_ran_names_target_shifted_logits(monkeypatch):
    """A three-matmul row whose chunks held target-shifted logits says so (a variant's rows
    look like the fp32 logits' otherwise)."""
    import own_kernel
    import suite.frontier  # noqa: F401 - registers own_ws256
    from suite.providers.own import register_variant

    monkeypatch.setattr(own_kernel, "linear_cross_entropy", lambda *a, **k: torch.zeros(()))
    monkeypatch.delitem(registry.PROVIDERS, "own_ws256@ts", raising=False)
    e = torch.zeros(64, 16, dtype=torch.float16, requires_grad=True)
    c = torch.zeros(40, 16, dtype=torch.float16, requires_grad=True)
    t = torch.zeros(64, dtype=torch.long)
    name = register_variant("own_ws256", "ts", {"fused": {"target_shift": True}})
    try:
        ran = {}
        for provider in ("own_ws256", name):
            catalog.get(provider).fn(e, c, t)
            ran[provider] = catalog.get(provider).ran()
        assert ran == {"own_ws256": "three-matmul, 1 chunk of 64 rows",
                       name: "three-matmul, target-shifted logits, 1 chunk of 64 rows"}
    finally:
        registry.PROVIDERS.pop(name, None)


def test_an_own_rows_ran_names_the_cublas_forwards_chunks(monkeypatch):
    """Off the three-matmul path, a forward that ran as cuBLAS row chunks is in ``ran`` with
    its chunks (the portable forward's two kernels look alike in a table otherwise)."""
    import own_kernel
    import suite.frontier  # noqa: F401 - registers own_ws256
    from suite.providers.own import register_variant

    monkeypatch.setattr(own_kernel, "linear_cross_entropy", lambda *a, **k: torch.zeros(()))
    monkeypatch.delitem(registry.PROVIDERS, "own_ws256@cublas16", raising=False)
    e, c = torch.zeros(2, 30, 16, dtype=torch.float16), torch.zeros(40, 16, dtype=torch.float16)
    t = torch.zeros(2, 30, dtype=torch.long)
    name = register_variant("own_ws256", "cublas16", {"forward": {
        "tma": False, "cublas_min_d": 1, "cublas_min_rows": 1, "cublas_max_rows": 16}})
    try:
        catalog.get(name).fn(e, c, t)
        # 60 rows (2 x 30) in chunks of at most 16: four, evenly
        assert catalog.get(name).ran() == "forward-only, cuBLAS forward, 4 chunks of 15 rows"
        catalog.get("own_ws256").fn(e, c, t)
        assert catalog.get("own_ws256").ran() == "forward-only"  # the interpreter's TMA forward
    finally:
        registry.PROVIDERS.pop(name, None)


def test_a_variant_runs_its_base_under_the_config_overrides(monkeypatch):
    """``own@<name>`` calls ``own`` with the overrides in force (seen inside the call), and only
    there; a second registration with other overrides is refused, naming the variant."""
    import own_kernel
    from own_kernel.policy.config import config_for
    from suite.providers.own import register_variant

    seen = []

    def fake_call(e, c, targets, **options):
        seen.append(config_for(torch.device("cpu"), torch.float32).forward.l2_mib)
        return torch.zeros(())

    monkeypatch.setattr(own_kernel, "linear_cross_entropy", fake_call)
    monkeypatch.delitem(registry.PROVIDERS, "own@l2", raising=False)  # removed again after
    name = register_variant("own", "l2", {"forward": {"l2_mib": 7}})
    try:
        assert name == "own@l2" and catalog.get(name).exact
        assert register_variant("own", "l2", {"forward": {"l2_mib": 7}}) == name  # no-op
        with pytest.raises(ValueError, match="'own@l2' is registered with other overrides"):
            register_variant("own", "l2", {"forward": {"l2_mib": 8}})
        e = torch.zeros(2, 2)
        catalog.get(name).fn(e, e, torch.zeros(2, dtype=torch.long))
        catalog.get("own").fn(e, e, torch.zeros(2, dtype=torch.long))
        assert seen[0] == 7 and seen[1] != 7
    finally:
        registry.PROVIDERS.pop(name, None)
