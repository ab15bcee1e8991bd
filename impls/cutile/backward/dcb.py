"""Backward stage in cuTile: d(C·Bᵀ) per group, and dC. One tile program per (row tile, group, batch·chunk) forms,
for each source tile s up to its rows, dG = Σ_{h in the group} dM^h ∘ L^h ∘ dt^h_s (one MMA per head), stores it
for the dB kernel and adds dG B_s to dC; then the entering states' term Σ_h e^{Λ^h_l} dŷ^h_l S^h_c
(impls/README.md, "The chunked backward", step 4), and with switch bwd_entry_term='dcb' dΛ's entering-state term
per head from the same state tile and the row tile's C (one more MMA per head, stored for the cumsum kernel). The
heads of a group are summed in a fixed order on chip: no atomics. A row tile past the end of a short last chunk has
no rows and does nothing. Switch bwd_group_split k > 1: k programs per group, each over its share of the heads
(`head_share`), writing fp32 partials of dG and dC (partial p of group g at g·k + p of the group axis), or adding its
dC into one fp32 buffer by atomic adds (bwd_atomics)."""

from __future__ import annotations

import math

import cuda.tile as ct
import torch

from impls.chunked_backward import group_output, source_widths, sum_partials
from impls.cutile.backward.common import (
    Hints,
    add_rows,
    allocate,
    chunk_length,
    dy_tiles,
    gated_dy,
    head_share,
    kernel_call,
    or_stand_in,
    per_position,
    rows,
    state_storage,
    state_tile,
)
from impls.cutile.common import KernelCall, next_pow2

ZERO = ct.PaddingMode.ZERO


