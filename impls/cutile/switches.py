"""The cuTile backend's switches: compile-time constants of its kernels, defaults = every trick on, except
`operand_swap` and `decay_factor`.

The help strings say what a switch does, per architecture in the field metadata (`sm90=`, `sm100=`);
docs/cutile-switches.md says, per stage, which tensor each switch transposes or swaps and who pays for it; what
each one measured, and so why a default is what it is, is in docs/perf-notes.md ("Switch defaults").
"""

from __future__ import annotations

from dataclasses import dataclass

from impls import tuning
from impls.cutile.common import DEFAULT_OPT_LEVEL
from impls.inner_chunk import INNER_CHUNKS
from impls.registry import switch

STATE_PASS = ("serial", "chunk_parallel")  # stage 2's arrangements (switch state_pass), the default first
FUSED_PROGRAMS = ("serial", "chunk")  # the fused kernel's program arrangements (switch fused_program), default first
OPT_LEVELS = (3, 2, 1, 0)  # what `ct.kernel(opt_level=)` accepts in cuda-tile 1.7 (0..3), its default first
STATE_SUBBLOCKS = (0, 64, 128)  # stage 2's positions per main-loop step (switch state_subblock); 0 = the whole chunk



@dataclass(frozen=True)
class CutileSwitches:
    transposed_layout: bool = switch(
        True,
        "stage 2 stores the chunk states (b, c, h, dstate, headdim) in memory (returned as a transposed view); "
        "stage 3 loads them in that form",
        sm90="states written dstate-major so that stage 3's C·stateᵀ reads its B operand in (K=dstate, N=headdim) "
             "form straight from the TMA box",
        sm100="same layout; stage 3's state operand arrives in the (K, N) form the tcgen05 MMA's B operand in shared "
              "memory takes")
    operand_swap: bool = switch(
        False,
        "swap the matmul operands: stage 2 computes stateᵀ = Bᵀ·(w x) (dstate on M, headdim on N); stage 3 "
        "computes yᵀ = state·Cᵀ + xᵀ·scoresᵀ (headdim on M, chunk rows on N)",
        sm90="which operand is the warpgroup MMA's A (M side, 64-row granules) and which dimension lands on N",
        sm100="which operand the tcgen05 MMA keeps in Tensor Memory as the accumulator's M side, i.e. TMEM placement "
              "of the (headdim × rows) vs (rows × headdim) accumulator")
    latency_hints: bool = switch(
        True, "pass `latency=` hints on the big operand loads (x, B, C, states), letting the compiler deepen "
              "the prefetch pipeline (the same hint on sm_90 and sm_100; what tileiras does with it is its own)")
    tma: bool = switch(
        True, "allow tensor-memory-accelerator (TMA) bulk loads/stores (allow_tma=None, the compiler decides); off "
              "forces allow_tma=False (per-thread loads)",
        sm90="on: tiles copied global → shared memory by the TMA unit (UTMALDG in the SASS), one thread issuing a "
             "whole box; off: every thread loads its elements (LDG) and stores them to shared memory",
        sm100="on: the TMA unit fills the shared-memory operands of the tcgen05 MMAs; off: per-thread loads as on "
              "sm_90")
    exp2: bool = switch(
        True, "work in base 2: dA_cumsum scaled by log2(e) once per tile, decays via exp2 (and softplus via "
              "exp2/log2) instead of exp",
        sm90="the hardware exponential is base 2 (MUFU.EX2): exp(v) costs a multiply by log2(e) per element before "
             "it; on, that multiply happens once per loaded dA_cumsum value instead of once per decay",
        sm100="as on sm_90 (MUFU.EX2 is base 2)")
    exp2_ftz: bool = switch(
        False, "the exp2 of stages 2 and 3 (stage 2's decay weights and chunk decays, stage 3's decays, state scale "
               "and silu gate) with subnormal inputs and results flushed to zero (`ct.exp2(..., flush_to_zero=True)`): "
               "a result below 2^-126 reads 0 instead of a subnormal. chunk_cumsum and the fused kernels keep the "
               "plain exp2. No effect with exp2 off (`ct.exp` has no flush-to-zero form)",
        sm90="ex2.approx.ftz.f32: one MUFU.EX2 per exponential; off, ex2.approx.f32 keeps subnormals, which the SASS "
             "does around the MUFU.EX2 with a compare and two predicated multiplies (the argument scaled into the "
             "normal range, the result scaled back)",
        sm100="as on sm_90 (MUFU.EX2)",
        needs={"exp2": True})
    decay_factor: bool = switch(
        False, "stage 3, source blocks before the row block: the decay exp(dA_l - dA_s) taken as exp(dA_l - dA_ref) · "
               "exp(dA_ref - dA_s) with dA_ref at the row block's first row (both factors <= 1 since dA_cumsum falls "
               "monotonically inside a chunk when dt >= 0, so neither overflows where the product does not); the "
               "source factor times dt scales the C·Bᵀ tile's columns, the row factor the blocks' sum, so those "
               "tiles need no causal mask and no exp per element — the diagonal block keeps the masked form",
        sm90="one multiply and a cast per score element instead of a compare, select, subtract, exp2 and two "
             "multiplies",
        sm100="the same per-element saving; the scaled tiles feed tcgen05 MMAs")
    decay_single: bool = switch(
        False, "stage 3 with decay_factor: the factored decay in the one accumulator. It starts from the off-chunk "
               "term scaled by exp(dA_ref) (not exp(dA_l)), sums the factored source blocks onto it, is scaled once "
               "per row by exp(dA_l - dA_ref) (giving the off-chunk term its exp(dA_l)), and then takes the skip "
               "term (with skip_first) and the diagonal block in the masked form; off, decay_factor sums the "
               "factored blocks in a second accumulator added after the loop. Every factor <= 1 (impls/README.md)",
        sm90="one (rows × headdim) fp32 accumulator per head live through the source loop instead of two, and a "
             "multiply per accumulator element after the loop instead of a multiply-add",
        sm100="the same accumulators; where tcgen05 keeps them (Tensor Memory) is the compiler's",
        needs={"decay_factor": True})
    heads_first: bool = switch(
        False, "stage 3 program order: the head blocks of one (batch, chunk, row block) tile fastest-varying in the "
               "program id, so that the programs resident at the same time share their C and B tiles (one group's "
               "heads read the same ones) instead of each reading another chunk's; off: the row tiles fastest, one "
               "head block at a time",
        sm90="CTAs are dispatched in increasing linear block id: on, the CTAs in flight (occupancy × 132 SMs) cover "
             "a few row tiles × all head blocks, so C_l and each B_j come from DRAM once and from L2 for the other "
             "heads of the group; off, they cover hundreds of row tiles of one head block and the next head block "
             "reads them again after they may have left L2",
        sm100="the same dispatch order and L2 reuse (148 SMs); the grid's layout is all the switch changes")
    skip_first: bool = switch(
        False, "stage 3: the skip term D ∘ x of the tile's rows added to the accumulator before the source-block "
               "loop (right after the off-chunk term) instead of in the epilogue, so that the D values and the "
               "per-head indices of their loads do not live across the loop; off: in the epilogue",
        sm90="fewer values live through the loop in the math warpgroup's registers (128 per thread at occupancy 3 "
             "after the producer warpgroup gives registers back), so fewer of them are spilled to local memory "
             "around it; x's row tile is read once more (before the loop; the epilogue still reads it for z)",
        sm100="the same live ranges; the accumulator is in registers as on sm_90 (cuTile's tcgen05 lowering is "
              "the compiler's)")
    head_loop: int = switch(
        0, "stage 3 with one program per (batch, chunk, row block, block of up to this many heads of one group, "
           "headdim block) that walks its heads in a runtime loop, heads_per_tile of them per step (the step is "
           "the default kernel's tile: C_l·B_jᵀ once per step for its heads, per_head or batched as head_mma says), "
           "so that one step's accumulators are live at a time and the C_l tile is loaded once for all the "
           "program's heads; each step reads B_j again (the program's own recent reads). A group's last block is "
           "shorter when the value does not divide nheads / ngroups; it must be a multiple of heads_per_tile. 0 = "
           "off (one program per heads_per_tile heads). The math and the rounding are the default kernel's",
        choices=(0, 2, 4, 8, 16),
        sm90="the SASS has two nested loops of TMA loads (heads, then source blocks) where the default has one; C_l's "
             "two boxes are loaded before the head loop and read by every step's HGMMAs from shared memory; the "
             "step's code, registers and spills are those of the default kernel at the same tiles",
        sm100="the same loop; the tcgen05 lowering of its body is the compiler's")
    cb_precision: str = switch(
        "tf32", "precision of the matmuls for fp32 inputs (C·Bᵀ and the others): tf32 tensor cores or full fp32; "
                "ignored for fp16/bf16 inputs", choices=("tf32", "fp32"))
    cb_mode: str = switch(
        "tuned", "stage 3's C·Bᵀ: 'shared' = once per (batch, chunk, group) by a kernel of its own, read by every "
                 "head of the group; 'inline' = recomputed inside the main kernel for each head; 'tuned' = the "
                 "tuning config's choice (shared_cb)", choices=("tuned", "shared", "inline"))
    head_mma: str = switch(
        "per_head", "stage 3 with heads_per_tile = HB > 1: 'batched' = the HB heads' matmuls as one rank-3 (HB-deep) "
                   "MMA per source block; 'per_head' = one 2-D MMA chain per head (HB accumulators, HB score tiles, "
                   "unrolled at compile time), the C tile, each B_j tile and C·B_jᵀ still loaded/computed once for "
                   "the HB heads. No effect when heads_per_tile is 1", choices=("batched", "per_head"),
        sm90="cuTile 1.7 lowers the batched rank-3 MMA to HMMA.16816 (mma.sync) with local-memory spills; per_head "
             "gives each head warpgroup HGMMAs as with heads_per_tile 1, HB independent HGMMA/MUFU.EX2 chains per "
             "source block",
        sm100="per_head: HB independent tcgen05 MMA chains per source block; the lowering of the batched rank-3 "
              "MMA on sm_100 has not been examined")
    fuse_state_out: bool = switch(
        False, "the whole forward as two kernels: chunk_cumsum, then one kernel that walks the chunks in order with "
               "the state in registers and writes y and the final state only (impls/cutile/fused.py; the per-chunk "
               "states are not stored, so the forward returns none; fused_program='chunk' arranges the kernel's "
               "programs otherwise). The stage calls keep the three-stage contract. No seq_idx / cu_seqlens",
        sm90="removes the states' write (stage 2) and read-back (stage 3) and one launch; the work of stages 2 and "
             "3 runs in batch x nheads x headdim-block programs, each serial over the chunks",
        sm100="as on sm_90")
    fused_program: str = switch(
        "serial", "the programs of the fused kernel (fuse_state_out): 'serial' = one per (batch, head, headdim block), "
                  "walking the chunks in order with the state in registers (impls/cutile/fused.py); 'chunk' = one per "
                  "(batch, chunk, head, headdim block), each computing its chunk's local state, taking the state "
                  "entering its chunk from the previous chunk's program (a flag in global memory, release/acquire, "
                  "the work named by a ticket so that every wait points at a running program), handing the next one "
                  "on, then walking its chunk's row blocks (impls/cutile/fused_chunk.py; the arrangement of the "
                  "PyTorch blog's fused SSD kernel). 'chunk' also writes the per-chunk states (state_dtype), which "
                  "the forward then returns. Needs fuse_state_out=True",
        choices=FUSED_PROGRAMS,
        sm90="'chunk': nchunks times the programs (10240 at S1 with 64-column blocks, against 640), each one chunk "
             "long; the hand-off is ATOMG.E.ADD.STRONG.GPU + CCTL.IVALL spun on by one thread (acquire) and a CTA "
             "barrier, MEMBAR.ALL.GPU + ATOMG.E.EXCH.STRONG.GPU (release), the state through plain LDG/STG "
             "(docs/cutile-switches.md, fused_program)",
        sm100="the same arrangement; the sm_100 lowering of the atomics has not been examined",
        needs={"fuse_state_out": True})
    state_pass: str = switch(
        "serial", "stage 2's arrangement: 'serial' = one kernel whose programs own (batch, head, headdim block, "
                  "dstate block) and walk the chunks in order, each chunk's local state kept in registers; "
                  "'chunk_parallel' = a kernel computing every chunk's local state at once into an fp32 scratch "
                  "(programs over batch x chunks x heads x blocks), then a light kernel carrying the state across "
                  "the chunks, parallel over (batch, head, state elements) (impls/README.md, two-pass form)",
        choices=STATE_PASS,
        sm90="chunk_parallel trades the local states' fp32 write and read-back (2 x 4 bytes per state element per "
             "chunk) for nchunks times more programs in the MMA kernel; the serial chain left is an FMA per element "
             "per chunk",
        sm100="as on sm_90")
    pdl: bool = switch(
        False, "programmatic dependent launch: stage 2's kernels (fwd_pass_state; local_state_kernel and pass_kernel "
               "with state_pass chunk_parallel) and stage 3's main kernel (compute_out_kernel) launched with "
               "`ct.launch(..., programmatic_dependent_launch=True)`, so that each may start while its predecessor "
               "in the stream still runs; its first statement waits for the predecessor's completion "
               "(`ct.grid_dependency_control_wait`) and then releases its own successor "
               "(`ct.grid_dependency_control_launch_dependents`); chunk_cumsum releases stage 2 at its start. "
               "cb_mode shared's C·Bᵀ kernel is launched without it. Not with fuse_state_out",
        sm90="griddepcontrol.wait / griddepcontrol.launch_dependents in the kernels (SASS ACQBULK / PREEXIT): the "
             "dependent grid's launch and its CTAs' start overlap the predecessor's last wave and its completion; "
             "no load or store of the dependent kernel runs before the wait",
        sm100="the same instructions and launch attribute (PDL exists from sm_90 on)")
    opt_level: int = switch(
        DEFAULT_OPT_LEVEL, "`ct.kernel(opt_level=)` of every kernel, passed to tileiras as -O<level>; 3 is cuTile's "
                           "default (0 is a real level here, not 'unset')", choices=OPT_LEVELS,
        sm90="tileiras's optimisation level for the sm_90 cubin",
        sm100="tileiras's optimisation level for the sm_100 cubin")
    block_heads: int = switch(
        0, "stage 1 heads per tile (the tile count is batch x nchunks x nheads / block_heads); 0 = from tuning",
        choices=(0, 4, 8, 16, 32, 64))
    block_rows: int = switch(
        0, "stage 3 rows (and source positions) of the chunk per tile; 0 = from tuning", choices=(0, 32, 64, 128))
    block_headdim: int = switch(
        0, "headdim columns per tile (stages 2, 3); 0 = from tuning", choices=(0, 32, 64, 128, 256))
    block_dstate: int = switch(
        0, "dstate columns per tile in stage 2; 0 = from tuning", choices=(0, 32, 64, 128, 256))
    heads_per_tile: int = switch(
        0, "stage 3 heads of one group per tile, sharing one C·Bᵀ (must divide nheads / ngroups; a value that "
           "does not raises); 0 = from tuning", choices=(0, 1, 2, 4, 8))
    occupancy: int = switch(
        0, "`ct.kernel(occupancy=)` hint, CTAs per SM; 0 = from tuning", choices=(0, 1, 2, 4),
        sm90="tileiras caps registers per thread so that this many CTAs fit in the SM's 64 K registers (at most "
             "255 per thread), spilling to local memory if the kernel needs more",
        sm100="as on sm_90 (64 K registers per SM)")
    tuning: str = switch(
        "auto", "where tile sizes/occupancy come from (impls/tuning.py modes)",
        choices=tuning.MODES)
    exp_fold: bool = switch(
        False, "stage 3: dt folded into the decay's exponent. A small kernel of the stage (fold_kernel) first writes "
               "q = dA_cumsum·log2(e) − log2(dt) (dA_cumsum − ln(dt) with exp2 off) per (batch, head, chunk, "
               "position), fp32; the main kernel reads q where it read dt and dA_cumsum per source block and takes "
               "each score as cb·exp2(dA_l·log2(e) − q_s) instead of cb·exp2(dA_l·log2(e) − dA_s·log2(e))·dt_s (the "
               "factored decay's source factor likewise); dt = 0 gives q = +inf and a zero term. Needs dt >= 0 "
               "after processing (a negative dt gives NaN: check_values and the gate refuse it, naming dt). The "
               "stage interface is unchanged; not with fuse_state_out",
        sm90="one FMUL less per score element, one (HB, rows) load and its log2(e) multiply less per source block, "
             "for one extra launch reading dt and dA_cumsum and writing q (4 bytes per (batch, head, position) each)",
        sm100="as on sm_90")
    bwd_recompute_states: bool = switch(
        False, "the backward (impls.ssd): off = the forward keeps the states entering every chunk (its `states`, "
               "batch·nchunks·nheads·headdim·dstate elements in state_dtype) until the backward reads them; on = it "
               "keeps none and the backward recomputes them with stage 2 (one fwd_pass_state more), as it always "
               "does after fuse_state_out's serial program, which makes none; the forward's kernels are unchanged "
               "either way (impls/cutile/backward/)")
    cb_occupancy: int = switch(
        0, "the `ct.kernel(occupancy=)` hint of stage 3's C·Bᵀ kernel (cb_kernel, which runs where C·Bᵀ is shared: "
           "cb_mode shared, or cb_mode tuned with a config whose shared_cb is true; the row's config says which), "
           "CTAs per SM; 0 = no hint, the compiler's choice. Not with cb_mode inline",
        choices=(0, 2, 4),
        sm90="tileiras caps the kernel's registers per thread so that this many CTAs fit an SM's 64 K registers; 0 "
             "leaves the count to it (docs/perf-notes.md has the SASS of each value)",
        sm100="as on sm_90 (64 K registers per SM)")
    cb_lower_triangle: bool = switch(
        False, "stage 3's C·Bᵀ kernel (where C·Bᵀ is shared, as for cb_occupancy) launches one program per (row "
               "block, source block) pair on or below the diagonal, n(n + 1)/2 of a chunk's n × n, the pair's "
               "indices computed from the program id; the pairs above it, which compute_out never reads (causal: "
               "sources j <= row block i), stay unwritten. Off: every pair computed and written. Not with cb_mode "
               "inline",
        sm90="the same per-program code (two TMA loads, the warpgroup MMA, one TMA store) with a few integer "
             "instructions more for the pair's indices; 10 programs instead of 16 per chunk at 64-row blocks of a "
             "256 chunk",
        sm100="as on sm_90")
    state_subblock: int = switch(
        0, "stage 2's local state (serial kernel, or state_pass chunk_parallel's local-state kernel) as a GEMM main "
           "loop over the chunk's positions: this many positions per step, each step's x and B tiles MMA'd onto one "
           "accumulator, instead of the whole chunk's x and B loaded as one tile and one MMA; must divide "
           "chunk_size. 0 = the whole chunk at once. Not with fuse_state_out (the fused kernels' carry takes the "
           "whole chunk)",
        choices=STATE_SUBBLOCKS,
        sm90="a loop of chunk_size / state_subblock steps of TMA loads and warpgroup MMAs per chunk, whose step's "
             "tiles (not the chunk's) are staged in shared memory: the shared memory and registers per CTA the "
             "whole-chunk tiles take leave room for more CTAs per SM",
        sm100="the same loop; its tcgen05 lowering is the compiler's")
    bwd_state_split: bool = switch(
        True, "the backward's reverse state pass (impls/cutile/backward/state_pass.py): the decay-weighted dŷ "
              "(γ e^Λ dŷ, fp32) enters the state gradient's MMA as two operands in x's dtype, hi = its rounding and "
              "lo = the rounding of what hi left out, both MMA'd with the same C tile into the one fp32 accumulator "
              "(R then carries no rounding of the decay's product at first order; dΛ's carried term d_c ⟨R, S_c⟩ "
              "and the initial states' gradient read R); off = one rounded operand, one MMA. No effect with fp32 "
              "inputs (the operand is not rounded to x's dtype: one MMA at cb_precision)",
        sm90="two warpgroup MMAs per chunk of the state pass instead of one (the same C tile, a second A operand), an "
             "FADD and a cast per dŷ element more; the other backward kernels unchanged",
        sm100="as on sm_90")
    bwd_exp2_ftz: bool = switch(
        False, "the backward kernels' exp2 (impls/cutile/backward/: the decays in the state pass, chunk, dcb and db "
               "kernels, silu's and softplus's exponentials) with subnormal inputs and results flushed to zero, as "
               "switch exp2_ftz does for the forward's stages 2 and 3 (`ct.exp2(..., flush_to_zero=True)`): a decay "
               "below 2^-126 reads 0 instead of a subnormal. Our Triton's backward has it always: tl.exp2 lowers to "
               "ex2.approx.ftz.f32. No effect with exp2 off",
        sm90="ex2.approx.ftz.f32: one MUFU.EX2 per exponential; off, ex2.approx.f32 keeps subnormals, which the SASS "
             "does around the MUFU.EX2 with a compare and two predicated multiplies",
        sm100="as on sm_90 (MUFU.EX2)",
        needs={"exp2": True})
    bwd_decay_factor: bool = switch(
        False, "the backward's chunk kernel (impls/cutile/backward/chunk.py): on, the decays L_ls = e^(Λ_l − Λ_s) of "
               "the row tiles wholly below the diagonal (inside the chunk, without seq_idx) are an outer product "
               "e^(Λ_l − Λ_p)·e^(Λ_p − Λ_s) factored at the source tile's last position p (each factor at most 1 "
               "where the decays do not grow, dt·A <= 0): one exponential per row of the row tile and one per source "
               "of the program, a multiply per pair, where off takes an exponential per pair. The diagonal tiles, "
               "a short last chunk and seq_idx keep the masked exponential",
        sm90="on: MUFU.EX2 per row tile 64 instead of 4096 at 64 × 64 tiles, and the subtraction and (without "
             "bwd_exp2_ftz) the subnormal handling around each gone; the default's loop unchanged",
        sm100="as on sm_90")
    bwd_entry_term: str = switch(
        "chunk", "where the backward forms dΛ_s's entering-state term e^(Λ_s) dŷ_s · (S_c C_s) "
                 "(impls/cutile/backward/): "
                 "'chunk' = the chunk kernel, every (source tile, head) program loading its C_s rows and the chunk's "
                 "state and forming C_s·S_cᵀ with an MMA; 'state_pass' = the reverse state pass, which holds C and "
                 "S_c for its (headdim, dstate) block already, forms C·S_cᵀ over the whole chunk with one more MMA per "
                 "chunk and writes the term's partial per state tile, which the cumsum kernel adds; 'dcb' = the "
                 "d(C·Bᵀ) kernel, which loads every head's state for dC's entering-state term already: one more MMA "
                 "per head (its row tile's C against the state), the term stored per head and position for the "
                 "cumsum kernel. Away from 'chunk' the chunk kernel reads neither C_s nor the states",
        choices=("chunk", "state_pass", "dcb"),
        sm90="'state_pass': the chunk kernel one (sources × headdim × dstate) HGMMA and two TMA tiles lighter per "
             "program (less shared memory per program), the state pass one (chunk × headdim × dstate block) HGMMA "
             "heavier per chunk step, on its serial walk; 'dcb': the same HGMMA per (row tile, head) in the dcb "
             "kernel's head loop instead, off any serial chain, and the row tile's C once per program",
        sm100="as on sm_90")
    bwd_cb: str = switch(
        "inline", "the backward's C·Bᵀ (impls/cutile/backward/chunk.py): 'inline' = bwd_chunk forms G = C_l·B_sᵀ with "
                  "an MMA in every (source tile, head) program, once per head although it depends on the group only; "
                  "'shared' = compute_out's cb_kernel (its lower-triangle grid, 64 × 64 tiles) forms it once per "
                  "(batch, chunk, group) into a (batch, nchunks, ngroups, chunk, chunk) fp32 buffer (4·chunk² bytes "
                  "per (batch, chunk, group) allocated, the tiles above the diagonal unwritten) and bwd_chunk loads "
                  "its (rows × sources) tile, keeping the causal elements, instead (two MMAs per row tile instead of "
                  "three, no C_l load). bwd_dcb and bwd_db form no C·Bᵀ; the forward's kernels are unchanged",
        choices=("inline", "shared"),
        sm90="'shared': one launch more (cb_kernel: two TMA loads, a warpgroup MMA, a TMA store per tile); "
             "bwd_chunk's loop reads an fp32 (rows × sources) tile where it read a (rows × dstate) tile of C in the "
             "input dtype (the same bytes at 64 sources and dstate 128 in bf16) and drops an HGMMA",
        sm100="as on sm_90")
    bwd_dcb_sources: str = switch(
        "tiles", "the backward's d(C·Bᵀ) kernel (impls/cutile/backward/dcb.py): 'tiles' = each row-tile program walks "
                 "the source tiles up to its rows and, inside each, the group's heads (one (rows × sources) "
                 "dŷ_l·x_sᵀ MMA per head and source tile; dŷ_l and the decays of its rows loaded again for every "
                 "source tile), then the heads again for the entering states' term; 'chunk' = one walk over the "
                 "heads, each forming the row tile against the whole chunk of sources in one (rows × chunk) MMA, the "
                 "entering states' term in the same walk, dG's row block stored whole (zeros above the diagonal) "
                 "and dC's sources' term as one MMA with the chunk's B: a tenth of the loop's steps at S1, the tile "
                 "products above the diagonal formed and masked (up to twice the triangle's MMA flops), the chunk's x "
                 "read once per row tile and head",
        choices=("tiles", "chunk"),
        sm90="'chunk': per head one (rows × chunk × headdim) MMA where 'tiles' issued one (rows × rows × headdim) MMA "
             "per source tile, and a (rows × chunk) fp32 accumulator held across the walk",
        sm100="as on sm_90")
    bwd_group_split: int = switch(
        1, "the backward's sums over a group's heads (bwd_dcb: d(C·Bᵀ) and dC; bwd_db: dB; "
           "impls/cutile/backward/): 1 = one tile program per (tile, group, chunk, batch) walks every head of the "
           "group; k > 1 = k programs per group, program p taking heads [p·H/k, (p+1)·H/k) of the group's H (floor "
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
               "fp32 buffer each by float atomic adds (ct.atomic_add, relaxed) instead of storing k partial planes "
               "summed on the host: the order of the adds is the hardware's, so two calls may differ in the last bits "
               "(not deterministic). d(C·Bᵀ)'s partials stay one per program. Refused with bwd_group_split=1 (one "
               "program per group, nothing to accumulate)",
        sm90="an fp32 atomic reduction per element of each program's (rows × dstate) tile, no partial planes "
             "written or read back",
        sm100="as on sm_90",
        needs={"bwd_group_split": 4})

    inner_chunk: int = switch(
        0, "the forward (ssd_forward, impls.ssd's forward, the parts the harness times) runs its stages at chunks of "
           "this many tokens behind the caller's chunk_size, which it must divide (ValueError naming both), and "
           "returns the ForwardResult at the caller's chunk: y, the final and per-sequence states as they come, the "
           "states entering every caller chunk (every chunk_size/inner_chunk-th inner state), dt and dA_cumsum laid "
           "out and re-based per caller chunk (impls/inner_chunk.py; impls/README.md, \"An internal chunk\"). "
           "0 = off; at a chunk_size no larger than it, nothing changes (the stages already run at most at it). The "
           "stage entries (chunk_cumsum, fwd_pass_state, compute_out) keep the chunk they are given; the backward "
           "(impls.ssd) runs at the caller's chunk on the converted intermediates. Tiles: the records of the shape at "
           "the inner chunk (describe()'s inner_chunk and inner_<stage> entries say which ran). A state_subblock "
           "longer than it is refused",
        choices=INNER_CHUNKS,
        sm90="no kernel changes: stage 3's quadratic part costs inner_chunk/2 score elements per token "
             "instead of chunk_size/2, for chunk_size/inner_chunk times the states stage 2 writes and stage 3 "
             "reads; the returned states are a view of every chunk_size/inner_chunk-th (no copy, the inner "
             "ones' memory held)",
        sm100="as on sm_90")

    def __post_init__(self):
        if self.bwd_atomics and self.bwd_group_split == 1:
            raise ValueError("switch bwd_atomics of backend 'cutile': it accumulates the partials of "
                             "bwd_group_split's k > 1 programs per group, and bwd_group_split=1 has one program per "
                             "group (set bwd_group_split to 2, 4 or 8, or leave bwd_atomics off)")
        cb_set = {name: getattr(self, name) for name in CB_KERNEL_SWITCHES if getattr(self, name) != _CB_DEFAULTS[name]}
        if cb_set and self.cb_mode == "inline":
            raise ValueError(f"switches {cb_set} of backend 'cutile' set stage 3's C·Bᵀ kernel, which cb_mode='inline' "
                             "never launches (C·Bᵀ computed in the main kernel): use cb_mode 'shared' or 'tuned', or "
                             "leave them at their defaults")
        if self.inner_chunk and self.state_subblock > self.inner_chunk:
            raise ValueError(f"switches inner_chunk={self.inner_chunk} and state_subblock={self.state_subblock} of "
                             f"backend 'cutile': the forward's stage 2 runs at {self.inner_chunk}-token chunks, which "
                             f"{self.state_subblock}-position sub-blocks cannot step through (use a state_subblock of "
                             "at most inner_chunk, or 0)")
        if self.decay_single and not self.decay_factor:
            raise ValueError("switch decay_single=True of backend 'cutile' sums the factored decay (decay_factor) in "
                             "one accumulator, and decay_factor=False takes no factored decay: set decay_factor=True "
                             "or leave decay_single off")
        if self.fused_program != FUSED_PROGRAMS[0] and not self.fuse_state_out:
            raise ValueError(f"switch fused_program={self.fused_program!r} of backend 'cutile': it arranges the "
                             "programs of the fused kernel, which runs only with fuse_state_out=True (set it, or "
                             f"leave fused_program at {FUSED_PROGRAMS[0]!r})")
        if self.fuse_state_out:
            set_away = {name: getattr(self, name) for name in NOT_READ_BY_FUSED
                        if getattr(self, name) != _DEFAULTS[name]}
            if set_away:
                raise ValueError(f"switches {set_away}: fuse_state_out=True runs chunk_cumsum and the fused kernel, "
                                 f"which read {FUSED_READS} and the tile sizes {FUSED_SIZES}; the switches "
                                 f"{list(NOT_READ_BY_FUSED)} would be recorded without running: leave them at their "
                                 "defaults or turn fuse_state_out off")


