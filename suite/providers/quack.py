"""QuACK (quack-kernels, CuTe DSL): chunked linear cross-entropy with the gradients of each chunk
made by fused GEMM epilogues.

QuACK has two pipelines: the base one (a logits GEMM per chunk, a cross-entropy kernel, two
gradient GEMMs) and, where it is eligible (an sm_90 GPU, bf16, V a multiple of 128 with a tile
width dividing it, 128-row chunks), the scaled-exp pipeline, which its
``chunked_linear_cross_entropy`` picks by default. ``quack`` names the scaled-exp pipeline
explicitly and refuses a cell it is not eligible for (the row's error says why), so its rows are
always that pipeline's; ``quack_chunked`` is the base pipeline. Neither has a bias or a softcap:
such cells are ``unsupported``.

QuACK 0.6.5 keys its compiled kernels by a fingerprint of the code they call; code outside a
folder named ``site-packages`` or ``dist-packages`` counts as its own and is fingerprinted in
depth, which fails at import for the CuTe DSL's runtime objects ("... has no fail-closed semantic
key"). So QuACK and the DSL must be installed into a ``site-packages`` folder (a virtual
environment, or ``pip install --target /some/site-packages``): results/notes/peers.md.
"""
from suite.registry import all_of, needs_cuda, needs_module, register

PACKAGE = "quack-kernels"
VERSION = "0.6.5"
DSL = "nvidia-cutlass-dsl[cu13]==4.8.1"
INSTALL = f'pip install {PACKAGE}=={VERSION} "{DSL}"'
CHUNK = 4096  # quack's default chunk of rows
YELLOW = "#F0E442"  # figures: QuACK's family colour (Okabe & Ito)

_requires = all_of(needs_module("quack", PACKAGE, INSTALL), needs_cuda)


def _scaled_exp_refusal(e, c, chunk) -> str | None:
    """Why the scaled-exp pipeline cannot take these inputs, in quack's own terms; None if it can."""
    from quack.linear_cross_entropy import scaled_exp_lce_supported

    if scaled_exp_lce_supported(e, c, chunk, "mean"):
        return None
    import torch

    cc = torch.cuda.get_device_capability(e.device)
    return (f"quack's scaled-exp pipeline is not eligible here (needs sm_90, bf16 E and C, "
            f"V % 128 == 0, D % 8 == 0; got sm_{cc[0]}{cc[1]}, {e.dtype}, V {c.shape[0]}, "
            f"D {c.shape[1]}): quack_chunked measures the base pipeline")


@register("quack", summary=f"QuACK chunked linear CE, scaled-exp pipeline (chunks of {CHUNK})",
          features=(), requires=_requires, package=PACKAGE, install=INSTALL,
          style=dict(color=YELLOW, marker="s", linestyle="-"), order=50)
def quack(e, c, targets, *, bias=None, softcap=None, ignore_index=-100):
    from quack.linear_cross_entropy import chunked_linear_cross_entropy

    refusal = _scaled_exp_refusal(e, c, CHUNK)
    if refusal:
        raise ValueError(refusal)
    return chunked_linear_cross_entropy(e, c, targets, chunk_size=CHUNK,
                                        ignore_index=ignore_index, use_scaled_exp=True)


@register("quack_chunked",
          summary=f"QuACK chunked linear CE, base pipeline (use_scaled_exp=False, chunks of "
                  f"{CHUNK})",
          features=(), requires=_requires, package=PACKAGE, install=INSTALL,
          style=dict(color=YELLOW, marker="o", linestyle="--"), order=51)
def quack_chunked(e, c, targets, *, bias=None, softcap=None, ignore_index=-100):
    from quack.linear_cross_entropy import chunked_linear_cross_entropy

    return chunked_linear_cross_entropy(e, c, targets, chunk_size=CHUNK,
                                        ignore_index=ignore_index, use_scaled_exp=False)
