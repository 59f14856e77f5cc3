"""The GPU's SM clock, board power and clock-event reasons, read through NVML while timed calls
run (`python -m suite kernel interleave --clocks`, `python -m suite bench --clocks`): whether a
kernel's time moves with the clock it ran at, and why the clock was where it was.

A GPU runs its SMs below their boost clock when the board reaches its power limit; a kernel
that keeps the tensor cores busier draws more power and may run at a lower clock than a slower
kernel. Timed in a process of its own, each kernel runs at the clock its own power sets; timed
between other kernels, at the clock their mix sets. ClockLog.during() reads the clock while the
device's stream still has the call's work (it waits for that work, so the next call starts on
an idle GPU); the samples are kept per entry. ClockLog.sampling() reads them from a thread
while a block of calls runs unsynchronised (suite bench's timed calls), so the calls' timing is
unchanged but for the thread's reads, which hold the GIL only between NVML calls.

NVML's Python module is nvidia-ml-py (`import pynvml`), one pure-Python wheel, loaded only here.
Power is nvmlDeviceGetPowerUsage's, which recent boards average over about a second: it follows
a block of one entry's calls, not one call among others.
"""
from __future__ import annotations

import contextlib
import statistics
import threading
import time
from dataclasses import dataclass

# NVML's clock-event reasons that lower the SM clock under load (nvml.h, ClocksEventReason*)
LIMITING_REASONS = {0x4: "power_cap", 0x8: "hw_slowdown", 0x20: "sw_thermal",
                    0x40: "hw_thermal", 0x80: "power_brake"}
POLL_S = 0.0005
SAMPLING_PERIOD_S = 0.002   # sampling(): reads more often would take the GIL from launches more


@dataclass(frozen=True)
class Sample:
    sm_mhz: int
    power_w: float
    reasons: int        # NVML's clock-event reason bits


def summary(samples: list[Sample]) -> dict:
    """An entry's columns: the median SM clock and power of its samples, the fraction of them
    with a limiting reason set, and those reasons by name."""
    if not samples:
        return {}
    seen = 0
    for s in samples:
        seen |= s.reasons
    # the median's int: an even count's median is a float, which the CSV would print apart
    return {"sm_mhz": round(statistics.median(s.sm_mhz for s in samples)),
            "power_w": round(statistics.median(s.power_w for s in samples), 1),
            "clock_limited": round(sum(bool(s.reasons & sum(LIMITING_REASONS)) for s in samples)
                                   / len(samples), 3),
            "clock_reasons": "+".join(name for bit, name in LIMITING_REASONS.items()
                                      if seen & bit)}


def unavailable(device) -> str:
    """Why NVML cannot read this device's clock here, or "" where it can (NVML initialised)."""
    import torch
    if torch.device(device).type != "cuda":
        return "NVML reads a GPU's clock: it needs a CUDA device"
    try:
        import pynvml
    except ImportError:
        return "needs NVML's Python module: pip install nvidia-ml-py"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return f"NVML does not answer here ({exc})"
    return ""


class ClockLog:
    """NVML samples per entry name, for one device (found by its PCI bus id, as NVML numbers
    devices without CUDA_VISIBLE_DEVICES)."""

    def __init__(self, device):
        import torch
        reason = unavailable(device)   # "" leaves NVML initialised
        if reason:
            raise SystemExit(f"--clocks: {reason}")
        import pynvml
        self._nvml = pynvml
        p = torch.cuda.get_device_properties(device)
        bus = f"{p.pci_domain_id:08X}:{p.pci_bus_id:02X}:{p.pci_device_id:02X}.0"
        self._handle = pynvml.nvmlDeviceGetHandleByPciBusId(bus)
        self._reasons = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            pynvml.nvmlDeviceGetCurrentClocksThrottleReasons
        self.samples: dict[str, list[Sample]] = {}

    def read(self) -> Sample:
        nv, h = self._nvml, self._handle
        return Sample(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
                      nv.nvmlDeviceGetPowerUsage(h) / 1000.0, self._reasons(h))

    def during(self, name: str, device) -> None:
        """Samples while the device's current stream has work (one after it, where the work ended
        before the first); returns when the stream is idle."""
        import torch
        stream = torch.cuda.current_stream(device)
        got, taken = self.samples.setdefault(name, []), False
        while not stream.query():
            got.append(self.read())
            time.sleep(POLL_S)
            taken = True
        if not taken:
            got.append(self.read())

    @contextlib.contextmanager
    def sampling(self, name: str, period_s: float = SAMPLING_PERIOD_S):
        """Samples under name every period_s from a thread, while the block runs (one read as
        it ends, where the block was too short for the thread's first)."""
        got, stop = self.samples.setdefault(name, []), threading.Event()

        def loop():
            while not stop.wait(period_s):
                got.append(self.read())

        thread = threading.Thread(target=loop, name="nvml-clocks", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()
            if not got:
                got.append(self.read())
