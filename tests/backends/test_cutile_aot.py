"""CPU tests of the cuTile backend: ahead-of-time compiles to sm_90 and sm_100 (no GPU needed), machine-code facts
read from the cubins with cuobjdump, the switch-effects table, and the backend's refusals.

Default set (dominated by tileiras; see the report for the measured time): every stage compiles for bf16 with the
defaults, each code switch off alone and all off (sm_90), for fp16/fp32 with the defaults (sm_90), and for bf16
with the defaults (sm_100). Marked slow: all-off for fp16/fp32 and sm_100, and the full factorial
(2^7 switch settings x stages x dtypes x arches, cubin only).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import re
import subprocess
import sys

import pytest
import torch

pytest.importorskip("cuda.tile")

from impls.cutile.switches import CODE_SWITCHES, CutileSwitches  # noqa: E402
from impls.cutile.tune import OFF_VALUE, baseline, off  # noqa: E402
from impls.cutile.tune import SASS_EFFECTS as EFFECTS_PATH  # noqa: E402
from impls.problem import Problem, Shape  # noqa: E402
from impls.registry import switch_table  # noqa: E402
from instruments.cutile.aot import AOT_DIMS, KERNELS, STAGES, STATE_PASS_KERNELS, build_call, export  # noqa: E402
from instruments.sass import (  # noqa: E402
    cuobjdump_path,
    facts,
    normalized,
    opcode_sequence,
    pdl_access_guards,
    pdl_unguarded,
    sass_instructions,
    sass_outline,
)
from instruments.sass import disassemble as sass  # noqa: E402

pytestmark = pytest.mark.skipif(cuobjdump_path() is None, reason="cuobjdump not installed")

ALL_OFF = CutileSwitches(**{k: OFF_VALUE.get(k, False) for k in CODE_SWITCHES})
DEFAULTS = CutileSwitches()
MMA_STAGES = ("fwd_pass_state", "compute_out")
_SASS: dict = {}


def compiled(stage: str, dtype: str, sw: CutileSwitches, arch: str = "sm_90") -> str:
    """SASS of one variant, compiled once per test session."""
    key = (stage, dtype, arch, dataclasses.astuple(sw))
    if key not in _SASS:
        _SASS[key] = sass(export(build_call(stage, getattr(torch, dtype), sw), arch))
    return _SASS[key]


def _covering():
    out = []
    for stage in STAGES:
        for name in CODE_SWITCHES:
            out.append(pytest.param(stage, "bfloat16", name, "sm_90", id=f"{stage}-bf16-no-{name}-sm90"))
        for dtype in ("bfloat16", "float16", "float32"):
            for variant in ("defaults", "all-off"):
                marks = [pytest.mark.slow] if (variant == "all-off" and dtype != "bfloat16") else []
                out.append(pytest.param(stage, dtype, variant, "sm_90", id=f"{stage}-{dtype}-{variant}-sm90",
                                        marks=marks))
        for variant in ("defaults", "all-off"):
            marks = [pytest.mark.slow] if variant == "all-off" else []
            out.append(pytest.param(stage, "bfloat16", variant, "sm_100", id=f"{stage}-bf16-{variant}-sm100",
                                    marks=marks))
    return out


def _switches(variant: str) -> CutileSwitches:
    return {"defaults": DEFAULTS, "all-off": ALL_OFF}.get(variant) or off(variant)


@pytest.mark.parametrize("stage,dtype,variant,arch", _covering())
def test_compiles(stage, dtype, variant, arch):
    text = compiled(stage, dtype, _switches(variant), arch)
    f = facts(text)
    assert f["instructions"] > 100
    if stage in MMA_STAGES and arch == "sm_90" and not (dtype == "float32" and _switches(variant).cb_precision ==
                                                         "fp32"):
        assert f["HGMMA"] > 0, "tensor-core stages must use the Hopper warpgroup MMA"
    if stage in MMA_STAGES and arch == "sm_100":
        assert f["UTCMMA"] > 0 and f["HGMMA"] == 0, "sm_100 uses tcgen05 MMAs, not HGMMA"


@pytest.mark.parametrize("stage", MMA_STAGES)
def test_tma_switch_controls_bulk_copies(stage):
    on, no = facts(compiled(stage, "bfloat16", DEFAULTS)), facts(compiled(stage, "bfloat16", off("tma")))
    assert on["UTMALDG"] > 0, "with tma on the big operand loads are TMA bulk tensor loads"
    assert no["UTMALDG"] == 0 and no["UTMASTG"] == 0, "with tma off no bulk tensor copy may remain"


@pytest.mark.parametrize("stage", MMA_STAGES)
def test_fp32_precision_switch(stage):
    """tf32 -> HGMMA on tf32 operands; fp32 -> no tensor-core MMA (cuTile emulates an fp32 MMA with FFMAs)."""
    tf32, fp32 = compiled(stage, "float32", DEFAULTS), compiled(stage, "float32", off("cb_precision"))
    assert facts(tf32)["HGMMA"] > 0 and ".TF32" in tf32
    assert facts(fp32)["HGMMA"] == 0


def test_exp2_switch_changes_every_stage():
    for stage in STAGES:
        assert normalized(compiled(stage, "bfloat16", DEFAULTS)) != normalized(compiled(stage, "bfloat16", off("exp2")))


@pytest.mark.parametrize("stage", MMA_STAGES)
def test_exp2_ftz_drops_the_subnormal_handling_around_each_exp2(stage):
    """exp2_ftz: the same MUFU.EX2s, without the compare and the two predicated multiplies the plain exp2 puts around
    each (ex2.approx.f32 keeping subnormals); chunk_cumsum keeps its plain exp2 (the switch-effects table)."""
    arms = {"plain": DEFAULTS, "ftz": dataclasses.replace(DEFAULTS, exp2_ftz=True)}
    code = {name: sass_instructions(compiled(stage, "bfloat16", sw)) for name, sw in arms.items()}
    ex2 = {name: sum(i.op.startswith("MUFU.EX2") for i in c) for name, c in code.items()}
    scaled = {name: sum(1 for i in c if i.base == "FMUL" and i.pred) for name, c in code.items()}
    fsetp = {name: sum(1 for i in c if i.base == "FSETP") for name, c in code.items()}
    assert ex2["plain"] == ex2["ftz"] > 0
    assert scaled["plain"] >= ex2["plain"] and scaled["ftz"] == 0, scaled
    assert fsetp["ftz"] < fsetp["plain"] and len(code["ftz"]) < len(code["plain"])


def test_switch_effects_table_is_current():
    """The committed table has a row per stage x dtype x code switch, and the rows this session compiled agree."""
    rows = json.loads(EFFECTS_PATH.read_text())["rows"]
    assert {(r["stage"], r["dtype"], r["switch"]) for r in rows} == set(
        itertools.product(STAGES, ("bfloat16", "float32"), CODE_SWITCHES))
    checked = 0
    for r in rows:
        if r["dtype"] != "bfloat16":
            continue
        same = normalized(compiled(r["stage"], "bfloat16", baseline(r["switch"]))) == normalized(
            compiled(r["stage"], "bfloat16", off(r["switch"])))
        assert r["effect"] == ("no-op on sm_90" if same else "changes sm_90 SASS"), r
        checked += 1
    assert checked == len(STAGES) * len(CODE_SWITCHES)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["sm_90", "sm_100"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("stage", STAGES)
def test_full_factorial(stage, dtype, arch):
    """Every switch combination compiles (cubin only: the bundled nvdisasm 12.8 cannot decode every sm_90 cubin)."""
    names = [k for k in CODE_SWITCHES if k != "head_mma"]  # head_mma builds the same kernel at heads_per_tile 1
    for values in itertools.product(*[(getattr(DEFAULTS, k), getattr(off(k), k)) for k in names]):
        chosen = dict(zip(names, values))
        if chosen["decay_single"] and not chosen["decay_factor"]:  # refused: it needs decay_factor
            continue
        sw = CutileSwitches(**chosen)
        assert len(export(build_call(stage, getattr(torch, dtype), sw), arch)) > 1000


# --- the backend object, without a GPU ---------------------------------------------------------------------------
def test_import_without_cuda_tile():
    code = ("import sys; sys.modules['cuda.tile'] = None\n"
            "from impls.cutile import CutileBackend\n"
            "ok, why = CutileBackend.available(); assert not ok and 'cuda.tile' in why, why\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_refusals():
    from impls.cutile import CutileBackend

    be = CutileBackend()
    assert not be.check_device(torch.device("cpu"))[0]
    base = Shape(2, 512, 8, 64, 2, 128, 128)
    assert be.supports(Problem(base))[0]
    for shape, word in [(dataclasses.replace(base, headdim=16), "headdim"),
                        (dataclasses.replace(base, dstate=512), "dstate"),
                        (dataclasses.replace(base, ngroups=3), "ngroups"),
                        (dataclasses.replace(base, chunk_size=512), "chunk_size")]:
        ok, reason = be.supports(Problem(shape))
        assert not ok and word in reason, reason
    assert not be.supports(Problem(base, dtype="float64"))[0]
    # past 2^31 elements the int64-indexed kernels take over (test_int64_indexed_kernels_compile)
    assert be.supports(Problem(dataclasses.replace(base, batch=1, seqlen=1 << 20, nheads=80, ngroups=1)))[0]


# Shapes that supports() accepts and no headline uses: headdim and dstate not powers of two (tiles padded past
# them), dstate 256 in one compute_out tile, the smallest and largest chunk, one token, heads 5 and 6.
ODD_DIMS = {
    "p48-n48-chunk16-L17-h3g1": dict(batch=1, seqlen=17, nheads=3, headdim=48, ngroups=1, dstate=48, chunk=16),
    "p80-n256-chunk32-L33-h6g2": dict(batch=3, seqlen=33, nheads=6, headdim=80, ngroups=2, dstate=256, chunk=32),
    "p32-n32-chunk256-L1-h5g5": dict(batch=1, seqlen=1, nheads=5, headdim=32, ngroups=5, dstate=32, chunk=256),
}


@pytest.mark.parametrize("stage", ["fwd_pass_state", "compute_out", "fused"])
@pytest.mark.parametrize("name", ODD_DIMS)
def test_odd_shapes_build_and_compile(name, stage):
    """The launch the backend builds for an odd shape it accepts compiles for sm_90 (bf16, defaults)."""
    from impls.cutile import CutileBackend

    d = ODD_DIMS[name]
    shape = Shape(d["batch"], d["seqlen"], d["nheads"], d["headdim"], d["ngroups"], d["dstate"], d["chunk"])
    ok, reason = CutileBackend().supports(Problem(shape))
    assert ok, reason
    call = build_call(stage, torch.bfloat16, DEFAULTS, dims=d)
    assert facts(sass(export(call, "sm_90")))["instructions"] > 100


@pytest.mark.parametrize("stage", STAGES)
def test_int64_indexed_kernels_compile(stage):
    """Arrays whose offsets pass 2^31 get the ct.IndexedWithInt64 build: it compiles for sm_90 and its address
    arithmetic differs from the int32 build's."""
    wide = build_call(stage, torch.bfloat16, DEFAULTS, wide=True)
    assert wide.wide and wide.kernel is not build_call(stage, torch.bfloat16, DEFAULTS).kernel
    text = sass(export(wide, "sm_90"))
    assert facts(text)["instructions"] > 100
    assert normalized(text) != normalized(compiled(stage, "bfloat16", DEFAULTS))


