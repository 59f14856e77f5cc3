"""The pointer kernels' k-loop in SASS, compiled for a GPU architecture without a GPU:
`python -m suite kernel sass [--kernel fwd|dlogits] [--arch 90,80] [--tiles 128x256x64x8x3]
[--variants 'stepped={"forward": {"fixed_base_loads": false}}'] [--out sass.csv]`.

Per architecture and variant (the base config, PORTABLE unless --target says otherwise, and
each NAME=JSON override on top of it), the kernel is compiled with the constexprs its launcher
passes for plain bf16 logits (no bias, softcap or extra sums; D a multiple of the tile's depth;
unit inner strides, 16-aligned pointers and row strides, as Triton specialises a real head),
disassembled with the nvdisasm bundled with Triton, and its k-loop counted: the innermost
loop around the first tensor-core instruction (HGMMA on sm90, HMMA before it), from its label
to the branch back. A static count, not a timing: it says what one k-step issues, which a
profile (ncu's source counters) then weighs. Prints the rows; --out also writes them as CSV.
"""
from __future__ import annotations

import collections
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass

from suite.report.log_csv import csv_text

COLUMNS = ("kernel", "arch", "entry", "tiles", "loop_instructions", "loop_top_ops",
           "kernel_instructions", "shared_bytes", "triton")
MMA_OPS = ("HGMMA", "HMMA")
SIZES = ("N", "V", "D")  # the kernels' int32 sizes; their other capitalised arguments are pointers
_LABEL = re.compile(r"^\s*(\.L_x_\d+):")
_INSTRUCTION = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;")  # addresses: 4 hex digits or more
_OPCODE = re.compile(r"^(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)")


def instructions(sass: str) -> list[tuple[str, str]]:
    """nvdisasm's text as [("label", name) | ("op", instruction text)], in order."""
    out = []
    for line in sass.splitlines():
        label = _LABEL.match(line)
        if label:
            out.append(("label", label.group(1)))
            continue
        ins = _INSTRUCTION.search(line)
        if ins:
            out.append(("op", ins.group(1)))
    return out


def opcode(text: str) -> str:
    """An instruction's opcode without its predicate and modifiers: `@P0 LDGSTS.E.128` ->
    LDGSTS."""
    match = _OPCODE.match(text)
    if not match:
        raise ValueError(f"no opcode in SASS instruction {text!r}")
    return match.group(1)


def mma_loop(sass: str) -> collections.Counter:
    """Opcode counts of the innermost loop around the first tensor-core instruction: the
    nearest label before it that a branch after it jumps back to, up to that branch."""
    items = instructions(sass)
    first = next((i for i, (kind, text) in enumerate(items)
                  if kind == "op" and opcode(text) in MMA_OPS), None)
    if first is None:
        raise ValueError(f"no tensor-core instruction ({', '.join(MMA_OPS)}) in the SASS")
    for start in range(first, -1, -1):
        kind, name = items[start]
        if kind != "label":
            continue
        back = next((j for j in range(first, len(items)) if items[j][0] == "op"
                     and opcode(items[j][1]) == "BRA" and f"({name})" in items[j][1]), None)
        if back is not None:
            return collections.Counter(opcode(text) for kind, text in items[start + 1:back + 1]
                                       if kind == "op")
    raise ValueError("no loop (label and branch back) around the first tensor-core instruction")


@dataclass(frozen=True)
class KernelSpec:
    """What it takes to compile one pointer kernel outside its launcher."""
    name: str
    pointers_16bit: tuple[str, ...]   # the inputs' dtype; other pointers fp32 (Targets int64)
    floats: tuple[str, ...]           # fp32 scalars; other scalars int32
    aligned: tuple[str, ...]          # int32 scalars specialised as multiples of 16

    def kernel(self):
        if self.name == "fwd":
            from own_kernel.kernels.forward import cce_fwd_kernel
            return cce_fwd_kernel
        from own_kernel.kernels.dlogits import cce_dlogits_kernel
        return cce_dlogits_kernel


SPECS = {
    "fwd": KernelSpec("fwd", ("E", "C"), ("tanh_scale", "cap"),
                      ("D", "stride_en", "stride_cv")),
    "dlogits": KernelSpec("dlogits", ("E", "C", "W"), ("tanh_scale", "cap", "smooth"),
                          ("D", "stride_en", "stride_cv", "stride_wn")),
}


def launch_constexprs(kernel: str, cfg) -> tuple[dict, object]:
    """The constexprs the kernel's launcher passes for plain bf16 logits under cfg, with unit
    inner strides; and the tiles (a config.Tiles) it launches."""
    if kernel == "fwd":
        tiles, f = cfg.forward.tiles, cfg.forward
        flags = dict(HAS_BIAS=False, HAS_SOFTCAP=False, NEED_ZSUM=False, NEED_ENT=False,
                     SKIP_IGNORED=False, FLATTEN=f.flatten, PARTS=1, HALVES=False,
                     IN_BOUNDS=f.in_bounds_loads, FIXED_BASE=f.fixed_base_loads)
    else:
        tiles = cfg.dlogits
        flags = dict(HAS_BIAS=False, HAS_SOFTCAP=False, HAS_GRAD_LSE=False, HAS_ENTROPY=False,
                     COL_ROUND=True, DETERMINISTIC=False, TILES=cfg.dlogits_tiles_per_program,
                     IN_BOUNDS=cfg.dlogits_in_bounds_loads,
                     FIXED_BASE=cfg.dlogits_fixed_base_loads)
    consts = dict(flags, BLOCK_N=tiles.block_n, BLOCK_V=tiles.block_v, BLOCK_D=tiles.block_d,
                  DOT_PRECISION="tf32", EVEN_D=True, stride_ed=1, stride_cd=1)
    return consts, tiles


