"""The one measurement path every provider goes through.

For each phase (schema.PHASES) of one provider on one cell:
1. ``warmup`` untimed calls (compilation, autotuning, allocator warm-up);
2. one call measured for memory (CUDA: peak over what was allocated just before) whose loss and
   gradients are checked against the reference (accuracy + non-finite detection);
3. ``reps`` timed calls: CUDA events around the phase only, L2 flushed and grads cleared
   outside the timed region; for ``grad`` the forward runs untimed before each backward.
A failure (OOM, compile error, non-finite output) becomes the row's status; memory is freed so
the next provider starts clean.
"""
from __future__ import annotations

import contextlib
import gc
import math
import statistics
import sys
import time

import torch

from suite.reference import loss_rel_err, rel_err
from suite.registry import UnsupportedInput
from suite.schema import PHASE_MATMULS, PHASES

MIB = 2 ** 20
L2_FLUSH_BYTES = 256 * MIB  # larger than any GPU's L2 (H100: 50 MiB, H200: 60 MiB)
GRAD_PHASES = ("grad", "loss+grad")


def is_oom(exc: BaseException) -> bool:
    """An allocation failure: torch's OOM, the CPU allocator's, or cuBLAS failing to allocate
    its workspace (seen in training steps at the edge of memory)."""
    if isinstance(exc, (torch.cuda.OutOfMemoryError, MemoryError)):
        return True
    return isinstance(exc, RuntimeError) and is_oom_text(str(exc))


def is_oom_text(text: str) -> bool:
    """is_oom for an error known only by its text (e.g. a child process's traceback)."""
    return ("out of memory" in text.lower() or "can't allocate memory" in text.lower()
            or "CUBLAS_STATUS_ALLOC_FAILED" in text or "OutOfMemoryError" in text)


def one_line(exc: BaseException, limit: int = 300) -> str:
    lines = str(exc).strip().splitlines()
    text = f"{type(exc).__name__}: {lines[0] if lines else ''}"
    return text if len(text) <= limit else text[:limit - 3] + "..."


def free_memory(device: torch.device, collect: bool = True) -> None:
    """Return cached blocks to the driver; ``collect`` also runs the cycle collector first,
    which costs ~0.3 s once torch.compile is loaded, so phases that ended cleanly skip it
    (refcounting has already freed their tensors)."""
    if collect:
        gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def reset_compiled():
    """Fresh torch.compile caches, for each shape a tool times: otherwise a second shape
    compiles with dynamic shapes (dynamo's automatic dynamic: generic kernels, which one shape
    at a time never needs), and over a grid the recompile limit is reached and the compiled
    providers silently fall back to eager."""
    if "torch._dynamo" in sys.modules:
        torch._dynamo.reset()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ---- timing --------------------------------------------------------------------------------

class RegionTimer:
    """Milliseconds of each timed region: CUDA events around it on a GPU (read back once, by
    :meth:`times`, so timing never synchronises), wall time on the CPU. A region that raises
    is not counted."""

    def __init__(self, device):
        self.device = torch.device(device)
        self._events, self._times = [], []

    @contextlib.contextmanager
    def region(self):
        if self.device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            yield
            end.record()
            self._events.append((start, end))
        else:
            t0 = time.perf_counter()
            yield
            self._times.append((time.perf_counter() - t0) * 1e3)

    def times(self) -> list[float]:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            return [s.elapsed_time(e) for s, e in self._events]
        return list(self._times)



def accuracy(phase: str, loss: float, x, ref: dict) -> tuple[dict, list[str]]:
    """({loss_rel_err, and in gradient phases de/dc/dbias_rel_err}, what came out non-finite):
    the measured call's loss and gradients (x's .grad) against the reference ``ref``."""
    errors = {"loss_rel_err": loss_rel_err(loss, ref["loss"])}
    bad = [] if math.isfinite(loss) else ["loss"]
    if phase in GRAD_PHASES:
        for key, got in (("de", x.e.grad), ("dc", x.c.grad),
                         ("dbias", None if x.bias is None else x.bias.grad)):
            if ref[key] is None:
                continue
            errors[f"{key}_rel_err"] = err = rel_err(got, ref[key])
            if not math.isfinite(err):
                bad.append(key if got is not None else f"{key} missing")
    return errors, bad

def time_calls(run, *, device, reps, prepare=None, flush_l2=True, sampling=None) -> list[float]:
    """Milliseconds of ``run(state)`` for ``reps`` repetitions, ``state = prepare()`` untimed;
    on a GPU the L2 cache is flushed before each (``flush_l2``), outside the timed region.
    ``sampling``: a context (clocks.ClockLog.sampling) held while the calls run, until the GPU
    has finished them."""
    device = torch.device(device)
    prepare = prepare or (lambda: None)
    timer = RegionTimer(device)
    flush = None
    if device.type == "cuda" and flush_l2:
        flush = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device=device)
    with sampling or contextlib.nullcontext():
        for _ in range(reps):
            state = prepare()
            if flush is not None:
                flush.zero_()
            with timer.region():
                run(state)
            del state
        times = timer.times()   # waits for the GPU
    del flush
    return times