def test_int64_indexing_chosen_by_span():
    """The launcher picks the int64 build from the largest element offset of any array, views included."""
    from impls.cutile.common import INT32_LIMIT, needs_int64, span

    small = torch.empty(4, 8)
    assert span(small) == 32 and not needs_int64(small)
    # a view whose last offset passes 2^31 with few elements (a stride of 2^30 elements on a 3-row view)
    view = torch.empty(0, device="meta").as_strided((3, 1), (2**30, 1))
    assert span(view) == 2 * 2**30 + 1 > INT32_LIMIT and needs_int64(view)


def test_heads_per_tile_must_divide_heads_per_group():
    sw = dataclasses.replace(DEFAULTS, heads_per_tile=2)
    with pytest.raises(ValueError, match="heads_per_tile"):
        build_call("compute_out", torch.bfloat16, sw, dims=dict(nheads=6, ngroups=2), config={"heads_per_tile": 2})
    assert build_call("compute_out", torch.bfloat16, sw, config={"heads_per_tile": 2}).grid[1] == 8 // 2


# --- head_mma: per-head 2-D MMAs for heads_per_tile > 1 ---------------------------------------------------------
PER_HEAD = dataclasses.replace(DEFAULTS, head_mma="per_head")  # the default, spelled out
BATCHED = dataclasses.replace(DEFAULTS, head_mma="batched")


