"""A real training step per loss backend, and convergence parity.

    python -m suite train-bench --out runs/train_h100 --mode all         # one GPU command
    python -m suite.train       --out runs/train_h100 --mode all         # same, without the CLI
    python -m suite train-bench --model hf:gemma2                       # a Hugging Face model

The package, along its seams: ``model`` (the decoder, one training step, the memory
breakdown), ``data`` (the synthetic corpus), ``backends`` (loss providers, ``selective+X``),
``bench`` (largest batch, peak memory and tokens/s), ``convergence`` (loss curves and parity
verdicts), ``hf`` (``--model hf:<arch>``: Hugging Face architectures and their loss patches),
``worker`` (the jobs as run in the worker process) and ``cli`` (arguments, the session). Columns
of its CSVs: ``suite/schema.py`` (TRAIN_*_FIELDS).

``--model hf:<arch>`` (llama, gemma2 and every other architecture own_kernel.transformers
supports; ``suite/train/hf.py``) replaces the GPT with a transformers model built from a config
(random init, ~1B parameters at the published vocabulary; ``--tiny`` for the CPU) and the loss
providers with whole-model patches: ``hf_loss`` (the model's own logits and loss: the reference,
in the place of naive), ``own`` / ``own_filter`` (own_kernel.transformers.patch), ``liger_flce``
(Liger's apply_liger_kernel_to_<arch>, its fused linear cross entropy only) and ``apple_cce``
(Apple's cce_patch). The same bench and convergence machinery runs them (the rows' columns are the
GPT's: d_model is the hidden size, n_params counted on the model); the output folder defaults to
``runs/train-hf-<arch>`` (git-ignored).

The model is a small GPT-style decoder in plain PyTorch (nanoGPT-like: token + position
embeddings, pre-LayerNorm blocks with causal SDPA attention and a 4x GELU MLP, final LayerNorm,
untied lm head). Its hidden states E (N, D) and lm-head weight C (V, D), both cast to bf16, go
to a loss provider of ``suite.registry``: ``fn(e, c, targets, softcap=..., ignore_index=...)``.
Default shape: d_model 512, 6 layers, 8 heads, sequence length 2048, vocab 32000: 52.7M
parameters counted WITH the token/position embeddings and the lm head (18.9M without). The
large-vocab variant swaps in V = 151936 (or any ``--vocab``). Weights are initialised locally
(normal, std 0.02; residual projections 0.02/sqrt(2 * layers)); nothing is downloaded.

Data: a deterministic synthetic corpus, a sparse bigram Markov chain whose successor lists are
drawn from a Zipf(1.1) prior (so token frequencies are Zipfian and the next token is
predictable), in an instruction-tuning layout: the first 50-70 % of every sequence (uniform per
sequence) is "prompt", labelled ``ignore_index``.

Backends: any registry provider, and ``selective+X`` = provider X on only the rows whose target
is not ignore_index (e.g. ``selective+liger_ce``).

Training step: bf16 autocast for the trunk, loss on bf16 E and C, ``loss.backward()``, gradient
clipping at 1.0, AdamW (fused where available), ``zero_grad(set_to_none=True)``.

Mode ``bench`` (per vocab, per backend; one row of ``train_bench.csv`` each):
- largest batch that fits: exponential search 1, 2, 4, ... then bisection, each try one full
  step on the same model (Adam states allocated beforehand, so one step is the steady state),
  OOM caught (``suite.measure.is_oom``), memory freed between tries; capped at ``--max-batch``;
- at a common batch (``--batch``; default: the largest power of two the naive baseline fits,
  a margin below the edge of memory, measured on every backend at that same batch): after
  ``--warmup`` untimed steps, one step measured for the whole-step peak memory and its
  breakdown (method below), then ``--timed-steps`` steps timed as ``suite.measure`` times a
  kernel (CUDA events around each step; median and percentiles; no L2 flush, which a whole
  step does not need and whose buffer would take memory from it).
  Caveat: the bench starts from the random init, where the softmax is nearly flat, so gradient
  filtering (apple_cce, own_filter) skips more of the backward than it would in a trained model;
  the convergence run's tokens/s (second half of training, peaked softmax) is the fairer number.
Mode ``convergence``: the same model (``--conv-*`` shape) trained ``--steps`` steps from the same
seed on the same batches with each of ``--conv-backends`` (naive twice: the noise floor); loss
curves to ``train_curves.csv``, verdicts to ``train_convergence.csv``. Mode ``all`` runs
convergence first (fixed cost), then the bench with what is left of ``--budget-s``.

Memory breakdown of the whole-step peak (MiB):
- weights, gradients, Adam states: computed from parameter counts and dtypes (fp32 master
  weights, fp32 gradients, two fp32 moments per parameter);
- loss: measured in one extra, otherwise identical step whose backward is split at E:
  max_memory_allocated during the loss forward + backward minus memory_allocated just before
  it (logits and their gradients, and the loss's outputs dE and dC);
- activations: the rest, peak - weights - gradients - Adam - loss. It holds the trunk's saved
  tensors minus whatever of the gradients is not yet allocated when the peak happens, plus
  allocator slack and the batch itself. ``saved_act_mib`` is the trunk's saved tensors measured
  directly (allocated after the trunk forward minus before) as a cross-check.

Isolation: jobs run in one worker process (``suite.isolate.Worker`` on ``python -m suite.train
--worker``), fed one job at a time; a job that kills the process or its CUDA context (segfault,
illegal address) is recorded as ``crashed`` and a fresh worker takes the remaining jobs.
``--in-process`` skips this.

Files written into ``--out``: ``env.json``, ``train_bench.csv``, ``train_curves.csv``,
``train_convergence.csv``, ``train_bench.{png,pdf}``, ``train_convergence.{png,pdf}``. Run again
into the same folder (e.g. ``--backends own`` after a kernel change), the CSVs get the new rows
appended (readers take each backend's latest) and the session's environment goes to
``env-<k>.json``.
"""
from suite.train.backends import SELECTIVE_PREFIX, get_backend
from suite.train.bench import bench_job, fits_by_running, largest_batch, run_bench
from suite.train.cli import (DEFAULT_BACKENDS, DEFAULT_CONV_BACKENDS, add_arguments,
                             estimate_seconds, main, make_plots)
