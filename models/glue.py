"""How the Mamba-2 layer runs the parts around its SSD (the causal conv + SiLU, the gated RMSNorm): the `glue` argument
of models.mamba2.Mamba2. The projections are plain GEMMs (nn.Linear) whatever the glue.

    "torch"    eager torch ops (models/mamba2.py: F.conv1d, or masked taps with packed sequences; the norm written out)
    "triton"   our fused Triton kernels, forward and backward (models/kernels/)
    "compile"  torch.compile (fullgraph) of the same math written for fusion: the conv as its taps, the norm as "torch"

Each glue says whether it can run here and on a problem; asking for one that cannot raises the reason, naming the
argument; nothing is replaced by another glue.
"""

from __future__ import annotations

import functools
from typing import ClassVar

import torch
import torch.nn.functional as F

from impls import validate as check
from impls.registry import BackendUnavailable

GLUES: dict[str, type[Glue]] = {}


def register(cls: type[Glue]) -> type[Glue]:
    GLUES[cls.NAME] = cls
    return cls


def get_glue(name: str, d_conv: int) -> Glue:
    """The glue called `name` for a layer of conv width `d_conv`; raises ValueError for an unknown name and
    BackendUnavailable (naming the argument and the reason) for one that cannot run here or at that width."""
    if not isinstance(name, str) or name not in GLUES:
        check.fail("glue", f"one of {sorted(GLUES)}", repr(name))
    cls = GLUES[name]
    ok, why = cls.available()
    if ok:
        why = cls.width_refusal(d_conv) or ""
    if why:
        raise BackendUnavailable(f"glue={name!r} cannot run: {why}")
    return cls()


class Glue:
    """One way to run the conv and the norm: `conv` has models.mamba2.causal_conv_silu's signature and result,
    `norm` models.mamba2.gated_rms_norm's."""

    NAME: ClassVar[str]
    norm_label: ClassVar[str]  # how the norm runs

    @classmethod
    def available(cls) -> tuple[bool, str]:
        return True, ""

    @classmethod
    def width_refusal(cls, d_conv: int) -> str | None:
        return None

    def check_device(self, device: torch.device) -> None:
        """Raises BackendUnavailable where this glue cannot run on tensors of `device`."""

    def conv(self, xBC, weight, bias, context=None, seq_idx=None):
        raise NotImplementedError

    def norm(self, y, z, weight, eps: float, group_size: int, norm_before_gate: bool):
        raise NotImplementedError

    def conv_label(self, packed: bool) -> str:
        """How the conv ran (the layer's describe()["last_call"]["conv"])."""
        raise NotImplementedError

    def describe(self) -> dict:
        return {"name": self.NAME, "conv": self.conv_label(False), "conv_packed": self.conv_label(True),
                "norm": self.norm_label}


@register
class TorchGlue(Glue):
    """Eager torch ops, the layer's own functions (the default)."""

    NAME = "torch"
    norm_label = "torch ops (fp32)"

    def __init__(self):
        from models import mamba2

        self._conv, self._norm = mamba2.causal_conv_silu, mamba2.gated_rms_norm

    def conv(self, xBC, weight, bias, context=None, seq_idx=None):
        return self._conv(xBC, weight, bias, context, seq_idx)

    def norm(self, y, z, weight, eps, group_size, norm_before_gate):
        return self._norm(y, z, weight, eps, group_size, norm_before_gate)

    def conv_label(self, packed: bool) -> str:
        return "masked taps (packed sequences)" if packed else "F.conv1d"


