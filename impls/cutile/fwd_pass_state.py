"""Stage 2 in cuTile: every chunk's own state (an MMA over the chunk's tokens) fused with the pass across chunks.

One tile program owns (batch, head, headdim block, dstate block) and walks the chunks in order: it writes the
state entering chunk c, computes chunk c's local state (w x)ᵀ·B with w_t = exp(dA_last − dA_t)·dt_t on the tensor
cores, and carries S ← exp(dA_last)·S + local. The local states never go to global memory. seq_idx: tokens of
another sequence than the chunk's last token get w = 0, and the carry is zeroed when the sequence at a chunk's last
token differs from the previous chunk's (the one before chunk 0 counts as sequence 0), as impls/reference.

Switch state_pass='chunk_parallel' (impls/README.md, two-pass form) splits the walk: `local_state_kernel`, one
program per (batch, chunk, head, headdim block, dstate block), writes every chunk's local state (`carry` from a zero
state) to an fp32 scratch laid out as the states; then `pass_kernel`, one program per (batch, head, block of state
rows in memory order), walks the chunks with S ← exp(dA_last)·S + local, writing the entering states in state_dtype
and the final state. The seq_idx rules are the serial kernel's, split the same way (w = 0 in the local kernel, the
carry reset in the pass).

Switches: operand_swap computes the local state as Bᵀ·(w x) (dstate × headdim); transposed_layout stores the
entering states (b, c, h, dstate, headdim). When the two disagree the tile is transposed before each store.
state_subblock forms the local state (in both arrangements) as a main loop over sub-blocks of the chunk's positions,
one MMA per sub-block (`carry_subblocks`), instead of one MMA over the whole chunk.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import cuda.tile as ct
import torch

from impls.cutile.common import LOG2E, CopyHints, KernelCall, kernel_call, next_pow2
from impls.cutile.pdl import start_as_dependent
from impls.cutile.switches import subblock_refusal

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
    EXP2_FTZ: bool = False  # switch exp2_ftz: the exp2 flush subnormal inputs and results to zero
    SUB: int = 0  # switch state_subblock: positions per step of the local state's main loop; 0 = the whole chunk


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


def seq_ends(seq, seqlen, b, c, CHUNK):
    """The sequence ids at the last tokens of chunks c and c − 1 (sequence 0 before chunk 0)."""
    last_pos = ct.minimum(seqlen, (c + 1) * CHUNK) - 1
    s_last = ct.gather(seq, (b, last_pos))
    s_prev = ct.gather(seq, (b, c * CHUNK - 1), mask=c > 0, padding_value=0)
    return s_last, s_prev


def carry(st, x, B, dt, dA, seq, seqlen, b, c, h, g, pb, nb, k):
    """The state leaving chunk c from the state st entering it: exp(dA_last)·st + the chunk's local state
    (w x)ᵀ·B with w_t = exp(dA_last − dA_t)·dt_t, on the tensor cores; st is (BN, BP) when SWAP else (BP, BN).
    seq_idx (HAS_SEQ; seq is None otherwise): tokens of another sequence than the chunk's last token get w = 0, and
    the carry is zeroed when the sequence at the chunk's last token differs from the previous chunk's. With SUB
    (switch state_subblock) the chunk's positions are walked in sub-blocks: `carry_subblocks`."""
    if k.SUB:
        return carry_subblocks(st, x, B, dt, dA, seq, seqlen, b, c, h, g, pb, nb, k)
    CHUNK, BP, BN, tma, lat = k.CHUNK, k.BP, k.BN, k.tma(), k.lat()
    dA_t = ct.load(dA, (b, h, c, 0), (1, 1, 1, CHUNK), allow_tma=tma).reshape((CHUNK,))
    dt_t = ct.load(dt, (b, h, c, 0), (1, 1, 1, CHUNK), allow_tma=tma).reshape((CHUNK,))
    last = ct.extract(dA_t, (CHUNK - 1,), (1,))
    if k.EXP2:
        w = ct.exp2((last - dA_t) * LOG2E, flush_to_zero=k.EXP2_FTZ) * dt_t
        decay = ct.exp2(last * LOG2E, flush_to_zero=k.EXP2_FTZ)
    else:
        w = ct.exp(last - dA_t) * dt_t
        decay = ct.exp(last)
    if k.HAS_SEQ:
        s_t = ct.load(seq, (b, c), (1, CHUNK), padding_mode=ZERO, allow_tma=tma).reshape((CHUNK,))
        s_last, s_prev = seq_ends(seq, seqlen, b, c, CHUNK)
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