def _heads_sass(dtype: str, sw: CutileSwitches, hb: int) -> str:
    key = ("heads", dtype, hb, dataclasses.astuple(sw))
    if key not in _SASS:
        config = {"heads_per_tile": hb, "shared_cb": sw.cb_mode == "shared"}
        _SASS[key] = sass(export(build_call("compute_out", getattr(torch, dtype), sw, config=config), "sm_90"))
    return _SASS[key]


@pytest.mark.parametrize("dtype,hb,switches,spill_free", [
    pytest.param("bfloat16", 2, {}, True, id="bf16-heads2"),
    pytest.param("float32", 2, {}, False, id="fp32-heads2"),  # tf32; 8 bytes of stack at 168 registers
    pytest.param("bfloat16", 4, {}, False, id="bf16-heads4"),  # 4 accumulators and score tiles: 128 bytes spilled
    pytest.param("bfloat16", 2, {"decay_factor": True}, True, id="bf16-heads2-decay_factor"),
    pytest.param("bfloat16", 2, {"cb_mode": "shared"}, True, id="bf16-heads2-cb-shared"),
])
def test_per_head_mma_compiles_to_warpgroup_mma(dtype, hb, switches, spill_free):
    """head_mma per_head: every head's MMAs lower to warpgroup HGMMA, no mma.sync HMMA (the batched rank-3 MMA's
    lowering), and no local-memory spills where marked."""
    text = _heads_sass(dtype, dataclasses.replace(PER_HEAD, **switches), hb)
    f = facts(text)
    assert f["HGMMA"] > 0 and f["MUFU.EX2"] > 0 and f["UTMALDG"] > 0 and "HMMA" not in text, f
    if spill_free:
        assert not re.findall(r"\b(?:LDL|STL)\b", text), "local-memory spills"


def test_batched_heads_lower_to_mma_sync():
    """What per_head avoids: the batched rank-3 MMA of heads_per_tile 2 compiles to HMMA (mma.sync) on sm_90."""
    text = _heads_sass("bfloat16", BATCHED, 2)
    assert "HMMA" in text and facts(text)["HGMMA"] < facts(_heads_sass("bfloat16", PER_HEAD, 2))["HGMMA"]


def test_head_mma_is_the_same_kernel_for_one_head():
    """heads_per_tile 1: head_mma per_head builds the very launch batched does (same kernel, same constants)."""
    one, per = (build_call("compute_out", torch.bfloat16, sw, config={"heads_per_tile": 1})
                for sw in (BATCHED, PER_HEAD))
    assert one.kernel is per.kernel and one.args == per.args and one.grid == per.grid
    two = build_call("compute_out", torch.bfloat16, PER_HEAD, config={"heads_per_tile": 2})
    assert _constant(two, "PER_HEAD") is True and two.grid[1] == AOT_DIMS["nheads"] // 2


def _constant(call, name: str):
    """The value `call` passes for the kernel parameter `name`."""
    import inspect

    params = list(inspect.signature(call.kernel._annotated_function.pyfunc).parameters)
    return call.args[params.index(name)]


