"""Writes dlogits_tma_diag.py next to this file: dlogits_tma.py at 8d3b081 with three diagnostic
switches (COLSUM, ROWSUM, STORE) that drop the column rounding sums, the row rounding sums or
the store of W. These are the string edits that made the kernel epilogue.py timed (as
scratch_dlv.py). Needs the repository's git history."""
import os
import subprocess

here = os.path.dirname(os.path.abspath(__file__))
src = subprocess.run(["git", "show", "8d3b081:own_kernel/dlogits_tma.py"], cwd=here, check=True,
                     capture_output=True, text=True).stdout
edits = [
    ("SUB_V: tl.constexpr):\n    # One",
     "SUB_V: tl.constexpr, COLSUM: tl.constexpr = True, STORE: tl.constexpr = True):\n    # One"),
    ("    W.store([n0, w0], d_used)\n", "    if STORE:\n        W.store([n0, w0], d_used)\n"),
    ("    tl.atomic_add(ColRound + offs_v, tl.sum(r, axis=0), mask=w_mask)\n",
     "    if COLSUM:\n        tl.atomic_add(ColRound + offs_v, tl.sum(r, axis=0), mask=w_mask)\n"),
    ("BLOCK_N: tl.constexpr, SUB_V: tl.constexpr):\n    # _subtile_grad",
     "BLOCK_N: tl.constexpr, SUB_V: tl.constexpr, COLSUM: tl.constexpr = True, "
     "STORE: tl.constexpr = True):\n    # _subtile_grad"),
    ("HAS_BIAS, HAS_SOFTCAP, FILTER, SUB_V)", "HAS_BIAS, HAS_SOFTCAP, FILTER, SUB_V, COLSUM, STORE)"),
    ("D: tl.constexpr, DOT_PRECISION: tl.constexpr):",
     "D: tl.constexpr, DOT_PRECISION: tl.constexpr, COLSUM: tl.constexpr = True, "
     "STORE: tl.constexpr = True, ROWSUM: tl.constexpr = True):"),
    ("HAS_BIAS, HAS_SOFTCAP, FILTER, BLOCK_N, BLOCK_V // 4)",
     "HAS_BIAS, HAS_SOFTCAP, FILTER, BLOCK_N, BLOCK_V // 4, COLSUM, STORE)"),
    ("        tl.atomic_add(RowRound + offs_n, r, mask=n_mask)\n",
     "        if ROWSUM:\n            tl.atomic_add(RowRound + offs_n, r, mask=n_mask)\n"),
]
for old, new in edits:
    assert old in src, old
    src = src.replace(old, new)
with open(os.path.join(here, "dlogits_tma_diag.py"), "w") as f:
    f.write(src)
