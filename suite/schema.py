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
    "sm_mhz",            # with bench --clocks: the median SM clock sampled while the timed calls
                         # ran (suite/clocks.py); at the power cap it follows the kernel's power
    "clock_limited",     # with bench --clocks: the fraction of those samples with the clock
                         # limited (power cap, thermal, slowdown)
    "loss_rel_err",      # |loss - ref| / |ref|
    "de_rel_err",        # ||dE - dE_ref|| / ||dE_ref||
    "dc_rel_err",        # ||dC - dC_ref|| / ||dC_ref||
    "dbias_rel_err",     # ||dbias - dbias_ref|| / ||dbias_ref|| (bias cells only)
    "ran",               # what code the provider reports it ran (a peer's backend or kernel
                         # module, checked after the call; the own kernel's route: its path
                         # and the three-matmul path's chunks), where it reports one
    "device",            # device name the row was measured on
    "world_size",        # ranks the cell ran on: 1, or K for `bench --vocab-parallel K` (C
                         # sharded by vocabulary over K ranks, one GPU each; peak_*_mib and ms*
                         # are then the max over ranks, floor_ms one rank's E @ C_shard.T, tflops
                         # the whole problem's FLOPs over that time, dc/dbias errors over the
                         # gathered shards)
    "run_id",
    "timestamp",
]

# Columns added after results were first written, with the value an older row means; readers
# fill them in (an older results.csv lacks them, and stays readable and resumable).
ROW_FIELD_DEFAULTS = {"world_size": "1", "ran": "", "sm_mhz": "", "clock_limited": ""}

# Model FLOPs of each phase in units of one E @ C.T (2*N*V*D): forward 1, backward dE + dC = 2.
# (A kernel that keeps no N x V values also recomputes the logits: 4 matmuls for loss+grad.)
PHASE_MATMULS = {"fwd": 1, "loss": 1, "grad": 2, "loss+grad": 3}


# ---- the training bench (suite.train) ----------------------------------------------------
# A training step is not a kernel call: its rows have their own columns, in these files of a
# ``results/train*/`` folder (beside env.json / env-<k>.json, one per session; rows name theirs
# by run_id). Timing and OOM handling are suite.measure's, as for the kernel rows.

TRAIN_BENCH_CSV = "train_bench.csv"
TRAIN_CURVES_CSV = "train_curves.csv"
TRAIN_CONVERGENCE_CSV = "train_convergence.csv"

# Statuses of a training job: the kernel statuses, plus a job killed at its time limit and one
# not started because the session's budget was spent.
TRAIN_STATUSES = STATUSES + ("timeout", "skipped")

TRAIN_BENCH_FIELDS = [
    "run_id", "timestamp", "device",  # the run and the device it was measured on
    "model",             # gpt (the suite's own), or hf:<arch> (a Hugging Face architecture)
    "vocab", "d_model", "n_layer", "n_head", "seq_len",
    "n_params",          # all parameters
    "n_params_nonemb",   # without wte, wpe and the lm head
    "dtype",             # bf16 = bf16 autocast for the trunk
    "softcap",
    "ignored_frac",      # mean fraction of targets that are ignore_index
    "optimizer",
    "backend",           # registry provider, or selective+<provider>
    "exact",             # 1 when its gradient is exact
    "status", "error",   # one of TRAIN_STATUSES, and the reason
    "batch",             # the common batch (sequences)
    "tokens_per_step",   # batch * seq_len
    "peak_mib",          # max_memory_allocated over one plain step after warm-up
    # The peak's breakdown (sums to peak_mib): weights, gradients and AdamW moments from
    # parameter counts; loss measured in a step split at E; activations the rest.
    "weights_mib", "grads_mib", "optim_mib", "act_mib", "loss_mib",
    "saved_act_mib",     # the trunk's saved tensors, measured directly (cross-check)
    "split_peak_mib",    # the split step's own peak (cross-check)
    "ms_step", "ms_step_p20", "ms_step_p80",  # median and percentiles of the timed steps
    "tokens_per_s",      # tokens_per_step / ms_step
    "max_batch",         # largest batch that fits
    "max_batch_capped",  # 1 when the search hit --max-batch
    "max_batch_peak_mib", "max_batch_tokens_per_s",  # that try's peak and rough throughput
    "search_log",        # every try as batch+ (fits) or batch- (OOM)
    "search_s",          # the search's wall time
    "loss_path",         # the own kernel's path in one profiled step at the common batch
                         # (three-matmul or recompute, from its kernels' names; "" otherwise)
]
TRAIN_CURVE_FIELDS = ["run", "backend", "step", "loss", "lr", "ms_step"]
TRAIN_CONVERGENCE_FIELDS = [
    "run_id", "timestamp", "device", "model", "run", "backend", "exact",
    "verdict",           # pass | fail | diverged | reference | noise floor (the reference's
                         # rerun) | incomplete | no reference | a status
    "error", "steps", "steps_done", "vocab", "d_model", "n_layer", "seq_len", "batch", "lr",
    "tol",               # the tolerance applied: --tol, or wider where the rerun's noise is
    "warmup_steps", "smooth",
    "shift_steps",       # the reference's range over +- this many steps is the comparison
    "first_loss", "final_loss", "final_loss_naive",  # final: mean of the last `smooth` steps
    "final_rel_diff",    # (final - naive's final) / naive's final
    "max_rel_dev",       # largest relative deviation of the smoothed curve from naive's
    "max_rel_dev_step",  # after the warm-up steps
    "ms_step",           # median step time over the second half of the run
    "tokens_per_s",
    "peak_mib",          # includes the run's whole token set, kept on the device
]
