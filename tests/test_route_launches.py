"""What runs is what ``own_kernel.plan`` names. Over the routes the interpreter reaches (paths x
entries x forward kernels x W writers x the three-matmul path's logits formats x the filter),
the Triton kernels a call launches are spied on and compared with the route ``plan()`` returns
for the same arguments; and the paths follow the route where it names something else than the
config would (a path that decided again, from the config or the tensors, would not). Hopper's
decisions (shifted logits by default, filtered calls kept off the three-matmul path) are forced
on the interpreter's config through the config's overrides."""
from __future__ import annotations

import os
from dataclasses import dataclass

import pytest
import torch

if not torch.cuda.is_available():  # before triton is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

import own_kernel  # noqa: E402
from own_kernel.kernels import (dlogits, dlogits_tma, forward, forward_tma,  # noqa: E402
                                logits_grad, softmax_grad, target_shifted_grad)
from own_kernel.policy import route as route_module  # noqa: E402
from own_kernel.policy.config import overridden  # noqa: E402

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
N, D, V = 24, 16, 90  # several vocabulary chunks and a tail on the interpreter's config

# The kernels a route chooses between: (module, kernel) -> (the route's field, the name it uses)
KERNELS = {
    (forward, "cce_fwd_kernel"): ("forward", "pointer"),
    (forward_tma, "cce_fwd_tma_kernel"): ("forward", "tma"),
    (dlogits, "cce_dlogits_kernel"): ("writer", "pointer"),
    (dlogits_tma, "cce_dlogits_tma_kernel"): ("writer", "tma"),
    (softmax_grad, "cce_softmax_grad_kernel"): ("writer", "cublas"),
    (logits_grad, "_logits_to_grad_kernel"): ("logits", "cublas"),
    (logits_grad, "_shifted_to_grad_kernel"): ("logits", "shifted"),
    (target_shifted_grad, "_target_shifted_partials_kernel"): ("logits", "target-shifted"),
    (target_shifted_grad, "_target_shifted_grad_kernel"): ("logits", "target-shifted"),
}


@dataclass(frozen=True)
class Launch:
    role: str          # forward, writer or logits
    name: str          # the route's name of the kernel
    filters: bool      # launched as filtering (FILTER)
    stores_y: bool     # the TMA forward writing the shifted logits (STORE_Y)


class _Spy:
    """A Triton kernel that records each launch, then launches the real one."""

    def __init__(self, real, role, name, seen):
        self.real, self.role, self.name, self.seen = real, role, name, seen

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.seen.append(Launch(self.role, self.name, bool(kwargs.get("FILTER", False)),
                                    bool(kwargs.get("STORE_Y", False))))
            return self.real[grid](*args, **kwargs)
        return launch


@pytest.fixture
def launches(monkeypatch):
    seen: list[Launch] = []
    for (module, kernel), (role, name) in KERNELS.items():
        monkeypatch.setattr(module, kernel, _Spy(getattr(module, kernel), role, name, seen))
    return seen


def _inputs(dtype=torch.float32, misaligned=False, seed=0):
    """Peaked rows (the filter has columns to skip); misaligned: e's base 4 bytes off a 16-byte
    boundary (an offset view: no TMA descriptor can read it)."""
    g = torch.Generator().manual_seed(seed)
    c = torch.randn(V, D, generator=g)
    t = torch.randint(0, V, (N,), generator=g)
    e = (3.0 * c[t] / c[t].norm(dim=1, keepdim=True)
         + 0.3 * torch.randn(N, D, generator=g)).to(DEV, dtype)
    if misaligned:  # one element into a buffer of its own
        e = torch.cat([e.new_zeros(1), e.reshape(-1)])[1:].view(N, D)
    return e.requires_grad_(), c.to(DEV, dtype).requires_grad_(), t.to(DEV)


def _named(r) -> dict:
    """The kernels route r names: forward kernels, logits kernels, W writers, whether any
    launch filters."""
    if r.path == "three-matmul":
        logits = r.logits if r.logits in ("shifted", "target-shifted") else "cublas"
        return dict(forward={"tma"} if r.forward == "tma" else set(),
                    logits={logits}, writers=set(),
                    filters=r.filter is not None, stores_y=r.logits == "shifted")
    writers = set()
    if r.path == "recompute":
        writers = {r.tail_writer if ch.in_tail else r.writer
                   for ch in r.vocab_chunks(r.filter is not None)}
    elif r.path == "low-memory":
        writers = {r.writer}
    return dict(forward={r.forward}, logits=set(), writers=writers,
                filters=r.filter is not None, stores_y=False)


def _ran(seen: list[Launch]) -> dict:
    return dict(forward={x.name for x in seen if x.role == "forward"},
                logits={x.name for x in seen if x.role == "logits"},
                writers={x.name for x in seen if x.role == "writer"},
                filters=any(x.filters for x in seen),
                stores_y=any(x.stores_y for x in seen if x.role == "forward"))


def _run(fn, e, c, t, options):
    out = fn(e, c, t, **options)
    loss = out if isinstance(out, torch.Tensor) else out[0]
    if loss.requires_grad:
        loss.sum().backward()


