"""Stage 2 in cuTile: every chunk's own state (an MMA over the chunk's tokens) fused with the pass across chunks.

One tile program owns (batch, head, headdim block, dstate block) and walks the chunks in order: it writes the
state entering chunk c, computes chunk c's local state (w x)ᵀ·B with w_t = exp(dA_last − dA_t)·dt_t on the tensor
cores, and carries S ← exp(dA_last)·S + local. The local states never go to global memory. seq_idx: tokens of
another sequence than the chunk's last token get w = 0, and the carry is zeroed when the sequence at a chunk's last
token differs from the previous chunk's (the one before chunk 0 counts as sequence 0), as impls/reference.

Switches: operand_swap computes the local state as Bᵀ·(w x) (dstate × headdim); transposed_layout stores the
entering states (b, c, h, dstate, headdim). When the two disagree the tile is transposed before each store.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import cuda.tile as ct
import torch

from impls.cutile.common import LOG2E, CopyHints, KernelCall, kernel_call, next_pow2

ZERO = ct.PaddingMode.ZERO


def _mma(a, b, acc, TF32):
    if TF32:
        return ct.mma(a.astype(ct.tfloat32), b.astype(ct.tfloat32), acc)
    return ct.mma(a, b, acc)


@dataclass(frozen=True)
class StateConsts(CopyHints):
    """The compile-time constants of a stage-2 tile program (fwd_pass_state_kernel, and fused_kernel for its state
    carry), built once in the kernel from its `ct.Constant` parameters and handed whole to the helpers; as
    `compute_out.OutConsts`, its fields stay compile-time constants."""

    CHUNK: int  # chunk length
    BP: int  # headdim columns of the state tile
    BN: int  # dstate columns of the state tile
    HAS_INIT: bool  # initial_states given
    HAS_SEQ: bool  # seq_idx given
    SWAP: bool  # switch operand_swap: the state tile is (BN, BP), from Bᵀ·(w x)
    TRANS: bool  # switch transposed_layout: states stored (dstate, headdim)
    TF32: bool  # fp32 inputs through the tf32 tensor cores
    EXP2: bool  # switch exp2: decays by exp2
    TMA: bool  # switch tma: TMA bulk copies allowed
    LAT: int  # latency hint of the x and B loads; 0 = none


def _store_state(states, b, c, h, pb, nb, st, k):
    """st is (BN, BP) when SWAP else (BP, BN); memory is (dstate, headdim) when TRANS else (headdim, dstate)."""
    BP, BN = k.BP, k.BN
    tile = st.astype(states.dtype)
    if k.SWAP != k.TRANS:
        tile = ct.transpose(tile)
    if k.TRANS:
        ct.store(states, (b, c, h, nb, pb), tile.reshape((1, 1, 1, BN, BP)), allow_tma=k.tma())
    else:
        ct.store(states, (b, c, h, pb, nb), tile.reshape((1, 1, 1, BP, BN)), allow_tma=k.tma())


def initial_state(init, b, h, pb, nb, k):
    """The state entering chunk 0 in fp32: the (BP, BN) tile of initial_states (zeros when absent), transposed
    to (BN, BP) when SWAP."""
    BP, BN = k.BP, k.BN
    if k.HAS_INIT:
        st = ct.load(init, (b, h, pb, nb), (1, 1, BP, BN), padding_mode=ZERO, allow_tma=k.tma())
        st = st.reshape((BP, BN)).astype(ct.float32)
        if k.SWAP:
            st = ct.transpose(st)
        return st
    if k.SWAP:
        return ct.zeros((BN, BP), ct.float32)
    return ct.zeros((BP, BN), ct.float32)


def carry(st, x, B, dt, dA, seq, seqlen, b, c, h, g, pb, nb, k):
    """The state leaving chunk c from the state st entering it: exp(dA_last)·st + the chunk's local state
    (w x)ᵀ·B with w_t = exp(dA_last − dA_t)·dt_t, on the tensor cores; st is (BN, BP) when SWAP else (BP, BN).
    seq_idx (HAS_SEQ; seq is None otherwise): tokens of another sequence than the chunk's last token get w = 0, and
    the carry is zeroed when the sequence at the chunk's last token differs from the previous chunk's."""
    CHUNK, BP, BN, tma, lat = k.CHUNK, k.BP, k.BN, k.tma(), k.lat()
    dA_t = ct.load(dA, (b, h, c, 0), (1, 1, 1, CHUNK), allow_tma=tma).reshape((CHUNK,))
    dt_t = ct.load(dt, (b, h, c, 0), (1, 1, 1, CHUNK), allow_tma=tma).reshape((CHUNK,))
    last = ct.extract(dA_t, (CHUNK - 1,), (1,))
    if k.EXP2:
        w = ct.exp2((last - dA_t) * LOG2E) * dt_t
        decay = ct.exp2(last * LOG2E)
    else:
        w = ct.exp(last - dA_t) * dt_t
        decay = ct.exp(last)
    if k.HAS_SEQ:
        s_t = ct.load(seq, (b, c), (1, CHUNK), padding_mode=ZERO, allow_tma=tma).reshape((CHUNK,))
        last_pos = ct.minimum(seqlen, (c + 1) * CHUNK) - 1
        s_last = ct.gather(seq, (b, last_pos))
        s_prev = ct.gather(seq, (b, c * CHUNK - 1), mask=c > 0, padding_value=0)
        w = ct.where(s_t == s_last, w, 0.0)
        decay = ct.where(s_last == s_prev, decay, 0.0)
    xt = ct.load(x, (b, c, h, pb), (1, CHUNK, 1, BP), padding_mode=ZERO, allow_tma=tma, latency=lat)
    bt = ct.load(B, (b, c, g, nb), (1, CHUNK, 1, BN), padding_mode=ZERO, allow_tma=tma, latency=lat)
    xt = xt.reshape((CHUNK, BP))
    bt = bt.reshape((CHUNK, BN))
    # the decay weights go on x (in fp32, then back to the input dtype for the tensor cores)
    xw = (xt.astype(ct.float32) * w.reshape((CHUNK, 1))).astype(xt.dtype)
    if k.SWAP:
        return _mma(ct.transpose(bt), xw, st * decay.reshape((1, 1)), k.TF32)
    return _mma(ct.transpose(xw), bt, st * decay.reshape((1, 1)), k.TF32)


def fwd_pass_state_kernel(x, B, dt, dA, init, seq, states, final, seqlen, heads_per_group,
                          CHUNK: ct.Constant[int], BP: ct.Constant[int], BN: ct.Constant[int],
                          HAS_INIT: ct.Constant[bool], HAS_SEQ: ct.Constant[bool], SWAP: ct.Constant[bool],
                          TRANS: ct.Constant[bool], TF32: ct.Constant[bool], EXP2: ct.Constant[bool],
                          TMA: ct.Constant[bool], LAT: ct.Constant[int]):
    k = StateConsts(CHUNK, BP, BN, HAS_INIT, HAS_SEQ, SWAP, TRANS, TF32, EXP2, TMA, LAT)
    bh, pb, nb = ct.bid(0), ct.bid(1), ct.bid(2)
    nheads = x.shape[2]
    nchunks = dA.shape[2]
    b, h = bh // nheads, bh % nheads
    g = h // heads_per_group
    st = initial_state(init, b, h, pb, nb, k)
    for c in range(nchunks):
        _store_state(states, b, c, h, pb, nb, st, k)
        st = carry(st, x, B, dt, dA, seq, seqlen, b, c, h, g, pb, nb, k)
    if SWAP:
        st = ct.transpose(st)
    ct.store(final, (b, h, pb, nb), st.reshape((1, 1, BP, BN)), allow_tma=k.tma())


def blocks(headdim: int, dstate: int, config: dict) -> tuple[int, int]:
    bp = config.get("block_headdim") or min(64, next_pow2(headdim))
    bn = config.get("block_dstate") or min(128, next_pow2(dstate))
    return min(bp, next_pow2(headdim)), min(bn, next_pow2(dstate))


def make_call(arrays, dims, chunk_size, has_init, has_seq, tf32, sw, config) -> KernelCall:
    """arrays = (x, B, dt, dA, init, seq, states, final): tensors, or ArraySpec for AOT compiles."""
    batch, seqlen, nheads, headdim, ngroups, dstate = dims
    bp, bn = blocks(headdim, dstate, config)
    args = (*arrays, seqlen, nheads // ngroups, chunk_size, bp, bn, bool(has_init), bool(has_seq),
            sw.operand_swap, sw.transposed_layout, bool(tf32), sw.exp2, sw.tma, 4 if sw.latency_hints else 0)
    grid = (batch * nheads, math.ceil(headdim / bp), math.ceil(dstate / bn))
    return kernel_call(fwd_pass_state_kernel, grid, args, config.get("occupancy", 0))


def run(B, x, dt, dA_cumsum, initial_states, seq_idx, state_dtype, sw, config):
    from impls.cutile.common import dummy, launch

    batch, seqlen, nheads, headdim = x.shape
    ngroups, dstate = B.shape[2], B.shape[3]
    nchunks, chunk = dt.shape[2], dt.shape[3]
    sdtype = state_dtype or x.dtype
    if sw.transposed_layout:
        storage = torch.empty(batch, nchunks, nheads, dstate, headdim, device=x.device, dtype=sdtype)
        states = storage.transpose(-1, -2)
    else:
        storage = states = torch.empty(batch, nchunks, nheads, headdim, dstate, device=x.device, dtype=sdtype)
    final = torch.empty(batch, nheads, headdim, dstate, device=x.device, dtype=torch.float32)
    init = initial_states if initial_states is not None else dummy(x.device, ndim=4)
    seq = seq_idx if seq_idx is not None else dummy(x.device, torch.int32, ndim=2)
    tf32 = x.dtype == torch.float32 and sw.cb_precision == "tf32"
    call = make_call((x, B, dt, dA_cumsum, init, seq, storage, final),
                     (batch, seqlen, nheads, headdim, ngroups, dstate), chunk, initial_states is not None,
                     seq_idx is not None, tf32, sw, config)
    launch(call)
    return states, final
