"""The portable target's autotuning (own_kernel/policy/autotune.py) and target selection: the
cache's key, its read and write across processes, the backward kernels' tuning (into scratch
sums), the forced portable target, config validation."""
import dataclasses
import itertools
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import own_kernel.policy.config as config
from own_kernel.policy import autotune
from own_kernel.policy.config import (HOPPER_16BIT, INTERPRETER, PORTABLE, SoftmaxGrad, Tiles,
                               with_overrides)
from tests.test_backward_portable import chunk_case, recompute_chunk, write_chunk


def test_shape_bucket_groups_shapes_that_share_tiles():
    assert autotune.shape_bucket(8192, 256000, 2304) == "n8192-v262144-d2304"
    assert autotune.shape_bucket(8000, 200000, 2300) == autotune.shape_bucket(8192, 256000, 2304)
    assert autotune.shape_bucket(16384, 256000, 2304) != autotune.shape_bucket(8192, 256000, 2304)
    key = autotune.tune_key("forward", torch.device("cpu"), torch.bfloat16, "b",
                            candidates=PORTABLE.forward_candidates)
    assert key.startswith("forward|cpu|bfloat16|b|") and len(key.split("|")) == 5
    assert autotune.shape_bucket(19, 40) == "n32-v64"  # softmax_grad: no reduction over D


_TUNE_IN_CHILD = textwrap.dedent("""
    import json, sys
    from own_kernel.policy import autotune
    from own_kernel.policy.config import Tiles
    calls = []
    candidates = (Tiles(64, 128, 32, 4, 3), Tiles(128, 128, 64, 8, 3), Tiles(16, 16, 16, 1, 1))
    def time_ms(tiles):
        calls.append(tiles.block_n)
        if tiles.block_n == 16:
            raise RuntimeError("does not compile here")  # skipped, not fatal
        return {64: 2.0, 128: 1.0}[tiles.block_n]
    best = autotune.tuned_tiles("forward|gpu|bfloat16|n8192", candidates, time_ms)
    again = autotune.tuned_tiles("forward|gpu|bfloat16|n8192", candidates, time_ms)
    print(json.dumps(dict(best=best.block_n, again=again.block_n, calls=calls)))
""")


