"""Triton kernels, each with its thin launcher: every choice (tiles, flags, buffers) an
argument; nothing decided here (the route decides: own_kernel/policy/route.py)."""