def compile_cubin(spec: KernelSpec, consts: dict, tiles, arch: int):
    """The compiled kernel (Triton's CompiledKernel) for sm<arch>."""
    from triton import compile as triton_compile
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = spec.kernel()
    names = [p.name for p in fn.params]
    unknown = sorted(set(consts) - set(names))
    if unknown:
        raise ValueError(f"{spec.name}: no such kernel arguments: {', '.join(unknown)}")
    signature = {}
    for p in fn.params:
        if p.is_constexpr or p.name in consts:
            signature[p.name] = "constexpr"
        elif p.name in spec.pointers_16bit:
            signature[p.name] = "*bf16"
        elif p.name == "Targets":
            signature[p.name] = "*i64"
        elif p.name[0].isupper() and p.name not in SIZES:
            signature[p.name] = "*fp32"
        else:
            signature[p.name] = "fp32" if p.name in spec.floats else "i32"
    aligned = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(names)
               if signature[name].startswith("*") or name in spec.aligned}
    src = ASTSource(fn, signature, consts, attrs=aligned)
    return triton_compile(src, target=GPUTarget("cuda", arch, 32),
                          options=dict(num_warps=tiles.num_warps, num_stages=tiles.num_stages))


def disassemble(cubin: bytes) -> str:
    """nvdisasm's text of a cubin, with the nvdisasm Triton bundles."""
    import triton
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin",
                        "nvdisasm")
    if not os.path.exists(tool):
        raise FileNotFoundError(f"nvdisasm: not at {tool} (this Triton has no NVIDIA backend)")
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "kernel.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        return subprocess.run([tool, "-c", path], capture_output=True, text=True,
                              check=True).stdout


def sass_row(kernel: str, arch: int, entry: str, cfg) -> dict:
    """One COLUMNS row: the kernel compiled under cfg for sm<arch>, its k-loop counted."""
    import triton

    consts, tiles = launch_constexprs(kernel, cfg)
    compiled = compile_cubin(SPECS[kernel], consts, tiles, arch)
    sass = disassemble(compiled.asm["cubin"])
    loop = mma_loop(sass)
    everything = [opcode(text) for kind, text in instructions(sass) if kind == "op"]
    return dict(kernel=kernel, arch=f"sm{arch}", entry=entry,
                tiles=(f"{tiles.block_n}x{tiles.block_v}x{tiles.block_d}"
                       f" w{tiles.num_warps} s{tiles.num_stages}"),
                loop_instructions=sum(loop.values()),
                loop_top_ops=" ".join(f"{op}:{n}" for op, n in loop.most_common(8)),
                kernel_instructions=len(everything), shared_bytes=compiled.metadata.shared,
                triton=triton.__version__)


def add_arguments(ap) -> None:
    ap.add_argument("--kernel", default="fwd", choices=sorted(SPECS),
                    help="the pointer forward (forward.py) or W writer (dlogits.py); "
                         "default %(default)s")
    ap.add_argument("--arch", default="90,80",
                    help="comma-separated compute capabilities, e.g. 90 (H100/H200), 80 (A100)")
    ap.add_argument("--tiles", default="",
                    help="BNxBVxBDxWARPSxSTAGES for the kernel in every variant "
                         "(default: each config's own)")
    ap.add_argument("--variants", nargs="*", default=[],
                    help="NAME=JSON config overrides, each compiled beside the base ({})")
    ap.add_argument("--target", default="portable", choices=("hopper-16bit", "portable"),
                    help="the config the variants override (default %(default)s)")
    ap.add_argument("--out", default="", help="also write the rows to this CSV")


def tiles_override(kernel: str, text: str) -> dict:
    """The config override that pins the kernel's tiles to BNxBVxBDxWARPSxSTAGES."""
    if not text:
        return {}
    parts = text.lower().split("x")
    if len(parts) != 5 or not all(p.isdigit() for p in parts):
        raise SystemExit(f"--tiles: expected BNxBVxBDxWARPSxSTAGES, e.g. 128x256x64x8x3, "
                         f"got {text!r}")
    tiles = dict(zip(("block_n", "block_v", "block_d", "num_warps", "num_stages"),
                     map(int, parts)))
    return {"forward": {"tiles": tiles}} if kernel == "fwd" else {"dlogits": tiles}


def main(args) -> int:
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise SystemExit("kernel sass compiles for a GPU: run it without TRITON_INTERPRET=1 "
                         "(under the interpreter Triton's kernels are Python functions)")
    from own_kernel.policy.config import HOPPER_16BIT, PORTABLE, with_overrides
    from suite.kernel.interleave import parse_variants

    try:
        arches = [int(a) for a in args.arch.split(",")]
    except ValueError:
        raise SystemExit(f"--arch: expected comma-separated integers, got {args.arch!r}")
    pin = tiles_override(args.kernel, args.tiles)
    base = HOPPER_16BIT if args.target == "hopper-16bit" else PORTABLE
    try:
        pinned = with_overrides(base, pin) if pin else base
        configs = [(name, with_overrides(pinned, ov) if ov else pinned)
                   for name, ov in parse_variants(args.variants)]
    except (TypeError, ValueError) as exc:
        raise SystemExit(f"--variants: {exc}") from None
    rows = [sass_row(args.kernel, arch, name, cfg) for arch in arches for name, cfg in configs]
    text = csv_text(rows, COLUMNS)
    print(text, end="")
    if args.out:
        with open(args.out, "w", newline="") as f:
            f.write(text)
    return 0