# (name, config override, input dtype, misaligned e, call options, the path plan() must name)
CASES = [
    ("recompute tma", {}, torch.float32, False, {}, "recompute"),
    ("recompute tma filtered", {}, torch.float32, False, dict(filter_eps=1e-9), "recompute"),
    ("recompute pointer fwd cublas writer", {"forward": {"tma": False},
                                             "chunks": {"recompute": "cublas"}},
     torch.float32, False, {}, "recompute"),
    ("recompute cublas filtered", {"chunks": {"recompute": "cublas"}}, torch.float16, False,
     dict(filter_eps=1e-9), "recompute"),
    ("recompute misaligned e", {}, torch.float32, True, {}, "recompute"),
    ("recompute fp16 reduction none", {}, torch.float16, False, dict(reduction="none"),
     "recompute"),
    ("low-memory tma", {}, torch.float16, False, dict(low_memory=True), "low-memory"),
    ("low-memory pointer", {"chunks": {"recompute": "cublas"}}, torch.float32, False,
     dict(low_memory=True), "low-memory"),
    ("low-memory misaligned e", {}, torch.float32, True, dict(low_memory=True), "low-memory"),
    ("forward-only", {}, torch.float32, False, dict(reduction="none"), "forward-only"),
    ("three-matmul fp32", {}, torch.float32, False, dict(workspace_mib=8), "three-matmul"),
    ("three-matmul fp32 logits", {}, torch.float16, False, dict(workspace_mib=8),
     "three-matmul"),
    ("three-matmul 16-bit logits", {"fused": {"logits_fp32": False}}, torch.float16, False,
     dict(workspace_mib=8), "three-matmul"),
    ("three-matmul shifted", {"fused": {"logits_shifted": True}}, torch.float16, False,
     dict(workspace_mib=8), "three-matmul"),
    ("three-matmul shifted misaligned e", {"fused": {"logits_shifted": True}}, torch.float16,
     True, dict(workspace_mib=8), "three-matmul"),
    ("three-matmul target-shifted", {"fused": {"target_shift": True}}, torch.float16, False,
     dict(workspace_mib=8), "three-matmul"),
    ("three-matmul filtered, chunks", {"fused": {"max_rows": 8}}, torch.float16, False,
     dict(workspace_mib=8, filter_eps=1e-9), "three-matmul"),
    # Hopper's decisions on the interpreter: the default budget, shifted logits, filtered
    # calls kept on the recompute path unless given a budget, and filter_eps="auto" running
    # exact where the exact call takes the three-matmul path
    ("hopper default", {"fused": {"logits_shifted": True, "default_workspace_mib": 8}},
     torch.float16, False, {}, "three-matmul"),
    ("hopper filtered", {"fused": {"logits_shifted": True, "default_workspace_mib": 8}},
     torch.float16, False, dict(filter_eps=1e-9), "recompute"),
    ("batch invariant", {}, torch.float32, False, dict(batch_invariant=True), "recompute"),
    ("batch invariant fp16 reduction none", {}, torch.float16, False,
     dict(batch_invariant=True, reduction="none"), "recompute"),
    # the pinned TMA kernels read an aligned copy of e (Route.needs_tma_copies)
    ("batch invariant misaligned e", {}, torch.float32, True, dict(batch_invariant=True),
     "recompute"),
    ("hopper auto filter runs exact", {"fused": {"logits_shifted": True,
                                                 "default_workspace_mib": 8}},
     torch.float16, False, dict(filter_eps="auto"), "three-matmul"),
]


@pytest.mark.skipif(DEV.type == "cuda", reason="the interpreter's config: a GPU's targets "
                    "plan other chunks at these sizes (tests/test_route.py covers them)")
@pytest.mark.parametrize("name, override, dtype, misaligned, options, path", CASES,
                         ids=[c[0] for c in CASES])
def test_the_eager_call_launches_what_plan_names(launches, monkeypatch, name, override, dtype,
                                                 misaligned, options, path):
    routes = []
    real_route = route_module.route
    monkeypatch.setattr(own_kernel.api, "route", lambda *a: routes.append(real_route(*a))
                        or routes[-1])
    e, c, t = _inputs(dtype, misaligned)
    with overridden(override):
        if name == "forward-only":
            with torch.no_grad():
                planned = own_kernel.plan(e, c, t, **options)
                _run(own_kernel.linear_cross_entropy, e, c, t, options)
        else:
            planned = own_kernel.plan(e, c, t, **options)
            _run(own_kernel.linear_cross_entropy, e, c, t, options)
    assert planned.path == path and planned.entry in ("eager", "fused")
    assert routes[-1] == planned, "plan() is the call's own route"
    assert _ran(launches) == _named(planned), (planned, launches)
    if misaligned:  # a misaligned e reaches no TMA kernel: pointer kernels, or a copy of it
        copied = planned.fused_copies[0] or options.get("batch_invariant", False)
        assert planned.call.e_tma_ready is False and planned.forward != "tma" or copied
        if options.get("batch_invariant"):  # the pinned TMA kernels read an aligned copy
            assert planned.call.e_tma_ready is True and planned.forward == "tma"
    if path == "recompute" and planned.filter is None:  # one W launch per chunk
        chunks = planned.vocab_chunks(False)
        assert sum(x.role == "writer" for x in launches) == len(chunks)


