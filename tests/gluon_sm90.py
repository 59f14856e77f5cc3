"""What the Gluon kernels' tests share (test_forward_ws.py, test_dlogits_ws.py): the device the
GPU cases run on, their skip, and the CPU's check of a kernel: compiled for sm90 in a process of
its own; and the memory order of a PTX's global atomics (test_determinism.py's too)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import torch

DEV = torch.device(os.environ.get("CCE_TEST_DEVICE", "cpu"))
ON_HOPPER = DEV.type == "cuda" and torch.cuda.get_device_capability(DEV)[0] == 9
NEEDS_HOPPER = pytest.mark.skipif(
    not ON_HOPPER, reason="runs the Gluon kernel: needs CCE_TEST_DEVICE=cuda on an sm90 GPU "
                          "(Gluon has no CPU interpreter; test_compiles_for_sm90 checks it here)")


def compiled_for_sm90(script: str, *argv: str) -> dict:
    """The JSON object the script prints last, run in a process without the interpreter (which
    would turn the Gluon functions into interpreted ones), from the repository's root."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    out = subprocess.run([sys.executable, "-c", script, *argv], env=env, capture_output=True,
                         text=True, timeout=600,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


ORDERS = ("relaxed", "acquire", "release", "acq_rel", "sc")


def global_atomic_orders(ptx: str) -> list:
    """The memory order of each global atom / red instruction in the PTX (PTX's default,
    relaxed, where none is written), whichever order of qualifiers the Triton writes."""
    found = []
    for quals in re.findall(r"\b(?:atom|red)((?:\.[\w:]+)+)", ptx):
        if ".global" in quals:
            named = [q for q in quals.split(".") if q in ORDERS]
            found.append(named[0] if named else "relaxed")
    return found
