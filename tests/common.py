"""What the correctness tests share: cases with readable ids, and stage-by-stage comparison against float64."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import impls
from impls.inputs import Inputs, make_inputs
from impls.problem import Problem, Shape
from impls.tolerance import blockwise_err, output_blocks, poisoned_allocations, rel_err, tolerance

TINY = Shape(batch=2, seqlen=100, nheads=4, headdim=16, ngroups=2, dstate=16, chunk_size=32)

# Each case covers a part of the contract; ids read as what they test.
CASES = [
    pytest.param(Problem(TINY), id="headline"),
    pytest.param(Problem(dataclasses.replace(TINY, seqlen=64)), id="seqlen-multiple-of-chunk"),
    pytest.param(Problem(dataclasses.replace(TINY, ngroups=1)), id="ngroups1"),
    pytest.param(Problem(TINY, has_initial_states=True), id="initial-states"),
    pytest.param(Problem(TINY, nseqs=3), id="seq_idx-3-seqs"),
    pytest.param(Problem(dataclasses.replace(TINY, batch=1), varlen=True, nseqs=3), id="cu_seqlens-3-seqs"),
    pytest.param(Problem(TINY, D_per_channel=True, has_z=True), id="D-per-channel-z"),
    pytest.param(Problem(TINY, has_D=False, has_z=True), id="no-D-z"),
    pytest.param(Problem(TINY, dt_limit=(0.005, 0.05)), id="dt_limit"),
    pytest.param(Problem(TINY, dt_softplus=False, has_dt_bias=False), id="no-softplus-no-bias"),
    pytest.param(Problem(TINY, state_dtype="float32"), id="state_dtype-fp32"),
    # seq_idx drawn per row; row 1 numbers its sequences from 1, so its initial state is dropped
    pytest.param(Problem(TINY, nseqs=3, has_initial_states=True), id="seq_idx-per-row-initial-states"),
    pytest.param(Problem(dataclasses.replace(TINY, batch=1), varlen=True, nseqs=3, has_initial_states=True),
                 id="cu_seqlens-initial-states"),
]


# The GPU switch-variant suites' cases (cutile, triton): the headline S1 and shapes covering the contract.
S1 = Shape(batch=8, seqlen=4096, nheads=80, headdim=64, ngroups=1, dstate=128, chunk_size=256)
GPU_SMALL = Shape(batch=2, seqlen=1000, nheads=8, headdim=64, ngroups=2, dstate=64, chunk_size=256)
GPU_CONTRACT_CASES = {
    "S1": Problem(S1),
    "seqlen1000-chunk256": Problem(GPU_SMALL),
    "ngroups8": Problem(Shape(2, 512, 16, 64, 8, 128, 128)),
    # seq_idx per row, row 1 numbered from 1 (its initial state dropped)
    "seq_idx-3-seqs-init": Problem(dataclasses.replace(GPU_SMALL, seqlen=700, chunk_size=128), nseqs=3,
                                   has_initial_states=True),
    "cu_seqlens-4-seqs-init": Problem(dataclasses.replace(GPU_SMALL, batch=1, seqlen=900, chunk_size=64),
                                      varlen=True, nseqs=4, has_initial_states=True),
    "init-z-Dchannel-fp32states": Problem(GPU_SMALL, has_initial_states=True, has_z=True, D_per_channel=True,
                                          state_dtype="float32", dt_limit=(0.001, 0.08)),
    "Dhead-noncontig-x-z": Problem(GPU_SMALL, has_z=True),  # x and z made strided views by the test
    "p80-n48": Problem(Shape(1, 300, 4, 80, 2, 48, 64), has_z=True, nseqs=2),
}


# dA_cumsum increasing inside a chunk, in the contract (impls/README.md): (case, the argument a refusal names)
INCREASING = [pytest.param("A-positive", "A", id="A-positive"),
              pytest.param("dt-negative-without-softplus", "dt", id="dt-negative-without-softplus")]


def increasing_decay(case: str, shape: Shape, device="cpu") -> Inputs:
    """fp32 inputs whose dA_cumsum increases inside a chunk (an INCREASING case): a positive A (softplus on), or a
    negative dt at tokens 3..5 of head 1 without softplus or dt_limit."""
    problem = Problem(shape, dt_softplus=case == "A-positive", has_dt_bias=False)
    inputs = make_inputs(problem, device=device, seed=6, dtype=torch.float32)
    if case == "A-positive":
        inputs.A = inputs.A.clone()
        inputs.A[1] = 0.5
    else:
        inputs.dt = inputs.dt.clone()
        inputs.dt[:, 3:6, 1] = -0.02  # small enough that the state stays bounded, large enough to show
    return inputs


def float64_forward(inputs: Inputs) -> impls.ForwardResult:
    """The chunked reference in float64 (itself checked against the sequential definition)."""
    return impls.ssd_forward(**inputs.to(torch.float64).forward_kwargs(), backend="reference")


def emulated_cutile_compute_out(inputs: Inputs, ref: impls.ForwardResult, switches, tiles: dict) -> torch.Tensor:
    """cuTile's compute_out under the CPU emulator (instruments/cutile/emulate.py), every allocation poisoned, fed
    the float64 reference's stage-1 and stage-2 outputs in fp32: its y."""
    from impls.cutile import compute_out
    from instruments.cutile.emulate import emulated_launches

    with emulated_launches(), poisoned_allocations():
        return compute_out.run(inputs.C, inputs.B, inputs.x, ref.dt.float(), ref.dA_cumsum.float(),
                               ref.states.float(), inputs.D, inputs.z, inputs.seq_idx, switches, tiles)