def percentile(xs, q):
    xs = sorted(xs)
    if len(xs) == 1:
        return xs[0]
    pos = q * (len(xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def time_stats(times) -> dict:
    return {"ms": statistics.median(times), "ms_p20": percentile(times, 0.2),
            "ms_p80": percentile(times, 0.8), "ms_min": min(times), "reps": len(times)}


def measure_floor(e, c, *, reps, warmup) -> dict:
    """One cuBLAS E @ C.T of the cell's shape and dtype, timed like a provider."""
    device = e.device
    with torch.no_grad():
        for _ in range(warmup):
            torch.mm(e, c.T)
        sync(device)
        return time_stats(time_calls(lambda _: torch.mm(e, c.T), device=device, reps=reps))


# ---- one provider ------------------------------------------------------------------------

class _Leaves:
    """The provider's inputs; leaves that require grad for the autograd phases."""

    def __init__(self, inputs, grad: bool):
        def leaf(t):
            return None if t is None else t.detach().requires_grad_(grad)

        self.e, self.c, self.bias = leaf(inputs["e"]), leaf(inputs["c"]), leaf(inputs["bias"])
        self.targets = inputs["targets"]

    def clear_grads(self):
        for t in (self.e, self.c, self.bias):
            if t is not None:
                t.grad = None


def _phase_calls(phase, fn, x: _Leaves, kwargs):
    """(prepare, run) for ``time_calls``: prepare is untimed, run is the timed phase."""
    def forward():
        return fn(x.e, x.c, x.targets, bias=x.bias, **kwargs)

    if phase == "fwd":
        def run(_):
            with torch.no_grad():
                forward()
        return x.clear_grads, run
    if phase == "loss":
        return x.clear_grads, lambda _: forward()
    if phase == "grad":
        def prepare():
            x.clear_grads()
            return forward()
        return prepare, lambda loss: loss.backward()
    if phase == "loss+grad":
        return x.clear_grads, lambda _: forward().backward()
    raise ValueError(f"phase must be one of {PHASES}, got {phase!r}")


def _memory_run(phase, fn, x: _Leaves, kwargs, device):
    """One call of the phase; returns (loss, peak_extra_mib, peak_abs_mib). Grads stay on x."""
    cuda = device.type == "cuda"
    x.clear_grads()
    sync(device)
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
    call = lambda: fn(x.e, x.c, x.targets, bias=x.bias, **kwargs)  # noqa: E731
    if phase == "fwd":
        with torch.no_grad():
            loss = call()
    elif phase == "loss":
        loss = call()  # kept alive with its graph until the peak is read
    elif phase == "grad":
        loss = call()
        if cuda:
            sync(device)
            torch.cuda.reset_peak_memory_stats(device)
            before = torch.cuda.memory_allocated(device)
        loss.backward()
    else:
        loss = call()
        loss.backward()
    sync(device)
    if not cuda:
        return float(loss.detach()), math.nan, math.nan
    peak = torch.cuda.max_memory_allocated(device)
    return float(loss.detach()), (peak - before) / MIB, peak / MIB


def clock_columns(clocks, name: str) -> dict:
    """The schema's clock columns of the samples clocks holds under name (taken out of it)."""
    if clocks is None:
        return {}
    from suite.clocks import summary

    got = summary(clocks.samples.pop(name, []))
    return {k: got[k] for k in ("sm_mhz", "clock_limited") if k in got}


def measure_provider(provider, inputs, ref, *, phases, softcap, ignore_index, reps, warmup,
                     floor_ms, n, v, d, clocks=None) -> list[dict]:
    """One dict of metrics (schema names) per phase for ``provider`` on ``inputs``; clocks (a
    clocks.ClockLog): the SM clock sampled while the timed calls run (sm_mhz, clock_limited)."""
    device = inputs["e"].device
    bias = inputs["bias"] is not None
    reason = provider.unavailable_reason(device)
    if reason:
        return [{"phase": p, "status": "unavailable", "error": reason} for p in phases]
    reason = provider.unsupported_reason(bias=bias, softcap=softcap, device=device)
    if reason:
        return [{"phase": p, "status": "unsupported", "error": reason} for p in phases]

    kwargs = {"softcap": softcap, "ignore_index": ignore_index}
    rows = []
    for phase in phases:
        row = {"phase": phase}
        failure = None
        x = _Leaves(inputs, grad=phase != "fwd")
        try:
            prepare, run = _phase_calls(phase, provider.fn, x, kwargs)
            for _ in range(warmup):
                run(prepare())
            loss, row["peak_extra_mib"], row["peak_abs_mib"] = _memory_run(
                phase, provider.fn, x, kwargs, device)
            errors, bad = accuracy(phase, loss, x, ref)
            row.update(errors)
            x.clear_grads()
            if bad:
                row.update(status="nan", error="non-finite " + ", ".join(bad))
            else:
                sampling = clocks.sampling(phase) if clocks is not None else None
                stats = time_stats(time_calls(run, device=device, reps=reps, prepare=prepare,
                                              sampling=sampling))
                row.update(stats)
                row.update(clock_columns(clocks, phase))
                row["status"] = "ok"
                row["tokens_per_s"] = n / (stats["ms"] / 1e3)
                row["tflops"] = PHASE_MATMULS[phase] * 2 * n * v * d / (stats["ms"] / 1e3) / 1e12
                if floor_ms:
                    row["floor_ms"] = floor_ms
                    if device.type == "cuda":  # a CPU time over the CPU's matmul means nothing
                        row["floor_ratio"] = stats["ms"] / floor_ms
        except UnsupportedInput as exc:  # inputs the peer does not take: not a failure
            failure = ("unsupported", str(exc))
        except Exception as exc:  # noqa: BLE001 - a failing provider is data, not a crash
            failure = ("oom" if is_oom(exc) else "error", one_line(exc))
        if failure:
            # Leave the except block first so the traceback (and the tensors its frames hold)
            # is gone before memory is freed.
            row = {"phase": phase, "status": failure[0], "error": failure[1]}
        if provider.ran is not None:
            row["ran"] = provider.ran()
        del x
        free_memory(device, collect=failure is not None)
        rows.append(row)
    free_memory(device)
    return rows