@pytest.mark.parametrize("heads_first", [False, True])
def test_heads_first_grid(heads_first):
    """heads_first: the head blocks move from grid axis 1 into axis 0 (fastest); the programs' count is the same."""
    from impls.cutile.compute_out import grid_of

    assert grid_of(512, 40, 1, False) == (512, 40, 1) and grid_of(512, 40, 2, True) == (20480, 1, 2)
    sw = dataclasses.replace(PER_HEAD, heads_first=heads_first)
    call = build_call("compute_out", torch.bfloat16, sw, config={"heads_per_tile": 2, "block_rows": 64})
    rows = AOT_DIMS["batch"] * (AOT_DIMS["seqlen"] // AOT_DIMS["chunk"]) * (AOT_DIMS["chunk"] // 64)
    heads = AOT_DIMS["nheads"] // 2
    assert call.grid == ((rows * heads, 1, 1) if heads_first else (rows, heads, 1))
    assert _constant(call, "HEADS_FIRST") is heads_first and _constant(call, "SKIP_FIRST") is False


@pytest.mark.parametrize("switches,config,dims,word", [
    pytest.param({"operand_swap": True}, {"heads_per_tile": 2}, {}, "operand_swap", id="operand_swap"),
    pytest.param({}, {"heads_per_tile": 8}, {"nheads": 8, "ngroups": 1}, "heads_per_tile=8", id="heads8"),
])
def test_per_head_refusals(switches, config, dims, word):
    """What the per-head lowering does not build raises at launch construction, naming the switches."""
    with pytest.raises(ValueError, match="head_mma") as err:
        build_call("compute_out", torch.bfloat16, dataclasses.replace(PER_HEAD, **switches), dims=dims, config=config)
    assert word in str(err.value) and "heads_per_tile" in str(err.value)
    # the batched lowering takes them
    build_call("compute_out", torch.bfloat16, dataclasses.replace(BATCHED, **switches), dims=dims, config=config)


def test_switch_metadata():
    rows = {r["name"]: r for r in switch_table(CutileSwitches)}
    assert set(CODE_SWITCHES) <= set(rows)
    assert rows["operand_swap"]["sm90"] != rows["operand_swap"]["sm100"]
    assert "TMEM" in rows["operand_swap"]["sm100"] or "Tensor Memory" in rows["operand_swap"]["sm100"]
    from impls.cutile import CutileBackend

    with pytest.raises(ValueError):
        CutileBackend(cb_precision="fp16")


@pytest.mark.parametrize("stage,switches,expect", [
    ("compute_out", {"heads_per_tile": 2}, {"heads_per_tile": 2}),
    ("compute_out", {"block_rows": 128, "occupancy": 3}, {"block_rows": 128, "occupancy": 3}),
    ("chunk_cumsum", {"block_heads": 4}, {"block_heads": 4}),
    ("fwd_pass_state", {"heads_per_tile": 2}, {}),  # a size the stage does not read
], ids=["heads_per_tile", "rows-occupancy", "block_heads", "not-read"])
def test_size_switches_override_tuning(stage, switches, expect):
    """Every size switch a stage reads overrides the record/fallback, searched or not (no switch is ignored)."""
    from impls import tuning
    from impls.cutile import tune

    sw = dataclasses.replace(DEFAULTS, tuning="fallback", **switches)
    assert tune.explicit(stage, sw) == expect
    resolution = tuning.resolve(tune.tunable(stage, sw, "cpu", "S", "bfloat16", make_call=None))
    config, source = resolution.config, resolution.source
    assert source in ("fallback", "switches") and {k: config[k] for k in expect} == expect
    assert set(config) >= set(tune.FALLBACK[9][stage]) or source == "switches"


# --- shared C·Bᵀ (cb_mode / the shared_cb config) ----------------------------------------------------------------
def _shared_sass(stage: str, shared: bool, arch: str = "sm_90") -> str:
    key = ("shared", stage, shared, arch)
    if key not in _SASS:
        _SASS[key] = sass(export(build_call(stage, torch.bfloat16, DEFAULTS, config={"shared_cb": shared}), arch))
    return _SASS[key]


def test_cb_kernel_compiles_to_one_warpgroup_mma_tile():
    f = facts(_shared_sass("compute_out_cb", True))
    assert f["HGMMA"] > 0 and f["UTMALDG"] > 0 and f["MUFU.EX2"] == 0  # C·Bᵀ only: no decay in it


def test_shared_cb_drops_the_per_head_cb_mma():
    inline, shared = facts(_shared_sass("compute_out", False)), facts(_shared_sass("compute_out", True))
    assert 0 < shared["HGMMA"] < inline["HGMMA"], (inline, shared)


@pytest.mark.parametrize("mode,config,expect", [
    pytest.param("tuned", {"shared_cb": True}, True, id="tuned-reads-config"),
    pytest.param("tuned", {}, False, id="tuned-default-inline"),
    pytest.param("inline", {"shared_cb": True}, False, id="switch-overrides-config"),
    pytest.param("shared", {}, True, id="switch-shared"),
])
def test_cb_mode_switch(mode, config, expect):
    from impls.cutile import compute_out, tune

    sw = dataclasses.replace(DEFAULTS, cb_mode=mode)
    assert compute_out.shared_cb(sw, config) is expect
    if mode != "tuned":
        assert tune.explicit("compute_out", sw) == {"shared_cb": mode == "shared"}


# --- programmatic dependent launch (switch pdl) and the compiler's optimisation level (switch opt_level) ---------
PDL_ON = dataclasses.replace(DEFAULTS, pdl=True)
PDL_PARALLEL = dataclasses.replace(PDL_ON, state_pass="chunk_parallel")
# kernel -> (its switches with pdl on, launched as a programmatic dependent launch (so it waits))
PDL_KERNELS = {"chunk_cumsum": (PDL_ON, False), "fwd_pass_state": (PDL_ON, True), "compute_out": (PDL_ON, True),
               "fwd_pass_state_local": (PDL_PARALLEL, True), "fwd_pass_state_pass": (PDL_PARALLEL, True)}
# the warp-specialised ones: their TMA producer and store warps branch past the ACQBULK and wait on mbarriers
WARP_SPECIALISED = ("fwd_pass_state", "compute_out", "fwd_pass_state_local")


def _pdl_sass(kernel: str, pdl: bool) -> str:
    sw, _ = PDL_KERNELS[kernel]
    return compiled(kernel, "bfloat16", sw if pdl else dataclasses.replace(sw, pdl=False))


@pytest.mark.parametrize("kernel", list(PDL_KERNELS))
def test_pdl_instructions(kernel):
    """pdl on: griddepcontrol.launch_dependents (SASS PREEXIT) in every kernel the switch reaches, and in the kernels
    launched as dependents griddepcontrol.wait (SASS ACQBULK); pdl off: neither instruction. The launches carry the
    flag ct.launch gets."""
    on, no = opcode_sequence(_pdl_sass(kernel, True)), opcode_sequence(_pdl_sass(kernel, False))
    sw, waits = PDL_KERNELS[kernel]
    assert on.count("PREEXIT") == 1 and "PREEXIT" not in no and "ACQBULK" not in no
    assert on.count("ACQBULK") == (1 if waits else 0), on.count("ACQBULK")
    call = build_call(kernel, torch.bfloat16, sw)
    assert call.pdl is waits and _constant(call, "PDL") is True
    assert build_call(kernel, torch.bfloat16, dataclasses.replace(sw, pdl=False)).pdl is False


@pytest.mark.parametrize("kernel", [k for k, (_, waits) in PDL_KERNELS.items() if waits])
def test_pdl_wait_precedes_every_global_access(kernel):
    """Along every path of the control flow (not in file order), each global-memory access of a dependent kernel
    comes after the ACQBULK or after a wait on an mbarrier that is arrived on only after one: the warp-specialised
    kernels' producer and store warps branch past the ACQBULK and rely on the second."""
    text = _pdl_sass(kernel, True)
    assert not pdl_unguarded(text), "\n".join(pdl_unguarded(text) + ["listing:", sass_outline(sass_instructions(text))])
    assert ("mbarrier" in pdl_access_guards(text).values()) is (kernel in WARP_SPECIALISED)


def _with_load_at_role_branch(text: str) -> tuple[str, int]:
    """The listing with its first instruction past the warp-role branch (the last branch before the ACQBULK that
    jumps beyond it) made a global load, and that address."""
    code = sass_instructions(text)
    acq = next(ins.addr for ins in code if ins.op == "ACQBULK")
    targets = [int(ins.args.split(",")[-1], 16) for ins in code if ins.base == "BRA" and ins.addr < acq]
    beyond = [t for t in targets if t > acq]
    assert beyond, "no warp-role branch past the ACQBULK:\n" + "\n".join(map(str, code[:80]))
    new = re.sub(rf"(/\*{beyond[-1]:04x}\*/\s+)[^;]*;", r"\1LDG.E R0, desc[UR4][R2.64] ;", text)
    assert new != text
    return new, beyond[-1]


@pytest.mark.parametrize("kernel", WARP_SPECIALISED)
def test_pdl_check_catches_a_producer_load_before_its_wait(kernel):
    """The compiled kernel with a load put where the producer warps start, before their first mbarrier wait."""
    text, addr = _with_load_at_role_branch(_pdl_sass(kernel, True))
    assert pdl_access_guards(text)[addr] == "none"


def _listing(*lines: str) -> str:
    """A hand-made one-kernel SASS listing in cuobjdump's layout, one instruction every 16 bytes."""
    return "\n".join(f"        /*{16 * k:04x}*/                   {line} ;" for k, line in enumerate(lines))


# consumer warps (tid < 128): ACQBULK, then the arrive the producer waits on; producer warps branch to 0x80
_CONSUMER = ("S2R R0, SR_TID.X", "ISETP.GT.U32.AND P0, PT, R0, 0x7f, PT", "@P0 BRA 0x80", "ACQBULK",
             "SYNCS.ARRIVE.TRANS64.A1T0 RZ, [UR4+0x100], RZ", "SYNCS.PHASECHK.TRANS64.TRYWAIT P1, [UR4+0x108], R3",
             "STG.E desc[UR6][R4.64], R5", "EXIT")
_WAIT, _LOAD = "SYNCS.PHASECHK.TRANS64.TRYWAIT P1, [UR4+0x100], R3", "UTMALDG.2D [UR8], [UR10], desc[URZ]"
_ARRIVE = "SYNCS.ARRIVE.TRANS64 RZ, [UR4+0x108], R2"
_EARLY_ARRIVE = ("S2R R0, SR_TID.X", "ISETP.GT.U32.AND P0, PT, R0, 0x7f, PT", "@P0 BRA 0x80",
                 "SYNCS.ARRIVE.TRANS64.A1T0 RZ, [UR4+0x100], RZ", "ACQBULK",
                 "SYNCS.PHASECHK.TRANS64.TRYWAIT P1, [UR4+0x108], R3", "STG.E desc[UR6][R4.64], R5", "EXIT")


@pytest.mark.parametrize("lines, unguarded", [
    (_CONSUMER + (_WAIT, _LOAD, _ARRIVE, "EXIT"), []),
    (_CONSUMER + (_LOAD, _WAIT, _ARRIVE, "EXIT"), ["/*0080*/ UTMALDG.2D"]),
    (_EARLY_ARRIVE + (_WAIT, _LOAD, _ARRIVE, "EXIT"), ["/*0090*/ UTMALDG.2D"]),
    (_CONSUMER + ("@P1 " + _WAIT, _LOAD, _ARRIVE, "EXIT"), ["/*0090*/ UTMALDG.2D"]),
    (_CONSUMER + ("@P1 BRA 0xa0", _WAIT, _LOAD, _ARRIVE, "EXIT"), ["/*00a0*/ UTMALDG.2D"]),
], ids=["producer-waits", "producer-loads-first", "arrive-before-acqbulk", "predicated-wait", "wait-skipped"])
def test_pdl_check_on_hand_made_listings(lines, unguarded):
    found = pdl_unguarded(_listing(*lines))
    assert [f.split(" [")[0] for f in found] == unguarded, found


@pytest.mark.parametrize("lines, word", [
    (("ACQBULK", "BRX R4 -0x10", "LDG.E R0, desc[UR4][R2.64]", "EXIT"), "indirect"),
    (("ACQBULK", "@P0 BRA 0x18", "LDG.E R0, desc[UR4][R2.64]", "EXIT"), "no instruction"),
    (("ACQBULK", "EXIT"), "no global-memory access"),
    (("BRA 0x30", "LDG.E R0, desc[UR4][R2.64]", "EXIT", "EXIT"), "no path reaches"),
], ids=["indirect-branch", "bad-target", "no-access", "unreached-access"])
def test_pdl_check_refuses_what_it_cannot_follow(lines, word):
    with pytest.raises(ValueError, match=word):
        pdl_access_guards(_listing(*lines))


def test_pdl_leaves_the_other_kernels_alone():
    """cb_mode shared's C·Bᵀ kernel and the fused kernel are launched as before; fuse_state_out refuses pdl."""
    assert build_call("compute_out_cb", torch.bfloat16, PDL_ON, config={"shared_cb": True}).pdl is False
    with pytest.raises(ValueError, match="pdl"):
        CutileSwitches(fuse_state_out=True, pdl=True)


@pytest.mark.parametrize("level", [v for v in CutileSwitches.__dataclass_fields__["opt_level"].metadata["choices"]
                                   if v != DEFAULTS.opt_level])
def test_opt_level_compiles(level):
    """Every opt_level the switch offers compiles compute_out for sm_90 (the tensor-core kernel, the one the level
    can change most); -O0 gives other machine code than the default -O3. Every kernel object gets the level."""
    sw = dataclasses.replace(DEFAULTS, opt_level=level)
    for kernel in KERNELS:
        call = build_call(kernel, torch.bfloat16, sw, config={"shared_cb": True})
        assert call.kernel._compiler_options.opt_level == level, kernel
    text = compiled("compute_out", "bfloat16", sw)
    assert facts(text)["instructions"] > 100 and facts(text)["HGMMA"] > 0
    if level == 0:
        assert normalized(text) != normalized(compiled("compute_out", "bfloat16", DEFAULTS))


def test_pdl_and_opt_level_key_their_own_records():
    """A search with pdl on or another opt_level stores under a key of its own and borrows the default's tiles."""
    from impls.cutile import tune

    for sw in (PDL_ON, dataclasses.replace(DEFAULTS, opt_level=1)):
        own, base = (tune.record_key("compute_out", sw, "S", "bfloat16", tricks) for tricks in (True, False))
        assert own != base == tune.record_key("compute_out", DEFAULTS, "S", "bfloat16")
    with pytest.raises(ValueError, match="opt_level"):
        from impls.cutile import CutileBackend

        CutileBackend(opt_level=4)


# --- stage 2 chunk-parallel (switch state_pass) -------------------------------------------------------------------
@pytest.mark.parametrize("dtype,switches,arch", [
    pytest.param("bfloat16", {}, "sm_90", id="bf16-defaults-sm90"),
    pytest.param("bfloat16", {"transposed_layout": False, "operand_swap": True}, "sm_90", id="bf16-swap-rowmajor-sm90"),
    pytest.param("float16", {"tma": False, "exp2": False, "latency_hints": False}, "sm_90", id="fp16-no-tricks-sm90"),
    pytest.param("float32", {}, "sm_90", id="fp32-tf32-sm90"),
    pytest.param("bfloat16", {}, "sm_100", id="bf16-defaults-sm100", marks=pytest.mark.slow),
])
def test_state_pass_kernels_compile(dtype, switches, arch):
    """The local-state kernel does the chunk's MMA on the tensor cores; the pass kernel has no MMA (one FMA per
    state element per chunk)."""
    sw = dataclasses.replace(DEFAULTS, state_pass="chunk_parallel", **switches)
    local_kernel, pass_kernel = (facts(sass(export(build_call(k, getattr(torch, dtype), sw), arch)))
                                 for k in STATE_PASS_KERNELS)
    mma = "HGMMA" if arch == "sm_90" else "UTCMMA"
    assert local_kernel[mma] > 0, local_kernel
    assert pass_kernel["HGMMA"] == pass_kernel["UTCMMA"] == 0 and pass_kernel["instructions"] > 100, pass_kernel


def test_state_pass_switch():
    from impls.cutile import CutileBackend, fwd_pass_state, tune

    with pytest.raises(ValueError, match="state_pass"):
        CutileBackend(state_pass="two_level")
    with pytest.raises(ValueError, match="state_pass"):
        CutileSwitches(fuse_state_out=True, state_pass="chunk_parallel")
    parallel = dataclasses.replace(DEFAULTS, state_pass="chunk_parallel")
    assert "state_pass" in tune.record_key("fwd_pass_state", parallel, "S", "bfloat16")
    assert tune.record_key("fwd_pass_state", DEFAULTS, "S", "bfloat16") == tune.record_key(
        "fwd_pass_state", dataclasses.replace(DEFAULTS, state_pass="serial"), "S", "bfloat16")
    assert "state_pass" not in tune.record_key("compute_out", parallel, "S", "bfloat16")
    # the pass kernel's tile: (rows, the whole contiguous dimension) in the states' memory order, 1024 elements
    assert fwd_pass_state.pass_tile(64, 128, True) == (16, 64, 128)
    assert fwd_pass_state.pass_tile(64, 128, False) == (8, 128, 64)
    assert fwd_pass_state.pass_tile(80, 48, True) == (8, 128, 48)


@pytest.mark.parametrize("kernel", STATE_PASS_KERNELS)
def test_state_pass_kernels_int64_build(kernel):
    """Past 2^31 elements (the fp32 scratch at 2^20 tokens × 80 heads holds 2.7·10^9) the int64-indexed build."""
    sw = dataclasses.replace(DEFAULTS, state_pass="chunk_parallel")
    wide = build_call(kernel, torch.bfloat16, sw, wide=True)
    assert wide.wide and facts(sass(export(wide, "sm_90")))["instructions"] > 100


# --- the head loop (switch head_loop) -------------------------------------------------------------------------------
def _headline_call(shape: str, sw: CutileSwitches, overrides: dict | None = None):
    """compute_out's bf16 launch at a headline shape as the launcher resolves it (the committed record, the
    switches' pins, `overrides` on top), D per head, no other optional input."""
    from instruments.cutile import spills

    config = dict(spills.resolved_config("compute_out", shape, switches=sw), **(overrides or {}))
    return build_call("compute_out", torch.bfloat16, sw, dims=spills.shape_dims(shape), config=config,
                      optional=False, d_mode=1)


@functools.cache
def _headline_sass(shape: str, sw: CutileSwitches, overrides: tuple = ()) -> tuple[str, dict]:
    """(SASS, resource usage) of `_headline_call`, compiled once per session."""
    from instruments.sass import resource_usage

    cubin = export(_headline_call(shape, sw, dict(overrides)), "sm_90")
    return sass(cubin), resource_usage(cubin)


def _spills(text: str, usage: dict) -> tuple[int, int, int]:
    from instruments.sass import count_spills

    return (*count_spills(text), usage["STACK"])


@pytest.mark.parametrize("shape, head_loop", [("S1", 8), ("S2", 16), ("S3", 4), ("S4", 16)])
def test_head_loop_keeps_the_step_code_of_the_default_kernel(shape, head_loop):
    """bf16 compute_out at the committed NVIDIA H200 tiles with the head loop, each step being the record's head
    block (heads_per_tile 2 at S1–S3, 1 at S4): the same warpgroup MMAs (HGMMA 64x64x16) as many as the default
    kernel's, the same registers per thread and the same stack (the step's live ranges are the default's: 56 bytes at
    the two-head S1–S3 tiles, where the default spills too; none at S4), and a program count divided by the loop."""
    sw = dataclasses.replace(DEFAULTS, head_loop=head_loop)
    loop, base = _headline_sass(shape, sw), _headline_sass(shape, DEFAULTS)
    assert facts(loop[0])["HGMMA"] == facts(base[0])["HGMMA"] > 0
    assert set(o for o in re.findall(r"HGMMA\.\S+", loop[0])) == {"HGMMA.64x64x16.F32.BF16"}
    assert loop[1]["REG"] == base[1]["REG"] and loop[1]["STACK"] == base[1]["STACK"], (loop[1], base[1])
    assert (loop[1]["STACK"] == 0) == (shape == "S4")
    from impls.cli import load_shape

    s = load_shape(shape)
    assert _headline_call(shape, sw).grid[1] * head_loop == s.nheads  # the loop divides every headline group


@pytest.mark.parametrize("shape", ["S1", "S2", "S3", "S4"])
def test_head_loop_one_head_per_step_does_not_spill(shape):
    """With one head per step (heads_per_tile 1) the head loop compiles at every headline shape's tiles with no
    local-memory load or store and no stack: one fp32 accumulator live, as the one-head default kernel; the negative
    control is the S1 record's two heads per step (the previous test: 56 bytes of stack)."""
    text, usage = _headline_sass(shape, dataclasses.replace(DEFAULTS, head_loop=8), (("heads_per_tile", 1),))
    assert _spills(text, usage) == (0, 0, 0), usage
    from impls.cli import load_shape

    # per step, in k-steps of 16: C_l·stateᵀ and C_l·B_jᵀ over dstate, scores·x_j over the 64 sources of a block
    assert facts(text)["HGMMA"] == 2 * load_shape(shape).dstate // 16 + 64 // 16


@pytest.mark.parametrize("heads_per_tile", [1, 2])
def test_head_loop_sass_nests_the_source_loop_in_the_head_loop(heads_per_tile):
    """The S1 tiles' SASS: the TMA loads sit in two nested loops (heads, then source blocks) where the default kernel
    has one (the negative control); every load but C_l's two boxes (64 rows x 128 dstate bf16: two 128-byte-wide
    boxes) is inside the head loop, so C_l is loaded once per program and stays in shared memory for every step."""
    from instruments.sass import tma_loops

    over = (("heads_per_tile", heads_per_tile),)
    loop_text = _headline_sass("S1", dataclasses.replace(DEFAULTS, head_loop=8), over)[0]
    base_text = _headline_sass("S1", DEFAULTS, over)[0]
    outer, inner = tma_loops(loop_text)[0], tma_loops(loop_text)[-1]
    assert len(tma_loops(loop_text)) == 2 and outer.start < inner.start < inner.end < outer.end
    assert outer.loads == facts(loop_text)["UTMALDG"] - 2
    assert len(tma_loops(base_text)) == 1 and facts(base_text)["UTMALDG"] == facts(loop_text)["UTMALDG"]


@pytest.mark.parametrize("dtype,switches,config", [
    pytest.param("bfloat16", {"head_loop": 8}, {}, id="bf16-loop8-one-head"),
    pytest.param("bfloat16", {"head_loop": 2, "head_mma": "per_head"}, {"heads_per_tile": 2},
                 id="bf16-loop2-heads2-per_head"),
    pytest.param("bfloat16", {"head_loop": 4, "head_mma": "batched"}, {"heads_per_tile": 2},
                 id="bf16-loop4-heads2-batched"),
    pytest.param("bfloat16", {"head_loop": 4, "operand_swap": True}, {}, id="bf16-loop4-swap"),
    pytest.param("bfloat16", {"head_loop": 4, "decay_factor": True, "skip_first": True}, {"heads_per_tile": 2},
                 id="bf16-loop4-heads2-decay_factor-skip_first"),
    pytest.param("bfloat16", {"head_loop": 16, "cb_mode": "shared"}, {"shared_cb": True}, id="bf16-loop16-cb-shared"),
    pytest.param("bfloat16", {"head_loop": 4, "heads_first": True, "pdl": True}, {}, id="bf16-loop4-heads_first-pdl"),
    pytest.param("bfloat16", {**{k: OFF_VALUE.get(k, False) for k in CODE_SWITCHES}, "head_loop": 4}, {},
                 id="bf16-loop4-all-off"),
    pytest.param("float32", {"head_loop": 4}, {"heads_per_tile": 2}, id="fp32-loop4-heads2"),
])
def test_head_loop_compiles_with_every_optional_input(dtype, switches, config):
    """The head loop with the switches the GPU tests combine it with, every optional input present (z, seq_idx, D
    per channel) at AOT_DIMS (4 heads per group: a loop of 8 or 16 covers a group in one shorter block); the
    tensor-core MMAs stay (HGMMA; HMMA for the batched rank-3 lowering; none with cb_precision fp32); with pdl no
    global-memory access precedes the wait."""
    sw = dataclasses.replace(DEFAULTS, **switches)
    call = build_call("compute_out", getattr(torch, dtype), sw, config=config)
    assert call.kernel._annotated_function.pyfunc.__name__ == "compute_out_head_loop_kernel"
    text = sass(export(call, "sm_90"))
    f = facts(text)
    assert f["instructions"] > 100
    assert f["HGMMA"] > 0 or "HMMA" in text or sw.cb_precision == "fp32", f
    if sw.pdl:  # every global-memory access after the wait for the predecessor grid, as in the default kernel
        assert pdl_unguarded(text) == []


@pytest.mark.parametrize("head_loop, heads_per_tile, nheads, match", [
    pytest.param(2, 4, 8, "head_loop=2 must be a multiple of heads_per_tile=4", id="step-larger-than-the-loop"),
    pytest.param(4, 2, 6, "heads_per_tile=2 must divide nheads/ngroups=3", id="step-not-dividing-the-group"),
])
def test_head_loop_refusals(head_loop, heads_per_tile, nheads, match):
    """The loop's step (heads_per_tile) must divide the loop and the heads of a group; refused with both named."""
    sw = dataclasses.replace(DEFAULTS, head_loop=head_loop)
    with pytest.raises(ValueError, match=re.escape(match)):
        build_call("compute_out", torch.bfloat16, sw, dims=dict(nheads=nheads, ngroups=2),
                   config={"heads_per_tile": heads_per_tile})


@pytest.mark.parametrize("nheads, ngroups, head_loop, blocks", [
    pytest.param(80, 1, 8, 10, id="divides"),
    pytest.param(80, 1, 16, 5, id="divides-16"),
    pytest.param(8, 2, 16, 1, id="loop-longer-than-a-group"),
    pytest.param(12, 1, 8, 2, id="tail-of-4"),
])
def test_head_loop_grid_covers_every_head_once(nheads, ngroups, head_loop, blocks):
    """ceil(heads_per_group / head_loop) programs per group along the head axis: the kernel's (first, end) head
    ranges, computed here as it computes them, cover every head of every group exactly once."""
    sw = dataclasses.replace(DEFAULTS, head_loop=head_loop)
    call = build_call("compute_out", torch.bfloat16, sw, dims=dict(nheads=nheads, ngroups=ngroups), config={})
    assert call.grid[1] == ngroups * blocks
    hpg = nheads // ngroups
    covered = []
    for hb in range(call.grid[1]):
        g, first = hb // blocks, (hb // blocks) * hpg + (hb % blocks) * head_loop
        covered += range(first, min(first + head_loop, (g + 1) * hpg))
    assert covered == list(range(nheads))
