"""interleave's dE difference from the base at budget 0, D 1152, V 262144 (3.3 in call24a, 5.8 in
call23e), where each call alone matches fp64 (repeat.py): interleave's head_rows run as the
tool runs it, each gradient it compares also measured against fp64.
Usage: python interleave_check.py NxDxV VARIANT..."""
import argparse
import sys

import torch

import suite.reference
from suite.inputs import make_inputs
from suite.kernel import interleave

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from probe import fp64_grads, rel  # noqa: E402

head = sys.argv[1]
n, d, v = map(int, head.split("x"))
inp = make_inputs("lm", n, d, v, torch.bfloat16, seed=0, device="cuda")
ref64 = fp64_grads(inp["e"], inp["c"], inp["targets"])
del inp
real = suite.reference.rel_err


def checked(got, ref, *a, **k):
    i = 0 if got.shape == ref64[0].shape else 1
    print("  grad", "dE" if i == 0 else "dC", "entry vs fp64", f"{rel(got, ref64[i]):.3e}",
          "base vs fp64", f"{rel(ref, ref64[i]):.3e}", "entry vs base", f"{real(got, ref):.3e}",
          flush=True)
    return real(got, ref, *a, **k)


suite.reference.rel_err = checked
ap = argparse.ArgumentParser()
interleave.add_arguments(ap)
args = ap.parse_args(["--out", "/tmp/ic", "--heads", head, "--budgets", "0", "--reps", "2",
                      "--variants", *sys.argv[2:]])
for row in interleave.head_rows(head, args, torch.device("cuda")):
    print(row["entry"], row["path"], row["chunks"], row.get("de_diff_vs_base"),
          row.get("dc_diff_vs_base"))