def carry_subblocks(st, x, B, dt, dA, seq, seqlen, b, c, h, g, pb, nb, k):
    """`carry` as a GEMM main loop over the chunk's positions (K): SUB positions per step, each step's weighted x
    and B tiles (SUB × BP, SUB × BN) MMA'd onto one accumulator that starts at exp(dA_last)·st, so that a step's
    tiles, not the whole chunk's, are held in shared memory and the compiler can pipeline the steps. The same terms
    as `carry`; the MMA adds them in SUB-position groups."""
    CHUNK, SUB, BP, BN, tma, lat = k.CHUNK, k.SUB, k.BP, k.BN, k.tma(), k.lat()
    nsub = CHUNK // SUB
    last = ct.gather(dA, (b, h, c, CHUNK - 1))
    decay = ct.exp2(last * LOG2E, flush_to_zero=k.EXP2_FTZ) if k.EXP2 else ct.exp(last)
    if k.HAS_SEQ:
        s_last, s_prev = seq_ends(seq, seqlen, b, c, CHUNK)
        decay = ct.where(s_last == s_prev, decay, 0.0)
    acc = st * decay.reshape((1, 1))
    for j in range(nsub):
        dA_t = ct.load(dA, (b, h, c, j), (1, 1, 1, SUB), allow_tma=tma).reshape((SUB,))
        dt_t = ct.load(dt, (b, h, c, j), (1, 1, 1, SUB), allow_tma=tma).reshape((SUB,))
        if k.EXP2:
            w = ct.exp2((last - dA_t) * LOG2E, flush_to_zero=k.EXP2_FTZ) * dt_t
        else:
            w = ct.exp(last - dA_t) * dt_t
        row = c * nsub + j  # the step's position block, in units of SUB positions
        if k.HAS_SEQ:
            s_t = ct.load(seq, (b, row), (1, SUB), padding_mode=ZERO, allow_tma=tma).reshape((SUB,))
            w = ct.where(s_t == s_last, w, 0.0)
        xt = ct.load(x, (b, row, h, pb), (1, SUB, 1, BP), padding_mode=ZERO, allow_tma=tma, latency=lat)
        bt = ct.load(B, (b, row, g, nb), (1, SUB, 1, BN), padding_mode=ZERO, allow_tma=tma, latency=lat)
        xt = xt.reshape((SUB, BP))
        bt = bt.reshape((SUB, BN))
        xw = (xt.astype(ct.float32) * w.reshape((SUB, 1))).astype(xt.dtype)
        if k.SWAP:
            acc = _mma(ct.transpose(bt), xw, acc, k.TF32)
        else:
            acc = _mma(ct.transpose(xw), bt, acc, k.TF32)
    return acc


def fwd_pass_state_kernel(x, B, dt, dA, init, seq, states, final, seqlen, heads_per_group,
                          CHUNK: ct.Constant[int], BP: ct.Constant[int], BN: ct.Constant[int],
                          HAS_INIT: ct.Constant[bool], HAS_SEQ: ct.Constant[bool], SWAP: ct.Constant[bool],
                          TRANS: ct.Constant[bool], TF32: ct.Constant[bool], EXP2: ct.Constant[bool],
                          TMA: ct.Constant[bool], LAT: ct.Constant[int], PDL: ct.Constant[bool],
                          EXP2_FTZ: ct.Constant[bool], SUB: ct.Constant[int]):
    if PDL:  # launched as a programmatic dependent launch: nothing before the wait
        start_as_dependent()
    k = StateConsts(CHUNK, BP, BN, HAS_INIT, HAS_SEQ, SWAP, TRANS, TF32, EXP2, TMA, LAT, EXP2_FTZ, SUB)
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


# --- state_pass='chunk_parallel': every chunk's local state at once, then the pass across chunks ------------------
def zero_state(k):
    """A zero state tile in fp32, (BN, BP) when SWAP else (BP, BN)."""
    if k.SWAP:
        return ct.zeros((k.BN, k.BP), ct.float32)
    return ct.zeros((k.BP, k.BN), ct.float32)