# With fuse_state_out the forward runs chunk_cumsum then the fused kernel (impls/cutile/fused.py). Of the code
# switches they read only FUSED_READS, of the sizes FUSED_SIZES (and tuning); the rest are refused away from their
# defaults and describe() marks them n/a.
FUSED_READS = ("exp2", "tma", "latency_hints", "cb_precision", "opt_level", "fused_program")
FUSED_SIZES = ("block_heads", "block_rows", "block_headdim", "occupancy")
NOT_READ_BY_FUSED = ("transposed_layout", "operand_swap", "decay_factor", "cb_mode", "head_mma", "block_dstate",
                     "heads_per_tile", "heads_first", "skip_first", "head_loop", "state_pass", "pdl", "exp2_ftz",
                     "cb_occupancy", "cb_lower_triangle", "state_subblock", "exp_fold",
                     "decay_single")
_DEFAULTS = {f: CutileSwitches.__dataclass_fields__[f].default for f in NOT_READ_BY_FUSED}
# the switches of stage 3's C·Bᵀ kernel alone (cb_kernel): refused with cb_mode inline, which never launches it
CB_KERNEL_SWITCHES = ("cb_occupancy", "cb_lower_triangle")
_CB_DEFAULTS = {f: CutileSwitches.__dataclass_fields__[f].default for f in CB_KERNEL_SWITCHES}


