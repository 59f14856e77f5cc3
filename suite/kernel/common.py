"""What the kernel tools share: the call they make, the CUDA check and the three-matmul path's
logits kinds."""
from __future__ import annotations

# The three-matmul path's logits kinds (route.LOGITS' names), each as the config.Fused overrides
# that pin it whatever the config's default (Hopper's is shifted, the portable one's
# target-shifted; shifted logits need the TMA forward, target-shifted ones no bias or filter)
LOGITS_OVERRIDES = {
    "fp32": {"logits_shifted": False, "target_shift": False, "logits_fp32": True},
    "input": {"logits_shifted": False, "target_shift": False, "logits_fp32": False},
    "shifted": {"logits_shifted": True},
    "target-shifted": {"logits_shifted": False, "target_shift": True},
}


def require_cuda(tool: str) -> None:
    import torch

    if not torch.cuda.is_available():
        raise SystemExit(f"python -m suite kernel {tool} needs a CUDA device")


def add_call_arguments(ap, note: str = "") -> None:
    """The shape and options of the call a measuring tool makes (Gemma 2 (2B) by default)."""
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--d", type=int, default=2304)
    ap.add_argument("--v", type=int, default=256000)
    ap.add_argument("--softcap", type=float, default=30.0, help="0 = none")
    ap.add_argument("--filter", action="store_true", help=f"filter_eps='auto' instead of exact{note}")
    ap.add_argument("--low-memory", action="store_true", help=f"low_memory=True (exact){note}")
