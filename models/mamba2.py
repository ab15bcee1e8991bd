"""The Mamba-2 block around the SSD, its SSD run by any registered backend (prefill, inference and training).

    u (batch, seqlen, d_model) -> in_proj -> [z | xBC | dt]
    xBC -> depthwise causal conv1d (width d_conv, left-padded) -> SiLU -> [x | B | C]
    y   = impls.ssd(x, dt, A = -exp(A_log), B, C, D, dt_bias, dt_softplus=True, dt_limit, backend=...)
    out = out_proj(gated RMSNorm(y, z))

The math: impls/README.md, "The Mamba-2 block around the SSD"; the float64 ground truth (the SSD as the sequential
recurrence): models/mamba2_reference.py. The backend is looked up once, at construction, through the registry
(`impls.get_backend`): an unknown name, a missing package or a bad switch raises there, a problem the backend
cannot run raises at the call; nothing is replaced by another backend. `describe()` says what ran.

The SSD goes through `impls.ssd`, the differentiable entry: with gradients wanted (grad mode on while the input,
the initial states or a parameter requires grad) the backend's backward runs, and a backend without one raises,
naming itself (run such a layer under `torch.inference_mode()` / `torch.no_grad()`); without, it is
`impls.ssd_forward`.

Packed sequences (`seq_idx`, or `cu_seqlens` with batch 1): the SSD resets its state at every new sequence, and so
does the conv here: a tap never reads a token of another sequence (the left context, `conv_initial_states`, counts
as sequence 0, as the SSD's initial state does). Without packed sequences the conv is one F.conv1d; with them it is
a sum of d_conv masked taps.

`glue` selects how the conv + SiLU and the gated RMSNorm run (models/glue.py): "torch" (these functions, the
default), "triton" (our fused kernels, models/kernels/) or "compile" (torch.compile of the same math); one that
cannot run raises, naming the argument.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

import impls
from impls import validate as check
from impls.registry import Backend, get_backend
from models.glue import get_glue


def _positive_float(arg: str, value, allow_zero: bool = False) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (value == 0 and not allow_zero):
        check.fail(arg, f"a finite number {'>=' if allow_zero else '>'} 0", repr(value))


@dataclass(frozen=True)
class Mamba2Config:
    """The block's sizes and options (names as in Mamba-2's `Mamba2` module; defaults its own). Derived:
    d_inner = expand·d_model, nheads = d_inner / headdim, conv_dim = d_inner + 2·ngroups·d_state."""

    d_model: int
    d_state: int = 128
    d_conv: int = 4
    expand: int = 2
    headdim: int = 64
    ngroups: int = 1
    chunk_size: int = 256
    dt_min: float = 1e-3  # dt_bias initialised to softplus⁻¹ of step sizes log-uniform in [dt_min, dt_max]
    dt_max: float = 1e-1
    dt_init_floor: float = 1e-4  # ... each at least this
    A_init_range: tuple[float, float] = (1.0, 16.0)  # A = -exp(A_log), -A uniform in this range at initialisation
    dt_limit: tuple[float, float] = (0.0, math.inf)  # the SSD's clamp of the step size after softplus
    D_per_channel: bool = False  # D of shape (nheads, headdim) instead of (nheads,)
    norm_before_gate: bool = False  # False (Mamba-2): RMSNorm(y · silu(z)); True: RMSNorm(y) · silu(z)
    norm_eps: float = 1e-5
    bias: bool = False  # in_proj and out_proj biases
    conv_bias: bool = True

    def __post_init__(self):
        for arg in ("d_model", "d_state", "d_conv", "expand", "headdim", "ngroups"):
            check.positive_int(arg, getattr(self, arg))
        if self.d_inner % self.headdim:
            check.fail("headdim", f"a divisor of d_inner = expand·d_model = {self.d_inner}", self.headdim)
        if self.nheads % self.ngroups:
            check.fail("ngroups", f"a divisor of nheads = d_inner/headdim = {self.nheads}", self.ngroups)
        check.chunk_size(self.chunk_size)
        for arg in ("dt_min", "dt_max", "norm_eps"):
            _positive_float(arg, getattr(self, arg))
        if self.dt_min > self.dt_max:
            check.fail("dt_min", f"<= dt_max = {self.dt_max}", self.dt_min)
        _positive_float("dt_init_floor", self.dt_init_floor, allow_zero=True)
        object.__setattr__(self, "A_init_range", _pair("A_init_range", self.A_init_range))
        low, high = self.A_init_range
        if not (0 < low <= high and math.isfinite(high)):
            check.fail("A_init_range", "0 < low <= high, finite", self.A_init_range)
        check.dt_limit(self.dt_limit)
        object.__setattr__(self, "dt_limit", _pair("dt_limit", self.dt_limit))
        for arg in ("D_per_channel", "norm_before_gate", "bias", "conv_bias"):
            check.flag(arg, getattr(self, arg))

    @property
    def d_inner(self) -> int:
        return self.expand * self.d_model

    @property
    def nheads(self) -> int:
        return self.d_inner // self.headdim

    @property
    def conv_dim(self) -> int:
        return self.d_inner + 2 * self.ngroups * self.d_state

    @property
    def in_proj_sizes(self) -> tuple[int, int, int]:
        """in_proj's output split: (z, xBC, dt)."""
        return self.d_inner, self.conv_dim, self.nheads

    @property
    def xbc_sizes(self) -> tuple[int, int, int]:
        """The conv output's split: (x, B, C)."""
        return self.d_inner, self.ngroups * self.d_state, self.ngroups * self.d_state

    @property
    def norm_group_size(self) -> int:
        """The gated RMSNorm normalises each group's d_inner / ngroups channels on their own (as Mamba-2 does)."""
        return self.d_inner // self.ngroups


