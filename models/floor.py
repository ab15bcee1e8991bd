"""The floor of the Mamba-2 layer's non-SSD part (models/mamba2.py): its two projections' flops at a matmul rate plus
the bytes the conv, the norm and the glue between them must move at a DRAM bandwidth; and `measure_rates`, a card's
measured matmul rate and bandwidth (CUDA only).

Per part, with T = batch·seqlen tokens, e bytes per element of the layer's dtype, W = d_conv, H = nheads,
conv_dim = d_inner + 2·ngroups·d_state (the byte counts are the least any implementation moves: each input read
once, each output written once; the SSD's own reads of x, B, C, dt and its write of y belong to the SSD, not here):

  forward
    in_proj   GEMM   2·T·d_model·(2·d_inner + 2·ngroups·d_state + H) flops
    out_proj  GEMM   2·T·d_inner·d_model flops
    conv      bytes  T·conv_dim·e (read xBC) + T·conv_dim·e (write silu(conv)) + conv_dim·(W + 1)·e (weight, bias)
    norm      bytes  2·T·d_inner·e (read y, z) + T·d_inner·e (write) + d_inner·e (weight)
    glue      bytes  batch·conv_dim·(W − 1)·e (the conv's final states) + 3·H·4 (A = −exp(A_log), D, dt_bias
                     in fp32); the splits of in_proj's output into z, xBC, dt and of the conv's into x, B, C are
                     views (0 bytes)
  backward (the gradients of every input and parameter)
    in_proj, out_proj  GEMM   twice the forward's flops each (the input's gradient and the weight's)
    conv      bytes  2·T·conv_dim·e (read xBC, dout) + T·conv_dim·e (write dxBC) + 2·conv_dim·(W + 1)·e
    norm      bytes  3·T·d_inner·e (read y, z, dout) + 2·T·d_inner·e (write dy, dz) + 2·d_inner·e
    glue      bytes  0: dz, dxBC and ddt can be written into one (T, in_proj width) gradient, in place
  train = forward + backward, part by part.

Time per part: flops / matmul rate for the GEMMs, bytes / bandwidth for the rest; the floor is their sum (nothing
overlaps in it). What the parts above leave out (a kernel's own scratch: per-program partials of the parameter
gradients, the norm's saved 1/rms) is the implementation's cost, above the floor.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from impls import validate as check
from models.mamba2 import Mamba2Config

DIRECTIONS = ("forward", "backward", "train")


@dataclass(frozen=True)
class Rates:
    """A card's rates: dense matmul flops per second in the layer's dtype, DRAM bytes per second; `source` says
    where they come from (measured: the card, the GEMM shape and the copy size; or given)."""

    matmul_flops_per_s: float
    dram_bytes_per_s: float
    source: str = "given"


@dataclass(frozen=True)
class FloorPart:
    name: str  # "in_proj", "out_proj", "conv", "norm", "glue"
    direction: str  # "forward" or "backward"
    flops: float  # the GEMMs' (0 for the others)
    bytes: float  # the others' (0 for the GEMMs: their time is their flops')
    seconds: float


@dataclass(frozen=True)
class Floor:
    """The non-SSD floor of one layer call: its parts and the rates they were priced at."""

    config: Mamba2Config
    batch: int
    seqlen: int
    dtype: str
    direction: str
    rates: Rates
    parts: tuple[FloorPart, ...]

    @property
    def seconds(self) -> float:
        return sum(p.seconds for p in self.parts)

    @property
    def gemm_seconds(self) -> float:
        return self.flops / self.rates.matmul_flops_per_s

    @property
    def memory_seconds(self) -> float:
        return self.bytes / self.rates.dram_bytes_per_s

    @property
    def bytes(self) -> float:
        return sum(p.bytes for p in self.parts)

    @property
    def flops(self) -> float:
        return sum(p.flops for p in self.parts)

    def as_dict(self) -> dict:
        """Milliseconds per part and in total, and what they were computed from."""
        return {"direction": self.direction, "batch": self.batch, "seqlen": self.seqlen, "dtype": self.dtype,
                "floor_ms": self.seconds * 1e3, "gemm_ms": self.gemm_seconds * 1e3,
                "memory_ms": self.memory_seconds * 1e3, "flops": self.flops, "bytes": self.bytes,
                "matmul_tflops": self.rates.matmul_flops_per_s / 1e12, "dram_gbps": self.rates.dram_bytes_per_s / 1e9,
                "rates_source": self.rates.source,
                "parts_ms": {f"{p.direction}.{p.name}": p.seconds * 1e3 for p in self.parts}}


def forward_parts(c: Mamba2Config, batch: int, seqlen: int, e: int) -> list[tuple[str, float, float]]:
    """(name, flops, bytes) of the forward's non-SSD parts (module docstring)."""
    tokens, width = batch * seqlen, c.d_conv
    return [
        ("in_proj", 2.0 * tokens * c.d_model * sum(c.in_proj_sizes), 0.0),
        ("out_proj", 2.0 * tokens * c.d_inner * c.d_model, 0.0),
        ("conv", 0.0, float(2 * tokens * c.conv_dim * e + c.conv_dim * (width + 1) * e)),
        ("norm", 0.0, float(3 * tokens * c.d_inner * e + c.d_inner * e)),
        ("glue", 0.0, float(batch * c.conv_dim * (width - 1) * e + 3 * c.nheads * 4)),
    ]


