"""A vocabulary sharded over 1, 2 and 3 gloo ranks (CPU, interpreter): with batch_invariant the
forward's rows (loss, lse, entropy) are the single-process call's bits for every number of
ranks, with a softcap, a temperature and label smoothing (whose sum of logits is a per-block
partial too); the entropy and a temperature work on a sharded vocabulary with and without it, within
the single-process call's tolerance; shards off the 8-column blocks (a block over two ranks,
or over a shard on which no block starts) give the same bits. The default sharded call (lse-only combine) differs in bits from the single
process, so the bitwise property is not one any combine meets."""

import pytest
import torch

from tests.gloo_world import gloo_rank, spawn_world

N, D, V = 16, 32, 100
# Shards on the interpreter's 8-column partial blocks (the last one stops at V), off its
# 16-column forward tile: a shard's tiles do not line up with one process's
SHARDS = {1: [(0, 100)], 2: [(0, 40), (40, 100)], 3: [(0, 24), (24, 56), (56, 100)]}
# Shards off the blocks: a block runs over two ranks, and (3 ranks) over a middle shard of 3
# columns on which no block starts, so rank 0 borrows from both others
ANY_SHARDS = {2: [(0, 52), (52, 100)], 3: [(0, 41), (41, 44), (44, 100)]}
OPTIONS = dict(softcap=20.0, temperature=0.8, label_smoothing=0.1)


def _row_independent_dots():
    """tests/test_batch_invariant.py's einsum dot (why: there)."""
    import numpy as np
    from triton.runtime import interpreter

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        product = np.einsum("...ik,...kj->...ij", a.data.astype(d.data.dtype),
                            b.data.astype(d.data.dtype))
        return interpreter.TensorHandle(product + d.data, d.dtype.scalar)

    interpreter.InterpreterBuilder.create_dot = create_dot


def _inputs():
    g = torch.Generator().manual_seed(5)
    e = torch.randn(N, D, generator=g) * 0.5
    c = torch.randn(V, D, generator=g) * 0.5
    t = torch.randint(0, V, (N,), generator=g)
    t[::5] = -100
    w = torch.rand(N, 2, generator=g) + 0.5
    return e, c, t, w


def _rows(e, c, t, w, invariant, vp=None, bias=None):
    """(loss, lse, entropy, dE, dC) of sum w0 loss + w1 entropy."""
    from own_kernel import linear_cross_entropy

    e = e.clone().requires_grad_()
    c = c.clone().requires_grad_()
    out = linear_cross_entropy(e, c, t, reduction="none", return_lse=True, return_entropy=True,
                               batch_invariant=invariant, vocab_parallel=vp, bias=bias,
                               **OPTIONS)
    (out.loss * w[:, 0] + out.entropy * w[:, 1]).sum().backward()
    return [out.loss.detach(), out.lse.detach(), out.entropy.detach(), e.grad, c.grad]


def _compare(got, ref, start, stop) -> dict:
    ref = ref[:4] + [ref[4][start:stop]]
    names = ("loss", "lse", "entropy", "dE", "dC")
    return {n: {"equal": bool(torch.equal(a, b)),
                "rel": float((a - b).norm() / b.norm().clamp_min(1e-30))}
            for n, a, b in zip(names, got, ref)}


def _worker(rank, world, port, out_dir):
    with gloo_rank(rank, world, port, out_dir) as res:
        _row_independent_dots()
        from own_kernel import VocabParallel

        e, c, t, w = _inputs()
        start, stop = SHARDS[world][rank]
        for mode, invariant in (("invariant", True), ("default", False)):
            got = _rows(e, c[start:stop], t, w, invariant, VocabParallel(None, start, stop))
            res[mode] = _compare(got, _rows(e, c, t, w, invariant), start, stop)
        # the lse-only combine (no entropy, no temperature): its bits against one process
        from own_kernel import linear_cross_entropy
        lse_only = linear_cross_entropy(e, c[start:stop], t, reduction="none",
                                        vocab_parallel=VocabParallel(None, start, stop))
        res["lse_only_equal"] = bool(torch.equal(
            lse_only, linear_cross_entropy(e, c, t, reduction="none", batch_invariant=True)))
        if world in ANY_SHARDS:
            start, stop = ANY_SHARDS[world][rank]
            got = _rows(e, c[start:stop], t, w, True, VocabParallel(None, start, stop))
            res["invariant_any_split"] = _compare(got, _rows(e, c, t, w, True), start, stop)
            # with a bias: a block across a boundary borrows the next ranks' bias entries too
            bias = torch.linspace(-1.0, 1.0, V)
            got = _rows(e, c[start:stop], t, w, True, VocabParallel(None, start, stop),
                        bias[start:stop])
            res["invariant_any_split_bias"] = _compare(got, _rows(e, c, t, w, True, bias=bias),
                                                       start, stop)


@pytest.fixture(scope="module", params=[1, 2, 3], ids=["world1", "world2", "world3"])
def ranks(request, tmp_path_factory):
    world = request.param
    return spawn_world(_worker, world, str(tmp_path_factory.mktemp(f"vi{world}")))


def test_invariant_forward_rows_are_the_single_process_bits(ranks):
    for rank, res in enumerate(ranks):
        for mode in ("invariant", "invariant_any_split", "invariant_any_split_bias"):
            for name in ("loss", "lse", "entropy"):
                if mode in res:
                    assert res[mode][name]["equal"], (len(ranks), rank, mode, name, res[mode])


def test_gradients_and_the_default_mode_match_the_single_process_call(ranks):
    """Entropy and temperature on a sharded vocabulary, both modes: fp32, sums over <= 100
    columns and 24 rows, and dE summed over the ranks' partials: a few hundred ulps."""
    for rank, res in enumerate(ranks):
        for mode in ("invariant", "default", "invariant_any_split", "invariant_any_split_bias"):
            for name, x in res.get(mode, {}).items():
                assert x["rel"] <= 1e-5, (len(ranks), rank, mode, name, x)


def test_the_lse_only_sharded_combine_is_not_bitwise(ranks):
    """The guard's sibling: without batch_invariant (no entropy asked), the sharded forward
    merges each rank's lse, whose bits differ from one process's."""
    if len(ranks) == 1:
        pytest.skip("one rank: the lse-only combine has nothing to merge")
    assert not all(res["lse_only_equal"] for res in ranks)


def test_a_split_off_the_blocks_is_compared_in_every_world_of_several_ranks(ranks):
    """The off-block shards ran (their rows' bits are checked above), in the 2- and 3-rank
    worlds."""
    if len(ranks) == 1:
        pytest.skip("one rank: no split")
    assert all("invariant_any_split" in res and "invariant_any_split_bias" in res
               for res in ranks)