def _pair(arg: str, value) -> tuple[float, float]:
    if isinstance(value, (str, bytes)):  # "12" would read as (1, 2)
        check.fail(arg, "a pair (low, high) of numbers", repr(value))
    try:
        low, high = (float(v) for v in value)
    except (TypeError, ValueError):
        check.fail(arg, "a pair (low, high) of numbers", value)
    return low, high


# the floating dtypes a layer's parameters may take (the SSD's own parameters stay fp32, float64 in float64)
LAYER_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


@dataclass
class Mamba2Output:
    """What the layer returns with `return_final_states=True`: the output (batch, seqlen, d_model); the SSD's final
    states (batch, nheads, headdim, d_state) and, with cu_seqlens, every sequence's (nseqs, ...); the conv's left
    context for a next call, the last d_conv − 1 inputs (batch, conv_dim, d_conv − 1), None with packed
    sequences (it would mix sequences)."""

    out: torch.Tensor
    final_states: torch.Tensor
    varlen_states: torch.Tensor | None = None
    conv_final_states: torch.Tensor | None = None


@dataclass(frozen=True)
class SSDCall:
    """The SSD's arguments as the layer hands them over (`impls.ssd_forward(**kwargs, backend=...)`), and what the
    layer keeps for after it."""

    kwargs: dict
    z: torch.Tensor
    conv_final_states: torch.Tensor | None
    conv: str  # how the conv ran (the glue's label): "F.conv1d", "masked taps (packed sequences)", ...


def causal_conv_silu(xBC: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                     context: torch.Tensor | None = None, seq_idx: torch.Tensor | None = None):
    """SiLU of the depthwise causal conv of xBC (batch, seqlen, channels), weight (channels, 1, width): output t
    reads inputs t − width + 1 … t, the ones before 0 from `context` (batch, channels, width − 1; zeros if None).
    With seq_idx (batch, seqlen) a tap reading a token of another sequence reads zero (the context counts as
    sequence 0). -> (output (batch, seqlen, channels) contiguous, the last width − 1 inputs or None with seq_idx)."""
    batch, seqlen, channels = xBC.shape
    width = weight.shape[-1]
    left = xBC.new_zeros(batch, channels, width - 1) if context is None else context.to(xBC.dtype)
    padded = torch.cat([left, xBC.transpose(1, 2)], dim=-1)  # (batch, channels, width - 1 + seqlen)
    if seq_idx is None:
        out = F.conv1d(padded, weight, bias, groups=channels)
        final = padded[..., padded.shape[-1] - (width - 1):]
    else:
        out = _masked_taps(padded, weight, bias, seq_idx)
        final = None
    return F.silu(out).transpose(1, 2).contiguous(), final


def _masked_taps(padded, weight, bias, seq_idx):
    """The conv as a sum over its taps, tap k (reading position t − width + 1 + k) masked where that position's
    sequence differs from t's; summed in fp32 (float64 for float64 inputs), returned in the input's dtype."""
    width, seqlen = weight.shape[-1], seq_idx.shape[1]
    dtype = torch.float64 if padded.dtype == torch.float64 else torch.float32
    seq = F.pad(seq_idx, (width - 1, 0), value=0)  # the context is sequence 0
    out = padded.new_zeros(padded.shape[0], padded.shape[1], seqlen, dtype=dtype)
    if bias is not None:
        out = out + bias.to(dtype)[:, None]
    for k in range(width):
        same = (seq[:, k:k + seqlen] == seq_idx)[:, None, :]  # (batch, 1, seqlen)
        out = out + torch.where(same, weight[:, :, k].to(dtype) * padded[..., k:k + seqlen].to(dtype), 0.0)
    return out.to(padded.dtype)


