"""The portable target's autotuning (own_kernel/autotune.py) and target selection: the cache's
key, its read and write across processes, the forced portable target, config validation."""
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import own_kernel.config as config
from own_kernel import autotune
from own_kernel.config import Tiles


def test_shape_bucket_groups_shapes_that_share_tiles():
    assert autotune.shape_bucket(8192, 256000, 2304) == "n8192-v262144-d2304"
    assert autotune.shape_bucket(8000, 200000, 2300) == autotune.shape_bucket(8192, 256000, 2304)
    assert autotune.shape_bucket(16384, 256000, 2304) != autotune.shape_bucket(8192, 256000, 2304)
    assert autotune.tune_key("forward", torch.device("cpu"), torch.bfloat16, "b") == \
        "forward|cpu|bfloat16|b"


_TUNE_IN_CHILD = textwrap.dedent("""
    import json, sys
    from own_kernel import autotune
    from own_kernel.config import Tiles
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


def test_config_validation_names_the_field():
    with pytest.raises(ValueError, match="tiles.block_v: expected a power of two"):
        Tiles(64, 100, 32, 4, 3)
    with pytest.raises(ValueError, match="chunks.recompute"):
        config.with_overrides(config.PORTABLE, {"chunks": {"recompute": "magic"}})
    with pytest.raises(ValueError, match="unknown field 'tile'"):
        config.with_overrides(config.PORTABLE, {"forward": {"tile": None}})
