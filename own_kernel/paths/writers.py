"""The backward's W writers, by the name the route gives them (Route.writer, Route.tail_writer;
policy/route.py's W_WRITERS): each writes the softmax gradient W of some rows at columns
[v_start, v_start + width) with its kernel (kernels/), adding the rounding and bias sums into
the call's Sums. The recompute path (paths/recompute.py) and the low-memory path
(paths/low_memory.py) place W and run the GEMMs; the writer only launches.

- ``"tma"``: kernels/dlogits_tma.py recomputes the logits on the tensor cores with TMA loads;
- ``"ws"``: kernels/dlogits_ws.py does so for plain logits, warp-specialised (Gluon, Hopper);
- ``"pointer"``: kernels/dlogits.py, pointer loads (any strides), its tiles timed on the GPU
  where the route says (Route.pointer_tuned);
- ``"cublas"``: cuBLAS writes the chunk's fp32 logits X, kernels/softmax_grad.py turns X into W
  (its launch shape timed where the route says: Route.softmax_grad_tuned).
"""
from __future__ import annotations

from triton.tools.tensor_descriptor import TensorDescriptor

from own_kernel.kernels.dlogits import write_w_pointer
from own_kernel.kernels.dlogits_tma import RecomputeTma
from own_kernel.kernels.gemm import mm_fp32
from own_kernel.kernels.softmax_grad import write_w_from_logits
from own_kernel.policy.options import Options
from own_kernel.policy.route import Route


class TmaWriter:
    """W from logits recomputed with TMA loads; the descriptors of E and C made once."""

    def __init__(self, e, c, bias, opts: Options, route: Route):
        self.tiles = route.cfg.recompute.tiles
        self.launcher = RecomputeTma(e, c, bias, opts.softcap, opts.label_smoothing, route.cfg,
                                     opts.deterministic, opts.temperature)

    def write(self, w, rows, sums, v_start, *, filters=False, col_round=True, e_rows=None):
        """e_rows: other rows of E than the whole (the low-memory path's row chunks)."""
        e_desc = None if e_rows is None else TensorDescriptor.from_tensor(
            e_rows, [self.tiles.block_n, self.tiles.block_d])
        self.launcher.write(w, rows, sums, v_start, filters=filters, col_round=col_round,
                            e_desc=e_desc)


class WsWriter:
    """W of plain logits by the warp-specialised Gluon kernel; exact, no column sums (the
    route sends it neither a filter, a bias nor recompute.col_round)."""

    def __init__(self, e, c, bias, opts: Options, route: Route):
        # imported here: the module needs Gluon's Hopper API, which the route checked
        from own_kernel.kernels.dlogits_ws import RecomputeWs
        self.launcher = RecomputeWs(e, c, opts.label_smoothing, route.cfg.recompute.group_n)

    def write(self, w, rows, sums, v_start, *, filters=False, col_round=True, e_rows=None):
        assert not filters, "the ws writer does not filter (the route sends it exact calls)"
        self.launcher.write(w, rows, sums, v_start, e_rows=e_rows)


class PointerWriter:
    """W from logits recomputed with pointer loads; exact only (no filter)."""

    def __init__(self, e, c, bias, opts: Options, route: Route):
        self.e, self.c, self.bias, self.opts, self.cfg = e, c, bias, opts, route.cfg
        self.tuned = route.pointer_tuned

    def write(self, w, rows, sums, v_start, *, filters=False, col_round=True, e_rows=None):
        assert not filters, "the pointer writer does not filter (the tail never does)"
        o = self.opts
        write_w_pointer(self.e if e_rows is None else e_rows, self.c, w, self.bias, rows, sums,
                        v_start, o.softcap, o.label_smoothing, self.cfg, tuned=self.tuned,
                        col_round=col_round, deterministic=o.deterministic,
                        temperature=o.temperature)


class CublasWriter:
    """W from the chunk's fp32 logits X, which cuBLAS writes first (into ``x``)."""

    def __init__(self, e, c, bias, opts: Options, route: Route):
        self.e, self.c, self.bias, self.opts, self.cfg = e, c, bias, opts, route.cfg
        self.tuned = route.softmax_grad_tuned

    def write(self, w, rows, sums, v_start, *, x, filters=False, kept_count=None, before_w=None):
        """before_w: called between the logits GEMM and the kernel that writes W (over the
        previous chunk's: the look-ahead's GEMMs go there)."""
        o, width = self.opts, w.shape[1]
        mm_fp32(self.e, self.c[v_start:v_start + width].t(), x)
        if before_w is not None:
            before_w()
        write_w_from_logits(x, w, self.bias, rows, sums, v_start, o.softcap, o.label_smoothing,
                            self.cfg, v=self.c.shape[0], tuned=self.tuned, filters=filters,
                            kept_count=kept_count, deterministic=o.deterministic,
                            temperature=o.temperature)


WRITERS = {"ws": WsWriter, "tma": TmaWriter, "pointer": PointerWriter, "cublas": CublasWriter}


def writers_of(route: Route, e, c, bias, opts: Options) -> tuple:
    """(the writer of the chunks in dC, the tail's writer) the route names: one object where
    both are the same."""
    made = {name: WRITERS[name](e, c, bias, opts, route)
            for name in dict.fromkeys((route.writer, route.tail_writer))}
    return made[route.writer], made[route.tail_writer]
