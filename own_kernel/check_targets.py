"""Target check and count, one program: out[0] = 1 if any target is outside [0, V) and is not
ignore_index, else 0; out[1] = the number of targets that are not ignore_index (the mean's
divisor). One launch instead of six elementwise ops and a reduction; N int64 reads are
microseconds even on one SM."""
import triton
import triton.language as tl


@triton.jit
def cce_check_targets_kernel(Targets, Out, N, V, ignore_index, BLOCK: tl.constexpr):
    bad = tl.zeros((BLOCK,), dtype=tl.int32)
    count = tl.zeros((BLOCK,), dtype=tl.int32)
    for start in range(0, N, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < N
        t = tl.load(Targets + offs, mask=mask, other=ignore_index)
        used = mask & (t != ignore_index)
        bad = tl.maximum(bad, (used & ((t < 0) | (t >= V))).to(tl.int32))
        count += used.to(tl.int32)
    tl.store(Out, tl.max(bad, axis=0).to(tl.float32))
    tl.store(Out + 1, tl.sum(count, axis=0).to(tl.float32))
