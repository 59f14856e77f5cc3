"""The one results schema. Every writer and reader (plots, reproduce, gate) uses these names.

A run directory holds:
- ``results.csv``: one row per (cell, provider, phase), appended as each cell finishes;
- ``env.json``: the environment of the run (see ``suite.results.environment``).

A *cell* is one input configuration (shape, dtype, distribution, options); its ``cell_id`` is a
stable string built from those fields, so ``--resume`` can skip finished (cell, provider) pairs.
"""

# Phases, as in the paper (Table 1) plus a forward without autograd.
PHASES = ("fwd", "loss", "grad", "loss+grad")
PHASE_HELP = {
    "fwd": "forward under torch.no_grad()",
    "loss": "forward with autograd on (saved tensors kept)",
    "grad": "backward only; peak memory reset after the forward",
    "loss+grad": "forward + backward",
}

# Bytes per element of each dtype name.
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}

# Row status values.
STATUSES = ("ok", "oom", "error", "nan", "unsupported", "unavailable", "crashed")

CELL_FIELDS = [
    "cell_id",      # stable id of the input configuration
    "dist",         # input distribution: uniform | lm | file
    "n",            # tokens (rows of E)
    "d",            # hidden size
    "v",            # vocabulary size
    "dtype",        # bf16 | fp16 | fp32
    "softcap",      # tanh softcap value, empty for none
    "ignore_frac",  # fraction of targets set to ignore_index
    "bias",         # 1 if the classifier has a bias
    "seed",
    "mean_loss",    # reference mean loss of the inputs (nats)
    "entropy",      # reference mean softmax entropy (nats)
]

ROW_FIELDS = CELL_FIELDS + [
    "provider",
    "phase",
    "status",            # one of STATUSES
    "error",             # error text when status != ok
    "peak_extra_mib",    # max_memory_allocated during the phase minus allocated before it (MiB)
    "peak_abs_mib",      # max_memory_allocated during the phase (MiB)
    "ms",                # median time (ms)
    "ms_p20",            # 20th percentile (ms)
    "ms_p80",            # 80th percentile (ms)
    "ms_min",
    "reps",              # timed repetitions
    "tokens_per_s",      # n / median time
    "tflops",            # model FLOPs of the phase (PHASE_MATMULS * 2NVD) / median time
    "floor_ms",          # one cuBLAS E @ C.T of the same shape, same run (median ms)
    "floor_ratio",       # ms / floor_ms: how many E @ C.T matmuls' worth of time
    "loss_rel_err",      # |loss - ref| / |ref|
    "de_rel_err",        # ||dE - dE_ref|| / ||dE_ref||
    "dc_rel_err",        # ||dC - dC_ref|| / ||dC_ref||
    "dbias_rel_err",     # ||dbias - dbias_ref|| / ||dbias_ref|| (bias cells only)
    "device",            # device name the row was measured on
    "run_id",
    "timestamp",
]

# Model FLOPs of each phase in units of one E @ C.T (2*N*V*D): forward 1, backward dE + dC = 2.
# (A kernel that keeps no N x V values also recomputes the logits: 4 matmuls for loss+grad.)
PHASE_MATMULS = {"fwd": 1, "loss": 1, "grad": 2, "loss+grad": 3}
