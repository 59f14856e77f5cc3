# ncu target: one forward at a shape, under CCE_OWN_CONFIG (set by the caller)
import sys, torch
from own_kernel.configs import config_for
from own_kernel.forward import forward
from suite.inputs import make_inputs
n, d, v = map(int, sys.argv[1:4])
x = make_inputs("lm", n, d, v, "bf16", seed=0, device=torch.device("cuda"), softcap=None)
cfg = config_for(x["e"].device, torch.bfloat16)
for _ in range(2):
    forward(x["e"], x["c"], None, x["targets"], None, 0.0, -100, cfg)
torch.cuda.synchronize()