@pytest.mark.skipif(DEV.type == "cuda", reason="the interpreter's config (see above)")
@pytest.mark.parametrize("options", [{}, dict(low_memory=True), dict(filter_eps=1e-9)],
                         ids=["recompute", "low-memory", "filtered"])
def test_the_compiled_entry_launches_what_plan_names(launches, options):
    """Under torch.compile each custom op routes its own real tensors: the same kernels as the
    eager call's plan. (fp32: compiled graphs hand the backward a materialised upstream
    gradient, whose per-row weights keep an fp16 call exact: Route.backward_filter.)"""
    e, c, t = _inputs(torch.float32)
    planned = own_kernel.plan(e, c, t, **options)
    torch._dynamo.reset()
    fn = torch.compile(lambda e, c, t: own_kernel.linear_cross_entropy(e, c, t, **options),
                       backend="aot_eager")
    _run(lambda e, c, t: fn(e, c, t), e, c, t, {})
    assert _ran(launches) == _named(planned), (planned, launches)


@pytest.mark.skipif(DEV.type == "cuda", reason="the interpreter's config (see above)")
def test_the_vocab_parallel_entry_launches_what_plan_names(launches, monkeypatch):
    import torch.distributed as dist

    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(29700 + os.getpid() % 1000))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        e, c, t = _inputs()
        vp = own_kernel.VocabParallel(None, 0, V)
        planned = own_kernel.plan(e, c, t, vocab_parallel=vp)
        _run(own_kernel.linear_cross_entropy, e, c, t, dict(vocab_parallel=vp))
    finally:
        dist.destroy_process_group()
    assert planned.entry == "vocab-parallel"
    assert _ran(launches) == _named(planned), (planned, launches)


@pytest.mark.skipif(DEV.type == "cuda", reason="the interpreter's config (see above)")
def test_rows_gathered_at_run_time_take_the_routes_choice_for_them(launches, monkeypatch):
    """Gathering the rows with a target depends on their count, read on the device: the route
    says it may happen and chooses the gathered rows' kernels (Route.for_rows)."""
    derived = []
    real_for_rows = route_module.Route.for_rows
    monkeypatch.setattr(route_module.Route, "for_rows",
                        lambda self, n: derived.append(real_for_rows(self, n)) or derived[-1])
    e, c, t = _inputs(misaligned=True)  # the gathered copy is aligned: the TMA forward
    t[::2] = -100
    planned = own_kernel.plan(e, c, t)
    assert planned.reads_count_before_forward and planned.forward == "pointer"
    _run(own_kernel.linear_cross_entropy, e, c, t, {})
    assert len(derived) == 1 and derived[0].call.n == N // 2
    assert _ran(launches) == _named(derived[0]) and derived[0].forward == "tma"


# ---- the paths follow the route ----------------------------------------------------------------

def _forced(monkeypatch, field, value):
    monkeypatch.setattr(route_module.Route, field, property(lambda self: value))


@pytest.mark.skipif(DEV.type == "cuda", reason="the interpreter's config (see above)")
@pytest.mark.parametrize("field, value, options, kernel", [
    ("forward", "pointer", {}, ("forward", "pointer")),
    ("writer", "cublas", {}, ("writer", "cublas")),
    ("writer", "pointer", dict(low_memory=True), ("writer", "pointer")),
    ("tail_writer", "pointer", {}, ("writer", "pointer")),
])
def test_the_paths_launch_the_routes_choice_not_the_configs(launches, monkeypatch, field,
                                                            value, options, kernel):
    """The interpreter's config asks for TMA everywhere and the inputs allow it: a route that
    names another kernel must get it (a path deciding again would launch TMA)."""
    e, c, t = _inputs()
    _forced(monkeypatch, field, value)
    _run(own_kernel.linear_cross_entropy, e, c, t, options)
    role, name = kernel
    assert name in {x.name for x in launches if x.role == role}, launches
    if field == "forward":
        assert {x.name for x in launches if x.role == "forward"} == {"pointer"}


@pytest.mark.skipif(DEV.type == "cuda", reason="the interpreter's config (see above)")
@pytest.mark.parametrize("options", [dict(filter_eps=1e-9), dict(filter_eps=1e-9, workspace_mib=8)],
                         ids=["recompute", "three-matmul"])
def test_the_filter_runs_only_where_the_route_says(launches, monkeypatch, options):
    e, c, t = _inputs()
    _run(own_kernel.linear_cross_entropy, e, c, t, options)
    assert any(x.filters for x in launches)
    launches.clear()
    _forced(monkeypatch, "filter", None)
    _run(own_kernel.linear_cross_entropy, e, c, t, options)
    assert launches and not any(x.filters for x in launches)
