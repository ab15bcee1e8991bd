"""Stages 2 and 3 fused, one program per chunk (switch fused_program='chunk', with fuse_state_out): every chunk's
programs run at once, and only the hand-off of the state from chunk to chunk is ordered, by flags in global memory.

Programs: one per (batch, chunk, head, headdim block), the full dstate (y contracts over it). Each
1. computes its chunk's local state Bᵀ·(w x) over the whole chunk (`fwd_pass_state.carry` from a zero state, in
   the (dstate × headdim) operand-swapped form the serial fused kernel carries), depending on nothing;
2. takes S_c, the state entering its chunk: the initial state (or zero) for chunk 0, else it waits until the program
   of chunk c − 1 (same batch, head, headdim block) has published it, and reads it from the fp32 hand-off slot; forms
   S_{c+1} = exp(dA_last)·S_c + local (fp32, as `fwd_pass_state.pass_kernel`), writes it to the slot and publishes
   it, then writes S_c's successor (and, in chunk 0, S_0) to the states output in its dtype (the stage-2 contract's
   output; nothing in the kernel reads it back);
3. walks the chunk's row blocks as the serial fused kernel does (`fused._rows_out`: C·S_c with S_c in the input
   dtype, the in-chunk causal term, D, z, one store per row block).
The slot is the `final` output (batch, nheads, headdim, dstate) fp32: after the last chunk it holds the final state.
Program c reads it before it writes it, and program c + 1 reads it only after c's publication, so no two programs
touch it at once.

Hand-off (cuTile 1.7 atomics on the int32 `sync` array, device scope; docs/cutile-switches.md has the SASS):
publishing is `ct.atomic_xchg(..., memory_order=ACQ_REL)` after the slot's store; waiting is a first
`ct.atomic_add(..., 0, memory_order=ACQ_REL)`, a `while` loop of relaxed ones, and an acquire exchange that clears the
flag. cuTile's token pass orders every memory operation of the tile program before a release before it and every one
after an acquire after it (cuda/tile/_passes/token_order.py) — and nothing else: later work may rise above a
release and earlier work sink below an acquire, which is why both ends are acquire-release (the local state before
the wait, the row blocks after the publication). tileiras 13.4 lowers a release to a CTA barrier, MEMBAR.ALL.GPU and
the atomic from one thread, an acquire to the atomic from one thread, CCTL.IVALL (the SM's L1 invalidated) and a
barrier, so the slot's later loads see the publisher's stores. The slot is loaded and stored with allow_tma=False:
plain LDG/STG of the generic proxy, which the release and acquire order (a TMA copy would go through the async
proxy).

Deadlock freedom. A program takes its coordinates not from its block id but from a ticket, an atomic increment of
sync[0] that is its first memory operation; tickets enumerate (chunk, batch, head, headdim block) with the chunk
outermost. A program holding ticket t is running, so every smaller ticket belongs to a program running or done
(CTAs that have started are not descheduled for others), and every wait (chunk c on chunk c − 1, same batch, head and
headdim block) points at a smaller ticket. By induction on tickets the smallest unfinished one waits on nothing
unpublished, so every program finishes, whatever order the hardware starts CTAs in and however many fit at once.

The sync array (int32, 1 + batch·nheads·headdim blocks·nchunks: the counter, then one flag per chunk) must be zero at
launch. The kernel leaves it zero: the last ticket's holder (every program has taken its ticket by then) resets the
counter, and each flag is cleared by its only waiter once it has seen it. So the same launch can be repeated on one
buffer (the tuning timer repeats one call).
"""

from __future__ import annotations

import math

import cuda.tile as ct
import torch

from impls import validate as check
from impls.cutile.common import KernelCall, kernel_call
from impls.cutile.compute_out import blocks
from impls.cutile.fused import _rows_out, consts, stage_inputs
from impls.cutile.fwd_pass_state import _store_state, carry, chunk_decay, initial_state, zero_state

ZERO = ct.PaddingMode.ZERO
RELAXED, ACQUIRE, ACQ_REL = ct.MemoryOrder.RELAXED, ct.MemoryOrder.ACQUIRE, ct.MemoryOrder.ACQ_REL
DEVICE = ct.MemoryScope.DEVICE


