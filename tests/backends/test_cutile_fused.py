"""CPU tests of the cuTile fused forward (switch fuse_state_out, impls/cutile/fused.py): its kernel compiles ahead
of time for sm_90 to warpgroup MMAs without register spills at the fallback tiles, and the backend refuses what the
fused kernel cannot do (packed sequences) with the reason, before anything runs."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch

pytest.importorskip("cuda.tile")

from impls.cutile.switches import CutileSwitches  # noqa: E402
from impls.problem import Problem, Shape  # noqa: E402
from instruments.cutile.aot import build_call, export  # noqa: E402
from instruments.sass import cuobjdump_path, facts  # noqa: E402
from instruments.sass import disassemble as sass  # noqa: E402

FUSED = CutileSwitches(fuse_state_out=True)
BASE = Shape(2, 512, 8, 64, 2, 128, 128)


@pytest.mark.skipif(cuobjdump_path() is None, reason="cuobjdump not installed")
def test_fused_kernel_compiles_to_warpgroup_mma_without_spills():
    from impls.cutile import tune

    text = sass(export(build_call("fused", torch.bfloat16, FUSED, config=tune.FALLBACK[9]["fused"]), "sm_90"))
    f = facts(text)
    assert f["HGMMA"] > 0 and "HMMA" not in text, f
    assert f["UTMALDG"] > 0 and f["MUFU.EX2"] > 0, f  # TMA loads; the decays
    spills = re.findall(r"\b(?:LDL|STL)\b", text)
    assert not spills, f"{len(spills)} local-memory loads/stores at the fallback tiles"


def test_fused_refuses_packed_sequences_with_the_reason():
    from impls.cutile import CutileBackend

    ok, reason = CutileBackend(fuse_state_out=True).supports(Problem(BASE, nseqs=3))
    assert not ok and "fuse_state_out" in reason and "seq_idx" in reason
    assert CutileBackend(fuse_state_out=True).supports(Problem(BASE, has_z=True, has_initial_states=True))[0]
    assert CutileBackend().supports(Problem(BASE, nseqs=3))[0]  # the three stages take them


def test_fused_forward_raises_before_running_on_seq_idx():
    """Called directly (past supports()), the forward raises naming the argument; no kernel is launched."""
    from impls.cutile import CutileBackend

    be = CutileBackend(fuse_state_out=True)
    x = torch.zeros(1, 128, 2, 32)
    with pytest.raises(ValueError, match="seq_idx"):
        be.ssd_forward(x, None, None, None, None, 64, None, None, None, None, torch.zeros(1, 128, dtype=torch.int32),
                       None, True, (0.0, float("inf")), None)


def test_fused_tiles_come_from_their_own_tuning_stage():
    from impls import tuning
    from impls.cutile import fused, tune

    sw = dataclasses.replace(FUSED, tuning="fallback", block_headdim=64)
    config = tuning.resolve(tune.tunable("fused", sw, "cpu", "S", "bfloat16", make_call=None)).config
    assert config["block_headdim"] == 64 and config["occupancy"] == tune.FALLBACK[9]["fused"]["occupancy"]
    assert fused.blocks(256, 64, 128, config) == (64, 64, 128)
    assert fused.blocks(64, 80, 48, {}) == (64, 64, 64)  # rows capped by the chunk; dstate whole (next pow2)


@pytest.mark.parametrize("name, value", [
    pytest.param("transposed_layout", False, id="transposed_layout"),
    pytest.param("operand_swap", True, id="operand_swap"),
    pytest.param("decay_factor", True, id="decay_factor"),
    pytest.param("cb_mode", "inline", id="cb_mode"),
    pytest.param("head_mma", "batched", id="head_mma"),
    pytest.param("block_dstate", 64, id="block_dstate"),
    pytest.param("heads_per_tile", 2, id="heads_per_tile"),
    pytest.param("heads_first", True, id="heads_first"),
    pytest.param("skip_first", True, id="skip_first"),
    pytest.param("head_loop", 8, id="head_loop"),
])
def test_fused_refuses_a_switch_it_does_not_read(name, value):
    from impls.cutile import CutileBackend

    with pytest.raises(ValueError, match=rf"{name}.*fuse_state_out"):
        CutileBackend(fuse_state_out=True, **{name: value})
    CutileBackend(**{name: value})  # the three stages read it


def test_fused_describe_marks_unread_switches_na():
    from impls.cutile import CutileBackend
    from impls.cutile.switches import FUSED_READS, NOT_READ_BY_FUSED

    described = CutileBackend(fuse_state_out=True, exp2=False, block_rows=32).describe()["switches"]
    assert {described[n] for n in NOT_READ_BY_FUSED} == {"n/a"}
    assert described["exp2"] is False and described["block_rows"] == 32 and set(FUSED_READS) <= set(described)


# --- fused_program='chunk' (impls/cutile/fused_chunk.py): one program per chunk, the state handed on by flags -----
CHUNK = CutileSwitches(fuse_state_out=True, fused_program="chunk")
_CHUNK_SASS: dict = {}


def _chunk_sass(dtype=torch.bfloat16, wide=False, **switches) -> str:
    from impls.cutile import tune

    key = (dtype, wide, tuple(sorted(switches.items())))
    if key not in _CHUNK_SASS:
        sw = dataclasses.replace(CHUNK, **switches)
        call = build_call("fused_chunk", dtype, sw, config=tune.FALLBACK[9]["fused"], wide=wide)
        _CHUNK_SASS[key] = sass(export(call, "sm_90"))
    return _CHUNK_SASS[key]


def _handoff(text: str) -> dict:
    """The hand-off instructions of a listing. Acquires: an atomic of RZ (the first poll's add, the clearing exchange)
    followed by an L1 invalidation. Spins: atomic adds of RZ inside a backward branch's range (the relaxed polls).
    Releases: a device-scope membar and the atomic right after it, with whether a CTA barrier lies between the
    program's last global store before it and it. Loads before the acquire: generic global loads (LDG) before the
    wait's last acquire (the clearing exchange). MMAs (warpgroup) before the first release (the local state, which
    must not wait), between it and the last one (none: only the fp32 combine lies between the wait and the
    publication) and after the last one (the row blocks, which must not hold up the chain)."""
    from instruments.sass import sass_instructions

    code = sass_instructions(text)
    acquires = [k for k, ins in enumerate(code[:-1]) if ins.base == "ATOMG" and ins.args.endswith("RZ")
                and code[k + 1].op == "CCTL.IVALL"]
    back = [(int(ins.args.split(",")[-1].strip(), 16), ins.addr) for ins in code
            if ins.base == "BRA" and int(ins.args.split(",")[-1].strip(), 16) < ins.addr]
    spins = [k for k, ins in enumerate(code) if ins.op == "ATOMG.E.ADD.STRONG.GPU" and ins.args.endswith("RZ")
             and any(lo <= ins.addr <= hi for lo, hi in back)]
    releases, release_at = [], []
    for k, ins in enumerate(code):
        if ins.op != "MEMBAR.ALL.GPU":
            continue
        j, nxt = next((j, i) for j, i in enumerate(code[k + 1:], k + 1) if i.base == "ATOMG")
        stores = [j for j in range(k) if code[j].base == "STG"]
        barrier = bool(stores) and any(code[j].base == "BAR" for j in range(stores[-1], k))
        releases.append((nxt.op, barrier))
        release_at.append(j)
    first_atomic = next(i for i in code if i.base == "ATOMG")
    wait_end = max((k for k in acquires if code[k].op.startswith("ATOMG.E.EXCH")), default=None)
    loads_before = sum(ins.base == "LDG" for ins in code[:wait_end]) if wait_end is not None else None
    mma = [k for k, ins in enumerate(code) if "GMMA" in ins.base]
    first, last = (release_at[0], release_at[-1]) if release_at else (len(code), len(code))
    return {"acquires": len(acquires), "spins": len(spins), "releases": releases, "first_atomic": first_atomic.op,
            "loads_before_acquire": loads_before,
            "mma_order": (sum(k < first for k in mma), sum(first < k < last for k in mma), sum(k > last for k in mma))}


# the wait's first poll (an add, acquire-release) and the publication (an exchange, acquire-release)
HANDOFF_RELEASES = [("ATOMG.E.ADD.STRONG.GPU", False), ("ATOMG.E.EXCH.STRONG.GPU", True)]


def _work_stays_parallel(h: dict) -> bool:
    """The local state's MMAs before the wait, none between it and the publication, the row blocks' after it."""
    before, between, after = h["mma_order"]
    return before > 0 and between == 0 and after > 0


@pytest.mark.skipif(cuobjdump_path() is None, reason="cuobjdump not installed")
def test_fused_chunk_hands_off_with_acquire_spin_and_release():
    """sm_90 SASS of the chunk kernel at the fallback tiles: the ticket is its first atomic (an add); the wait is an
    acquire-release add (a membar before it, L1 invalidated after it), a spin of relaxed adds, and an exchange that
    clears the flag with acquire semantics (L1 invalidated); the publication is an exchange after a CTA barrier and
    a device-scope membar; no generic global load comes before the wait's acquire (with TMA the chunk's x, B, dt and
    dA come by bulk copies, so the slot's loads, which must follow the wait, are the first LDGs: one hoisted above
    it would read a state not yet published); the chunk's local state is computed before the wait and its row
    blocks after the publication; warpgroup MMAs; no local memory."""
    text = _chunk_sass()
    h = _handoff(text)
    assert h["first_atomic"] == "ATOMG.E.ADD.STRONG.GPU", h
    assert h["loads_before_acquire"] == 0, h
    assert h["spins"] >= 1 and h["acquires"] >= 2, h
    assert h["releases"] == HANDOFF_RELEASES, h
    assert _work_stays_parallel(h), h
    f = facts(text)
    assert f["HGMMA"] > 0 and "HMMA" not in text and f["UTMALDG"] > 0, f
    spills = re.findall(r"\b(?:LDL|STL)\b", text)
    assert not spills, f"{len(spills)} local-memory loads/stores at the fallback tiles"


@pytest.mark.skipif(cuobjdump_path() is None, reason="cuobjdump not installed")
def test_serial_fused_kernel_has_no_handoff():
    """Negative control of the check above: the serial fused kernel synchronises with no other program."""
    from impls.cutile import tune

    text = sass(export(build_call("fused", torch.bfloat16, FUSED, config=tune.FALLBACK[9]["fused"]), "sm_90"))
    h_text = "ATOMG" in text or "CCTL.IVALL" in text or "MEMBAR.ALL.GPU" in text
    assert not h_text


@pytest.mark.skipif(cuobjdump_path() is None, reason="cuobjdump not installed")
@pytest.mark.parametrize("dtype, wide, switches", [
    pytest.param(torch.float32, False, {}, id="fp32-tf32"),
    pytest.param(torch.bfloat16, False, {"tma": False, "exp2": False, "latency_hints": False, "cb_precision": "fp32"},
                 id="bf16-all-off"),
    pytest.param(torch.bfloat16, True, {}, id="bf16-int64-indexed"),
])
def test_fused_chunk_compiles_with_the_switches_it_reads(dtype, wide, switches):
    """The hand-off and the order of the work around it are the same whatever the code switches (the slot never
    goes through TMA) and in the build indexed with int64 (arrays past 2^31 elements)."""
    h = _handoff(_chunk_sass(dtype, wide, **switches))
    assert h["spins"] >= 1 and h["releases"] == HANDOFF_RELEASES, h
    # with a plain acquire and release tileiras moved the local state below the wait and the row blocks above the
    # publication in the all-off and int64 builds: every chunk then waited on the whole previous one
    assert _work_stays_parallel(h), h


@pytest.mark.parametrize("batch, nheads, tiles_p, nchunks", [(1, 1, 1, 3), (2, 3, 2, 4), (3, 5, 4, 2)],
                         ids=["one-program-a-chunk", "2x3x2", "3x5x4"])
def test_tickets_name_every_program_once_and_every_wait_points_back(batch, nheads, tiles_p, nchunks):
    """The ticket -> work map (the kernel's own helper, run on the host) is a bijection with the chunk outermost,
    so the program a wait depends on (chunk c - 1, same batch, head, headdim block) holds a smaller ticket; the flags
    are distinct elements of the sync array past its counter."""
    from impls.cutile.fused_chunk import flag_index, sync_size, ticket_work

    total = batch * nheads * tiles_p * nchunks
    work = [ticket_work(t, batch, nheads, tiles_p) for t in range(total)]
    assert len(set(work)) == total and {c for c, *_ in work} == set(range(nchunks))
    ticket = {w: t for t, w in enumerate(work)}
    assert all(ticket[(c - 1, b, h, pb)] < t for t, (c, b, h, pb) in enumerate(work) if c > 0)
    assert [c for c, *_ in work] == sorted(c for c, *_ in work)  # chunk outermost
    size = sync_size(batch, nheads, tiles_p * 64, nchunks, 64)
    flags = {flag_index(b, h, pb, c, nheads, tiles_p, nchunks) for c, b, h, pb in work}
    assert len(flags) == total and min(flags) == 1 and max(flags) == size - 1


def test_fused_program_needs_fuse_state_out():
    from impls.cutile import CutileBackend

    with pytest.raises(ValueError, match="fused_program='chunk'.*fuse_state_out=True"):
        CutileBackend(fused_program="chunk")
    with pytest.raises(ValueError):
        CutileBackend(fuse_state_out=True, fused_program="row_tile")
    assert CutileBackend(fuse_state_out=True, fused_program="chunk").describe()["switches"]["fused_program"] == "chunk"


def test_fused_program_keys_the_fused_record_only():
    from impls.cutile import tune
    from instruments.cutile import spills

    chunk, serial = tune.record_key("fused", CHUNK, "S", "bfloat16"), tune.record_key("fused", FUSED, "S", "bfloat16")
    assert "fused_program=chunk" in chunk and "fused_program" not in serial
    assert tune.record_key("fused", CHUNK, "S", "bfloat16", code_tricks=False) == chunk  # it borrows nothing
    assert "fused_program" not in tune.record_key("compute_out", CHUNK, "S", "bfloat16")
    assert spills.kernels_of("fused", {}, fused_program="chunk") == ("fused_chunk",)
    assert spills.kernels_of("fused", {}) == ("fused",)


def test_fused_chunk_launch_on_tensors():
    """The host side on CPU tensors (nothing launched): one program per flag of the sync array (zeroed, int32),
    every tensor at its parameter, the states in state_dtype; a partial last chunk counts as a chunk."""
    import inspect

    from impls.cutile import fused_chunk, tune

    x, C, B = torch.randn(2, 200, 4, 64), torch.randn(2, 200, 2, 48), torch.randn(2, 200, 2, 48)
    dt, dA = torch.rand(2, 4, 4, 64), -torch.rand(2, 4, 4, 64)
    config = tune.FALLBACK[9]["fused"]
    y, states, final, sync = fused_chunk.outputs(x, B, dt, torch.float32, config)
    assert states.shape == (2, 4, 4, 64, 48) and states.dtype == torch.float32 and final.shape == (2, 4, 64, 48)
    assert sync.dtype == torch.int32 and not sync.any()
    call = fused_chunk.stage_call(C, B, x, dt, dA, None, None, None, y, states, final, sync, CHUNK, config)
    assert call.grid == (sync.numel() - 1,) == (2 * 4 * 4 * 64 // config["block_headdim"],)
    params = dict(zip(inspect.signature(fused_chunk.fused_chunk_kernel).parameters, call.args))
    assert all(params[name] is t for name, t in
               (("x", x), ("y", y), ("states", states), ("final", final), ("sync", sync), ("dA", dA)))
    assert params["BP"] == config["block_headdim"] and params["HAS_INIT"] is False and params["D_MODE"] == 0


@pytest.mark.parametrize("name", ["dt", "dA_cumsum"])
def test_fused_chunk_refuses_a_chunk_count_that_disagrees_with_seqlen(name):
    """The grid counts x's chunks, the flags dt's: with fewer in dt a waiter would spin on a flag no program sets
    (a hang). Refused before anything is allocated or launched, naming the argument."""
    from impls.cutile import fused_chunk, tune

    x, C, B = torch.randn(2, 200, 4, 64), torch.randn(2, 200, 2, 48), torch.randn(2, 200, 2, 48)
    good, short = torch.rand(2, 4, 4, 64), torch.rand(2, 4, 3, 64)
    dt, dA = (short, -good) if name == "dt" else (good, -short)
    message = rf"{name}: expected nchunks = ceil\(seqlen/chunk_size\) = 4 \(dimension 2\), got 3"
    with pytest.raises(ValueError, match=message):
        fused_chunk.run(C, B, x, dt, dA, None, None, None, None, CHUNK, tune.FALLBACK[9]["fused"])