def gated_rms_norm(y: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float, group_size: int,
                   norm_before_gate: bool) -> torch.Tensor:
    """RMSNorm over groups of `group_size` channels, gated by silu(z): of y·silu(z) (norm_before_gate False, Mamba-2)
    or times silu(z) after (True). Computed in fp32 (float64 for float64 inputs), returned in z's dtype."""
    dtype = torch.float64 if y.dtype == torch.float64 else torch.float32
    values, gate = y.to(dtype), F.silu(z.to(dtype))
    if not norm_before_gate:
        values = values * gate
    groups = values.unflatten(-1, (-1, group_size))
    normed = (groups * torch.rsqrt(groups.square().mean(-1, keepdim=True) + eps)).flatten(-2) * weight.to(dtype)
    if norm_before_gate:
        normed = normed * gate
    return normed.to(z.dtype)


class Mamba2(nn.Module):
    """The Mamba-2 block with its SSD run by `backend` (a registered name or a built `impls.Backend`; `switches`
    with a name). Parameters in `dtype`, except A_log, D and dt_bias: fp32 (float64 for a float64 layer), the SSD
    contract's dtypes for them."""

    def __init__(self, config: Mamba2Config, backend: str | Backend = "reference", switches=None, *, device=None,
                 dtype: torch.dtype | None = None, glue: str = "torch"):
        super().__init__()
        if not isinstance(config, Mamba2Config):
            check.fail("config", "a Mamba2Config", type(config).__name__)
        if dtype is not None and dtype not in LAYER_DTYPES:
            check.fail("dtype", f"None or one of {[str(d) for d in LAYER_DTYPES]}", repr(dtype))
        self.config = config
        self.backend = get_backend(backend, switches)
        self.glue = get_glue(glue, config.d_conv)
        kw = {"device": device, "dtype": dtype}
        ssd_kw = {"device": device, "dtype": torch.float64 if dtype == torch.float64 else torch.float32}
        c = config
        self.in_proj = nn.Linear(c.d_model, sum(c.in_proj_sizes), bias=c.bias, **kw)
        # padding is applied by causal_conv_silu (left only, or the given context)
        self.conv1d = nn.Conv1d(c.conv_dim, c.conv_dim, c.d_conv, groups=c.conv_dim, bias=c.conv_bias, **kw)
        self.dt_bias = nn.Parameter(_initial_dt_bias(c, **ssd_kw))
        self.A_log = nn.Parameter(torch.empty(c.nheads, **ssd_kw).uniform_(*c.A_init_range).log())
        self.D = nn.Parameter(torch.ones(c.d_inner if c.D_per_channel else c.nheads, **ssd_kw))
        self.norm_weight = nn.Parameter(torch.ones(c.d_inner, **kw))
        self.out_proj = nn.Linear(c.d_inner, c.d_model, bias=c.bias, **kw)
        self.last_call: dict = {}

    # --- the call ---------------------------------------------------------------------------------------------
    def forward(self, u: torch.Tensor, *, seq_idx=None, cu_seqlens=None, initial_states=None,
                conv_initial_states=None, return_final_states: bool = False, check_values: bool = False):
        """u (batch, seqlen, d_model) -> out (same shape), or a Mamba2Output with return_final_states.
        seq_idx (batch, seqlen) / cu_seqlens (nseqs + 1,): packed sequences (impls/README.md); initial_states
        (batch, nheads, headdim, d_state): the SSD's state before position 0; conv_initial_states
        (batch, conv_dim, d_conv − 1): the conv's inputs before position 0. check_values: the SSD's value checks."""
        check.flag("return_final_states", return_final_states)
        check.flag("check_values", check_values)
        call = self.ssd_call(u, seq_idx=seq_idx, cu_seqlens=cu_seqlens, initial_states=initial_states,
                             conv_initial_states=conv_initial_states)
        result = impls.ssd(**call.kwargs, backend=self.backend, check_values=check_values)
        out = self.finish(result.y, call.z)
        self.last_call = {"dtype": str(u.dtype).replace("torch.", ""), "shape": tuple(u.shape), "conv": call.conv,
                          "seq_idx": seq_idx is not None, "cu_seqlens": cu_seqlens is not None,
                          "initial_states": initial_states is not None,
                          "conv_initial_states": conv_initial_states is not None}
        if not return_final_states:
            return out
        return Mamba2Output(out, result.final_states, result.varlen_states, call.conv_final_states)

    def ssd_call(self, u, *, seq_idx=None, cu_seqlens=None, initial_states=None, conv_initial_states=None) -> SSDCall:
        """Everything before the SSD: in_proj, the conv and SiLU, the split; -> the SSD's arguments (x, B, C as views
        of the conv's output, dt a view of in_proj's) and z."""
        c = self.config
        self._check_inputs(u, seq_idx, cu_seqlens, conv_initial_states)
        z, xBC, dt = torch.split(self.in_proj(u), c.in_proj_sizes, dim=-1)
        conv_seq = seq_idx
        if conv_seq is None and cu_seqlens is not None:
            conv_seq = impls.seq_idx_from_cu_seqlens(cu_seqlens, u.shape[1])
        xBC, conv_final = self.glue.conv(xBC, self.conv1d.weight, self.conv1d.bias, conv_initial_states, conv_seq)
        x, B, C = torch.split(xBC, c.xbc_sizes, dim=-1)
        kwargs = self.ssd_kwargs(x.unflatten(-1, (c.nheads, c.headdim)), dt, B.unflatten(-1, (c.ngroups, c.d_state)),
                                 C.unflatten(-1, (c.ngroups, c.d_state)), initial_states=initial_states,
                                 seq_idx=seq_idx, cu_seqlens=cu_seqlens)
        conv = self.glue.conv_label(conv_seq is not None)
        return SSDCall(kwargs, z, conv_final, conv)

    def ssd_kwargs(self, x, dt, B, C, *, initial_states=None, seq_idx=None, cu_seqlens=None) -> dict:
        """The SSD's arguments from its inputs x (batch, seqlen, nheads, headdim), dt, B and C (batch, seqlen,
        ngroups, d_state) and the layer's own parameters (A = -exp(A_log), D, dt_bias in the SSD's dtype)."""
        c = self.config
        ssd_dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
        D = self.D.to(ssd_dtype)
        return dict(x=x, dt=dt, A=-torch.exp(self.A_log.to(ssd_dtype)), B=B, C=C, chunk_size=c.chunk_size,
                    D=D.view(c.nheads, c.headdim) if c.D_per_channel else D, dt_bias=self.dt_bias.to(ssd_dtype),
                    initial_states=initial_states, seq_idx=seq_idx, cu_seqlens=cu_seqlens, dt_softplus=True,
                    dt_limit=c.dt_limit)

    def finish(self, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """Everything after the SSD: y (batch, seqlen, nheads, headdim) -> gated RMSNorm with z -> out_proj."""
        c = self.config
        normed = self.glue.norm(y.flatten(-2), z, self.norm_weight, c.norm_eps, c.norm_group_size,
                                c.norm_before_gate)
        return self.out_proj(normed)

    # --- checks -----------------------------------------------------------------------------------------------
    def _check_inputs(self, u, seq_idx, cu_seqlens, conv_initial_states) -> None:
        """Metadata only (the SSD checks its own arguments again, initial_states among them)."""
        c, weight = self.config, self.in_proj.weight
        check.tensor("u", u, shape=(None, None, c.d_model), dtypes=(weight.dtype,), device=weight.device,
                     device_of="the layer's parameters")
        batch, seqlen, _ = u.shape
        if batch < 1 or seqlen < 1:
            check.fail("u", "batch >= 1 and seqlen >= 1", tuple(u.shape))
        self.glue.check_device(u.device)
        check.seq_idx(seq_idx, batch, seqlen, u.device)
        check.cu_seqlens(cu_seqlens, batch, u.device)
        check.optional("conv_initial_states", conv_initial_states, shape=(batch, c.conv_dim, c.d_conv - 1),
                       dtypes=(u.dtype,), device=u.device, device_of="u")  # no silent cast to u's dtype

    # --- what ran ---------------------------------------------------------------------------------------------
    def describe(self) -> dict:
        """The config, the parameters' dtype, the SSD backend with its switches (and what it resolved), the glue
        (how the conv and the norm run), the SSD call's options and what the last call passed."""
        c = self.config
        return {
            "module": "models.mamba2.Mamba2",
            "config": dataclasses.asdict(c),
            "param_dtype": str(self.in_proj.weight.dtype).replace("torch.", ""),
            "ssd": self.backend.describe(),
            "glue": self.glue.describe(),
            "ssd_call": {"chunk_size": c.chunk_size, "dt_softplus": True, "dt_limit": c.dt_limit,
                         "D": "per channel" if c.D_per_channel else "per head", "z": "none (gated in the norm)"},
            "last_call": dict(self.last_call),
        }

    def extra_repr(self) -> str:
        c = self.config
        return f"backend={self.backend.name!r}, glue={self.glue.NAME!r}, nheads={c.nheads}, headdim={c.headdim}"


def _initial_dt_bias(c: Mamba2Config, device=None, dtype=None) -> torch.Tensor:
    """softplus⁻¹ of per-head step sizes log-uniform in [dt_min, dt_max], each at least dt_init_floor, so that
    softplus(dt_bias) starts in that range (Mamba-2's initialisation)."""
    low, high = math.log(c.dt_min), math.log(c.dt_max)
    step = torch.exp(low + (high - low) * torch.rand(c.nheads, device=device, dtype=dtype))
    step = step.clamp(min=c.dt_init_floor)
    return step + torch.log(-torch.expm1(-step))