def ticket_work(ticket, batch, nheads, tiles_p):
    """(chunk, batch, head, headdim block) that a ticket names, the chunk outermost (kernel and host code alike)."""
    pb = ticket % tiles_p
    h = (ticket // tiles_p) % nheads
    b = (ticket // (tiles_p * nheads)) % batch
    c = ticket // (tiles_p * nheads * batch)
    return c, b, h, pb


def flag_index(b, h, pb, c, nheads, tiles_p, nchunks):
    """The sync element of flag c (S_c published) of (batch, head, headdim block); element 0 is the counter."""
    return 1 + ((b * nheads + h) * tiles_p + pb) * nchunks + c


def _ticket(sync):
    """This program's ticket (sync[0]'s old value); its last holder sets the counter back to zero."""
    ticket = ct.atomic_add(sync, 0, 1, memory_order=RELAXED, memory_scope=DEVICE)
    if ticket == ct.num_blocks(0) - 1:
        ct.atomic_xchg(sync, 0, 0, memory_order=RELAXED, memory_scope=DEVICE)
    return ticket


def _wait(sync, flag):
    """Returns once sync[flag] is set, with acquire semantics (what its publisher stored before it is visible), and
    clears it (this program is its only waiter).

    The first poll is acquire-release: its release half keeps every earlier operation (the local state's loads and
    MMAs) before the wait, where an acquire alone would let the compiler sink them below it and serialise the chunks
    (tileiras did so with TMA off and with int64 indexing). The spin polls relaxed; the clearing exchange, which reads
    the published 1, is the acquire — one L1 invalidation per wait instead of one per poll."""
    seen = ct.atomic_add(sync, flag, 0, memory_order=ACQ_REL, memory_scope=DEVICE)
    while seen == 0:
        seen = ct.atomic_add(sync, flag, 0, memory_order=RELAXED, memory_scope=DEVICE)
    ct.atomic_xchg(sync, flag, 0, memory_order=ACQUIRE, memory_scope=DEVICE)


def _publish(sync, flag):
    """Sets sync[flag]: its release half makes every store of this program before it visible to its waiter, its
    acquire half keeps every later operation (the row blocks) after it, so the chain is not held up by them."""
    ct.atomic_xchg(sync, flag, 1, memory_order=ACQ_REL, memory_scope=DEVICE)


def _load_slot(final, b, h, pb, ks):
    """The (BN, BP) fp32 state in the hand-off slot (final is (batch, nheads, headdim, dstate)), not through TMA."""
    st = ct.load(final, (b, h, pb, 0), (1, 1, ks.BP, ks.BN), padding_mode=ZERO, allow_tma=False)
    return ct.transpose(st.reshape((ks.BP, ks.BN)))


def _store_slot(final, b, h, pb, st, ks):
    ct.store(final, (b, h, pb, 0), ct.transpose(st).reshape((1, 1, ks.BP, ks.BN)), allow_tma=False)


def _hand_off(local, init, dA, states, final, sync, seqlen, tiles_p, b, c, h, pb, ks):
    """S_c (BN, BP) fp32, the state entering chunk c; S_{c+1} = exp(dA_last)·S_c + local written to the slot and
    published (flag c + 1), then the states output written."""
    nheads, nchunks = dA.shape[1], dA.shape[2]
    if c == 0:
        st = initial_state(init, b, h, pb, 0, ks)
    else:
        _wait(sync, flag_index(b, h, pb, c, nheads, tiles_p, nchunks))
        st = _load_slot(final, b, h, pb, ks)
    nxt = chunk_decay(dA, None, seqlen, b, c, h, ks) * st + local
    _store_slot(final, b, h, pb, nxt, ks)
    if c + 1 < nchunks:
        _publish(sync, flag_index(b, h, pb, c + 1, nheads, tiles_p, nchunks))
    # after the publication: the waiter does not read the states output, so its stores stay off the chain
    if c == 0:
        _store_state(states, b, 0, h, pb, 0, st, ks)
    if c + 1 < nchunks:
        _store_state(states, b, c + 1, h, pb, 0, nxt, ks)
    return st


def fused_chunk_kernel(C, B, x, dt, dA, init, D, z, y, states, final, sync, seqlen, heads_per_group,
                       CHUNK: ct.Constant[int], BL: ct.Constant[int], BP: ct.Constant[int], BN: ct.Constant[int],
                       HAS_INIT: ct.Constant[bool], D_MODE: ct.Constant[int], HAS_Z: ct.Constant[bool],
                       TF32: ct.Constant[bool], EXP2: ct.Constant[bool], TMA: ct.Constant[bool],
                       LAT: ct.Constant[int]):
    k, ks = consts(CHUNK, BL, BP, BN, HAS_INIT, D_MODE, HAS_Z, TF32, EXP2, TMA, LAT)
    ticket = _ticket(sync)  # the ticket, not the block id, names the work: chunk outermost
    tiles_p = ct.cdiv(x.shape[3], BP)
    c, b, h, pb = ticket_work(ticket, x.shape[0], x.shape[2], tiles_p)
    g = h // heads_per_group
    local = carry(zero_state(ks), x, B, dt, dA, None, seqlen, b, c, h, g, pb, 0, ks)
    st = _hand_off(local, init, dA, states, final, sync, seqlen, tiles_p, b, c, h, pb, ks)
    s_op = st.astype(C.dtype)  # the MMA operand, as in the serial fused kernel
    for i in range(CHUNK // BL):
        _rows_out(C, B, x, dt, dA, y, D, z, s_op, b, c, h, g, pb, i, k)


def sync_size(batch: int, nheads: int, headdim: int, nchunks: int, bp: int) -> int:
    """Elements of the sync array: the ticket counter, then one flag per (batch, head, headdim block, chunk)."""
    return 1 + batch * nheads * math.ceil(headdim / bp) * nchunks  # = flag_index of the last flag + 1


def make_call(arrays, dims, chunk_size, has_init, d_mode, has_z, tf32, sw, config) -> KernelCall:
    """arrays = (C, B, x, dt, dA, init, D, z, y, states, final, sync): tensors, or ArraySpec for AOT compiles."""
    batch, seqlen, nheads, headdim, ngroups, dstate = dims
    bl, bp, bn = blocks(chunk_size, headdim, dstate, config)
    args = (*arrays, seqlen, nheads // ngroups, chunk_size, bl, bp, bn, bool(has_init), int(d_mode), bool(has_z),
            bool(tf32), sw.exp2, sw.tma, 4 if sw.latency_hints else 0)
    grid = (batch * math.ceil(seqlen / chunk_size) * nheads * math.ceil(headdim / bp),)
    return kernel_call(fused_chunk_kernel, grid, args, config.get("occupancy", 0), sw.opt_level)


def stage_call(C, B, x, dt, dA_cumsum, initial_states, D, z, y, states, final, sync, sw, config) -> KernelCall:
    """The launch on these tensors; sync must be zero (`outputs` makes it so)."""
    arrays, *rest = stage_inputs(C, B, x, dt, dA_cumsum, initial_states, D, z, sw)
    return make_call((*arrays, y, states, final, sync), *rest, sw, config)


def outputs(x, B, dt, state_dtype, config):
    """(y, states, final, sync) for one launch: y like x, states (batch, nchunks, nheads, headdim, dstate) in
    state_dtype (x's dtype when None), final fp32, and the zeroed sync array."""
    batch, _seqlen, nheads, headdim = x.shape
    nchunks, dstate = dt.shape[2], B.shape[3]
    _bl, bp, _bn = blocks(dt.shape[3], headdim, dstate, config)
    y = torch.empty(x.shape, device=x.device, dtype=x.dtype)
    states = torch.empty(batch, nchunks, nheads, headdim, dstate, device=x.device, dtype=state_dtype or x.dtype)
    final = torch.empty(batch, nheads, headdim, dstate, device=x.device, dtype=torch.float32)
    sync = torch.zeros(sync_size(batch, nheads, headdim, nchunks, bp), device=x.device, dtype=torch.int32)
    return y, states, final, sync


def run(C, B, x, dt, dA_cumsum, initial_states, D, z, state_dtype, sw, config):
    """-> (y like x, states (batch, nchunks, nheads, headdim, dstate) in state_dtype, final states fp32)."""
    from impls.cutile.common import launch

    # the grid counts x's chunks, the flags and states dt's: with fewer in dt (or dA_cumsum) a waiter would spin on a
    # flag no program sets, a hang rather than an error
    check.nchunks("dt", dt, x.shape[1])
    check.nchunks("dA_cumsum", dA_cumsum, x.shape[1])
    y, states, final, sync = outputs(x, B, dt, state_dtype, config)
    launch(stage_call(C, B, x, dt, dA_cumsum, initial_states, D, z, y, states, final, sync, sw, config))
    return y, states, final
