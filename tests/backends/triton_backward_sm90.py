"""Compiles the Triton backward's kernels for sm_90 without a GPU (triton.compile through ptxas) at S1's sizes in
bf16, with the GPU fallback tiles: one line per kernel (shared memory, registers, spills, the PTX's wgmma.mma_async
count); exit status 1 if any fails to compile or needs more shared memory than a block may have; bwd_chunk twice,
with switch bwd_cb 'inline' and 'shared' (and the forward's C·Bᵀ kernel on its lower triangle, which 'shared'
launches); bwd_dcb and bwd_db again with switch bwd_group_split 4 (dcb's fp32 partials, db's atomic adds:
bwd_atomics); bwd_state_pass with switch bwd_state_split on (its default: two dots per inner step) and off;
bwd_state_pass and bwd_chunk with switch bwd_entry_term 'state_pass', bwd_dcb with 'dcb'. Run it
with TRITON_INTERPRET unset (the CPU test tests/backends/test_triton_backward.py runs it in a subprocess):
`python -m tests.backends.triton_backward_sm90`."""

from __future__ import annotations

import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from impls.chunked_backward import source_widths
from impls.triton.backward import tune
from impls.triton.backward.chunk import bwd_chunk_kernel
from impls.triton.backward.cumsum import bwd_cumsum_kernel
from impls.triton.backward.db import bwd_db_kernel
from impls.triton.backward.dcb import bwd_dcb_kernel
from impls.triton.backward.state_pass import bwd_state_pass_kernel
from impls.triton.compute_out import CB_BLOCK, cb_kernel

SHARED_MEMORY_LIMIT = 232448  # bytes of dynamic shared memory per block on sm_90
CHUNK, HEADDIM, DSTATE = 256, 64, 128  # S1's blocks
FP32 = ("dt_ptr", "dA_ptr", "fin_ptr", "dfin_ptr", "ext_ptr", "last_ptr", "dinit_ptr", "ddt_ptr", "dl_ptr",
        "row_ptr", "dD_ptr", "D_ptr", "dG_ptr", "xv_ptr", "bv_ptr", "A_ptr", "bias_ptr", "ddt1_ptr", "dlv_ptr",
        "ddtv_ptr", "dA_part_ptr", "bias_part_ptr", "cb_ptr", "enter_ptr")


def signature(kernel, dtype: str, constexprs: dict) -> dict[str, str]:
    """Pointers in `dtype` (fp32 where the backward keeps fp32, and dC's and dB's partials with SPLIT > 1; int32
    seq_idx), the bounds fp32, integers i32."""
    fp32 = FP32 + (("dC_ptr", "dB_ptr") if constexprs.get("SPLIT", 1) > 1 else ())
    out = {}
    for name in kernel.arg_names:
        if name in constexprs:
            out[name] = "constexpr"
        elif name == "seq_ptr":
            out[name] = "*i32"
        elif name.endswith("_ptr"):
            out[name] = "*fp32" if name in fp32 else f"*{dtype}"
        elif name in ("dt_min", "dt_max"):
            out[name] = "fp32"
        else:
            out[name] = "i32"
    return out