def judged(name: str, out, expected, chunk_size: int) -> tuple[float, float]:
    """(whole-tensor relative error, worst block's) of output `name` (y, states, final_states, varlen_states,
    dt, dA_cumsum): both must be within tolerance."""
    block, _ = output_blocks(name, chunk_size)
    return rel_err(out, expected), blockwise_err(out, expected, block).ratio


def forward_errors(backend, inputs: Inputs, ref: impls.ForwardResult) -> dict[str, float]:
    """Errors of `backend`'s full forward and of each stage fed the float64 reference's inputs: per output
    "stage.name" the whole-tensor relative error and "stage.name[blocks]" the worst block's
    (impls.tolerance.blockwise_err); both must be within tolerance."""
    kw = inputs.forward_kwargs()
    dtype = inputs.x.dtype
    errors = {}

    def judge(key: str, out, expected) -> None:
        errors[key], errors[f"{key}[blocks]"] = judged(key.split(".")[-1], out, expected, inputs.chunk_size)

    with poisoned_allocations():
        out = impls.ssd_forward(**kw, backend=backend)
        judge("forward.y", out.y, ref.y)
        judge("forward.final_states", out.final_states, ref.final_states)
        if ref.varlen_states is not None:
            judge("forward.varlen_states", out.varlen_states, ref.varlen_states)
        stages = impls.get_backend(backend).STAGES
        if "chunk_cumsum" not in stages:
            return errors
        dt, dA = impls.chunk_cumsum(inputs.dt, inputs.A, inputs.chunk_size, inputs.dt_bias, inputs.dt_softplus,
                                    inputs.dt_limit, backend=backend)
        judge("chunk_cumsum.dt", dt, ref.dt)
        judge("chunk_cumsum.dA_cumsum", dA, ref.dA_cumsum)
        # later stages get the reference's fp32 intermediates, so each stage is judged on its own
        ref_dt, ref_dA = ref.dt.float(), ref.dA_cumsum.float()
        states, final = impls.fwd_pass_state(inputs.B, inputs.x, ref_dt, ref_dA, inputs.initial_states,
                                             inputs.seq_idx, inputs.state_dtype, backend=backend)
        judge("fwd_pass_state.states", states, ref.states)
        judge("fwd_pass_state.final_states", final, ref.final_states)
        y = impls.compute_out(inputs.C, inputs.B, inputs.x, ref_dt, ref_dA,
                              ref.states.to(inputs.state_dtype or dtype), inputs.D, inputs.z, inputs.seq_idx,
                              backend=backend)
        judge("compute_out.y", y, ref.y)
    return errors


def failures(errors: dict[str, float], dtype: torch.dtype, backend=None, device="cpu") -> dict[str, float]:
    """The errors ("<stage>.<output>") over their stage's tolerance: the dtype's, or tf32's where `backend` (a
    name or a built backend) reports tf32 matmuls for that stage on `device` (Backend.precision)."""
    impl = impls.get_backend(backend) if backend is not None else None

    def tol(name: str) -> float:
        precision = impl.precision(name.split(".")[0], dtype, device) if impl is not None else None
        return tolerance(dtype, precision == "tf32")

    return {name: err for name, err in errors.items() if not err <= tol(name)}


