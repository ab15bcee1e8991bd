"""Stage 3 through mamba-ssm: `_bmm_chunk_fwd` (C·Bᵀ per chunk, fp32) then `_chunk_scan_fwd`."""

import torch

from impls.mamba_ssm.layout import upstream_layout


def compute_out(up, C, B, x, dt, dA_cumsum, states, D, z, seq_idx):
    C, B, x, z, D = upstream_layout(C=C, B=B, x=x, z=z, D=D)
    CB = up.ssd_bmm._bmm_chunk_fwd(C, B, dt.shape[-1], seq_idx=seq_idx, output_dtype=torch.float32)
    out, _out_x = up.ssd_chunk_scan._chunk_scan_fwd(CB, x, dt, dA_cumsum, C, states, D=D, z=z, seq_idx=seq_idx)
    return out
