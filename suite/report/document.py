"""results/RESULTS.md, generated whole from the curated runs (suite/report/curated.py): a short
section per question a user asks, each table under the command that prints it again.

    python -m suite report --results-doc

Nothing in it is typed by hand but the prose below, which names no measured number.
"""
from __future__ import annotations

import dataclasses
import re

from suite.report.readme import RESULTS_DOC, rebase_links
from suite.report.verdict import RULE_TEXT

@dataclasses.dataclass(frozen=True)
class Section:
    title: str
    intro: str
    tables: tuple[str, ...]  # `python -m suite report` arguments, one table (or set) each


# Links here are written from the repository's root, as the report prints its own;
# render_document rebases them all to results/ (readme.rebase_links).
HEAD = f"""# Results

Every table below is printed by the `python -m suite report ...` command above it, from the run
folders in this directory (the curated runs: `suite/report/curated.py`; older runs are in git,
see [PROVENANCE.md](results/PROVENANCE.md)); this file is rewritten whole by
`python -m suite report --results-doc`, and a test checks that doing so changes nothing. The
[README](README.md) shows one compact table per GPU; the measurement notes behind the
kernel's tuned values are in [notes/](results/notes/README.md); the figures in
[plots/](plots/) come from the same runs (`python -m suite plots`).

How to read them: memory is the peak over what was allocated just before the call (MiB); time
is the median of the timed calls (CUDA events, L2 flushed); ×floor is the time over one cuBLAS
`E @ Cᵀ` of the same shape measured in the same run (an exact loss+grad needs at least three);
errors are relative to an fp32 reference on the same inputs. Faster, slower and level: {RULE_TEXT}
(the p20 and p80 of each row are in its results.csv). `uniform` inputs give a nearly flat softmax
(the best case for gradient filtering); `lm` inputs are built like a trained LM head (a peaked
softmax). A provider that did not run shows its status (`oom`, `error`, `unavailable`,
`unsupported`) and why. Each table takes its rows from one run folder, and each folder from one
session (one GPU model within two hours: `suite/report/curated.py` checks); a folder resumed
within its session says so where a cell's rows come from more than one run of it.
"""

