"""The layer's Triton kernels (models/kernels/) compiled for sm_90 as the layer launches them at a size, on a machine
without a GPU: per kernel, registers per thread and local-memory loads/stores in the SASS (the spill traffic).

    python -m instruments.triton.layer_kernels [--d-model 2560] [--ngroups 1] [--batch 8] [--seqlen 4096]
                                               [--dtype bfloat16]

The host functions run on empty CPU tensors of the layer's shapes (the conv's input a view of in_proj's output, as
the layer hands it over) under instruments.intercept.compile_only: each launch compiles (ptxas included) and returns
without running. Every variant the layer launches: the conv with and without seq_idx and the context, the norm with
the gate before and after. One line per kernel; exit status 1 if any spills. The process must not run under the
interpreter (TRITON_INTERPRET unset).
"""

from __future__ import annotations

import argparse
import sys

import torch

from instruments.intercept import compile_only
from instruments.sass import cubin_facts


def launches(d_model: int, ngroups: int, batch: int, seqlen: int, dtype: torch.dtype) -> list[str]:
    """Compile every variant (module docstring); -> one line per kernel."""
    from models.kernels import causal_conv, gated_norm
    from models.mamba2 import Mamba2Config

    c = Mamba2Config(d_model=d_model, ngroups=ngroups)
    proj = torch.empty(batch, seqlen, sum(c.in_proj_sizes), dtype=dtype)
    x, z = proj[..., c.d_inner:c.d_inner + c.conv_dim], proj[..., :c.d_inner].reshape(-1, c.d_inner)
    weight, bias = torch.empty(c.conv_dim, 1, c.d_conv, dtype=dtype), torch.empty(c.conv_dim, dtype=dtype)
    context = torch.empty(batch, c.conv_dim, c.d_conv - 1, dtype=dtype)
    seq_idx = torch.zeros(batch, seqlen, dtype=torch.int32)
    dconv = torch.empty(batch, seqlen, c.conv_dim, dtype=dtype)
    y, dnorm = torch.empty(batch * seqlen, c.d_inner, dtype=dtype), torch.empty(batch * seqlen, c.d_inner, dtype=dtype)
    norm_weight, rstd = torch.empty(c.d_inner, dtype=dtype), torch.empty(batch * seqlen, ngroups)
    labels = []
    with compile_only() as compiled:
        for ctx, seq in ((None, None), (None, seq_idx), (context, seq_idx)):
            causal_conv.conv_forward(x, weight, bias, ctx, seq)
            causal_conv.conv_backward(x, weight, bias, ctx, seq, dconv, ctx is not None)
            # with a context each op launches twice: the first rows reading it, then the rest
            launches = 2 if ctx is None else 4
            labels += [f"seq_idx={seq is not None}" + (" first rows, context" if ctx is not None and k % 2 == 0
                                                         else "") for k in range(launches)]
        for before in (False, True):
            gated_norm.norm_forward(y, z, norm_weight, 1e-5, c.norm_group_size, before)
            gated_norm.norm_backward(y, z, norm_weight, rstd, dnorm, c.norm_group_size, before)
            labels += [f"group={c.norm_group_size} norm_before_gate={before}"] * 2
    assert len(labels) == len(compiled), (labels, [name for name, _ in compiled])
    lines = []
    for (name, kernel), label in zip(compiled, labels):
        facts = cubin_facts(kernel.asm["cubin"])
        verdict = "ok  " if facts.ldl == facts.stl == 0 else "SPILLS"
        lines.append(f"{verdict} {name:<16} {label:<36} warps={kernel.metadata.num_warps} "
                     f"registers={facts.registers} ldl={facts.ldl} stl={facts.stl}")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--d-model", type=int, default=2560)
    parser.add_argument("--ngroups", type=int, default=1)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seqlen", type=int, default=4096)
    parser.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16")
    args = parser.parse_args(argv)
    lines = launches(args.d_model, args.ngroups, args.batch, args.seqlen, getattr(torch, args.dtype))
    print("\n".join(lines))
    return 0 if all(line.startswith("ok") for line in lines) else 1


if __name__ == "__main__":
    sys.exit(main())