from suite.train.convergence import (RERUN_LABEL, converge_job, lr_at, parity_verdict,
                                     run_convergence, smooth)
from suite.train.data import (IGNORE_INDEX, MarkovChain, instruction_batch, markov_chain,
                              sample_tokens, zipf_prior)
from suite.train.model import (GPT, GPTConfig, head_loss, init_optimizer_state, make_optimizer,
                               memory_breakdown_mib, param_counts, split_step_memory,
                               static_memory, train_step)
from suite.train.worker import run_job

# The CSV columns live in suite/schema.py; these names stay for the readers that import them here.
from suite.schema import TRAIN_BENCH_FIELDS as BENCH_FIELDS  # noqa: E402
from suite.schema import TRAIN_CONVERGENCE_FIELDS as CONV_FIELDS  # noqa: E402
from suite.schema import TRAIN_CURVE_FIELDS as CURVE_FIELDS  # noqa: E402

__all__ = [
    "SELECTIVE_PREFIX", "get_backend", "bench_job", "fits_by_running", "largest_batch",
    "run_bench", "DEFAULT_BACKENDS", "DEFAULT_CONV_BACKENDS", "add_arguments",
    "estimate_seconds", "main", "make_plots", "RERUN_LABEL", "converge_job", "lr_at",
    "parity_verdict", "run_convergence", "smooth", "IGNORE_INDEX", "MarkovChain",
    "instruction_batch", "markov_chain", "sample_tokens", "zipf_prior", "GPT", "GPTConfig",
    "head_loss", "init_optimizer_state", "make_optimizer", "memory_breakdown_mib",
    "param_counts", "split_step_memory", "static_memory", "train_step", "run_job",
    "BENCH_FIELDS", "CONV_FIELDS", "CURVE_FIELDS",
]
