"""The switches of the Triton backend (`TritonSwitches`) with their help strings, and which of them change code.

Two kinds of knobs:
- *code switches* change what the kernels compute with: layout of the states, operand order of the MMAs, exp vs
  exp2, tf32 vs fp32 dots. They are part of the kernel's identity (and of the tuning key: `code_switches`).
- *launch switches* (block sizes, num_warps, num_stages, occupancy, heads_per_tile) pin fields of the launch
  configurations, which otherwise come from the tuning machinery in impls/tuning.py (search / record / fallback /
  auto; impls/triton/tune.py): 0 means "tuned", a value pins that field in every stage where it applies (the search
  then only varies the other fields; a stage whose fields are all pinned reports the source "switches").
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any

from impls.inner_chunk import INNER_CHUNKS
from impls.registry import switch
from impls.tuning import MODES


@dataclass(frozen=True)
class TritonSwitches:
    """Defaults: every switch on, launch configuration tuned (tuning mode "auto"). Names follow the cuTile
    backend's switches where both have the knob."""

    transposed_layout: bool = switch(
        True,
        "states (the entering-state tensor of fwd_pass_state, and its fp32 chunk-local scratch) are stored "
        "(batch, nchunks, nheads, dstate, headdim), i.e. dstate-major, and returned as a .transpose(-1, -2) view; "
        "compute_out then reads the (dstate x headdim) operand of C·stateᵀ with headdim contiguous",
        sm90="the state tile reaches compute_out's warpgroup MMA as the (K=dstate, N=headdim) B operand in shared "
             "memory without a transpose",
        sm100="the same layout; the state tile is the B operand of the MMA in shared memory")
    operand_swap: bool = switch(
        True,
        "MMAs computed transposed: chunk state as Bᵀ·x (dstate on M, headdim on N) instead of xᵀ·B; output tile "
        "as yᵀ = xᵀ·(B·Cᵀ ∘ Lᵀ) + state·Cᵀ (headdim on M, chunk positions on N) instead of "
        "y = (C·Bᵀ ∘ L)·x + C·stateᵀ (chunk positions on M, headdim on N)",
        sm90="the order of tl.dot's operands decides which tile is the warpgroup MMA's M side (64-row granules) and "
             "which lands on N; Triton picks the instruction and layouts",
        sm100="the order of tl.dot's operands decides the M side of the accumulator; Triton picks the MMA "
              "instruction (tcgen05 where it applies) and the layouts")
    exp2: bool = switch(
        True, "every exp(v) computed as exp2(v·log2 e), with log2 e folded into the dA_cumsum values as loaded "
        "(one multiply per loaded element instead of per exponent); softplus via exp2/log2 too",
        sm90="the hardware exponential is base 2 (ex2.approx, MUFU.EX2): tl.exp costs a multiply by log2 e per "
             "element before it; on, that multiply happens once per loaded dA_cumsum value",
        sm100="as on sm_90 (MUFU.EX2 is base 2)")
    exp2_ftz: bool = switch(
        True, "the exp2 of stages 2 and 3 (stage 2's decay weights and chunk decays, stage 3's decays, state scale "
              "and silu gate): on, tl.exp2 as Triton lowers it, subnormal inputs and results flushed to zero (a "
              "result below 2^-126 reads 0); off, ex2.approx.f32 through inline PTX, which keeps subnormals (cuTile's "
              "plain exp2). chunk_cumsum and the fused kernel keep tl.exp2. No effect with exp2 off: the kernels "
              "then call tl.exp, which Triton lowers to a multiply and ex2.approx.f32 either way. Off is refused "
              "under the Triton interpreter (it runs no PTX) and with fuse_state_out",
        sm90="on: ex2.approx.ftz.f32, one MUFU.EX2 per exponential; off: ex2.approx.f32, which ptxas expands "
             "around the MUFU.EX2 with a compare and two predicated multiplies (the argument scaled into the normal "
             "range, the result scaled back)",
        sm100="as on sm_90 (MUFU.EX2)",
        needs={"exp2": True})
    cb_precision: str = switch(
        "tf32", "fp32 inputs: tl.dot input_precision of every MMA ('tf32' = tensor cores at tf32, 'fp32' = "
        "input_precision='ieee'); fp16/bf16 inputs are unaffected", choices=("tf32", "fp32"))
    cb_mode: str = switch(
        "inline", "compute_out's C·Bᵀ: 'inline' = recomputed on the fly for each head; 'shared' = once per (batch, "
                  "chunk, group) by cb_kernel (fp32, read back by every head of the group)",
        choices=("inline", "shared"))
    decay_factor: bool = switch(
        False, "compute_out: source tiles wholly before the row tile use the factored decay exp(dA_m - dA_ref)·"
               "exp(dA_ref - dA_k), dA_ref at the row tile's first row (impls/README.md): the source factor times dt "
               "scales the C·Bᵀ tile's columns, the row factor the tiles' sum — no causal mask and no exp per "
               "(row, source) pair there",
        sm90="one multiply per score element instead of a compare, select, subtract, exp2 and two multiplies on "
             "those tiles",
        sm100="the same per-element saving; the scaled tiles feed the MMAs")
    decay_single: bool = switch(
        False, "compute_out with decay_factor: the factored decay in the one accumulator. It starts from the state "
               "term scaled by exp(dA_ref) (not exp(dA_m)), sums the factored source tiles onto it, is scaled once "
               "per row by exp(dA_m - dA_ref) (giving the state term its exp(dA_m)), and then takes the tiles "
               "reaching the diagonal in the masked form; off, decay_factor sums the factored tiles in a second "
               "accumulator added after them. Every factor <= 1 (impls/README.md). Not with fuse_state_out",
        sm90="one (rows × headdim) fp32 accumulator per head live through the factored tiles' loop instead of two, "
             "and a multiply per accumulator element after it instead of a multiply-add",
        sm100="the same accumulators",
        needs={"decay_factor": True})
    heads_first: bool = switch(
        False, "compute_out program order: the head blocks of one (batch, chunk, row tile, headdim tile) fastest in "
               "the flat program id, so that the programs in flight together read the same C and B tiles (one group's "
               "heads share them); off: the (row, headdim) tiles fastest, then the head blocks",
        sm90="programs are dispatched in increasing program id: on, consecutive programs read one C tile and the "
             "same B tiles, from DRAM once and from L2 after; off, consecutive programs read the other row tiles "
             "of the chunk (their own C tile) and the heads come a chunk's row tiles apart",
        sm100="the same dispatch order and L2 reuse; the flat grid's order is all the switch changes")
    tma: bool = switch(
        False, "tensor-descriptor loads and stores (tl.make_tensor_descriptor) for the MMA stages' tiles: x and B in "
               "chunk_state (and its fp32 scratch store), C, B, x and the states in compute_out (and the y store), "
               "C, B and x in the fused kernel; off = pointer loads with masks. Needs the tensors contiguous in the "
               "last dimension, 16-byte aligned, strides 16-byte multiples (else ValueError naming the tensor). "
               "chunk_cumsum and state_passing keep pointer loads (as cuTile's chunk_cumsum, whose compiler uses no "
               "TMA there)",
        sm90="in-kernel TMA descriptors (tensormap.cp_fenceproxy into a workspace from triton.set_allocator), tiles "
             "by cp.async.bulk.tensor into shared memory, out-of-bounds boxes zero-filled",
        sm100="same TMA descriptors and bulk copies")
    tma_descriptors: str = switch(
        "device", "with tma on, where the tensor descriptors of compute_out and chunk_state (x, B, C, the states, "
                  "the fp32 scratch, y; x and B of state_pass='serial''s kernel) are made: 'device' = in the kernel "
                  "by every program (tl.make_tensor_descriptor, the behaviour tma had alone); 'host' = once per "
                  "launch on the host (triton.tools.tensor_descriptor.TensorDescriptor) and passed as kernel "
                  "arguments. 'host' needs tma=True and the three-stage arrangement (ValueError otherwise); same "
                  "alignment rules as tma",
        choices=("device", "host"),
        sm90="'host': the descriptor is a __grid_constant__ CUtensorMap kernel parameter, encoded once per launch by "
             "the driver; no tensormap.cp_fenceproxy, no workspace",
        sm100="same")
    fuse_state_out: bool = switch(
        False, "the forward as chunk_cumsum, then one kernel for stages 2 and 3 (impls/triton/fused.py): one program "
               "per (chunk, batch, head, row tile, headdim tile) does its rows' intra-chunk output; the row-tile-0 "
               "program of each (chunk, batch, head, headdim tile) also computes the chunk's local state and hands "
               "the state on (flags with acquire/release, programs numbered by an atomic ticket so that waits only "
               "point at running programs); every program adds exp(dA)·C·S_c once S_c is there",
        sm90="removes the chunk-local fp32 scratch (write and read-back), the state_passing launch and the "
             "compute_out launch; the states are still written (the contract's output, read back by the row tiles)",
        sm100="as on sm_90")
    fused_program: str = switch(
        "row_tile", "the programs of the fused kernel (fuse_state_out): 'row_tile' = one per (chunk, batch, head, row "
                    "tile, headdim tile), the row-tile-0 program of each chunk also computing its local state and "
                    "handing the state on; 'chunk' = one per (chunk, batch, head, headdim tile), each computing its "
                    "chunk's local state, handing the state on, then walking the chunk's row tiles (the arrangement "
                    "of the PyTorch blog's fused SSD kernel). Needs fuse_state_out=True",
        choices=("row_tile", "chunk"),
        sm90="'chunk': a quarter of the programs (at 64-row tiles and chunk 256), each four times as long, no carrier "
             "doing more than the others",
        sm100="the same program arrangement",
        needs={"fuse_state_out": True})
    state_pass: str = switch(
        "chunk_parallel", "fwd_pass_state's arrangement: 'chunk_parallel' = chunk_state (every chunk's local state at "
                          "once, into an fp32 scratch) then state_passing (the carry across chunks, parallel over "
                          "(batch, head, state elements)); 'serial' = one kernel whose programs own (batch, head, "
                          "headdim tile, dstate tile) and walk the chunks, the local states in registers (cuTile's "
                          "default arrangement; launch fields of chunk_state, tuned under their own key)",
        choices=("serial", "chunk_parallel"))
    launch_path: str = switch(
        "triton", "how every kernel of the backend is launched (impls/triton/launcher.py): 'triton' = "
                  "kernel[grid](...) on every call (Triton binds and specialises each argument at each launch); "
                  "'cached' = the first launch of a signature through Triton, later ones straight to the kernel it "
                  "compiled (key: each tensor's dtype and 16-byte alignment, each scalar's value, each host "
                  "descriptor's dtype and box, the constexprs and launch options), host descriptors passed without "
                  "TensorDescriptor's per-call validation. Changes no kernel; host cost only. Not under the Triton "
                  "interpreter, which compiles nothing (ValueError)",
        choices=("triton", "cached"))
    tuning: str = switch("auto", "where launch configurations come from (impls/tuning.py modes)", choices=MODES)
    # Launch sizes: 0 = from tuning (as in the cuTile backend); a value pins that field wherever it applies.
    block_rows: int = switch(0, "compute_out: chunk rows (output positions) per program; 0 = from tuning",
                             choices=(0, 16, 32, 64, 128))
    block_positions: int = switch(
        0, "chunk positions per inner step: compute_out's source positions, chunk_state's reduction step; "
           "0 = from tuning", choices=(0, 16, 32, 64, 128))
    block_headdim: int = switch(0, "headdim columns per program (chunk_state, compute_out); 0 = from tuning",
                                choices=(0, 16, 32, 64, 128, 256))
    block_dstate: int = switch(0, "dstate columns per program in chunk_state (compute_out takes all of dstate); "
                                  "0 = from tuning", choices=(0, 16, 32, 64, 128, 256))
    block_heads: int = switch(0, "chunk_cumsum: heads per program; 0 = from tuning", choices=(0, 1, 2, 4, 8, 16))
    block_state: int = switch(0, "state_passing: state elements per program; 0 = from tuning",
                              choices=(0, 64, 128, 256, 512, 1024, 2048, 4096))
    num_warps: int = switch(0, "warps per program in every stage; 0 = from tuning", choices=(0, 1, 2, 4, 8, 16))
    num_stages: int = switch(
        0, "software-pipelining depth of the loops (chunk_state, compute_out); 0 = from tuning. Triton's "
           "nearest analogue of cuTile's latency hints", choices=(0, 1, 2, 3, 4, 5))
    heads_per_tile: int = switch(
        0, "compute_out: heads of one group per program (1 or 2; must divide nheads / ngroups, else ValueError); "
           "with 2, C's rows, each B tile and each C·Bᵀ tile are loaded/computed once for both heads, each head "
           "keeping its own state term, scores, x tiles, accumulator and epilogue (cuTile's head_mma='per_head'); "
           "0 = from tuning (fallback 1)", choices=(0, 1, 2))
    occupancy: int = switch(
        0, "CTAs per SM the register allocation must leave room for (chunk_state, compute_out, the fused kernel): "
           "N > 0 launches with maxnreg = 65536 / (N · 32 · num_warps), rounded down to a multiple of 8, at most "
           "255; 0 = from tuning, whose fallback 0 leaves registers to the compiler. cuTile's occupancy hint, as far "
           "as Triton can express it: registers only (shared memory still decides its own limit)",
        choices=(0, 1, 2, 3, 4),
        sm90="PTX .maxnreg on the kernel (Triton 3.6 has no .minnctapersm; an `occupancy=` compile option is "
             "ignored without an error, docs/triton-switches.md)")
    state_occupancy: int = switch(
        0, "stage 2's occupancy where it differs from compute_out's: N > 0 pins chunk_state's (the local-state "
           "kernel, or state_pass='serial''s kernel) occupancy to N over the `occupancy` switch, as cuTile's "
           "records tune occupancy per stage; 0 = stage 2 takes `occupancy` (or tuning) like the other MMA kernels",
        choices=(0, 1, 2, 3, 4))
    exp_fold: bool = switch(
        False, "compute_out: dt folded into the decay's exponent. A small kernel (fold_kernel) first writes q = "
               "dA_cumsum·log2(e) − log2(dt) (dA_cumsum − ln(dt) with exp2 off) per (batch, head, chunk, position), "
               "fp32; the main kernel reads q where it read dt and dA_cumsum per source and takes each score as "
               "cb·exp2(dA_m·log2(e) − q_k) instead of cb·exp2(dA_m·log2(e) − dA_k·log2(e))·dt_k (the factored "
               "decay's source factor likewise); dt = 0 gives q = +inf and a zero term. Needs dt >= 0 after "
               "processing (a negative dt gives NaN: check_values and the gate refuse it, naming dt). The stage "
               "interface is unchanged; not with fuse_state_out",
        sm90="one multiply less per score element and one per-source load less in the source loop, for one extra "
             "launch reading dt and dA_cumsum and writing q (4 bytes per (batch, head, position) each)",
        sm100="as on sm_90")
    bwd_recompute_states: bool = switch(
        False, "the backward (impls.ssd): off = the forward keeps the states entering every chunk (its `states`, "
               "batch·nchunks·nheads·headdim·dstate elements in state_dtype) until the backward reads them; on = it "
               "keeps none and the backward recomputes them with stage 2 (one fwd_pass_state more); the forward's "
               "kernels are unchanged either way (impls/triton/backward/)")
    bwd_state_split: bool = switch(
        True, "the backward's reverse state pass (impls/triton/backward/state_pass.py): the decay-weighted dŷ "
              "(γ e^Λ dŷ, fp32) enters the state gradient's tl.dot as two operands in x's dtype, hi = its rounding "
              "and lo = the rounding of what hi left out, both dotted with the same C tile into the one fp32 "
              "accumulator (R then carries no rounding of the decay's product at first order; dΛ's carried term "
              "d_c ⟨R, S_c⟩ and the initial states' gradient read R); off = one rounded operand, one tl.dot. No "
              "effect with fp32 inputs (the operand is not rounded to x's dtype: one tl.dot at cb_precision)",
        sm90="two warpgroup MMAs per inner step of the state pass instead of one (the same C tile, a second A "
             "operand), an FSUB and a cast per dŷ element more; the other backward kernels unchanged",
        sm100="as on sm_90")
    bwd_cb: str = switch(
        "inline", "the backward's C·Bᵀ (impls/triton/backward/chunk.py): 'inline' = bwd_chunk forms G = C_l·B_sᵀ with "
                  "a tl.dot in every (source tile, head) program, once per head although it depends on the group "
                  "only; 'shared' = compute_out's cb_kernel forms it once per (batch, chunk, group) into a (batch, "
                  "nchunks, ngroups, chunk, chunk) fp32 buffer (the tiles on or below the diagonal, 4·chunk² bytes "
                  "per (batch, chunk, group) allocated) and bwd_chunk loads its causal elements instead (two tl.dot "
                  "per row tile instead of three). bwd_dcb and bwd_db form no C·Bᵀ",
        choices=("inline", "shared"),
        sm90="'shared': one launch more (64 × 64 tiles, one warpgroup MMA each); bwd_chunk's loop reads an fp32 "
             "(rows × sources) tile from L2 where it read a (rows × dstate) tile of C in the input dtype, the same "
             "bytes at 64 sources and dstate 128 in bf16",
        sm100="as on sm_90")
    bwd_decay_factor: bool = switch(
        False, "the backward's chunk kernel (impls/triton/backward/chunk.py): on, the decays L_ls = e^(Λ_l − Λ_s) of "
               "the row tiles wholly below the diagonal (inside the chunk, without seq_idx) are an outer product "
               "e^(Λ_l − Λ_p)·e^(Λ_p − Λ_s) factored at the source tile's last position p (each factor at most 1 "
               "where the decays do not grow, dt·A <= 0): one exponential per row of the row tile and one per source "
               "of the program, a multiply per pair, where off takes an exponential per pair. The diagonal tiles, "
               "a short last chunk and seq_idx keep the masked exponential",
        sm90="on: ex2.approx per row of a row tile instead of per pair, and its subtraction gone; the default's loop "
             "unchanged",
        sm100="as on sm_90")
    bwd_entry_term: str = switch(
        "chunk", "where the backward forms dΛ_s's entering-state term e^(Λ_s) dŷ_s · (S_c C_s) "
                 "(impls/triton/backward/): "
                 "'chunk' = the chunk kernel, every (source tile, head) program loading its C_s rows and the chunk's "
                 "state and forming C_s·S_cᵀ with a tl.dot; 'state_pass' = the reverse state pass, which holds C and "
                 "S_c for its (headdim, dstate) block already, forms C·S_cᵀ with one more tl.dot per block of "
                 "positions and writes the term's partial per state tile, which the cumsum kernel adds; 'dcb' = the "
                 "d(C·Bᵀ) kernel, which loads every head's state for dC's entering-state term already: one more "
                 "tl.dot per head (its row tile's C against the state), the term stored per head and position for "
                 "the cumsum kernel. Away from 'chunk' the chunk kernel reads neither C_s nor the states",
        choices=("chunk", "state_pass", "dcb"),
        sm90="'state_pass': the chunk kernel one wgmma and two tile loads lighter per program (fewer registers), the "
             "state pass one wgmma heavier per block of positions; 'dcb': that wgmma per (row tile, head) in the dcb "
             "kernel's head loop instead",
        sm100="as on sm_90")
    bwd_dcb_sources: str = switch(
        "tiles", "the backward's d(C·Bᵀ) kernel (impls/triton/backward/dcb.py): 'tiles' = each row-tile program walks "
                 "the source tiles up to its rows and, inside each, the group's heads (one (rows × sources) "
                 "dŷ_l·x_sᵀ tl.dot per head and source tile; dŷ_l and the decays of its rows loaded again for every "
                 "source tile), then the heads again for the entering states' term; 'chunk' = one walk over the "
                 "heads, each forming the row tile against the whole chunk of sources in one (rows × chunk) tl.dot, "
                 "the entering states' term in the same walk, dG's row block stored whole (zeros above the diagonal) "
                 "and dC's sources' term as one tl.dot with the chunk's B: a tenth of the loop's steps at S1, the "
                 "tile products above the diagonal formed and masked, the chunk's x read once per row tile and head",
        choices=("tiles", "chunk"),
        sm90="'chunk': per head one (rows × chunk × headdim) warpgroup MMA where 'tiles' issued one per source tile, "
             "and a (rows × chunk) fp32 accumulator held across the walk",
        sm100="as on sm_90")
    bwd_group_split: int = switch(
        1, "the backward's sums over a group's heads (bwd_dcb: d(C·Bᵀ) and dC; bwd_db: dB; "
           "impls/triton/backward/): 1 = one program per (tile, group, chunk, batch) walks every head of the group; "
           "k > 1 = k programs per group, program p taking heads [p·H/k, (p+1)·H/k) of the group's H (floor "
           "division: shares differ by at most one head, some empty where k > H) in order into fp32 partials; "
           "bwd_db's program p also takes a share of the row tiles, where it adds the k partials of d(C·Bᵀ) in "
           "order as it loads them (d(C·Bᵀ) complete before its use); the dC and dB partials, (batch, seqlen, "
           "ngroups·k, dstate) fp32, are summed by one torch.sum over the split axis on the host (no atomics), "
           "then cast: the same bits on every call. "
           "Memory: k d(C·Bᵀ) buffers and the two partial buffers",
        choices=(1, 2, 4, 8),
        sm90="k times the programs of bwd_dcb and bwd_db; each bwd_dcb program forms its own partial's "
             "d(C·Bᵀ)·B MMAs (k of them where one program formed one), each bwd_db program loads k d(C·Bᵀ) tiles "
             "per row tile of its share",
        sm100="as on sm_90")
    bwd_atomics: bool = switch(
        False, "with bwd_group_split k > 1: the k programs of a group add their dC and dB partials into one zeroed "
               "fp32 buffer each by float atomic adds (tl.atomic_add, relaxed) instead of storing k partial planes "
               "summed on the host: the order of the adds is the hardware's, so two calls may differ in the last bits "
               "(not deterministic). d(C·Bᵀ)'s partials stay one per program. Refused with bwd_group_split=1 (one "
               "program per group, nothing to accumulate)",
        sm90="red.global.add.f32 per element of each program's (rows × dstate) tile, no partial planes written or "
             "read back",
        sm100="as on sm_90",
        needs={"bwd_group_split": 4})
    cb_lower_triangle: bool = switch(
        False, "cb_mode shared's C·Bᵀ kernel (cb_kernel, 64 × 64 tiles) launches one program per tile on or below "
               "the chunk's diagonal, n(n + 1)/2 of n × n, the tile's indices computed from the program id; the tiles "
               "above it stay unwritten and compute_out loads only the causal elements of C·Bᵀ (source <= row, "
               "all inside the written tiles; the others read as 0, as causality masks them). Off: every tile "
               "written, loads masked by the chunk's length only. Needs cb_mode shared; not with fuse_state_out",
        sm90="10 programs instead of 16 per chunk of 256; compute_out's C·Bᵀ loads take the causal compare in "
             "their mask",
        sm100="as on sm_90",
        needs={"cb_mode": "shared"})

    inner_chunk: int = switch(
        0, "the forward (ssd_forward, impls.ssd's forward, the parts the harness times) runs its stages at chunks of "
           "this many tokens behind the caller's chunk_size, which it must divide (ValueError naming both), and "
           "returns the ForwardResult at the caller's chunk: y, the final and per-sequence states as they come, the "
           "states entering every caller chunk (every chunk_size/inner_chunk-th inner state), dt and dA_cumsum laid "
           "out and re-based per caller chunk (impls/inner_chunk.py; impls/README.md, \"An internal chunk\"). "
           "0 = off; at a chunk_size no larger than it, nothing changes (the stages already run at most at it). The "
           "stage entries (chunk_cumsum, fwd_pass_state, compute_out) keep the chunk they are given; the backward "
           "(impls.ssd) runs at the caller's chunk on the converted intermediates. Tiles: the records of the shape at "
           "the inner chunk (describe()'s inner_chunk and inner_<stage> entries say which ran)",
        choices=INNER_CHUNKS,
        sm90="no kernel changes: compute_out's quadratic part costs inner_chunk/2 score elements per token "
             "instead of chunk_size/2, for chunk_size/inner_chunk times the states stage 2 writes and compute_out "
             "reads; the returned states are a view of every chunk_size/inner_chunk-th (no copy, the inner "
             "ones' memory held)",
        sm100="as on sm_90")

def code_switches(switches: TritonSwitches) -> dict[str, Any]:
    """The switches that change the kernels' code (part of the tuning key)."""
    # equal switches can differ in type (tma=1 == tma=True) and so in the key's text: the types are in the cache key
    return dict(_code_switches(switches, tuple(type(v) for v in vars(switches).values())))


@functools.lru_cache(maxsize=64)
def _code_switches(switches: TritonSwitches, _types: tuple) -> tuple[tuple[str, Any], ...]:
    # every stage's tuning key on every call reads them: worked out once per (frozen, hashable) switches
    return tuple((k, v) for k, v in dataclasses.asdict(switches).items()
            if k in ("transposed_layout", "operand_swap", "exp2", "cb_precision", "cb_mode")
            # in the key only when on: records found without them keep their keys
            or (k in ("decay_factor", "tma", "fuse_state_out", "heads_first", "exp_fold", "decay_single") and v)
            or (k == "tma_descriptors" and v != "device")
            or (k == "exp2_ftz" and not v)
            or (k == "fused_program" and v != "row_tile")
            or (k == "cb_lower_triangle" and v))