def bwd_dcb_kernel(x, B, dt, dA, seq, states, dy, z, dG, dC, C, terms, seqlen, heads_per_group,
                   CHUNK: ct.Constant[int], BT: ct.Constant[int], BP: ct.Constant[int], BN: ct.Constant[int],
                   HAS_SEQ: ct.Constant[bool], HAS_Z: ct.Constant[bool], TRANS: ct.Constant[bool],
                   TF32: ct.Constant[bool], EXP2: ct.Constant[bool], TMA: ct.Constant[bool], LAT: ct.Constant[int],
                   SPLIT: ct.Constant[int], ATOMIC: ct.Constant[bool], FTZ: ct.Constant[bool],
                   WHOLE: ct.Constant[bool], ENTER_TERM: ct.Constant[bool], WIDTHS: ct.Constant[int]):
    """dG (b, nchunks, g·SPLIT, chunk, chunk) fp32, tiles (row tile i, source tile j ≤ i) of BT × BT; dC in C's dtype
    (SPLIT 1), its fp32 partials (b, seqlen, g·SPLIT, dstate), or one fp32 buffer added into (ATOMIC). ENTER_TERM
    (switch bwd_entry_term='dcb'): dΛ's entering-state term of every head of the share at the row tile's positions,
    stored in terms (b, h, nchunks, 1, chunk) fp32 (a store, not an addition: a search runs the kernel many times).
    WIDTHS (WHOLE only): log2(CHUNK / BT) + 1, the source widths BT, 2·BT, … CHUNK a row tile may read
    (impls/chunked_backward.py source_widths)."""
    k = Hints(TMA, LAT, EXP2, TF32, FTZ)
    # one flat grid axis: row tile fastest, then the group's share of heads (SPLIT of them), group, chunk, batch
    pid = ct.bid(0)
    tiles, ngroups, nchunks = CHUNK // BT, B.shape[2] * SPLIT, dA.shape[2]
    i, gp = pid % tiles, (pid // tiles) % ngroups
    c, b = (pid // (tiles * ngroups)) % nchunks, pid // (tiles * ngroups * nchunks)
    chunk_len = chunk_length(seqlen, c, CHUNK)
    if i * BT < chunk_len:
        if WHOLE:  # switch bwd_dcb_sources='chunk': the sources up to the row tile's causal width
            for level in ct.static_iter(range(WIDTHS)):
                # row tiles 2^(level-1) … 2^level − 1 (tile 0 at level 0) read the first BT·2^level sources
                if (i < (1 << level)) & (i >= ((1 << level) >> 1)):
                    _row_block(x, B, dt, dA, seq, states, dy, z, dG, dC, C, terms, seqlen, heads_per_group, b, c, gp,
                               i, chunk_len, CHUNK, BT << level, BT, BP, BN, HAS_SEQ, HAS_Z, TRANS, SPLIT, ATOMIC,
                               ENTER_TERM, k)
        else:
            _row_tile(x, B, dt, dA, seq, states, dy, z, dG, dC, C, terms, seqlen, heads_per_group, b, c, gp, i,
                      chunk_len, CHUNK, BT, BP, BN, HAS_SEQ, HAS_Z, TRANS, SPLIT, ATOMIC, ENTER_TERM, k)


def _row_tile(x, B, dt, dA, seq, states, dy, z, dG, dC, C, terms, seqlen, heads_per_group, b, c, gp, i, chunk_len,
              CHUNK, BT, BP, BN, HAS_SEQ, HAS_Z, TRANS, SPLIT, ATOMIC, ENTER_TERM, k):
    lb = c * (CHUNK // BT) + i
    offs_l = i * BT + ct.arange(BT, dtype=ct.int32)
    mask_l = offs_l < chunk_len
    enter = mask_l
    seq_l = offs_l
    if HAS_SEQ:
        seq_l = ct.load(seq, (b, lb), (1, BT), padding_mode=ZERO, allow_tma=k.tma()).reshape((BT,))
        s_prev = ct.gather(seq, (b, c * CHUNK - 1), mask=c > 0, padding_value=0)
        enter = enter & (seq_l == s_prev)
    g, lo, hi = head_share(gp, heads_per_group, SPLIT)
    h0 = g * heads_per_group
    acc = ct.zeros((BT, BN), ct.float32)
    for j in range(i + 1):  # every source tile j ≤ i starts inside the chunk (the row tile does)
        sb = c * (CHUNK // BT) + j
        offs_s = j * BT + ct.arange(BT, dtype=ct.int32)
        keep = (offs_l.reshape((BT, 1)) >= offs_s.reshape((1, BT))) & mask_l.reshape((BT, 1))
        keep = keep & (offs_s < chunk_len).reshape((1, BT))
        if HAS_SEQ:
            seq_s = ct.load(seq, (b, sb), (1, BT), padding_mode=ZERO, allow_tma=k.tma()).reshape((1, BT))
            keep = keep & (seq_l.reshape((BT, 1)) == seq_s)
        dGt = ct.zeros((BT, BT), ct.float32)
        for hh in range(lo, hi):
            h = h0 + hh
            part, _, _ = _head_part(x, dy, z, dA, b, c, h, lb, i, sb, j, per_position(dt, b, h, c, j, BT, k), keep, BT,
                                    BT, BP, HAS_Z, k)
            dGt = dGt + part
        # whole tiles: the dB kernel reads the causal part of what is here
        ct.store(dG, (b, c, gp, i, j), dGt.reshape((1, 1, 1, BT, BT)))
        acc = k.mma(dGt.astype(x.dtype), rows(B, b, sb, g, 0, BT, BN, k), acc)
    C_l = _entering_rows(C, b, lb, g, BT, BN, ENTER_TERM, k)
    for hh in range(lo, hi):
        h = h0 + hh
        dA_l = per_position(dA, b, h, c, i, BT, k) * k.base()
        dyh_l = gated_dy(dy, z, b, lb, h, 0, BT, BP, HAS_Z, k)
        acc = _states_term(states, acc, dyh_l, dA_l, enter, b, c, h, i, BT, BP, BN, TRANS, x.dtype, k, C_l, terms,
                           ENTER_TERM)
    _store_dc(dC, acc, b, lb, c * CHUNK + offs_l, g, gp, BT, BN, ATOMIC, k)


def _head_part(x, dy, z, dA, b, c, h, lb, i, sb, j, dt_s, keep, BT, BS, BP, HAS_Z, k):
    """Head h's part of dG on row tile i (row block lb of BT) and source block j (row block sb of BS), dM ∘ L ∘ dt_s
    (fp32), with its dŷ_l (fp32) and its rows' Λ in the exponential's base."""
    dy_l, dyh_l = dy_tiles(dy, z, b, lb, h, 0, BT, BP, HAS_Z, x.dtype, k)
    x_s = rows(x, b, sb, h, 0, BS, BP, k)
    dA_l = per_position(dA, b, h, c, i, BT, k) * k.base()
    dA_s = per_position(dA, b, h, c, j, BS, k) * k.base()
    L = k.exp(ct.where(keep, dA_l.reshape((BT, 1)) - dA_s.reshape((1, BS)), -math.inf))
    dM = k.mma(dy_l, ct.transpose(x_s), ct.zeros((BT, BS), ct.float32))
    return dM * L * dt_s.reshape((1, BS)), dyh_l, dA_l


def _entering_rows(C, b, lb, g, BT, BN, ENTER_TERM, k):
    """The row tile's C_l (BT, BN) for dΛ's entering-state term (switch bwd_entry_term='dcb'), else None."""
    return rows(C, b, lb, g, 0, BT, BN, k) if ENTER_TERM else None


def _states_term(states, acc, dyh_l, dA_l, enter, b, c, h, i, BT, BP, BN, TRANS, dtype, k, C_l, terms, ENTER_TERM):
    """acc + head h's entering-state term of dC on the row tile, e^{Λ_l} dŷ_l S_c (rows of the sequence before);
    with ENTER_TERM also dΛ_l's, e^{Λ_l} dŷ_l · (S_c C_l), stored at the row tile's positions of head h."""
    scale = ct.where(enter, k.exp(dA_l), 0.0)
    S = state_tile(states, b, c, h, 0, 0, BP, BN, TRANS, k).astype(dtype)
    if ENTER_TERM:  # this program alone owns (head, row tile)
        CS = k.mma(C_l, ct.transpose(S), ct.zeros((BT, BP), ct.float32))
        ct.store(terms, (b, h, c, 0, i), (scale * ct.sum(dyh_l * CS, axis=1)).reshape((1, 1, 1, 1, BT)))
    return k.mma((dyh_l * scale.reshape((BT, 1))).astype(dtype), S, acc)


def _store_dc(dC, acc, b, lb, positions, g, gp, BT, BN, ATOMIC, k):
    if ATOMIC:  # switch bwd_atomics: the group's one fp32 buffer
        add_rows(dC, b, positions, g, acc, BT, BN)
    else:  # dC (SPLIT 1), or this program's fp32 partial
        ct.store(dC, (b, lb, gp, 0), acc.astype(dC.dtype).reshape((1, BT, 1, BN)), allow_tma=k.tma())


def _row_block(x, B, dt, dA, seq, states, dy, z, dG, dC, C, terms, seqlen, heads_per_group, b, c, gp, i, chunk_len,
               CHUNK, W, BT, BP, BN, HAS_SEQ, HAS_Z, TRANS, SPLIT, ATOMIC, ENTER_TERM, k):
    """Switch bwd_dcb_sources='chunk': the row tile against the chunk's first W sources (W ≥ its last row + 1: every
    source it depends on), one (BT × W) product per head (dŷ_l · x_cᵀ) and, in the same head loop, the entering
    states' term; then dG's row block stored for those W sources (zero above the diagonal; the sources past W, which
    the dB kernel's causal mask never reads, left as they are) and dC's sources' term as one MMA with their B."""
    lb = c * (CHUNK // BT) + i
    cb = c * (CHUNK // W)  # the chunk's first W positions, in W-row blocks
    offs_l = i * BT + ct.arange(BT, dtype=ct.int32)
    offs_c = ct.arange(W, dtype=ct.int32)
    mask_l = offs_l < chunk_len
    mask_c = offs_c < chunk_len
    keep = ((offs_l.reshape((BT, 1)) >= offs_c.reshape((1, W))) & mask_l.reshape((BT, 1))
            & mask_c.reshape((1, W)))
    enter = mask_l
    if HAS_SEQ:
        seq_l = ct.load(seq, (b, lb), (1, BT), padding_mode=ZERO, allow_tma=k.tma()).reshape((BT,))
        seq_c = ct.load(seq, (b, cb), (1, W), padding_mode=ZERO, allow_tma=k.tma()).reshape((1, W))
        keep = keep & (seq_l.reshape((BT, 1)) == seq_c)
        s_prev = ct.gather(seq, (b, c * CHUNK - 1), mask=c > 0, padding_value=0)
        enter = enter & (seq_l == s_prev)
    g, lo, hi = head_share(gp, heads_per_group, SPLIT)
    h0 = g * heads_per_group
    dGt = ct.zeros((BT, W), ct.float32)
    acc = ct.zeros((BT, BN), ct.float32)
    C_l = _entering_rows(C, b, lb, g, BT, BN, ENTER_TERM, k)
    for hh in range(lo, hi):
        h = h0 + hh
        dt_c = ct.where(mask_c, per_position(dt, b, h, c, 0, W, k), 0.0)
        part, dyh_l, dA_l = _head_part(x, dy, z, dA, b, c, h, lb, i, cb, 0, dt_c, keep, BT, W, BP, HAS_Z, k)
        dGt = dGt + part
        acc = _states_term(states, acc, dyh_l, dA_l, enter, b, c, h, i, BT, BP, BN, TRANS, x.dtype, k, C_l, terms,
                           ENTER_TERM)
    ct.store(dG, (b, c, gp, i, 0), dGt.reshape((1, 1, 1, BT, W)))
    acc = k.mma(dGt.astype(x.dtype), rows(B, b, cb, g, 0, W, BN, k), acc)
    _store_dc(dC, acc, b, lb, c * CHUNK + offs_l, g, gp, BT, BN, ATOMIC, k)


def blocks(chunk: int, headdim: int, dstate: int, config: dict) -> tuple[int, int, int]:
    """(row and source tile, headdim, dstate)."""
    return min(config.get("block") or 64, chunk), next_pow2(headdim), next_pow2(dstate)


def make_call(arrays, dims, chunk_size: int, flags: dict, transposed: bool, tf32: bool, sw, config) -> KernelCall:
    """arrays = (x, B, dt, dA, seq, states storage, dy, z, dG, dC, C, terms): tensors, or ArraySpec for AOT compiles;
    flags: seq, z."""
    batch, seqlen, nheads, headdim, ngroups, dstate = dims
    bt, bp, bn = blocks(chunk_size, headdim, dstate, config)
    args = (*arrays, seqlen, nheads // ngroups, chunk_size, bt, bp, bn, bool(flags["seq"]), bool(flags["z"]),
            bool(transposed), bool(tf32), sw.exp2, sw.tma, 4 if sw.latency_hints else 0, sw.bwd_group_split,
            sw.bwd_atomics, sw.bwd_exp2_ftz, sw.bwd_dcb_sources == "chunk", sw.bwd_entry_term == "dcb",
            source_widths(chunk_size, bt))
    grid = ((chunk_size // bt) * ngroups * sw.bwd_group_split * math.ceil(seqlen / chunk_size) * batch, 1, 1)
    return kernel_call(bwd_dcb_kernel, grid, args, config, sw.opt_level)


def dcb_grads(x, B, C, dt, dA_cumsum, seq_idx, states, dy, z, *, sw, config, tf32: bool,
              submit=None):
    """-> (dC in C's dtype, d(C·Bᵀ) per group (batch, nchunks, ngroups·k, chunk, chunk) fp32: its causal part, k =
    switch bwd_group_split's partials of each group, partial p of group g at g·k + p; dΛ's entering-state term
    (batch, nheads, nchunks, 1, chunk) fp32 with switch bwd_entry_term='dcb', else None)."""
    from impls.cutile import common

    batch, seqlen, nheads, headdim = x.shape
    ngroups, dstate = B.shape[2], B.shape[3]
    nchunks, chunk = dt.shape[2], dt.shape[3]
    dev = x.device
    storage, transposed = state_storage(states)
    dG = torch.empty((batch, nchunks, ngroups * sw.bwd_group_split, chunk, chunk), dtype=torch.float32, device=dev)
    dC = group_output(C, sw.bwd_group_split, sw.bwd_atomics, allocate)
    terms = (torch.empty((batch, nheads, nchunks, 1, chunk), dtype=torch.float32, device=dev)
             if sw.bwd_entry_term == "dcb" else None)
    arrays = (x, B, dt, dA_cumsum, or_stand_in(seq_idx, dev, torch.int32, 2), storage, dy,
              or_stand_in(z, dev, dy.dtype, 4), dG, dC, C, or_stand_in(terms, dev, torch.float32, 5))
    flags = {"seq": seq_idx is not None, "z": z is not None}
    call = make_call(arrays, (batch, seqlen, nheads, headdim, ngroups, dstate), chunk, flags, transposed, tf32, sw,
                     config)
    (submit or common.launch)(call)
    return sum_partials(dC, ngroups, None, C.dtype), dG, terms