def subblock_refusal(sub: int, chunk_size: int) -> str:
    """Why stage 2 cannot step through a chunk of chunk_size positions in sub-blocks of `sub` (switch
    state_subblock): the backend's supports() and the stage's launch say it."""
    return (f"switch state_subblock={sub} of backend 'cutile': stage 2's main loop steps through the chunk in "
            f"{sub}-position sub-blocks, which must divide chunk_size={chunk_size} (use a chunk of at least {sub} "
            "positions, a smaller sub-block, or 0 for the whole chunk)")


PER_HEAD_BLOCKS = (2, 4)  # heads_per_tile values the per-head lowering (head_mma per_head) is built and tested for


def per_head_refusal(sw: CutileSwitches, hb: int) -> str | None:
    """Why compute_out cannot lower hb heads per tile per head with these switches, or None when it can (or when
    the per-head lowering is not asked for, or hb == 1: one head is the same kernel either way). Not built: hb
    outside PER_HEAD_BLOCKS, and operand_swap, whose per-head form tileiras 13.4 rejects at heads_per_tile 2
    ("Invalid use-def chain in schedule"). compute_out raises with it; the tile search leaves such hb out."""
    if sw.head_mma != "per_head" or hb == 1:
        return None
    if hb not in PER_HEAD_BLOCKS:
        return f"head_mma='per_head' takes heads_per_tile in {PER_HEAD_BLOCKS}, got heads_per_tile={hb}"
    if sw.operand_swap:
        return (f"head_mma='per_head' with operand_swap is not supported (heads_per_tile={hb}; tileiras 13.4 fails "
                "to schedule it): use head_mma='batched' or operand_swap off")
    return None