@register
class TritonGlue(Glue):
    """Our kernels: models/kernels/causal_conv.py and gated_norm.py (compiled on CUDA devices, on the CPU only under
    the Triton interpreter)."""

    NAME = "triton"
    norm_label = "triton gated_norm (norm_fwd_kernel / norm_bwd_kernel)"

    @classmethod
    def available(cls) -> tuple[bool, str]:
        from models.kernels import common

        return common.available()

    @classmethod
    def width_refusal(cls, d_conv: int) -> str | None:
        from models.kernels.causal_conv import MAX_WIDTH

        if d_conv > MAX_WIDTH:
            return f"d_conv {d_conv} > {MAX_WIDTH}, the widest the conv kernels hold in registers"
        return None

    def check_device(self, device: torch.device) -> None:
        from models.kernels import common

        why = common.refusal(device)
        if why:
            raise BackendUnavailable(f"glue='triton' cannot run: {why}")

    def conv(self, xBC, weight, bias, context=None, seq_idx=None):
        from models.kernels.causal_conv import causal_conv_silu

        return causal_conv_silu(xBC, weight, bias, context, seq_idx)

    def norm(self, y, z, weight, eps, group_size, norm_before_gate):
        from models.kernels.gated_norm import gated_rms_norm

        return gated_rms_norm(y, z, weight, eps, group_size, norm_before_gate)

    def conv_label(self, packed: bool) -> str:
        return "triton causal_conv (conv_fwd_kernel / conv_bwd_kernel)" + (", seq_idx masked" if packed else "")


@register
class CompileGlue(Glue):
    """torch.compile(fullgraph=True) of `conv_taps` and the layer's gated_rms_norm: the compiler fuses each into its
    own kernels (forward and backward); a graph break raises instead of running part of it eagerly."""

    NAME = "compile"
    norm_label = "torch.compile of the torch ops"

    @classmethod
    def available(cls) -> tuple[bool, str]:
        import torch._dynamo

        if not torch._dynamo.is_dynamo_supported():
            return False, "torch.compile is not supported on this Python / platform"
        return True, ""

    def conv(self, xBC, weight, bias, context=None, seq_idx=None):
        out = _compiled()[0](xBC, weight, bias, context, seq_idx)
        if seq_idx is not None:
            return out, None
        from models.kernels.causal_conv import last_inputs

        return out, last_inputs(xBC, context, weight.shape[-1])

    def norm(self, y, z, weight, eps, group_size, norm_before_gate):
        return _compiled()[1](y, z, weight, eps, group_size, norm_before_gate)

    def conv_label(self, packed: bool) -> str:
        return "torch.compile of the conv's taps" + (", seq_idx masked" if packed else "")


@functools.cache
def _compiled():
    """The compiled conv and norm, made once per process (every layer shares them and their compiled graphs)."""
    from models import mamba2

    return torch.compile(conv_taps, fullgraph=True), torch.compile(mamba2.gated_rms_norm, fullgraph=True)


def conv_taps(xBC: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, context: torch.Tensor | None,
              seq_idx: torch.Tensor | None) -> torch.Tensor:
    """silu(causal conv) as a sum of shifted inputs in the (batch, seqlen, channels) layout, no transposes, in fp32
    (float64 for float64), returned in xBC's dtype: the conv written so that a compiler fuses it into one pass.
    The same math as models.mamba2.causal_conv_silu (the context counts as sequence 0)."""
    batch, seqlen, channels = xBC.shape
    width = weight.shape[-1]
    work = torch.float64 if xBC.dtype == torch.float64 else torch.float32
    left = xBC.new_zeros(batch, width - 1, channels) if context is None else context.transpose(1, 2)
    padded = torch.cat([left, xBC], dim=1).to(work)  # (batch, width − 1 + seqlen, channels)
    taps = weight.reshape(channels, width).to(work)
    out = torch.zeros(batch, seqlen, channels, dtype=work, device=xBC.device)
    if bias is not None:
        out = out + bias.to(work)
    if seq_idx is not None:
        seq = F.pad(seq_idx, (width - 1, 0), value=0)
    for k in range(width):
        tap = padded[:, k:k + seqlen] * taps[:, k]
        if seq_idx is not None:
            tap = torch.where((seq[:, k:k + seqlen] == seq_idx)[..., None], tap, 0.0)
        out = out + tap
    return F.silu(out).to(xBC.dtype)
