"""Stages 2 and 3 fused (switch `fuse_state_out`): one kernel walks the chunks in order, keeps the state in
registers, and writes only y and the final state — the per-chunk states never go to memory.

One tile program owns (batch, head, headdim block) — the full dstate, since y contracts over it. For each chunk c
it holds S_c (dstate × headdim block, fp32) and
1. for each row block i of the chunk: acc = exp(dA_l)·C_l·S_c (S_c cast to the input dtype for the MMA, as the
   stage-3 kernel reads states stored in it by default), then the in-chunk causal term over source blocks j <= i
   exactly as stage 3 does it (`compute_out._source_block`), then D, z and one store of the (rows × headdim) tile;
2. S_{c+1} = exp(dA_last)·S_c + Bᵀ·(w x) with w_t = exp(dA_last − dA_t)·dt_t, as stage 2 does it
   (`fwd_pass_state.carry`, in its (dstate × headdim) operand-swapped form, so that step 1 reads S as the MMA's
   (K = dstate, N = headdim) operand without a transpose).
impls/README.md states the arrangement. No seq_idx / cu_seqlens (refused by the backend with the reason).

Parallelism is batch × nheads × headdim blocks programs (640 at S1 with 64-column blocks), each serial over the
chunks: the work is compute_out's plus stage 2's, but each program lives for the whole sequence, so the loads of
chunk c+1 can be in flight while chunk c computes, and the states' write and read-back (~0.67 GB at S1 in bf16)
are gone.
"""

from __future__ import annotations

import math

import cuda.tile as ct
import torch

from impls.cutile.common import LOG2E, KernelCall, kernel_call
from impls.cutile.compute_out import OutConsts, _exp, _load_rows, _mma, _per_head, _source_block, blocks
from impls.cutile.fwd_pass_state import StateConsts, carry, initial_state

ZERO = ct.PaddingMode.ZERO