def local_state_kernel(x, B, dt, dA, seq, local, seqlen, heads_per_group,
                       CHUNK: ct.Constant[int], BP: ct.Constant[int], BN: ct.Constant[int],
                       HAS_SEQ: ct.Constant[bool], SWAP: ct.Constant[bool], TRANS: ct.Constant[bool],
                       TF32: ct.Constant[bool], EXP2: ct.Constant[bool], TMA: ct.Constant[bool],
                       LAT: ct.Constant[int], PDL: ct.Constant[bool], EXP2_FTZ: ct.Constant[bool],
                       SUB: ct.Constant[int]):
    """local[b, c, h] = the state chunk c builds from zero (fp32, the states' memory layout); heads fastest in the
    grid's first axis, so neighbouring programs share the chunk's B tile."""
    if PDL:  # launched as a programmatic dependent launch: nothing before the wait
        start_as_dependent()
    k = StateConsts(CHUNK, BP, BN, False, HAS_SEQ, SWAP, TRANS, TF32, EXP2, TMA, LAT, EXP2_FTZ, SUB)
    bch, pb, nb = ct.bid(0), ct.bid(1), ct.bid(2)
    nheads = x.shape[2]
    nchunks = dA.shape[2]
    b, c, h = bch // (nchunks * nheads), (bch // nheads) % nchunks, bch % nheads
    st = carry(zero_state(k), x, B, dt, dA, seq, seqlen, b, c, h, h // heads_per_group, pb, nb, k)
    _store_state(local, b, c, h, pb, nb, st, k)


@dataclass(frozen=True)
class PassConsts(CopyHints):
    """The compile-time constants of `pass_kernel`. Its tile is (ROWS, COLS) in the states' memory order: rows are
    dstate (TRANS) or headdim, COLS covers the whole contiguous dimension."""

    CHUNK: int
    ROWS: int
    COLS: int
    HAS_INIT: bool
    HAS_SEQ: bool
    TRANS: bool
    EXP2: bool
    TMA: bool
    LAT: int
    EXP2_FTZ: bool = False  # switch exp2_ftz


def entering_state(init, b, h, rb, k):
    """The (ROWS, COLS) tile of initial_states (b, h, headdim, dstate) in the states' memory order, fp32; zeros when
    absent."""
    ROWS, COLS = k.ROWS, k.COLS
    if not k.HAS_INIT:
        return ct.zeros((ROWS, COLS), ct.float32)
    if k.TRANS:
        st = ct.load(init, (b, h, 0, rb), (1, 1, COLS, ROWS), padding_mode=ZERO, allow_tma=k.tma())
        return ct.transpose(st.reshape((COLS, ROWS)).astype(ct.float32))
    st = ct.load(init, (b, h, rb, 0), (1, 1, ROWS, COLS), padding_mode=ZERO, allow_tma=k.tma())
    return st.reshape((ROWS, COLS)).astype(ct.float32)


def store_final(final, b, h, rb, st, k):
    """The (ROWS, COLS) tile st, in the states' memory order, into final (b, h, headdim, dstate)."""
    if k.TRANS:
        ct.store(final, (b, h, 0, rb), ct.transpose(st).reshape((1, 1, k.COLS, k.ROWS)), allow_tma=k.tma())
    else:
        ct.store(final, (b, h, rb, 0), st.reshape((1, 1, k.ROWS, k.COLS)), allow_tma=k.tma())


def chunk_decay(dA, seq, seqlen, b, c, h, k):
    """exp(dA_last) of chunk c, zeroed when the sequence at its last token differs from the previous chunk's."""
    last = ct.gather(dA, (b, h, c, k.CHUNK - 1))
    decay = ct.exp2(last * LOG2E, flush_to_zero=k.EXP2_FTZ) if k.EXP2 else ct.exp(last)
    if k.HAS_SEQ:
        s_last, s_prev = seq_ends(seq, seqlen, b, c, k.CHUNK)
        decay = ct.where(s_last == s_prev, decay, 0.0)
    return decay


def pass_kernel(local, dA, init, seq, states, final, seqlen,
                CHUNK: ct.Constant[int], ROWS: ct.Constant[int], COLS: ct.Constant[int],
                HAS_INIT: ct.Constant[bool], HAS_SEQ: ct.Constant[bool], TRANS: ct.Constant[bool],
                EXP2: ct.Constant[bool], TMA: ct.Constant[bool], LAT: ct.Constant[int], PDL: ct.Constant[bool],
                EXP2_FTZ: ct.Constant[bool]):
    """S_0 = init, S_{c+1} = decay_c·S_c + local_c over the chunks; writes every S_c (state_dtype) and S_C (fp32).
    local and states are the 5-d storages, (b, c, h, dstate, headdim) when TRANS else (b, c, h, headdim, dstate)."""
    if PDL:  # launched as a programmatic dependent launch: nothing before the wait
        start_as_dependent()
    k = PassConsts(CHUNK, ROWS, COLS, HAS_INIT, HAS_SEQ, TRANS, EXP2, TMA, LAT, EXP2_FTZ)
    bh, rb = ct.bid(0), ct.bid(1)
    nheads = local.shape[2]
    nchunks = local.shape[1]
    b, h = bh // nheads, bh % nheads
    st = entering_state(init, b, h, rb, k)
    for c in range(nchunks):
        ct.store(states, (b, c, h, rb, 0), st.astype(states.dtype).reshape((1, 1, 1, ROWS, COLS)),
                 allow_tma=k.tma())
        loc = ct.load(local, (b, c, h, rb, 0), (1, 1, 1, ROWS, COLS), padding_mode=ZERO, allow_tma=k.tma(),
                      latency=k.lat())
        st = chunk_decay(dA, seq, seqlen, b, c, h, k) * st + loc.reshape((ROWS, COLS))
    store_final(final, b, h, rb, st, k)


PASS_ELEMS = 1024  # state elements per pass_kernel program (8 fp32 per thread at 128 threads)


def pass_tile(headdim: int, dstate: int, transposed: bool) -> tuple[int, int, int]:
    """(ROWS, COLS, row count) of pass_kernel's tile in the states' memory order."""
    rows, cols = (dstate, headdim) if transposed else (headdim, dstate)
    cols_p2 = next_pow2(cols)
    return min(next_pow2(rows), max(1, PASS_ELEMS // cols_p2)), cols_p2, rows


def make_local_call(arrays, dims, chunk_size, has_seq, tf32, sw, config) -> KernelCall:
    """arrays = (x, B, dt, dA, seq, local): tensors, or ArraySpec for AOT compiles."""
    batch, seqlen, nheads, headdim, ngroups, dstate = dims
    bp, bn = blocks(headdim, dstate, config)
    args = (*arrays, seqlen, nheads // ngroups, chunk_size, bp, bn, bool(has_seq), sw.operand_swap,
            sw.transposed_layout, bool(tf32), sw.exp2, sw.tma, 4 if sw.latency_hints else 0, sw.pdl, sw.exp2_ftz,
            subblock(sw, chunk_size))
    grid = (batch * math.ceil(seqlen / chunk_size) * nheads, math.ceil(headdim / bp), math.ceil(dstate / bn))
    return kernel_call(local_state_kernel, grid, args, config.get("occupancy", 0), sw.opt_level, sw.pdl)


def make_pass_call(arrays, dims, chunk_size, has_init, has_seq, sw) -> KernelCall:
    """arrays = (local, dA, init, seq, states, final): tensors, or ArraySpec for AOT compiles."""
    batch, seqlen, nheads, headdim, ngroups, dstate = dims
    rows_tile, cols, rows = pass_tile(headdim, dstate, sw.transposed_layout)
    args = (*arrays, seqlen, chunk_size, rows_tile, cols, bool(has_init), bool(has_seq), sw.transposed_layout,
            sw.exp2, sw.tma, 4 if sw.latency_hints else 0, sw.pdl, sw.exp2_ftz)
    return kernel_call(pass_kernel, (batch * nheads, math.ceil(rows / rows_tile)), args, opt_level=sw.opt_level,
                       pdl=sw.pdl)


def subblock(sw, chunk_size: int) -> int:
    """Switch state_subblock as the kernels' SUB: 0 (the whole chunk at once), or positions per main-loop step, which
    must divide the chunk (else ValueError naming both)."""
    sub = sw.state_subblock
    if sub and chunk_size % sub:
        raise ValueError(subblock_refusal(sub, chunk_size))
    return sub


def blocks(headdim: int, dstate: int, config: dict) -> tuple[int, int]:
    bp = config.get("block_headdim") or min(64, next_pow2(headdim))
    bn = config.get("block_dstate") or min(128, next_pow2(dstate))
    return min(bp, next_pow2(headdim)), min(bn, next_pow2(dstate))


def make_call(arrays, dims, chunk_size, has_init, has_seq, tf32, sw, config) -> KernelCall:
    """arrays = (x, B, dt, dA, init, seq, states, final): tensors, or ArraySpec for AOT compiles."""
    batch, seqlen, nheads, headdim, ngroups, dstate = dims
    bp, bn = blocks(headdim, dstate, config)
    args = (*arrays, seqlen, nheads // ngroups, chunk_size, bp, bn, bool(has_init), bool(has_seq),
            sw.operand_swap, sw.transposed_layout, bool(tf32), sw.exp2, sw.tma, 4 if sw.latency_hints else 0, sw.pdl,
            sw.exp2_ftz, subblock(sw, chunk_size))
    grid = (batch * nheads, math.ceil(headdim / bp), math.ceil(dstate / bn))
    return kernel_call(fwd_pass_state_kernel, grid, args, config.get("occupancy", 0), sw.opt_level, sw.pdl)


def state_storage(x, nchunks, dstate, dtype, transposed):
    """(storage, states): the contiguous 5-d storage, (b, c, h, dstate, headdim) when transposed else (b, c, h,
    headdim, dstate), and its logical (b, c, h, headdim, dstate) view."""
    batch, _, nheads, headdim = x.shape
    if transposed:
        storage = torch.empty(batch, nchunks, nheads, dstate, headdim, device=x.device, dtype=dtype)
        return storage, storage.transpose(-1, -2)
    storage = torch.empty(batch, nchunks, nheads, headdim, dstate, device=x.device, dtype=dtype)
    return storage, storage


def _dims(B, x):
    return (*x.shape, B.shape[2], B.shape[3])


def local_call(B, x, dt, dA_cumsum, seq_idx, tf32, sw, config) -> KernelCall:
    """The chunk-parallel arrangement's local-state launch on a fresh fp32 scratch (what a tile search times)."""
    from impls.cutile.common import dummy

    local, _ = state_storage(x, dt.shape[2], B.shape[3], torch.float32, sw.transposed_layout)
    seq = seq_idx if seq_idx is not None else dummy(x.device, torch.int32, ndim=2)
    return make_local_call((x, B, dt, dA_cumsum, seq, local), _dims(B, x), dt.shape[3], seq_idx is not None, tf32,
                           sw, config)


def _outputs(B, x, dt, initial_states, seq_idx, state_dtype, sw):
    """(states storage, states view, final, init, seq) of a stage call, stand-ins for absent optional inputs."""
    from impls.cutile.common import dummy

    storage, states = state_storage(x, dt.shape[2], B.shape[3], state_dtype or x.dtype, sw.transposed_layout)
    final = torch.empty(x.shape[0], x.shape[2], x.shape[3], B.shape[3], device=x.device, dtype=torch.float32)
    init = initial_states if initial_states is not None else dummy(x.device, ndim=4)
    seq = seq_idx if seq_idx is not None else dummy(x.device, torch.int32, ndim=2)
    return storage, states, final, init, seq


def run_serial(B, x, dt, dA_cumsum, initial_states, seq_idx, state_dtype, sw, config):
    from impls.cutile.common import launch

    storage, states, final, init, seq = _outputs(B, x, dt, initial_states, seq_idx, state_dtype, sw)
    tf32 = x.dtype == torch.float32 and sw.cb_precision == "tf32"
    launch(make_call((x, B, dt, dA_cumsum, init, seq, storage, final), _dims(B, x), dt.shape[3],
                     initial_states is not None, seq_idx is not None, tf32, sw, config))
    return states, final


def run_chunk_parallel(B, x, dt, dA_cumsum, initial_states, seq_idx, state_dtype, sw, config):
    from impls.cutile.common import launch

    tf32 = x.dtype == torch.float32 and sw.cb_precision == "tf32"
    local = local_call(B, x, dt, dA_cumsum, seq_idx, tf32, sw, config)
    launch(local)
    storage, states, final, init, seq = _outputs(B, x, dt, initial_states, seq_idx, state_dtype, sw)
    scratch = local.args[5]  # the fp32 local states, in the states' memory layout
    launch(make_pass_call((scratch, dA_cumsum, init, seq, storage, final), _dims(B, x), dt.shape[3],
                          initial_states is not None, seq_idx is not None, sw))
    return states, final


ARRANGEMENTS = {"serial": run_serial, "chunk_parallel": run_chunk_parallel}  # switch state_pass


def run(B, x, dt, dA_cumsum, initial_states, seq_idx, state_dtype, sw, config):
    return ARRANGEMENTS[sw.state_pass](B, x, dt, dA_cumsum, initial_states, seq_idx, state_dtype, sw, config)