# Switches that change generated code (the rest pick sizes or where sizes come from).
CODE_SWITCHES = ("transposed_layout", "operand_swap", "latency_hints", "tma", "exp2", "exp2_ftz", "decay_factor",
                 "decay_single",
                 "cb_precision", "head_mma", "heads_first", "skip_first", "head_loop", "state_subblock",
                 "exp_fold")
# fuse_state_out picks the forward's arrangement of kernels, not the code of a stage (its kernel is AOT-tested in
# tests/backends/test_cutile_aot.py). cb_mode picks between two kernels' arrangements like a tile size (its "tuned"
# default reads the config); its ablation points are cb_mode:inline and cb_mode:shared. state_pass picks stage 2's
# kernels (fwd_pass_state, or fwd_pass_state_local + fwd_pass_state_pass: aot.STATE_PASS_KERNELS), as cb_mode does
# fused_program picks the fused kernel (fused_kernel or fused_chunk_kernel: aot.FUSED_PROGRAM_KERNELS) as state_pass
# does stage 2's.
# pdl and opt_level change the code of the kernels they reach but stay out of CODE_SWITCHES (the switch-effects
# table and the factorials): tests/backends/test_cutile_aot.py shows the PDL instructions in the SASS with pdl on and
# none with it off, and compiles every opt_level.
# bwd_group_split and bwd_atomics change the backward's bwd_dcb and bwd_db kernels only: they key those kernels'
# records (impls/cutile/backward/tune.py KERNEL_SWITCHES) and tests/backends/test_cutile_backward.py compiles them.
# bwd_state_split changes the backward's bwd_state_pass kernel only (as bwd_cb bwd_chunk's): it keys that kernel's
# record when off (impls/cutile/backward/tune.py KERNEL_SWITCHES) and tests/backends/test_cutile_backward.py compiles
# both values.
# bwd_entry_term changes the backward's bwd_state_pass, bwd_chunk, bwd_dcb and bwd_cumsum kernels: it keys their
# records when away from 'chunk' (each value, the kernels it leaves unchanged included;
# impls/cutile/backward/tune.py KERNEL_SWITCHES) and tests/backends/test_cutile_backward.py compiles the kernels it
# changes.
# bwd_dcb_sources changes the backward's bwd_dcb kernel only: it keys that kernel's record
# (impls/cutile/backward/tune.py KERNEL_SWITCHES) and tests/backends/test_cutile_backward.py compiles both values.
# bwd_cb changes the backward's bwd_chunk kernel only, which the forward's switch-effects table does not compile: it
# keys bwd_chunk's record (impls/cutile/backward/tune.py KERNEL_SWITCHES) and tests/backends/test_cutile_backward.py
# compiles both values.
# cb_occupancy and cb_lower_triangle change only the C·Bᵀ kernel (compute_out_cb), which the switch-effects table
# does not compile (its compute_out row is the main kernel, where both are no-ops): in CODE_SWITCHES they would read
# "no-op on sm_90" and borrow the defaults' record as the same code. tests/backends/test_cutile_aot.py shows their
# effect on compute_out_cb's SASS.