SECTIONS = (
    Section(
        "Which is fastest at my shape?",
        "Every provider at the Gemma 2 (2B) shape in one H100 run; every peer at three model "
        "shapes on the H100 (Gemma 2 (2B), Llama 3 (8B), Qwen 2.5 (7B)); QuACK beside own and "
        "torch.compile at those shapes on the H100 (QuACK and its CuTe DSL installed into a "
        "folder named `site-packages`, which its import needs); the three-matmul path "
        "(`own_fused`: loss and gradients in the forward, a row chunk at a time in a workspace) "
        "against torch.compile over a grid of shapes on the H100.",
        ("results/headline-h200",
         "results/peers-h100",
         "results/quack-h100",
         "results/fused-grid-h100-3-lm results/fused-grid-h100-3-uniform "
         "results/fused-n32768-h100-4 --versus own_fused "
         "--peers torch_compile,naive")),
    Section(
        "Which fits my memory budget?",
        "First the frontier: every exact provider's loss+grad at one shape as a point (peak "
        "memory, time), the own kernel swept over `workspace_mib` (`own_ws*`), with a verdict "
        "per peer: is some exact own point within that peer's memory faster or level? Then: "
        "the gradients dE + dC are the least a loss+grad call can hold (`MiB ÷ grads` 1.0). "
        "`own_fused` holds at most its budget beyond them (3 GiB by default); `own_low_memory` "
        "holds close to the gradients alone, against the exact recompute path "
        "`own_recompute` and the default call `own`.",
        ("results/frontier-llama3-8b-h200 results/frontier-gemma2-2b-h200 "
         "results/frontier-qwen25-7b-h200 results/frontier-d5120-h200 "
         "results/frontier-d1152-h200 --frontier",
         "results/fused-3gib-h100 --versus own_fused --peers torch_compile,naive",
         "results/headline-h200 --versus own_low_memory --peers own_recompute,own")),
    Section(
        "How accurate is each?",
        "Every table gives the dE error of each provider; here the own kernel's targets at the "
        "Gemma 2 (2B) shape of the headline run, its errors over the naive baseline's among "
        "them. Every route's loss and gradient errors against fp64, on confident and large "
        "logits: [notes/accuracy-by-route.md](results/notes/accuracy-by-route.md).",
        ("results/headline-h200 --targets",)),
    Section(
        "Without a Hopper GPU?",
        "The portable path (`own_portable*`: no TMA, no Hopper-only instructions) forced on the "
        "H100, beside the Hopper path and the peers.",
        ("results/portable-h100-2",)),
    Section(
        "Does it scale to several GPUs?",
        "The vocabulary sharded over two H100s of one host (`vocab_parallel`, or a DTensor "
        "weight sharded on the vocabulary) against one GPU of the same host, then a whole "
        "training step of a Llama-architecture model under FSDP2 on one and two GPUs, each "
        "backend's loss curve checked against its single-GPU run of the same global batch. "
        "Then the same step on two H200s with the current kernel (its targets check queued "
        "before the model's trunk, so the loss does not wait for the forward), with the host "
        "syncs of one step, and each configuration's largest batch per rank (doubling until "
        "CUDA runs out of memory or 64 is passed). "
        "Then, on another two-H200 host, the vocabulary sharded over two GPUs against one GPU "
        "of the host, and the FSDP2 step at 1 and 2 GPUs with 8 sequences per rank after the "
        "host-sync fix (the loss's first chunk sized from the check queued before the trunk). "
        "Then four H200s of one host: the vocabulary sharded over four GPUs against one GPU "
        "of the same host, and the FSDP2 step at 1, 2 and 4 GPUs with 8 sequences per rank "
        "(the global batch grows with K), 100 steps, the plain and the tensor-parallel head, "
        "each configuration's loss curve held to `hf_loss` with the same head in the same "
        "world. "
        "Then, on 4 H200s again, the same steps at 1, 2 and 4 GPUs after the host-sync fix at "
        "a second seed, the tensor-parallel head at K = 4, and the largest batch per rank at "
        "K = 4. "
        "What larger counts would give, from these measurements: "
        "[notes/scaling.md](results/notes/scaling.md).",
        ("results/multigpu-2xh100", "results/multigpu-2xh200", "results/multigpu-2xh200-2",
         "results/multigpu-4xh200", "results/multigpu-4xh200-2")),
    Section(
        "Does it train the same?",
        "Whole training steps of Hugging Face architectures on the H100 against the model's own "
        "loss (peak memory, tokens/s, the largest batch that fits, and loss curves), then the "
        "same steps measured again with the path the own kernel took in each (under autocast "
        "an fp32 `lm_head.weight` takes the three-matmul path by default; the filter stays on "
        "the recompute path).",
        ("results/train-hf-llama-h100 results/train-hf-gemma2-h100 --headline",
         "results/train-hf-llama-autocast-h100",
         "results/train-hf-gemma2-autocast-h100")),
    Section(
        "Who has what?",
        "The peers as they stand in 2026, in one H100 run (`bash suite/kernel/peers_gpu.sh`): "
        "Liger's fused linear CE on its Triton and CuTe-DSL backends (the CuTe kernel's "
        "launches counted in every call), Liger's scaled CE (per-token NLL and entropy; a "
        "CuTe-DSL kernel on sm_90) and its tensor-parallel variant, and verl's fused log-prob "
        "kernel, against the own kernel: the loss+grad cell of Gemma 2 (2B) and one at Liger's "
        "published shape, then the RL step (log-probs, entropy and their backward) at two "
        "shapes, with log-prob, entropy and gradient errors against fp64. "
        "Then Liger's tensor-parallel variant where it runs, on two H200s of one host (one "
        "process per GPU, each with its vocabulary shard; `python -m suite bench "
        "--vocab-parallel 2`), beside the own kernel's vocabulary-parallel path and Liger's "
        "own PyTorch fallback.",
        ("results/peers-2026-h100 --who-has-what",
         "results/peers-2026-h100 --rl",
         "results/multigpu-2xh200-2 --tensor-parallel")),
)


def github_anchor(title: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")


def render_document(table_text) -> str:
    """The whole document; ``table_text(arguments)``: what `python -m suite report <arguments>`
    prints (suite.report.results_doc_text passes it, so this module needs no parser)."""
    toc = "\n".join(f"- [{s.title}](#{github_anchor(s.title)})" for s in SECTIONS)
    parts = [HEAD, toc]
    for s in SECTIONS:
        parts.append(f"## {s.title}\n\n{s.intro}")
        parts += [table_text(t) for t in s.tables]
    return rebase_links("\n\n".join(parts) + "\n", RESULTS_DOC)
