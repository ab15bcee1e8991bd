"""Stage 3 in cuTile: y = (C·Bᵀ ∘ decay ∘ causal mask)·(dt x) inside each chunk + exp(dA)·C·state + D x, gated by
silu(z).

One tile program owns (batch, chunk, a block of BL output rows, a block of HB heads of one group, a headdim block).
It starts from the off-chunk term C_l·stateᵀ scaled by exp(dA_l), then walks the source blocks j <= its own row
block like a causal attention: cb = C_l·B_jᵀ once for the head block (the heads of a group share B and C), then per
head scores = cb ∘ exp(dA_l − dA_j) ∘ dt_j (masked by causality and, with seq_idx, by sequence equality) and
acc += scores·x_j. The score tile is cast to the input dtype for the second MMA (as upstream). `heads_per_tile` = HB:
1 recomputes C·Bᵀ for every head; HB > 1 computes it once per HB heads (it must divide nheads / ngroups).

Switch head_mma picks how HB > 1 heads are lowered. The kernel runs NL lanes of HL heads each (NL·HL = HB), every
per-head value a tuple of NL tiles unrolled at compile time (`ct.static_iter`): "batched" = one lane of HB heads,
(HB, ·, ·) tiles and one rank-3 MMA per product (cuTile 1.7 lowers it to HMMA.16816 with spills on sm_90);
"per_head" = HB lanes of one head, each with its own state tile, x_j, dA/dt rows, scores, accumulator, 2-D MMAs
(warpgroup HGMMA on sm_90), epilogue and store, while C_l, each B_j, C_l·B_jᵀ and the masks stay shared: HB
independent MMA/exp chains per source-block step. With HB = 1 both are the same kernel.

With `shared_cb` (a tuning choice, or the `cb_mode` switch) C·Bᵀ is computed once per (batch, chunk, group) by a
small kernel of its own (`cb_kernel`, fp32, every (row block, source block) pair) and read by the heads of the group
from memory (L2 at the headline shapes: 33.5 MB at S1) instead of being recomputed for every head: at S1 (80 heads,
one group) that removes 53 % of the stage's matmul work. The numbers are the same either way (the tile is fp32 in
both, from the same operands). Switches of that kernel alone: cb_occupancy (its `ct.kernel(occupancy=)` hint; 0 =
none) and cb_lower_triangle (programs for the pairs on or below the diagonal only, the only ones read).

Switch head_loop = N runs `compute_out_head_loop_kernel` instead: one program per (batch, chunk, row block, block of
up to N heads of one group, headdim block) that loads C_l once and walks its heads HB at a time in a runtime loop,
each step the default kernel's head block (`_head_block`, the same helper), so that C_l is read once per N heads and
only one step's accumulators are live (docs/perf-notes.md, version 14).

Switch exp_fold folds dt into the exponent: `fold_kernel` first writes q = dA_cumsum·log2(e) − log2(dt) per (batch,
head, chunk, position), the main kernel reads it in dt's place (its `dt` argument) and takes each score as
cb ∘ exp2(dA_l·log2(e) − q_j): no multiply by dt and no dA_j load per source block (dt = 0: q = +inf, a zero term).
q is computed by a kernel of its own because cuTile 1.7 has no approximate log2: in the loop, ct.log2 lowers to a
polynomial of ~24 instructions per source value of each thread (docs/perf-notes.md).

Switches: operand_swap accumulates yᵀ (headdim × rows): state·C_lᵀ and x_jᵀ·scoresᵀ; transposed_layout reads the
states stored (dstate, headdim) by stage 2.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import cuda.tile as ct
import torch

from impls.cutile.common import LOG2E, CopyHints, KernelCall, kernel_call, next_pow2
from impls.cutile.pdl import start_as_dependent
from impls.cutile.switches import per_head_refusal

ZERO = ct.PaddingMode.ZERO


def _mma(a, b, acc, TF32):
    if TF32:
        return ct.mma(a.astype(ct.tfloat32), b.astype(ct.tfloat32), acc)
    return ct.mma(a, b, acc)


def _bmm(a, b, acc, TF32, HB):
    """acc (HB, M, N) += a·b, a (HB or 1, M, K), b (HB or 1, K, N): one 2-D MMA when HB == 1, else batched."""
    if HB == 1:
        m, k, n = a.shape[1], a.shape[2], b.shape[2]
        out = _mma(a.reshape((m, k)), b.reshape((k, n)), acc.reshape((m, n)), TF32)
        return out.reshape((1, m, n))
    return _mma(ct.broadcast_to(a, (HB, a.shape[1], a.shape[2])), ct.broadcast_to(b, (HB, b.shape[1], b.shape[2])),
                acc, TF32)


def _exp(v, EXP2, FTZ=False):
    """v is already scaled by log2(e) when EXP2; FTZ (switch exp2_ftz): the exp2 flushes subnormals to zero."""
    if EXP2:
        return ct.exp2(v, flush_to_zero=FTZ)
    return ct.exp(v)


def _load_rows(t, b, row_block, h, col_block, BL, BC, tma, lat):
    """(BL, BC) tile of a (batch, seqlen, heads_or_groups, cols) tensor; rows past seqlen read as zero."""
    tile = ct.load(t, (b, row_block, h, col_block), (1, BL, 1, BC), padding_mode=ZERO, allow_tma=tma, latency=lat)
    return tile.reshape((BL, BC))


def _load_heads(t, b, row_block, hb, pb, BL, HB, BP, tma, lat):
    """(HB, BL, BP) tile of a (batch, seqlen, nheads, headdim) tensor (x, z): HB heads from head block hb."""
    tile = ct.load(t, (b, row_block, hb, pb), (1, BL, HB, BP), padding_mode=ZERO, allow_tma=tma, latency=lat)
    return ct.permute(tile.reshape((BL, HB, BP)), (1, 0, 2))


def _per_head(t, b, hb, c, blk, HB, BL, tma):
    """(HB, BL) slice of a (batch, nheads, nchunks, chunk) fp32 tensor (dt, dA_cumsum)."""
    return ct.load(t, (b, hb, c, blk), (1, HB, 1, BL), allow_tma=tma).reshape((HB, BL))


def cb_kernel(C, B, cb, CHUNK: ct.Constant[int], BL: ct.Constant[int], BN: ct.Constant[int],
              TF32: ct.Constant[bool], TMA: ct.Constant[bool], LAT: ct.Constant[int], LOWER: ct.Constant[bool]):
    """cb[b, c, g, rows of block i, sources of block j] = C_i·B_jᵀ in fp32, for every pair (i, j) of a chunk; with
    LOWER (switch cb_lower_triangle) for the pairs j <= i only, one program each, the pairs above the diagonal left
    unwritten (the main kernels read j <= i only)."""
    pid, g = ct.bid(0), ct.bid(1)
    nsub = CHUNK // BL
    nchunks = cb.shape[1]
    if LOWER:
        pairs = nsub * (nsub + 1) // 2
        i, j = _lower_pair(pid % pairs, nsub)
        c = (pid // pairs) % nchunks
        b = pid // (pairs * nchunks)
    else:
        j = pid % nsub
        i = (pid // nsub) % nsub
        c = (pid // (nsub * nsub)) % nchunks
        b = pid // (nsub * nsub * nchunks)
    tma = None if TMA else False
    lat = LAT if LAT > 0 else None
    c_l = _load_rows(C, b, c * nsub + i, g, 0, BL, BN, tma, lat)
    b_s = _load_rows(B, b, c * nsub + j, g, 0, BL, BN, tma, lat)
    out = _mma(c_l, ct.transpose(b_s), ct.zeros((BL, BL), ct.float32), TF32)
    ct.store(cb, (b, c, g, i, j), out.reshape((1, 1, 1, BL, BL)), allow_tma=tma)


def _lower_pair(t, NSUB):
    """(i, j) of the t-th pair on or below the diagonal of NSUB × NSUB blocks, row by row: t = i(i + 1)/2 + j,
    0 <= j <= i (i found by comparing t with each row's first pair, unrolled at compile time)."""
    i = 0
    for r in ct.static_iter(range(1, NSUB)):
        if t >= r * (r + 1) // 2:
            i = r
    return i, t - i * (i + 1) // 2


def cb_pairs(nsub: int, lower: bool) -> int:
    """cb_kernel's programs per (batch, chunk, group): every (row block, source block) pair, or with lower
    (switch cb_lower_triangle) those on or below the diagonal."""
    return nsub * (nsub + 1) // 2 if lower else nsub * nsub


def fold_kernel(dt, dA, q, CHUNK: ct.Constant[int], EXP2: ct.Constant[bool], TMA: ct.Constant[bool]):
    """Switch exp_fold: q = dA_cumsum·log2(e) − log2(dt) (dA_cumsum − ln(dt) with EXP2 off) of one (batch, head,
    chunk) row of stage 1's (batch, nheads, nchunks, chunk) outputs, fp32; dt = 0 gives q = +inf."""
    bc, h = ct.bid(0), ct.bid(1)
    nchunks = q.shape[2]
    b, c = bc // nchunks, bc % nchunks
    tma = None if TMA else False
    dt_row = ct.load(dt, (b, h, c, 0), (1, 1, 1, CHUNK), allow_tma=tma).astype(ct.float32)
    dA_row = ct.load(dA, (b, h, c, 0), (1, 1, 1, CHUNK), allow_tma=tma).astype(ct.float32)
    if EXP2:
        out = dA_row * LOG2E - ct.log2(dt_row)
    else:
        out = dA_row - ct.log(dt_row)
    ct.store(q, (b, h, c, 0), out, allow_tma=tma)


@dataclass(frozen=True)
class OutConsts(CopyHints):
    """The compile-time constants of a stage-3 tile program, built once in the kernel (compute_out_kernel, and
    fused_kernel for its output rows) from its `ct.Constant` parameters and handed whole to the helpers.

    cuTile 1.7 takes a frozen dataclass in kernel code as an aggregate whose fields are the values it was built
    from, so fields built from constants stay compile-time constants: `if k.SWAP:` and `ct.static_iter(range(k.NL))`
    fold exactly as the parameters themselves did (the normalised SASS of every kernel is unchanged, see
    instruments/cutile/sass_hashes.py). The kernels keep their scalar `ct.Constant` parameters: a dataclass kernel
    parameter is "a development-only feature" in cuTile 1.7 (`cuda.tile.compilation.DataclassConstraint` refuses
    it outside calling convention v3)."""

    CHUNK: int  # chunk length
    BL: int  # rows of the tile, = positions of a source block
    BP: int  # headdim columns of the tile
    BN: int  # dstate, whole (C·Bᵀ and C·stateᵀ contract over it)
    NL: int  # lanes: 1 = the heads as one (batched) chain; HB = one chain per head (head_mma per_head)
    HL: int  # heads per lane (NL·HL = heads per tile)
    HAS_SEQ: bool  # seq_idx given: sources of another sequence are masked
    SWAP: bool  # switch operand_swap: the tile accumulates yᵀ (headdim × rows)
    TRANS: bool  # switch transposed_layout: states stored (dstate, headdim)
    TF32: bool  # fp32 inputs through the tf32 tensor cores
    EXP2: bool  # switch exp2: dA scaled by log2(e) once per load, decays by exp2
    TMA: bool  # switch tma: TMA bulk copies allowed
    LAT: int  # latency hint of the big loads (x, B, C, states); 0 = none
    SHARED_CB: bool  # C·Bᵀ read from cb_kernel's output instead of computed in the tile
    D_MODE: int  # skip term D: 0 absent, 1 per head, 2 per (head, channel)
    HAS_Z: bool  # gate by silu(z)
    SKIP_FIRST: bool = False  # switch skip_first: D∘x added to the accumulator before the source loop, not after
    EXP2_FTZ: bool = False  # switch exp2_ftz: the exp2 flush subnormal inputs and results to zero
    EXP_FOLD: bool = False  # switch exp_fold: dt folded into the scores' exponent (q = dA·log2(e) − log2(dt))
    DECAY_SINGLE: bool = False  # switch decay_single: the factored decay summed into the one accumulator


def _by_source(v, HB, BL, SWAP):
    """(HB, BL) per-source values shaped to broadcast over the score tile: (HB, 1, BL), or (HB, BL, 1) with SWAP."""
    if SWAP:
        return v.reshape((HB, BL, 1))
    return v.reshape((HB, 1, BL))


def _by_row(v, HB, BL, SWAP):
    """(HB, BL) per-row values shaped to broadcast over the score tile: (HB, BL, 1), or (HB, 1, BL) with SWAP."""
    if SWAP:
        return v.reshape((HB, 1, BL))
    return v.reshape((HB, BL, 1))


def _lane_block(hb, lane, NL):
    """Head-block index, in units of a lane's HL = HB / NL heads, of lane `lane` of head block hb: hb itself with
    one lane (all HB heads in one batched MMA), head hb·HB + lane with NL = HB lanes (one head, one 2-D MMA each)."""
    h = hb
    if NL > 1:
        h = hb * NL + lane
    return h


def _cb_tile(B, cbm, c_l, b, c, g, i, j, src_block, k):
    """C_l·B_jᵀ (rows × sources; sources × rows with SWAP), fp32, shared by every head of the tile: read from
    cb_kernel's output with SHARED_CB, else one MMA on the B_j tile (source block j = chunk block src_block)."""
    BL = k.BL
    if k.SHARED_CB:  # (rows, sources), computed once for the group by cb_kernel
        cb = ct.load(cbm, (b, c, g, i, j), (1, 1, 1, BL, BL), allow_tma=k.tma(), latency=k.lat()).reshape((BL, BL))
        if k.SWAP:
            cb = ct.transpose(cb)
    else:
        b_s = _load_rows(B, b, src_block, g, 0, BL, k.BN, k.tma(), k.lat())
        if k.SWAP:
            cb = _mma(b_s, ct.transpose(c_l), ct.zeros((BL, BL), ct.float32), k.TF32)
        else:
            cb = _mma(c_l, ct.transpose(b_s), ct.zeros((BL, BL), ct.float32), k.TF32)
    return cb


def _same_sequence(seq, s_l, b, src_block, k):
    """(1, BL, BL) seq(row) == seq(source) over the score tile (transposed with SWAP); s_l: the rows' seq_idx."""
    BL = k.BL
    s_s = ct.load(seq, (b, src_block), (1, BL), padding_mode=ZERO, allow_tma=k.tma()).reshape((1, BL))
    return _by_row(s_l.reshape((1, BL)), 1, BL, k.SWAP) == _by_source(s_s, 1, BL, k.SWAP)


def _source_mask(seq, s_l, rows, b, src_block, j, k, FACTORED):
    """(1, BL, BL) mask of the score tile (transposed with SWAP), shared by the tile's heads: row >= source
    (causality) and, with seq_idx, `_same_sequence`. FACTORED (j < i, causal throughout; called with seq_idx only):
    the sequence test alone."""
    BL = k.BL
    if FACTORED:
        keep = _same_sequence(seq, s_l, b, src_block, k)
    else:
        srcs = j * BL + ct.arange(BL, dtype=ct.int32)
        keep = _by_row(rows.reshape((1, BL)), 1, BL, k.SWAP) >= _by_source(srcs.reshape((1, BL)), 1, BL, k.SWAP)
        if k.HAS_SEQ:
            keep = keep & _same_sequence(seq, s_l, b, src_block, k)
    return keep


def _lane_loads(x, dt, dA, b, c, h, pb, j, src_block, k):
    """The source block's per-head operands of the HL heads of lane block h: x_j (HL, BL, BP), dA_j (scaled by
    log2(e) with EXP2) and dt_j, (HL, BL) each. EXP_FOLD (switch exp_fold): the kernel's dt argument holds
    q = dA_cumsum − log(dt) in the exponent's base (`fold_kernel`), loaded as q_j in dA_j's place; dt_j is None."""
    x_s = _load_heads(x, b, src_block, h, pb, k.BL, k.HL, k.BP, k.tma(), k.lat())
    if k.EXP_FOLD:
        return x_s, _per_head(dt, b, h, c, j, k.HL, k.BL, k.tma()), None
    dA_s = _per_head(dA, b, h, c, j, k.HL, k.BL, k.tma()) * (LOG2E if k.EXP2 else 1.0)
    dt_s = _per_head(dt, b, h, c, j, k.HL, k.BL, k.tma())
    return x_s, dA_s, dt_s


def _masked_scores(cb, keep, dA_s, dt_s, dA_l, k):
    """(HL, BL, BL) scores of one lane: cb ∘ exp(dA_l − dA_j) ∘ dt_j where keep, else 0 (transposed with SWAP);
    with EXP_FOLD dA_s is q_j (`_lane_loads`) and the scores cb ∘ exp(dA_l − q_j), no multiply by dt."""
    HL, BL, SWAP = k.HL, k.BL, k.SWAP
    diff = ct.where(keep, _by_row(dA_l, HL, BL, SWAP) - _by_source(dA_s, HL, BL, SWAP), -math.inf)
    if k.EXP_FOLD:
        return cb.reshape((1, BL, BL)) * _exp(diff, k.EXP2, k.EXP2_FTZ)
    return cb.reshape((1, BL, BL)) * _exp(diff, k.EXP2, k.EXP2_FTZ) * _by_source(dt_s, HL, BL, SWAP)


def _factored_scores(cb, dA_s, dt_s, dA_ref, k):
    """(HL, BL, BL) scores of one lane off the diagonal (decay_factor): cb ∘ exp(dA_ref − dA_j)·dt_j per source,
    the source factor of the decay only (the caller applies the row factor exp(dA_l − dA_ref) to the block sum);
    with EXP_FOLD dA_s is q_j and the factor exp(dA_ref − q_j)."""
    w = _exp(dA_ref - dA_s, k.EXP2, k.EXP2_FTZ)  # (HL, BL) per source
    if not k.EXP_FOLD:
        w = w * dt_s
    return cb.reshape((1, k.BL, k.BL)) * _by_source(w, k.HL, k.BL, k.SWAP)


def _score_mma(scores, x_s, acc, k):
    """acc += scores·x_j (HL heads), or with SWAP acc += x_jᵀ·scoresᵀ; the scores cast to x's dtype (as upstream)."""
    if k.SWAP:
        return _bmm(ct.transpose(x_s, 1, 2), scores.astype(x_s.dtype), acc, k.TF32, k.HL)
    return _bmm(scores.astype(x_s.dtype), x_s, acc, k.TF32, k.HL)


def _source_lanes(B, x, dt, dA, seq, cbm, accs, c_l, dA_ls, dA_refs, s_l, rows, b, c, g, hb, pb, i, j, k, FACTORED):
    """Source block j for the NL lanes of HL heads (tuples accs, dA_ls, dA_refs: one entry per lane): the B_j load,
    cb = C_l·B_jᵀ and the mask once for all lanes, then per lane its x_j, dA_j, dt_j, scores and
    accs[l] += scores_l·x_j: NL independent load/exp/MMA chains per step. FACTORED (j < i): `_factored_scores`,
    masked by sequence only (causal throughout). seq and s_l (the rows' seq_idx) are read only with HAS_SEQ, cbm
    only with SHARED_CB: None otherwise."""
    NL = k.NL
    src_block = c * (k.CHUNK // k.BL) + j
    cb = _cb_tile(B, cbm, c_l, b, c, g, i, j, src_block, k)
    ops = tuple(_lane_loads(x, dt, dA, b, c, _lane_block(hb, l, NL), pb, j, src_block, k)
                for l in ct.static_iter(range(NL)))
    if FACTORED:
        scores = tuple(_factored_scores(cb, ops[l][1], ops[l][2], dA_refs[l], k) for l in ct.static_iter(range(NL)))
        if k.HAS_SEQ:
            keep = _source_mask(seq, s_l, rows, b, src_block, j, k, FACTORED)
            scores = tuple(ct.where(keep, scores[l], 0.0) for l in ct.static_iter(range(NL)))
    else:
        keep = _source_mask(seq, s_l, rows, b, src_block, j, k, FACTORED)
        scores = tuple(_masked_scores(cb, keep, ops[l][1], ops[l][2], dA_ls[l], k) for l in ct.static_iter(range(NL)))
    return tuple(_score_mma(scores[l], ops[l][0], accs[l], k) for l in ct.static_iter(range(NL)))


def _source_block(B, x, dt, dA, seq, cbm, acc, c_l, dA_l, dA_ref, s_l, rows, b, c, g, hb, pb, i, j, k, FACTORED):
    """acc += scores(rows of block i, sources of block j)·x_j for the HL heads of head block hb (k.NL must be 1),
    scores = C_l·B_jᵀ ∘ decay ∘ dt_j (∘ causal and sequence masks), as one (batched when HL > 1) MMA:
    `_source_lanes` with one lane. FACTORED (j < i, switch decay_factor): the decay's source factor
    exp(dA_ref - dA_s)·dt_s only, the row factor exp(dA_l - dA_ref) is applied by the caller to the block sum; no
    causal mask is needed off the diagonal. SWAP accumulates the transposed (headdim × rows) product."""
    return _source_lanes(B, x, dt, dA, seq, cbm, (acc,), c_l, (dA_l,), (dA_ref,), s_l, rows, b, c, g, hb, pb, i, j, k,
                         FACTORED)[0]


def _off_chunk(states, c_l, state_scale, b, c, h, pb, k):
    """The off-chunk term of the HL heads of lane block h: (C_l·stateᵀ) scaled per row by state_scale (HL, BL),
    (HL, BL, BP); with SWAP its transpose state·C_lᵀ, (HL, BP, BL). States are stored (n, p) with TRANS, else (p, n)."""
    BL, BP, BN, HL, tma, lat = k.BL, k.BP, k.BN, k.HL, k.tma(), k.lat()
    if k.TRANS:
        s_np = ct.load(states, (b, c, h, 0, pb), (1, 1, HL, BN, BP), padding_mode=ZERO, allow_tma=tma, latency=lat)
        s_np = s_np.reshape((HL, BN, BP)).astype(c_l.dtype)
    else:
        s_pn = ct.load(states, (b, c, h, pb, 0), (1, 1, HL, BP, BN), padding_mode=ZERO, allow_tma=tma, latency=lat)
        s_np = ct.transpose(s_pn.reshape((HL, BP, BN)).astype(c_l.dtype), 1, 2)
    if k.SWAP:
        acc = _bmm(ct.transpose(s_np, 1, 2), ct.transpose(c_l).reshape((1, BN, BL)),
                   ct.zeros((HL, BP, BL), ct.float32), k.TF32, HL)
        acc = acc * state_scale.reshape((HL, 1, BL))
    else:
        acc = _bmm(c_l.reshape((1, BL, BN)), s_np, ct.zeros((HL, BL, BP), ct.float32), k.TF32, HL)
        acc = acc * state_scale.reshape((HL, BL, 1))
    return acc


def _decay_refs(dA, b, c, hb, i, scale, k):
    """Per lane, dA_cumsum at the first row of row block i, (HL, 1), times `scale` (log2(e) with EXP2): the factored
    decay's reference point dA_ref."""
    return tuple(ct.load(dA, (b, _lane_block(hb, l, k.NL), c, i * k.BL), (1, k.HL, 1, 1), allow_tma=k.tma())
                 .reshape((k.HL, 1)) * scale for l in ct.static_iter(range(k.NL)))


def _skip_term(x, D, b, row_block, h, pb, k):
    """D ∘ x on the (HL, BL, BP) tile of the HL heads of lane block h (D per head or per channel; D_MODE > 0),
    transposed to the accumulator's (HL, BP, BL) with SWAP."""
    BL, BP, HL, tma = k.BL, k.BP, k.HL, k.tma()
    x_l = _load_heads(x, b, row_block, h, pb, BL, HL, BP, tma, None).astype(ct.float32)
    if k.D_MODE == 1:
        d = ct.load(D, (h,), (HL,), allow_tma=tma).astype(ct.float32).reshape((HL, 1, 1))
    else:
        d = ct.load(D, (h, pb), (HL, BP), padding_mode=ZERO, allow_tma=tma).astype(ct.float32).reshape((HL, 1, BP))
    if k.SWAP:
        return ct.transpose(x_l * d, 1, 2)
    return x_l * d


def _epilogue(acc, x, D, z, y, b, row_block, h, pb, k):
    """y = (acc + D ∘ x)·silu(z) on the (HL, BL, BP) tile of the HL heads of lane block h (D per head or per
    channel, each term when present; D ∘ x already in acc with SKIP_FIRST), then one store."""
    BL, BP, HL, tma = k.BL, k.BP, k.HL, k.tma()
    D_HERE = k.D_MODE > 0 and not k.SKIP_FIRST
    if D_HERE or k.HAS_Z:
        x_l = _load_heads(x, b, row_block, h, pb, BL, HL, BP, tma, None).astype(ct.float32)
    if D_HERE and k.D_MODE == 1:
        d_h = ct.load(D, (h,), (HL,), allow_tma=tma).astype(ct.float32)
        acc = acc + x_l * d_h.reshape((HL, 1, 1))
    if D_HERE and k.D_MODE == 2:
        d_hp = ct.load(D, (h, pb), (HL, BP), padding_mode=ZERO, allow_tma=tma).astype(ct.float32)
        acc = acc + x_l * d_hp.reshape((HL, 1, BP))
    if k.HAS_Z:
        z_l = _load_heads(z, b, row_block, h, pb, BL, HL, BP, tma, None).astype(ct.float32)
        acc = acc * z_l / (1.0 + _exp(-z_l * (LOG2E if k.EXP2 else 1.0), k.EXP2, k.EXP2_FTZ))
    out = ct.permute(acc.astype(y.dtype), (1, 0, 2)).reshape((1, BL, HL, BP))
    ct.store(y, (b, row_block, h, pb), out, allow_tma=tma)


def compute_out_kernel(C, B, x, dt, dA, states, D, z, seq, cbm, y, heads_per_group,
                       CHUNK: ct.Constant[int], BL: ct.Constant[int], BP: ct.Constant[int], BN: ct.Constant[int],
                       HB: ct.Constant[int], D_MODE: ct.Constant[int], HAS_Z: ct.Constant[bool],
                       HAS_SEQ: ct.Constant[bool], SWAP: ct.Constant[bool], TRANS: ct.Constant[bool],
                       TF32: ct.Constant[bool], EXP2: ct.Constant[bool], TMA: ct.Constant[bool],
                       LAT: ct.Constant[int], SHARED_CB: ct.Constant[bool], DECAY_FACTOR: ct.Constant[bool],
                       PER_HEAD: ct.Constant[bool], HEADS_FIRST: ct.Constant[bool], SKIP_FIRST: ct.Constant[bool],
                       PDL: ct.Constant[bool], EXP2_FTZ: ct.Constant[bool], EXP_FOLD: ct.Constant[bool],
                       DECAY_SINGLE: ct.Constant[bool]):
    """One (batch, chunk, row block i, head block hb of HB heads, headdim block pb) tile. The heads run as NL lanes
    of HL heads: switch head_mma "batched" = one lane of HB heads (rank-3 MMAs when HB > 1), "per_head" (PER_HEAD)
    = HB lanes of one head (2-D MMAs). Per-lane values (accumulator, dA rows, decay reference) are tuples unrolled
    at compile time; C_l, each B_j, C_l·B_jᵀ and the masks are shared by the lanes. Program order (`grid_of`):
    the row tiles (b, c, i) along axis 0 and the head blocks along axis 1, or with HEADS_FIRST (switch
    heads_first) both along axis 0, head block fastest."""
    if PDL:  # launched as a programmatic dependent launch: nothing before the wait
        start_as_dependent()
    NL = HB if PER_HEAD else 1
    HL = HB // NL
    k = OutConsts(CHUNK, BL, BP, BN, NL, HL, HAS_SEQ, SWAP, TRANS, TF32, EXP2, TMA, LAT, SHARED_CB, D_MODE, HAS_Z,
                  SKIP_FIRST, EXP2_FTZ, EXP_FOLD, DECAY_SINGLE)
    pid, hb, pb = ct.bid(0), ct.bid(1), ct.bid(2)
    if HEADS_FIRST:
        head_blocks = x.shape[2] // HB
        pid, hb = ct.bid(0) // head_blocks, ct.bid(0) % head_blocks
    _row_tile(C, B, x, dt, dA, states, D, z, y, seq, cbm, heads_per_group, pid, hb, pb, k, HB, DECAY_FACTOR)


def _row_tile(C, B, x, dt, dA, states, D, z, y, seq, cbm, heads_per_group, pid, hb, pb, k, HB, DECAY_FACTOR):
    """Tile (row tile pid = (batch, chunk, row block), head block hb, headdim block pb): C_l, then `_head_block`."""
    nsub = k.CHUNK // k.BL
    nchunks = dA.shape[2]
    i = pid % nsub
    c = (pid // nsub) % nchunks
    b = pid // (nsub * nchunks)
    g = (hb * HB) // heads_per_group  # HB divides heads_per_group: the block's heads share one group
    c_l = _load_rows(C, b, c * nsub + i, g, 0, k.BL, k.BN, k.tma(), k.lat())
    _head_block(B, x, dt, dA, states, D, z, y, seq, cbm, c_l, b, c, g, hb, pb, i, k, DECAY_FACTOR)


def _head_block(B, x, dt, dA, states, D, z, y, seq, cbm, c_l, b, c, g, hb, pb, i, k, DECAY_FACTOR):
    """The output tile of head block hb (HB = NL·HL heads, lanes as in compute_out_kernel) for the rows of block i,
    from the C_l tile of those rows: the off-chunk term, the skip term with SKIP_FIRST, the source blocks j <= i
    (C_l·B_jᵀ once per source block for the block's heads), the epilogue and the store of each lane."""
    NL, HL, BL, CHUNK, EXP2, FTZ, SWAP = k.NL, k.HL, k.BL, k.CHUNK, k.EXP2, k.EXP2_FTZ, k.SWAP
    row_block = c * (CHUNK // BL) + i
    tma = k.tma()
    scale = LOG2E if EXP2 else 1.0
    dA_ls = tuple(_per_head(dA, b, _lane_block(hb, l, NL), c, i, HL, BL, tma) * scale
                  for l in ct.static_iter(range(NL)))
    rows = i * BL + ct.arange(BL, dtype=ct.int32)

    # off-chunk term: C_l · stateᵀ, scaled by exp(dA_l) (zero for rows of a sequence that began in this chunk);
    # with DECAY_SINGLE by exp(dA_ref), its row factor exp(dA_l − dA_ref) coming with the factored blocks'
    dA_refs = None
    if k.DECAY_SINGLE:
        dA_refs = _decay_refs(dA, b, c, hb, i, scale, k)
        state_scales = tuple(ct.broadcast_to(_exp(dA_refs[l], EXP2, FTZ), (HL, BL)) for l in ct.static_iter(range(NL)))
    else:
        state_scales = tuple(_exp(dA_ls[l], EXP2, FTZ) for l in ct.static_iter(range(NL)))
    s_l = None  # the rows' seq_idx, read only with HAS_SEQ
    if k.HAS_SEQ:
        s_l = ct.load(seq, (b, row_block), (1, BL), padding_mode=ZERO, allow_tma=tma).reshape((BL,))
        s_before = ct.gather(seq, (b, c * CHUNK - 1), mask=c > 0, padding_value=0)
        same = (s_l == s_before).reshape((1, BL))
        state_scales = tuple(ct.where(same, state_scales[l], 0.0) for l in ct.static_iter(range(NL)))
    accs = tuple(_off_chunk(states, c_l, state_scales[l], b, c, _lane_block(hb, l, NL), pb, k)
                 for l in ct.static_iter(range(NL)))

    if k.SKIP_FIRST and k.D_MODE > 0 and not k.DECAY_SINGLE:  # D ∘ x now: its indices and values need not live
        accs = tuple(accs[l] + _skip_term(x, D, b, row_block, _lane_block(hb, l, NL), pb, k)
                     for l in ct.static_iter(range(NL)))

    # in-chunk term, causal over source blocks j <= i
    if DECAY_FACTOR and k.DECAY_SINGLE:
        # one accumulator: the off-chunk term (scaled by exp(dA_ref)) and blocks j < i (source factors relative to
        # dA_ref) summed in it, scaled once per row by exp(dA_l - dA_ref), then the skip term and the diagonal block
        for j in range(i):
            accs = _source_lanes(B, x, dt, dA, seq, cbm, accs, c_l, dA_ls, dA_refs, s_l, rows, b, c, g, hb, pb, i, j,
                                 k, True)
        accs = tuple(accs[l] * _by_row(_exp(dA_ls[l] - dA_refs[l], EXP2, FTZ), HL, BL, SWAP)
                     for l in ct.static_iter(range(NL)))
        if k.SKIP_FIRST and k.D_MODE > 0:
            accs = tuple(accs[l] + _skip_term(x, D, b, row_block, _lane_block(hb, l, NL), pb, k)
                         for l in ct.static_iter(range(NL)))
        accs = _source_lanes(B, x, dt, dA, seq, cbm, accs, c_l, dA_ls, dA_refs, s_l, rows, b, c, g, hb, pb, i, i, k,
                             False)
    elif DECAY_FACTOR:
        # blocks j < i: exp(dA_l - dA_s) = exp(dA_l - dA_ref) * exp(dA_ref - dA_s), dA_ref = dA at the block's first
        # row; the source factor (times dt) scales the C·Bᵀ tile's source side, the row factor the sum afterwards
        dA_refs = _decay_refs(dA, b, c, hb, i, scale, k)
        offs = tuple(ct.zeros(accs[l].shape, ct.float32) for l in ct.static_iter(range(NL)))
        for j in range(i):
            offs = _source_lanes(B, x, dt, dA, seq, cbm, offs, c_l, dA_ls, dA_refs, s_l, rows, b, c, g, hb, pb, i, j,
                                 k, True)
        accs = tuple(accs[l] + offs[l] * _by_row(_exp(dA_ls[l] - dA_refs[l], EXP2, FTZ), HL, BL, SWAP)
                     for l in ct.static_iter(range(NL)))
        accs = _source_lanes(B, x, dt, dA, seq, cbm, accs, c_l, dA_ls, dA_refs, s_l, rows, b, c, g, hb, pb, i, i, k,
                             False)
    else:
        for j in range(i + 1):
            accs = _source_lanes(B, x, dt, dA, seq, cbm, accs, c_l, dA_ls, dA_ls, s_l, rows, b, c, g, hb, pb, i, j, k,
                                 False)

    # epilogue per lane on (HL, BL, BP): D skip, z gate, one store
    for l in ct.static_iter(range(NL)):
        acc = ct.transpose(accs[l], 1, 2) if SWAP else accs[l]
        _epilogue(acc, x, D, z, y, b, row_block, _lane_block(hb, l, NL), pb, k)


def compute_out_head_loop_kernel(C, B, x, dt, dA, states, D, z, seq, cbm, y, heads_per_group,
                                 CHUNK: ct.Constant[int], BL: ct.Constant[int], BP: ct.Constant[int],
                                 BN: ct.Constant[int], HB: ct.Constant[int], HLOOP: ct.Constant[int],
                                 D_MODE: ct.Constant[int], HAS_Z: ct.Constant[bool], HAS_SEQ: ct.Constant[bool],
                                 SWAP: ct.Constant[bool], TRANS: ct.Constant[bool], TF32: ct.Constant[bool],
                                 EXP2: ct.Constant[bool], TMA: ct.Constant[bool], LAT: ct.Constant[int],
                                 SHARED_CB: ct.Constant[bool], DECAY_FACTOR: ct.Constant[bool],
                                 PER_HEAD: ct.Constant[bool], HEADS_FIRST: ct.Constant[bool],
                                 SKIP_FIRST: ct.Constant[bool], PDL: ct.Constant[bool],
                                 EXP2_FTZ: ct.Constant[bool], EXP_FOLD: ct.Constant[bool],
                                 DECAY_SINGLE: ct.Constant[bool]):
    """Switch head_loop: one (batch, chunk, row block i, block of up to HLOOP heads of one group, headdim block pb)
    program that walks its heads HB at a time in a runtime loop (HB = heads_per_tile heads per step, lanes as in
    compute_out_kernel; HB divides HLOOP and heads_per_group), so that only one step's accumulators are live. The
    C_l tile is loaded once for all the block's heads (seq_idx's rows, 64 ints, once per step); each step's loop
    reads B_j again (this program's own recent reads) and computes C_l·B_jᵀ once for its HB heads. A group's heads
    form ceil(heads_per_group / HLOOP) blocks, the last one shorter when HLOOP does not divide heads_per_group.
    Program order (`grid_of`) as compute_out_kernel's: head blocks along axis 1 or, with HEADS_FIRST, fastest along
    axis 0."""
    if PDL:  # launched as a programmatic dependent launch: nothing before the wait
        start_as_dependent()
    pid, hb, pb = ct.bid(0), ct.bid(1), ct.bid(2)
    per_group = (heads_per_group + HLOOP - 1) // HLOOP  # head blocks of the loop per group
    if HEADS_FIRST:
        head_blocks = per_group * (x.shape[2] // heads_per_group)
        pid, hb = ct.bid(0) // head_blocks, ct.bid(0) % head_blocks
    NL = HB if PER_HEAD else 1
    k = OutConsts(CHUNK, BL, BP, BN, NL, HB // NL, HAS_SEQ, SWAP, TRANS, TF32, EXP2, TMA, LAT, SHARED_CB, D_MODE,
                  HAS_Z, SKIP_FIRST, EXP2_FTZ, EXP_FOLD, DECAY_SINGLE)
    nsub = CHUNK // BL
    nchunks = dA.shape[2]
    i = pid % nsub
    c = (pid // nsub) % nchunks
    b = pid // (nsub * nchunks)
    g = hb // per_group
    first = g * heads_per_group + (hb % per_group) * HLOOP  # the block's first head, a multiple of HB
    end = min(first + HLOOP, (g + 1) * heads_per_group)
    c_l = _load_rows(C, b, c * nsub + i, g, 0, BL, BN, k.tma(), k.lat())  # once for all the block's heads
    for step in range(first // HB, end // HB):  # head block `step` of HB heads
        _head_block(B, x, dt, dA, states, D, z, y, seq, cbm, c_l, b, c, g, step, pb, i, k, DECAY_FACTOR)


def head_block(heads_per_group: int, config: dict) -> int:
    """Heads per tile: the configured value, which must divide nheads / ngroups (1 when unset)."""
    hb = config.get("heads_per_tile") or 1
    if heads_per_group % hb:
        raise ValueError(f"heads_per_tile={hb} must divide nheads/ngroups={heads_per_group} (cutile compute_out)")
    return hb


def per_head_mma(sw, hb: int) -> bool:
    """Whether the kernel gives each of its hb heads its own 2-D MMAs (switch head_mma "per_head") instead of one
    batched rank-3 MMA; False when hb == 1 (one head: both lowerings are the same kernel). Raises ValueError for
    the combinations it does not build (`switches.per_head_refusal`)."""
    reason = per_head_refusal(sw, hb)
    if reason:
        raise ValueError(f"{reason} (cutile compute_out)")
    return sw.head_mma == "per_head" and hb > 1


def blocks(chunk: int, headdim: int, dstate: int, config: dict) -> tuple[int, int, int]:
    bl = min(config.get("block_rows") or 64, chunk)
    bp = min(config.get("block_headdim") or 64, next_pow2(headdim))
    return bl, bp, next_pow2(dstate)


CB_MODES = {"shared": True, "inline": False}


def shared_cb(sw, config: dict) -> bool:
    """C·Bᵀ once per group (cb_kernel) or inside the main kernel per head: the cb_mode switch, else the config."""
    if sw.cb_mode != "tuned":
        return CB_MODES[sw.cb_mode]
    return bool(config.get("shared_cb", False))


def grid_of(row_tiles: int, head_blocks: int, headdim_blocks: int, heads_first: bool) -> tuple[int, int, int]:
    """The launch grid. CTAs are dispatched in increasing linear block id (axis 0 fastest), so the programs resident
    together are neighbours along axis 0: by default the row tiles (batch, chunk, row block) of one head block, each
    reading its own C and B tiles; with heads_first (switch) the head blocks of one row tile, which read the same C
    and B tiles (the heads of a group share them) and so find them in L2 after the first."""
    if heads_first:
        return (row_tiles * head_blocks, 1, headdim_blocks)
    return (row_tiles, head_blocks, headdim_blocks)


def make_call(arrays, dims, chunk_size, d_mode, has_z, has_seq, tf32, sw, config) -> KernelCall:
    """arrays = (C, B, x, dt, dA, states_storage, D, z, seq, cb, y): tensors, or ArraySpec for AOT compiles; cb is
    the (b, c, g, chunk, chunk) fp32 output of cb_kernel when shared_cb, else a 5-d stand-in."""
    if sw.head_loop:
        return make_head_loop_call(arrays, dims, chunk_size, d_mode, has_z, has_seq, tf32, sw, config)
    batch, seqlen, nheads, headdim, ngroups, dstate = dims
    nchunks = math.ceil(seqlen / chunk_size)
    bl, bp, bn = blocks(chunk_size, headdim, dstate, config)
    hb = head_block(nheads // ngroups, config)
    args = (*arrays, nheads // ngroups, chunk_size, bl, bp, bn, hb, int(d_mode), bool(has_z), bool(has_seq),
            sw.operand_swap, sw.transposed_layout, bool(tf32), sw.exp2, sw.tma, 4 if sw.latency_hints else 0,
            shared_cb(sw, config), sw.decay_factor, per_head_mma(sw, hb), sw.heads_first,
            sw.skip_first, sw.pdl, sw.exp2_ftz, sw.exp_fold, sw.decay_single)
    grid = grid_of(batch * nchunks * (chunk_size // bl), nheads // hb, math.ceil(headdim / bp), sw.heads_first)
    return kernel_call(compute_out_kernel, grid, args, config.get("occupancy", 0), sw.opt_level, sw.pdl)


def make_head_loop_call(arrays, dims, chunk_size, d_mode, has_z, has_seq, tf32, sw, config) -> KernelCall:
    """Switch head_loop: compute_out_head_loop_kernel's launch, up to sw.head_loop heads of one group per program
    (ceil(heads_per_group / head_loop) head blocks per group); the config's tiles and occupancy as for
    compute_out_kernel, its heads_per_tile must be 1 (the heads are the loop's)."""
    batch, seqlen, nheads, headdim, ngroups, dstate = dims
    heads_per_group = nheads // ngroups
    hb = head_block(heads_per_group, config)
    if sw.head_loop % hb:
        raise ValueError(f"head_loop={sw.head_loop} must be a multiple of heads_per_tile={hb} (the heads of one step "
                         "of the loop) (cutile compute_out)")
    nchunks = math.ceil(seqlen / chunk_size)
    bl, bp, bn = blocks(chunk_size, headdim, dstate, config)
    args = (*arrays, heads_per_group, chunk_size, bl, bp, bn, hb, sw.head_loop, int(d_mode), bool(has_z),
            bool(has_seq), sw.operand_swap, sw.transposed_layout, bool(tf32), sw.exp2, sw.tma,
            4 if sw.latency_hints else 0, shared_cb(sw, config), sw.decay_factor, per_head_mma(sw, hb), sw.heads_first,
            sw.skip_first, sw.pdl, sw.exp2_ftz, sw.exp_fold, sw.decay_single)
    head_blocks = ngroups * math.ceil(heads_per_group / sw.head_loop)
    grid = grid_of(batch * nchunks * (chunk_size // bl), head_blocks, math.ceil(headdim / bp), sw.heads_first)
    return kernel_call(compute_out_head_loop_kernel, grid, args, config.get("occupancy", 0), sw.opt_level, sw.pdl)


def make_cb_call(arrays, dims, chunk_size, tf32, sw, config, lower: bool | None = None) -> KernelCall:
    """arrays = (C, B, cb): cb_kernel's launch, with the main kernel's row block as its tile; its occupancy hint
    is switch cb_occupancy's (0: none), its programs those of `cb_pairs` (`lower`, default switch
    cb_lower_triangle; the backward's switch bwd_cb='shared' asks for the lower triangle whatever the forward's)."""
    batch, seqlen, _nheads, headdim, ngroups, dstate = dims
    nchunks = math.ceil(seqlen / chunk_size)
    bl, _bp, bn = blocks(chunk_size, headdim, dstate, config)
    lower = sw.cb_lower_triangle if lower is None else bool(lower)
    pairs = cb_pairs(chunk_size // bl, lower)
    args = (*arrays, chunk_size, bl, bn, bool(tf32), sw.tma, 4 if sw.latency_hints else 0, lower)
    return kernel_call(cb_kernel, (batch * nchunks * pairs, ngroups), args, sw.cb_occupancy, sw.opt_level)


def make_fold_call(arrays, dims, chunk_size, sw) -> KernelCall:
    """arrays = (dt, dA_cumsum, q): fold_kernel's launch (switch exp_fold), one program per (batch, chunk, head);
    dims = (batch, nheads, nchunks)."""
    batch, nheads, nchunks = dims
    args = (*arrays, chunk_size, sw.exp2, sw.tma)
    return kernel_call(fold_kernel, (batch * nchunks, nheads, 1), args, opt_level=sw.opt_level)


def folded_exponent(dt, dA_cumsum, sw) -> torch.Tensor:
    """Switch exp_fold: q = dA_cumsum·log2(e) − log2(dt) (fold_kernel), (batch, nheads, nchunks, chunk) fp32, which
    the main kernel reads in dt's place (and no dA_cumsum per source)."""
    from impls.cutile.common import launch

    batch, nheads, nchunks, chunk = dt.shape
    q = torch.empty(batch, nheads, nchunks, chunk, device=dt.device, dtype=torch.float32)
    launch(make_fold_call((dt, dA_cumsum, q), (batch, nheads, nchunks), chunk, sw))
    return q


def cb_matrix(C, B, chunk, tf32, sw, config) -> torch.Tensor:
    """C·Bᵀ of every chunk and group, (b, c, g, chunk, chunk) fp32, by cb_kernel: written everywhere, or with
    cb_lower_triangle in the (row block, source block) pairs on or below the diagonal only (the rest is never read:
    the main kernels load the pairs j <= i)."""
    from impls.cutile.common import launch

    cb, call = cb_launch(C, B, chunk, tf32, sw, config)
    launch(call)
    return cb


def cb_launch(C, B, chunk, tf32, sw, config, lower: bool | None = None) -> tuple[torch.Tensor, KernelCall]:
    """cb_kernel's output, (b, c, g, chunk, chunk) fp32, allocated, and its launch on it (not run); `lower` as in
    `make_cb_call`."""
    batch, seqlen, ngroups, dstate = B.shape
    nchunks = math.ceil(seqlen / chunk)
    cb = torch.empty(batch, nchunks, ngroups, chunk, chunk, device=B.device, dtype=torch.float32)
    return cb, make_cb_call((C, B, cb), (batch, seqlen, 0, 0, ngroups, dstate), chunk, tf32, sw, config, lower)


def search_calls(C, B, x, dt, dA_cumsum, states, D, z, seq_idx, y, sw, config) -> tuple[KernelCall, ...]:
    """The stage's launches as the tile search times them, in order: cb_kernel's when shared_cb (on an output of
    its own), then the main kernel's (on a C·Bᵀ computed once here)."""
    main = stage_call(C, B, x, dt, dA_cumsum, states, D, z, seq_idx, y, sw, config)
    if not shared_cb(sw, config):
        return (main,)
    tf32 = x.dtype == torch.float32 and sw.cb_precision == "tf32"
    return cb_launch(C, B, dt.shape[3], tf32, sw, config)[1], main


def stage_arrays(C, B, x, dt, dA_cumsum, states, D, z, seq_idx, y, tf32, sw, config) -> tuple:
    """The main kernel's array arguments (stand-ins for absent optional tensors); computes cb when shared, and with
    exp_fold q (`folded_exponent`) in dt's place."""
    from impls.cutile.common import dummy

    chunk = dt.shape[3]
    cb = cb_matrix(C, B, chunk, tf32, sw, config) if shared_cb(sw, config) else dummy(x.device, ndim=5)
    if sw.exp_fold:
        dt = folded_exponent(dt, dA_cumsum, sw)
    return (C, B, x, dt, dA_cumsum, states_storage(states, sw.transposed_layout),
            D if D is not None else dummy(x.device), z if z is not None else dummy(x.device, x.dtype, ndim=4),
            seq_idx if seq_idx is not None else dummy(x.device, torch.int32, ndim=2), cb, y)


def states_storage(states: torch.Tensor, transposed: bool) -> torch.Tensor:
    """The (b, c, h, n, p) or (b, c, h, p, n) view the kernel reads; a copy only if the given layout differs."""
    if transposed:
        storage = states.transpose(-1, -2)
    else:
        storage = states
    return storage if storage.stride(-1) == 1 else storage.contiguous()


def stage_call(C, B, x, dt, dA_cumsum, states, D, z, seq_idx, y, sw, config) -> KernelCall:
    """The main kernel's launch on these tensors (cb_kernel launched first when shared_cb)."""
    batch, seqlen, nheads, headdim = x.shape
    ngroups, dstate = B.shape[2], B.shape[3]
    d_mode = 0 if D is None else (1 if D.dim() == 1 else 2)
    tf32 = x.dtype == torch.float32 and sw.cb_precision == "tf32"
    arrays = stage_arrays(C, B, x, dt, dA_cumsum, states, D, z, seq_idx, y, tf32, sw, config)
    return make_call(arrays, (batch, seqlen, nheads, headdim, ngroups, dstate), dt.shape[3], d_mode,
                     z is not None, seq_idx is not None, tf32, sw, config)


def run(C, B, x, dt, dA_cumsum, states, D, z, seq_idx, sw, config):
    from impls.cutile.common import launch

    y = torch.empty(x.shape, device=x.device, dtype=x.dtype)
    launch(stage_call(C, B, x, dt, dA_cumsum, states, D, z, seq_idx, y, sw, config))
    return y