def run_case(backend, problem: Problem, dtype: torch.dtype, seed: int = 0, device="cpu") -> dict[str, float]:
    inputs = make_inputs(problem, device=device, seed=seed, dtype=dtype)
    return forward_errors(backend, inputs, float64_forward(inputs))


def as_fused_projection_views(inputs: Inputs) -> Inputs:
    """x and z as column slices of one (batch, seqlen, 2·nheads·headdim + 8) projection, as in Mamba-2's in_proj
    (non-contiguous, with a gap between them); values unchanged."""
    b, l, h, p = inputs.x.shape
    proj = torch.randn(b, l, 2 * h * p + 8, device=inputs.x.device, dtype=inputs.x.dtype)
    x = proj[..., : h * p].view(b, l, h, p)
    z = proj[..., h * p + 8:].view(b, l, h, p)
    x.copy_(inputs.x)
    if inputs.z is not None:
        z.copy_(inputs.z)
    assert not x.is_contiguous() and not z.is_contiguous()
    inputs.x, inputs.z = x, (z if inputs.z is not None else None)
    return inputs


def switch_variant_params(cases, variants, heavy=("S1",), skip=lambda case, variant: False):
    """(case, variant, dtype) params: every variant in bf16; defaults, all-off and the fp32 MMA variant also in
    fp16 and fp32; cases named in `heavy` carry the heavy mark (float64 references of tens of GB)."""
    out = []
    for case in cases:
        for variant in variants:
            if skip(case, variant):
                continue
            dtypes = ["bfloat16"]
            if variant in ("defaults", "all-off", "no-cb_precision"):
                dtypes += ["float16", "float32"]
            marks = pytest.mark.heavy if case in heavy else ()
            out += [pytest.param(case, variant, dt, id=f"{case}-{variant}-{dt}", marks=marks) for dt in dtypes]
    return out


# switch inner_chunk (cuTile, Triton) on the GPU: chunk 256, seqlen not a multiple of it; packed sequences with
# cu_seqlens (a boundary inside an inner chunk), initial states and z
INNER_CHUNK_CASES = {
    "seqlen1000-chunk256": Problem(GPU_SMALL),
    "cu_seqlens-3-seqs-init-z": Problem(dataclasses.replace(GPU_SMALL, batch=1, seqlen=900), varlen=True, nseqs=3,
                                        has_initial_states=True, has_z=True),
}


def assert_inner_chunk_matches_float64(backend, problem: Problem, dtype_name: str, label: str):
    """The forward with switch inner_chunk: every output of its ForwardResult, the per-chunk ones at the caller's
    chunk, against the float64 reference's (outputs poisoned), at the tolerance of compute_out's matmul precision."""
    dtype = getattr(torch, dtype_name)
    inputs = make_inputs(problem, device="cuda", seed=1, dtype=dtype)
    ref = float64_forward(inputs)
    with poisoned_allocations():
        out = impls.ssd_forward(**inputs.forward_kwargs(), backend=backend)
    names = [n for n in ("y", "final_states", "varlen_states", "dt", "dA_cumsum", "states")
             if getattr(ref, n) is not None and getattr(out, n) is not None]
    errors = {n: judged(n, getattr(out, n), getattr(ref, n), inputs.chunk_size) for n in names}
    tol = tolerance(dtype, backend.precision("compute_out", dtype, "cuda") == "tf32")
    bad = {n: e for n, e in errors.items() if not max(e) <= tol}
    assert not bad, f"{label}: {bad} over {tol}"
    assert backend.describe()["inner_chunk"]["chunk"] == backend.switches.inner_chunk


def assert_matches_float64(backend, problem: Problem, dtype_name: str, label: str, fused_views: bool = False):
    """One GPU switch-variant check: fresh inputs, every stage and the forward against float64 (outputs
    poisoned), at the tolerance of each stage's reported matmul precision."""
    dtype = getattr(torch, dtype_name)
    inputs = make_inputs(problem, device="cuda", seed=1, dtype=dtype)
    if fused_views:
        inputs = as_fused_projection_views(inputs)
    errors = forward_errors(backend, inputs, float64_forward(inputs))
    bad = failures(errors, dtype, backend, "cuda")
    worst = max(errors, key=errors.get)
    print(f"[{label}] worst {worst}={errors[worst]:.2e} {backend.describe().get('stages')}")
    assert not bad, f"over tolerance: {bad} (all: {errors})"
