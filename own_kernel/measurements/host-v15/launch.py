# Host cost per launch on this machine: tiny Triton kernels with few / many args / descriptors.
import time, torch, triton, triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

@triton.jit
def k3(X, n, BLOCK: tl.constexpr):
    o = tl.arange(0, BLOCK); tl.store(X + o, tl.load(X + o, mask=o < n), mask=o < n)

@triton.jit
def k30(X, A1, A2, A3, A4, A5, A6, A7, A8, A9, A10, n, i1, i2, i3, i4, i5, f1, f2, f3, f4,
        F1: tl.constexpr, F2: tl.constexpr, F3: tl.constexpr, F4: tl.constexpr, BLOCK: tl.constexpr):
    o = tl.arange(0, BLOCK); tl.store(X + o, tl.load(X + o, mask=o < n), mask=o < n)

@triton.jit
def kdesc(Xd, Yd, Zd, n, BLOCK: tl.constexpr):
    x = Xd.load([0, 0]); Zd.store([0, 0], x)

x = torch.zeros(1024, device="cuda")
m = torch.zeros(256, 256, device="cuda", dtype=torch.bfloat16)
def bench(name, fn, reps=2000):
    for _ in range(20): fn()
    torch.cuda.synchronize(); t0 = time.perf_counter()
    for _ in range(reps): fn()
    t1 = time.perf_counter(); torch.cuda.synchronize()
    print(f"{name:40s} {1e6*(t1-t0)/reps:7.1f} us/launch (host)")
a = [x] * 10
bench("triton 2 args", lambda: k3[(1,)](x, 1000, BLOCK=1024))
bench("triton 21 args + 4 constexpr", lambda: k30[(1,)](x, *a, 1000, 1, 2, 3, 4, 5, 1.0, 2.0, 3.0, 4.0, F1=True, F2=False, F3=True, F4=1, BLOCK=1024))
bench("triton 3 descriptors (made per launch)", lambda: kdesc[(1,)](*[TensorDescriptor.from_tensor(m, [64, 64])]*3, 1, BLOCK=64))
d = TensorDescriptor.from_tensor(m, [64, 64])
bench("triton 3 descriptors (reused)", lambda: kdesc[(1,)](d, d, d, 1, BLOCK=64))
bench("TensorDescriptor.from_tensor", lambda: TensorDescriptor.from_tensor(m, [64, 64]))
bench("torch.zeros(1024)", lambda: torch.zeros(1024, device="cuda"))
bench("torch.empty(1024)", lambda: torch.empty(1024, device="cuda"))
bench("x.add_(1)", lambda: x.add_(1))
mm = torch.zeros(64, 64, device="cuda", dtype=torch.bfloat16); acc = torch.zeros(64, 64, device="cuda")
bench("torch.addmm out_dtype fp32", lambda: torch.addmm(acc, mm, mm, out_dtype=torch.float32, out=acc))
bench("get_device_properties", lambda: torch.cuda.get_device_properties(x.device))