def _rows_out(C, B, x, dt, dA, y, D, z, s_op, b, c, h, g, pb, i, k):
    """y for row block i of chunk c, one head, one headdim block: exp(dA_l)·C_l·S + Σ_{j<=i} scores_ij·x_j, then
    D and z; stored. k: the tile's `compute_out.OutConsts` (one lane of one head, no seq_idx, C·Bᵀ in the tile)."""
    BL, BP, tma = k.BL, k.BP, k.tma()
    scale = LOG2E if k.EXP2 else 1.0
    row_block = c * (k.CHUNK // BL) + i
    c_l = _load_rows(C, b, row_block, g, 0, BL, k.BN, tma, k.lat())
    dA_l = _per_head(dA, b, h, c, i, 1, BL, tma) * scale  # (1, BL)
    rows = i * BL + ct.arange(BL, dtype=ct.int32)
    acc = _mma(c_l, s_op, ct.zeros((BL, BP), ct.float32), k.TF32) * _exp(dA_l, k.EXP2).reshape((BL, 1))
    acc = acc.reshape((1, BL, BP))
    for j in range(i + 1):  # no seq_idx (seq, the rows' s_l) and no C·Bᵀ from memory (cbm): None
        acc = _source_block(B, x, dt, dA, None, None, acc, c_l, dA_l, dA_l, None, rows, b, c, g, h, pb, i, j, k,
                            False)
    out = acc.reshape((BL, BP))
    if k.D_MODE > 0 or k.HAS_Z:
        x_l = _load_rows(x, b, row_block, h, pb, BL, BP, tma, None).astype(ct.float32)
    if k.D_MODE == 1:
        out = out + x_l * ct.load(D, (h,), (1,), allow_tma=tma).astype(ct.float32).reshape((1, 1))
    if k.D_MODE == 2:
        d_p = ct.load(D, (h, pb), (1, BP), padding_mode=ZERO, allow_tma=tma).astype(ct.float32)
        out = out + x_l * d_p.reshape((1, BP))
    if k.HAS_Z:
        z_l = _load_rows(z, b, row_block, h, pb, BL, BP, tma, None).astype(ct.float32)
        out = out * z_l / (1.0 + _exp(-z_l * scale, k.EXP2))
    ct.store(y, (b, row_block, h, pb), out.astype(y.dtype).reshape((1, BL, 1, BP)), allow_tma=tma)


def consts(CHUNK, BL, BP, BN, HAS_INIT, D_MODE, HAS_Z, TF32, EXP2, TMA, LAT):
    """(stage 3's `OutConsts`, stage 2's `StateConsts`) of a fused kernel (this one, and fused_chunk's)."""
    # stage 3's part: one lane of one head, no seq_idx, C·Bᵀ in the tile (TRANS, the stored states' layout, unused)
    k = OutConsts(CHUNK=CHUNK, BL=BL, BP=BP, BN=BN, NL=1, HL=1, HAS_SEQ=False, SWAP=False, TRANS=False, TF32=TF32,
                  EXP2=EXP2, TMA=TMA, LAT=LAT, SHARED_CB=False, D_MODE=D_MODE, HAS_Z=HAS_Z)
    # stage 2's part: the state as (dstate × headdim), no seq_idx; states stored (headdim, dstate) (fused_chunk)
    ks = StateConsts(CHUNK=CHUNK, BP=BP, BN=BN, HAS_INIT=HAS_INIT, HAS_SEQ=False, SWAP=True, TRANS=False, TF32=TF32,
                     EXP2=EXP2, TMA=TMA, LAT=LAT)
    return k, ks


def fused_kernel(C, B, x, dt, dA, init, D, z, y, final, seqlen, heads_per_group,
                 CHUNK: ct.Constant[int], BL: ct.Constant[int], BP: ct.Constant[int], BN: ct.Constant[int],
                 HAS_INIT: ct.Constant[bool], D_MODE: ct.Constant[int], HAS_Z: ct.Constant[bool],
                 TF32: ct.Constant[bool], EXP2: ct.Constant[bool], TMA: ct.Constant[bool], LAT: ct.Constant[int]):
    k, ks = consts(CHUNK, BL, BP, BN, HAS_INIT, D_MODE, HAS_Z, TF32, EXP2, TMA, LAT)
    bh, pb = ct.bid(0), ct.bid(1)
    nheads = x.shape[2]
    nchunks = dA.shape[2]
    b, h = bh // nheads, bh % nheads
    g = h // heads_per_group
    nsub = CHUNK // BL
    tma = k.tma()
    st = initial_state(init, b, h, pb, 0, ks)  # (BN, BP) fp32
    for c in range(nchunks):
        s_op = st.astype(C.dtype)  # the MMA operand; the carried state stays fp32
        for i in range(nsub):
            _rows_out(C, B, x, dt, dA, y, D, z, s_op, b, c, h, g, pb, i, k)
        st = carry(st, x, B, dt, dA, None, seqlen, b, c, h, g, pb, 0, ks)
    ct.store(final, (b, h, pb, 0), ct.transpose(st).reshape((1, 1, BP, BN)), allow_tma=tma)


def make_call(arrays, dims, chunk_size, has_init, d_mode, has_z, tf32, sw, config) -> KernelCall:
    """arrays = (C, B, x, dt, dA, init, D, z, y, final): tensors, or ArraySpec for AOT compiles."""
    batch, seqlen, nheads, headdim, ngroups, dstate = dims
    bl, bp, bn = blocks(chunk_size, headdim, dstate, config)
    args = (*arrays, seqlen, nheads // ngroups, chunk_size, bl, bp, bn, bool(has_init), int(d_mode), bool(has_z),
            bool(tf32), sw.exp2, sw.tma, 4 if sw.latency_hints else 0)
    grid = (batch * nheads, math.ceil(headdim / bp))
    return kernel_call(fused_kernel, grid, args, config.get("occupancy", 0), sw.opt_level)


def stage_inputs(C, B, x, dt, dA_cumsum, initial_states, D, z, sw) -> tuple:
    """What a fused kernel's `make_call` takes before its outputs, on these tensors: (input arrays with stand-ins
    for the absent optional ones, dims, chunk_size, has_init, d_mode, has_z, tf32)."""
    from impls.cutile.common import dummy

    batch, seqlen, nheads, headdim = x.shape
    ngroups, dstate = B.shape[2], B.shape[3]
    d_mode = 0 if D is None else (1 if D.dim() == 1 else 2)
    tf32 = x.dtype == torch.float32 and sw.cb_precision == "tf32"
    arrays = (C, B, x, dt, dA_cumsum, initial_states if initial_states is not None else dummy(x.device, ndim=4),
              D if D is not None else dummy(x.device), z if z is not None else dummy(x.device, x.dtype, ndim=4))
    return (arrays, (batch, seqlen, nheads, headdim, ngroups, dstate), dt.shape[3], initial_states is not None,
            d_mode, z is not None, tf32)


def stage_call(C, B, x, dt, dA_cumsum, initial_states, D, z, y, final, sw, config) -> KernelCall:
    arrays, *rest = stage_inputs(C, B, x, dt, dA_cumsum, initial_states, D, z, sw)
    return make_call((*arrays, y, final), *rest, sw, config)


def run(C, B, x, dt, dA_cumsum, initial_states, D, z, sw, config):
    """-> (y like x, final states (batch, nheads, headdim, dstate) fp32)."""
    from impls.cutile.common import launch

    batch, _seqlen, nheads, headdim = x.shape
    y = torch.empty(x.shape, device=x.device, dtype=x.dtype)
    final = torch.empty(batch, nheads, headdim, B.shape[3], device=x.device, dtype=torch.float32)
    launch(stage_call(C, B, x, dt, dA_cumsum, initial_states, D, z, y, final, sw, config))
    return y, final