def backward_parts(c: Mamba2Config, batch: int, seqlen: int, e: int) -> list[tuple[str, float, float]]:
    """(name, flops, bytes) of the backward's non-SSD parts (module docstring)."""
    tokens, width = batch * seqlen, c.d_conv
    return [
        ("in_proj", 4.0 * tokens * c.d_model * sum(c.in_proj_sizes), 0.0),
        ("out_proj", 4.0 * tokens * c.d_inner * c.d_model, 0.0),
        ("conv", 0.0, float(3 * tokens * c.conv_dim * e + 2 * c.conv_dim * (width + 1) * e)),
        ("norm", 0.0, float(5 * tokens * c.d_inner * e + 2 * c.d_inner * e)),
        ("glue", 0.0, 0.0),
    ]


# The layer workload's stages (harness/workloads/mamba2_layer.py) and the non-SSD parts each runs
STAGE_PARTS = {"in_proj_conv": ("in_proj", "conv", "glue"), "norm_out_proj": ("norm", "out_proj")}
COST_MODEL = "mamba2-layer-floor-v1"


def stage_costs(config: Mamba2Config, batch: int, seqlen: int, dtype: torch.dtype) -> dict[str, dict[str, float]]:
    """The forward's non-SSD floor per stage of the layer workload (STAGE_PARTS), as harness/cost_model.py costs:
    the parts' flops and bytes summed, marked `serial` (their floor is flops / matmul rate + bytes / bandwidth, as
    `layer_floor` prices them), for the rows' frac_floor beside each stage's time."""
    e = torch.empty((), dtype=dtype).element_size()
    parts = {name: (flops, moved) for name, flops, moved in forward_parts(config, batch, seqlen, e)}
    return {stage: {"flops": sum(parts[n][0] for n in names), "bytes": sum(parts[n][1] for n in names),
                    "serial": 1.0} for stage, names in STAGE_PARTS.items()}


def layer_floor(config: Mamba2Config, batch: int, seqlen: int, rates: Rates, dtype: torch.dtype = torch.bfloat16,
                direction: str = "forward") -> Floor:
    """The non-SSD floor of the layer at `config` over batch × seqlen tokens in `dtype`, priced at `rates`."""
    if not isinstance(config, Mamba2Config):
        raise ValueError(f"config: expected a Mamba2Config, got {type(config).__name__}")
    for arg, value in (("batch", batch), ("seqlen", seqlen)):
        check.positive_int(arg, value)
    if direction not in DIRECTIONS:
        raise ValueError(f"direction: expected one of {list(DIRECTIONS)}, got {direction!r}")
    if not isinstance(rates, Rates):
        raise ValueError(f"rates: expected a Rates, got {type(rates).__name__}")
    for arg in ("matmul_flops_per_s", "dram_bytes_per_s"):
        value = getattr(rates, arg)
        if not isinstance(value, (int, float)) or not 0 < value < float("inf"):
            raise ValueError(f"rates.{arg}: expected a finite number > 0, got {value!r}")
    e = torch.empty((), dtype=dtype).element_size()
    steps = {"forward": [("forward", forward_parts)], "backward": [("backward", backward_parts)],
             "train": [("forward", forward_parts), ("backward", backward_parts)]}[direction]
    parts = []
    for step, count in steps:
        for name, flops, moved in count(config, batch, seqlen, e):
            seconds = flops / rates.matmul_flops_per_s + moved / rates.dram_bytes_per_s
            parts.append(FloorPart(name, step, flops, moved, seconds))
    return Floor(config, batch, seqlen, str(dtype).replace("torch.", ""), direction, rates, tuple(parts))


# --- the card's rates (CUDA only) --------------------------------------------------------------------------------

def measure_rates(device="cuda", dtype: torch.dtype = torch.bfloat16, gemm: tuple[int, int, int] = (8192, 8192, 8192),
                  copy_bytes: int = 1 << 30, warmup_ms: int = 25, rep_ms: int = 200) -> Rates:
    """The card's dense matmul rate (a (m, k) @ (k, n) product in `dtype`, 2·m·n·k flops per call) and its DRAM
    bandwidth (a copy of `copy_bytes`: read plus write), each the median of triton.testing.do_bench (L2 flushed
    before every repetition). Raises on a device that is not CUDA."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        raise RuntimeError(f"device: measure_rates needs a CUDA device, got {device} "
                           f"(torch.cuda.is_available() = {torch.cuda.is_available()})")
    m, n, k = gemm
    matmul_ms = _matmul_ms(device, dtype, m, n, k, warmup_ms, rep_ms)
    elements = copy_bytes // torch.empty((), dtype=dtype).element_size()
    copy_ms = _copy_ms(device, dtype, elements, warmup_ms, rep_ms)
    name = torch.cuda.get_device_name(device)
    source = (f"measured on {name}: torch.matmul {m}x{k} @ {k}x{n} {str(dtype).replace('torch.', '')} "
              f"{matmul_ms:.3f} ms, copy of {copy_bytes} bytes {copy_ms:.3f} ms (do_bench medians)")
    moved = 2.0 * elements * torch.empty((), dtype=dtype).element_size()
    return Rates(2.0 * m * n * k / (matmul_ms * 1e-3), moved / (copy_ms * 1e-3), source)


def _matmul_ms(device, dtype, m: int, n: int, k: int, warmup_ms: int, rep_ms: int) -> float:
    from triton.testing import do_bench

    a = torch.randn(m, k, device=device, dtype=dtype)
    b = torch.randn(k, n, device=device, dtype=dtype)
    return do_bench(lambda: torch.matmul(a, b), warmup=warmup_ms, rep=rep_ms, return_mode="median")


def _copy_ms(device, dtype, elements: int, warmup_ms: int, rep_ms: int) -> float:
    from triton.testing import do_bench

    src = torch.randn(elements, device=device, dtype=dtype)
    dst = torch.empty_like(src)
    return do_bench(lambda: dst.copy_(src), warmup=warmup_ms, rep=rep_ms, return_mode="median")