def variants(dtype: str):
    """(kernel, constexprs, launch fields) of each kernel with the GPU fallback tiles, every optional part on."""
    fb = tune.FALLBACK["sm90"]
    common = {"EXP2": True, "HAS_SEQ": True}
    dots = {"DOT_PRECISION": "tf32"}
    state = {**common, **dots, "CHUNK": CHUNK, "BLOCK_P": fb[tune.STATE_PASS]["block_headdim"],
             "BLOCK_N": fb[tune.STATE_PASS]["block_dstate"], "BLOCK_K": fb[tune.STATE_PASS]["block_positions"],
             "HAS_DFINAL": True, "HAS_Z": True, "HAS_EXT": True, "HAS_INIT": True,
             "LOOP_STAGES": fb[tune.STATE_PASS]["num_stages"], "ENTER_TERM": False}
    yield bwd_state_pass_kernel, {**state, "SPLIT": True}, fb[tune.STATE_PASS]  # switch bwd_state_split on
    chunk = {**common, **dots, "CHUNK": CHUNK, "BLOCK_S": fb[tune.CHUNK]["block_sources"],
             "BLOCK_L": fb[tune.CHUNK]["block_rows"], "BLOCK_P": HEADDIM, "BLOCK_N": DSTATE, "HAS_Z": True,
             "HAS_D": True, "HAS_XV": True, "DECAY_FACTOR": False, "ENTER_TERM": True}
    yield bwd_chunk_kernel, {**chunk, "SHARED_CB": False, "cb_ptr": None}, fb[tune.CHUNK]  # switch bwd_cb='inline'
    one = {"SPLIT": 1, "ATOMIC": False}  # switch bwd_group_split 1
    dcb = {**common, **dots, "CHUNK": CHUNK, "BLOCK_L": fb[tune.DCB]["block_rows"],
           "BLOCK_S": fb[tune.DCB]["block_sources"], "BLOCK_P": HEADDIM, "BLOCK_N": DSTATE, "HAS_Z": True,
           "LOOP_STAGES": fb[tune.DCB]["num_stages"], "WHOLE": False, "ENTER_TERM": False,
           "WIDTHS": source_widths(CHUNK, fb[tune.DCB]["block_rows"])}
    db = {**common, **dots, "CHUNK": CHUNK, "BLOCK_S": fb[tune.DB]["block_sources"],
          "BLOCK_L": fb[tune.DB]["block_rows"], "BLOCK_P": HEADDIM, "BLOCK_N": DSTATE}
    yield bwd_dcb_kernel, {**dcb, **one}, fb[tune.DCB]
    yield bwd_db_kernel, {**db, **one, "HAS_BV": True}, fb[tune.DB]
    yield bwd_cumsum_kernel, {"EXP2": True, "CHUNK": CHUNK, "BLOCK_H": fb[tune.CUMSUM]["block_heads"],
                              "ROW_TILE": fb[tune.CHUNK]["block_sources"], "HAS_BIAS": True, "SOFTPLUS": True,
                              "HAS_LIMIT": True, "HAS_V": True}, fb[tune.CUMSUM]
    yield bwd_chunk_kernel, {**chunk, "SHARED_CB": True}, fb[tune.CHUNK]  # switch bwd_cb='shared'
    # ... which reads the forward's C·Bᵀ kernel's lower triangle (LOWER: switch cb_lower_triangle's grid)
    cb = {"CHUNK": CHUNK, "BLOCK": CB_BLOCK, "BLOCK_DSTATE": DSTATE, **dots, "LOWER": True}
    yield cb_kernel, cb, {"num_warps": 4}
    # switch bwd_group_split 4: dcb's fp32 partials, db's atomic adds (bwd_atomics; the per-sequence term on the host)
    yield bwd_dcb_kernel, {**dcb, "SPLIT": 4, "ATOMIC": False}, fb[tune.DCB]
    # switch bwd_dcb_sources='chunk': the row tile against the whole chunk of sources
    yield bwd_dcb_kernel, {**dcb, **one, "WHOLE": True}, fb[tune.DCB]
    yield bwd_db_kernel, {**db, "SPLIT": 4, "ATOMIC": True, "HAS_BV": False}, fb[tune.DB]
    yield bwd_state_pass_kernel, {**state, "SPLIT": False}, fb[tune.STATE_PASS]  # switch bwd_state_split off
    # switch bwd_decay_factor: the decays below the diagonal as an outer product
    yield bwd_chunk_kernel, {**chunk, "SHARED_CB": False, "cb_ptr": None, "DECAY_FACTOR": True}, fb[tune.CHUNK]
    # switch bwd_entry_term='state_pass': the entering state's term in the state pass, not in the chunk kernel
    yield bwd_state_pass_kernel, {**state, "SPLIT": True, "ENTER_TERM": True}, fb[tune.STATE_PASS]
    yield bwd_chunk_kernel, {**chunk, "SHARED_CB": False, "cb_ptr": None, "ENTER_TERM": False}, fb[tune.CHUNK]
    # switch bwd_entry_term='dcb': the term in the dcb kernel's head loop
    yield bwd_dcb_kernel, {**dcb, **one, "WHOLE": True, "ENTER_TERM": True}, fb[tune.DCB]


def main(dtype: str = "bf16") -> int:
    failed = 0
    for kernel, constexprs, launch in variants(dtype):
        names = kernel.arg_names
        source = ASTSource(kernel, signature(kernel, dtype, constexprs),
                           constexprs={(names.index(k),): v for k, v in constexprs.items()})
        name = kernel.fn.__name__
        try:
            compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32),
                                      options={"num_warps": launch["num_warps"],
                                               "num_stages": launch.get("num_stages", 1)})
        except Exception as exc:  # noqa: BLE001 -- every failure is reported by name
            print(f"FAIL {name}: {type(exc).__name__}: {str(exc)[:2000]}")
            failed += 1
            continue
        meta = compiled.metadata
        regs, spills = getattr(compiled, "n_regs", None), getattr(compiled, "n_spills", None)
        ok = meta.shared <= SHARED_MEMORY_LIMIT
        failed += not ok
        wgmma = compiled.asm["ptx"].count("wgmma.mma_async")
        print(f"{'ok  ' if ok else 'FAIL'} {name} shared={meta.shared} registers={regs} spills={spills} "
              f"wgmma={wgmma} launch={launch}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