def _child(cache):
    env = dict(os.environ, CCE_OWN_TUNE_CACHE=str(cache))
    out = subprocess.run([sys.executable, "-c", _TUNE_IN_CHILD], env=env, check=True,
                         capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_second_process_reuses_the_cache_and_does_not_tune_again(tmp_path):
    cache = tmp_path / "tiles.json"
    first = _child(cache)
    assert first == dict(best=128, again=128, calls=[64, 128, 16])  # timed once, in-process memo
    entry = json.loads(cache.read_text())["forward|gpu|bfloat16|n8192"]
    assert entry["tiles"]["block_n"] == 128 and entry["ms"] == 1.0
    second = _child(cache)
    assert second == dict(best=128, again=128, calls=[])  # read from disk: nothing timed


def test_no_candidate_that_runs_is_an_error(monkeypatch, tmp_path):
    monkeypatch.setenv("CCE_OWN_TUNE_CACHE", str(tmp_path / "tiles.json"))

    def fails(tiles):
        raise RuntimeError("out of resources")

    with pytest.raises(RuntimeError, match="no candidate tile ran for k"):
        autotune.tuned_tiles("k", (Tiles(16, 16, 16, 1, 1),), fails)


@pytest.mark.parametrize("capability, dtype, forced, expect", [
    ((9, 0), torch.bfloat16, None, "hopper-16bit"),
    ((9, 0), torch.float32, None, "portable"),
    ((8, 0), torch.bfloat16, None, "portable"),
    ((9, 0), torch.bfloat16, "portable", "portable"),
    ((8, 0), torch.bfloat16, "portable", "portable"),
])
def test_target_selection_and_the_forced_portable_path(monkeypatch, capability, dtype, forced,
                                                        expect):
    monkeypatch.setattr(config, "INTERPRET", False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    cuda = torch.device("cuda")
    natural = "hopper-16bit" if capability[0] == 9 and dtype != torch.float32 else "portable"
    if forced is None:
        assert config._target_key(cuda, dtype) == expect
    else:
        with config.use_target(forced):
            assert config._target_key(cuda, dtype) == expect
        assert config._target_key(cuda, dtype) == natural  # the block ended


def test_forced_targets_are_validated(monkeypatch):
    with pytest.raises(ValueError, match="use_target: expected one of hopper-16bit, portable"):
        with config.use_target("a100"):
            pass
    monkeypatch.setattr(config, "INTERPRET", False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    with pytest.raises(ValueError, match="needs a Hopper GPU"), config.use_target("hopper-16bit"):
        config._target_key(torch.device("cuda"), torch.bfloat16)


def test_the_interpreter_keeps_one_fixed_config():
    with config.use_target("portable"):
        cfg = config.config_for(torch.device("cpu"), torch.float32)
    assert cfg.name == "interpreter" and not cfg.autotune
    assert config.PORTABLE.autotune and config.PORTABLE.forward_candidates
    assert not config.HOPPER_16BIT.autotune
    # a CPU tensor never tunes, whatever the config
    assert not autotune.tunes(torch.zeros(1), PORTABLE, PORTABLE.softmax_grad_candidates)


def test_targets_softmax_grad_variant_and_backward_candidates():
    # TMA descriptors on Hopper only; the portable target tunes its pointer backward kernels
    # from a few candidates, the fixed launch shape first.
    assert HOPPER_16BIT.softmax_grad.tma and not PORTABLE.softmax_grad.tma
    assert PORTABLE.softmax_grad_candidates[0] == PORTABLE.softmax_grad
    assert PORTABLE.dlogits_candidates[0] == PORTABLE.dlogits
    for candidates in (PORTABLE.softmax_grad_candidates, PORTABLE.dlogits_candidates):
        assert 4 <= len(candidates) <= 6 and len(set(candidates)) == len(candidates)
    for cfg in (HOPPER_16BIT, INTERPRETER):
        assert not cfg.softmax_grad_candidates and not cfg.dlogits_candidates


def test_cache_entries_rebuild_their_type(monkeypatch, tmp_path):
    # Forward entries written before the type was stored read as Tiles; a SoftmaxGrad entry
    # comes back a SoftmaxGrad; an entry of another type is tuned again, not misread.
    cache = tmp_path / "tiles.json"
    monkeypatch.setenv("CCE_OWN_TUNE_CACHE", str(cache))
    monkeypatch.setattr(autotune, "_MEMO", {})
    old = Tiles(128, 128, 64, 8, 3)
    cache.write_text(json.dumps({"forward|gpu|bfloat16|b": dict(tiles=dataclasses.asdict(old),
                                                                 ms=1.0)}))

    def never(candidate):
        raise AssertionError("read from the cache: nothing to time")

    assert autotune.tuned_tiles("forward|gpu|bfloat16|b", (Tiles(64, 128, 32, 4, 3), old),
                                never) == old
    best = SoftmaxGrad(32, 128, num_warps=8, stages=3, waves=8, tma=False)
    key = "softmax_grad|gpu|bfloat16|n8192-v4096"
    assert autotune.tuned_tiles(key, (PORTABLE.softmax_grad, best),
                                lambda k: 1.0 if k == best else 2.0) == best
    entry = autotune.read_cache()[key]
    assert entry["type"] == "SoftmaxGrad" and entry["tiles"]["block_n"] == 32
    assert entry["tiles"]["tma"] is False
    autotune._MEMO.clear()
    again = autotune.tuned_tiles(key, (PORTABLE.softmax_grad, best), never)
    assert again == best and isinstance(again, SoftmaxGrad)
    autotune._MEMO.clear()
    assert autotune.tuned_tiles(key, (old,), lambda k: 1.0) == old


def test_the_key_tells_candidates_and_kernel_variants_apart(monkeypatch, tmp_path):
    # A config with other candidates, or another load scheme of the same kernel, tunes for
    # itself: before the key digested them, it read the other's pick (one outside its own
    # candidates, or one timed on other code).
    monkeypatch.setenv("CCE_OWN_TUNE_CACHE", str(tmp_path / "tiles.json"))
    monkeypatch.setattr(autotune, "_MEMO", {})
    cpu, a, b = torch.device("cpu"), Tiles(64, 128, 32, 4, 3), Tiles(128, 128, 64, 8, 3)

    def key(candidates, variant=()):
        return autotune.tune_key("dlogits", cpu, torch.bfloat16, "n8192-v4096-d2048",
                                 candidates=candidates, variant=variant)

    keys = {key((a, b)), key((b,)), key((a, b), (("fixed_base", True),)),
            key((a, b), (("fixed_base", False),))}
    assert len(keys) == 4
    assert key((a, b)) == key((a, b))  # the same in every process (no id() in it)
    assert autotune.tuned_tiles(key((a, b)), (a, b), lambda t: 1.0 if t == a else 2.0) == a
    assert autotune.tuned_tiles(key((b,)), (b,), lambda t: 1.0) == b
    fixed = key((a, b), (("fixed_base", True),))
    assert autotune.tuned_tiles(fixed, (a, b), lambda t: 1.0 if t == b else 2.0) == b


def test_a_cached_pick_outside_the_candidates_is_tuned_again(monkeypatch, tmp_path):
    cache = tmp_path / "tiles.json"
    monkeypatch.setenv("CCE_OWN_TUNE_CACHE", str(cache))
    monkeypatch.setattr(autotune, "_MEMO", {})
    stale, fresh = Tiles(16, 16, 16, 1, 1), Tiles(64, 128, 32, 4, 3)
    cache.write_text(json.dumps({"k": dict(tiles=dataclasses.asdict(stale), type="Tiles",
                                           ms=0.5)}))
    timed = []
    assert autotune.tuned_tiles("k", (fresh,), lambda t: timed.append(t) or 1.0) == fresh
    assert timed == [fresh]
    assert autotune.read_cache()["k"]["tiles"] == dataclasses.asdict(fresh)


def test_the_forwards_key_follows_its_load_scheme(monkeypatch, tmp_path):
    # paths/forward.py keys the forward's pick by every Forward option but the tiles: one
    # tuned with fixed base pointers is not read by the stepped loads.
    from own_kernel.paths import forward as fwd

    keys = []
    monkeypatch.setattr(fwd, "tuned_tiles", lambda key, candidates, time_ms: keys.append(key)
                        or candidates[0])
    g = torch.Generator().manual_seed(0)
    e, c = torch.randn(8, 16, generator=g), torch.randn(32, 16, generator=g)
    t = torch.randint(0, 32, (8,), generator=g)
    sums = fwd.PartialSums()
    for on in (False, True, False):
        cfg = with_overrides(PORTABLE, {"forward": {"fixed_base_loads": on}})
        fwd._tuned(e, c, None, t, sums, None, -100, cfg, False)
    assert keys[0] == keys[2] != keys[1]


# ---- the backward's kernels: timed into scratch sums -------------------------------------------

SMALL_SOFTMAX_GRAD = SoftmaxGrad(16, 8, num_warps=1, stages=1, waves=2, tma=False)
SMALL_DLOGITS = Tiles(32, 16, 16, num_warps=1, num_stages=1)


@pytest.fixture
def tune_here(monkeypatch, tmp_path):
    """The backward's writers tune on the CPU (the interpreter) into a fresh cache; time_launch
    runs each launch three times (as the real one: a warm-up and reps) and returns the next of
    the `times` set on the result (default: increasing, the first candidate wins). Yields a
    namespace: .timed (one entry per candidate timed), .times, .cache."""
    from types import SimpleNamespace

    if not config.INTERPRET:
        pytest.skip("tunes kernels launched on CPU tensors, which only the interpreter runs: "
                    "TRITON_INTERPRET=1")
    state = SimpleNamespace(timed=[], times=itertools.count(1.0), cache=tmp_path / "tiles.json")
    monkeypatch.setenv("CCE_OWN_TUNE_CACHE", str(state.cache))
    monkeypatch.setattr(autotune, "_MEMO", {})
    monkeypatch.setattr(autotune, "tunes", lambda t, cfg, candidates: cfg.autotune and
                        bool(candidates))

    def time_launch(launch, reps=5):
        for _ in range(3):
            launch()
        state.timed.append(launch)
        return next(state.times)

    monkeypatch.setattr(autotune, "time_launch", time_launch)
    return state


@pytest.mark.parametrize("kernel", ["softmax_grad", "dlogits"])
def test_backward_tuning_times_into_scratch_and_keeps_the_result(tune_here, kernel):
    # The second candidate is the fastest: the real launch must use it and give exactly what a
    # fixed config of that shape gives, W and every sum; the timed launches (W's bytes
    # overwritten, sums added three times per candidate) must not show.
    tune_here.times = iter([2.0, 1.0])
    if kernel == "softmax_grad":
        write, dtype, field, best = write_chunk, torch.float16, "softmax_grad", SMALL_SOFTMAX_GRAD
        fixed = INTERPRETER.softmax_grad
        expect_key = "softmax_grad_filter|cpu|float16|n32-v64"
    else:
        write, dtype, field, best = recompute_chunk, torch.float32, "dlogits", SMALL_DLOGITS
        fixed = INTERPRETER.dlogits
        expect_key = "dlogits|cpu|float32|n32-v64-d256"
    tuning = with_overrides(INTERPRETER, {"autotune": True, f"{field}_candidates": (fixed, best)})
    tuned = chunk_case(dtype, filters=kernel == "softmax_grad")
    untuned = chunk_case(dtype, filters=kernel == "softmax_grad")
    write(tuned, tuning)
    write(untuned, with_overrides(INTERPRETER, {field: best}))
    assert len(tune_here.timed) == 2
    assert torch.equal(tuned.w, untuned.w)
    for name in ("row_round", "col_round", "col_sum", "row_skip", "col_wsum", "col_keep",
                 "kept_count"):
        a, b = getattr(tuned.sums, name), getattr(untuned.sums, name)
        assert (a is None and b is None) or torch.equal(a, b), name
    entries = autotune.read_cache(tune_here.cache)
    assert [k.rsplit("|", 1)[0] for k in entries] == [expect_key]  # the key names the kernel
    expect_key = next(iter(entries))  # and ends in its candidates' and options' digest
    autotune._MEMO.clear()  # rebuilt from the file: the same launch shape, of its type

    def never(candidate):
        raise AssertionError("read from the cache: nothing to time")

    assert autotune.tuned_tiles(expect_key, (fixed, best), never) == best
    write(chunk_case(dtype, filters=kernel == "softmax_grad"), tuning)
    assert len(tune_here.timed) == 2  # tuned once per bucket


def test_a_tuned_backward_gives_the_untuned_gradients(monkeypatch, tune_here):
    # A whole call on the cuBLAS route (softmax_grad chunks, a dlogits tail) with tuning on:
    # each bucket is timed (the fixed shapes win), and the gradients are the untuned call's bit
    # for bit: no timed launch reached the real sums or the W the GEMMs read.
    from own_kernel import linear_cross_entropy

    base = with_overrides(INTERPRETER, {
        "chunks": {"recompute": "cublas"}, "poison": True,
        "softmax_grad_candidates": (INTERPRETER.softmax_grad, SMALL_SOFTMAX_GRAD),
        "dlogits_candidates": (INTERPRETER.dlogits, SMALL_DLOGITS)})
    g = torch.Generator().manual_seed(3)
    n, d, v = 29, 24, 113  # cuBLAS chunks and a pointer tail
    e, c = torch.randn(n, d, generator=g), torch.randn(v, d, generator=g)
    bias = 0.1 * torch.randn(v, generator=g)
    t = torch.randint(0, v, (n,), generator=g)

    def grads(autotune_on, filter_eps=None):
        cfg = dataclasses.replace(base, autotune=autotune_on)
        monkeypatch.setattr(config, "_resolved", lambda target: cfg)
        leaves = [x.clone().requires_grad_() for x in (e, c, bias)]
        linear_cross_entropy(leaves[0], leaves[1], t, bias=leaves[2], softcap=20.0,
                             filter_eps=filter_eps).backward()
        return [x.grad for x in leaves]

    for filter_eps in (None, 1e-9):
        assert all(torch.equal(a, b) for a, b in zip(grads(True, filter_eps),
                                                     grads(False, filter_eps)))
    kernels = {key.split("|")[0] for key in autotune.read_cache(tune_here.cache)}
    assert kernels == {"softmax_grad", "softmax_grad_filter", "dlogits"}
    assert tune_here.timed


def test_config_validation_names_the_field():
    with pytest.raises(ValueError, match="tiles.block_v: expected a power of two"):
        Tiles(64, 100, 32, 4, 3)
    with pytest.raises(ValueError, match="softmax_grad.block_v: expected a power of two"):
        SoftmaxGrad(16, 100, num_warps=8, stages=4, waves=8)
    with pytest.raises(ValueError, match="softmax_grad.stages: expected >= 1"):
        SoftmaxGrad(16, 128, num_warps=8, stages=0, waves=8)
    with pytest.raises(ValueError, match="softmax_grad.tma: expected a bool"):
        config.with_overrides(config.PORTABLE, {"softmax_grad": {"tma": "no"}})
    with pytest.raises(ValueError, match="softmax_grad_candidates: expected a tuple of Soft"):
        config.with_overrides(config.PORTABLE, {"softmax_grad_candidates": (PORTABLE.dlogits,)})
    with pytest.raises(ValueError, match="dlogits_candidates: expected a tuple of Tiles"):
        config.with_overrides(config.PORTABLE, {"dlogits_candidates": (PORTABLE.softmax_grad,)})
    with pytest.raises(ValueError, match="softmax_grad_candidates: expected tma False"):
        config.with_overrides(config.PORTABLE, {"softmax_grad_candidates": (
            HOPPER_16BIT.softmax_grad,)})
    with pytest.raises(ValueError, match="chunks.recompute"):
        config.with_overrides(config.PORTABLE, {"chunks": {"recompute": "magic"}})
    with pytest.raises(ValueError, match="unknown field 'tile'"):
        config.with_overrides(config.PORTABLE, {"forward": {"tile": None}})


def test_pretune_portable_runs_the_backward_and_prints_every_entry(monkeypatch, tmp_path, capsys):
    # `python -m suite kernel tune --portable`: per dtype, the forward and a loss and gradients
    # (exact and filtered) on the portable path; then each cache entry, Tiles or SoftmaxGrad.
    from types import SimpleNamespace

    from suite.kernel import internals, tune

    cache = tmp_path / "tiles.json"
    monkeypatch.setenv("CCE_OWN_TUNE_CACHE", str(cache))
    calls = []
    monkeypatch.setattr(tune, "make_inputs", lambda dist, n, d, v, dtype, **kw: dict(
        e=dtype, c=None, targets=None))
    monkeypatch.setattr(internals, "run_portable_forward", lambda e, *a: calls.append(("fwd", e)))
    monkeypatch.setattr(internals, "run_portable_loss_and_grad",
                        lambda e, c, t, softcap, eps: calls.append(("grad", e, eps)))
    autotune._write_entry("forward|gpu|fp32|b", Tiles(64, 128, 32, 4, 3), 1.0, cache)
    autotune._write_entry("softmax_grad|gpu|fp32|b", PORTABLE.softmax_grad, 0.5, cache)
    args = SimpleNamespace(n=64, d=32, v=128, softcap=0.0, out=None)
    assert tune.pretune_portable(args) == 0
    assert calls == [x for dt in ("bf16", "fp16", "fp32")
                     for x in (("fwd", dt), ("grad", dt, None), ("grad", dt, "auto"))]
    out = capsys.readouterr().out
    assert "forward|gpu|fp32|b: Tiles(block_d 32, block_n 64, block_v 128" in out
    assert "softmax_grad|gpu|fp32|b: SoftmaxGrad(block_n 16, block_v 128, num_warps 8" in out
    assert "tma False" in out
