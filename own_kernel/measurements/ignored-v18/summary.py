"""Loss+grad ms at 60 % ignored targets: rows dropped before the forward (default, from
results/ignored-h200), before the backward only, or never (drop-*/results.csv).
Run from the repository root: python own_kernel/measurements/ignored-v18/summary.py"""
import pandas as pd

here = "own_kernel/measurements/ignored-v18"
rows = []
for mode in ("none", "backward"):
    d = pd.read_csv(f"{here}/drop-{mode}/results.csv")
    d["drop"] = mode
    rows.append(d)
d = pd.read_csv("results/ignored-h200/results.csv")
d = d[(d.ignore_frac == 0.6) & d.provider.isin(["own", "own_filter"])]
d = d.drop_duplicates(["cell_id", "provider", "phase"], keep="last")
d["drop"] = "forward (default)"
rows.append(d)
d = pd.concat(rows)
d = d[d.phase == "loss+grad"]
print(d.pivot_table(index=["dist", "n", "v", "provider"], columns="drop", values="ms").round(2))
