"""The Mamba-2 layer as a workload: the block of models/mamba2.py with its SSD on the point's backend, gated against
models/mamba2_reference.py in float64 (the SSD stepped sequentially) and timed stage by stage, so that the SSD's
share of the layer reads off one point's rows (stage ssd over stage forward).

Its sizes come from the shape: d_model = nheads·headdim / expand, d_state = dstate, headdim, ngroups, chunk_size,
batch and seqlen; its options (conf/workload/mamba2_layer.yaml) expand, d_conv and glue (how the conv and the gated
norm run: models/glue.py, torch | triton | compile); of the problem it takes dt_limit
and D_per_channel. Parameters are drawn on the CPU from the point's seed (the same for every backend), the input u
from the seed + 1. Stages: in_proj_conv (in_proj, the causal conv and SiLU: the SSD's x, dt, B, C and the gate z),
ssd (the SSD's parameters cast, then `impls.ssd_forward` on the backend), norm_out_proj (the gated RMSNorm and
out_proj); the forward is the layer's own call. Every output is judged by the flat tolerance of the dtype (tf32's
where the backend or torch runs tf32 matmuls: models.mamba2_reference.layer_tolerance), whole and per (batch, chunk)
block; the gradients (backward directions: of u and every parameter, through `impls.ssd`) likewise, against float64
autograd of the reference on a float64 copy of the layer."""

from __future__ import annotations

from dataclasses import dataclass

import torch

import impls
from harness import cost_model
from harness.correctness import FlatTruth
from harness.workloads import DIRECTIONS, Backward, ShapeSchema, Workload, register
from impls.problem import Problem, Shape, dtype_name
from impls.stages import Stage
from impls.tolerance import output_blocks
from models import floor
from models.glue import GLUES
from models.mamba2 import Mamba2, Mamba2Config
from models.mamba2_reference import layer_tolerance, mamba2_float64, mamba2_float64_parts

OPTIONS = {"expand": 2, "d_conv": 4, "glue": "torch"}


@dataclass(frozen=True)
class LayerInputs:
    """The layer (parameters drawn from the seed, its SSD on the backend) and its input u (batch, seqlen, d_model)."""

    layer: Mamba2
    u: torch.Tensor


def layer_config(problem: Problem, options: dict) -> Mamba2Config:
    """The layer whose SSD has the problem's sizes; ValueError naming the shape or option that does not fit."""
    s, expand = problem.shape, options["expand"]
    d_inner = s.nheads * s.headdim
    if not isinstance(expand, int) or expand < 1 or d_inner % expand:
        raise ValueError(f"shape: nheads·headdim ({d_inner}) must be a multiple of workload.options.expand, got "
                         f"{expand!r}")
    return Mamba2Config(d_model=d_inner // expand, d_state=s.dstate, d_conv=options["d_conv"], expand=expand,
                        headdim=s.headdim, ngroups=s.ngroups, chunk_size=s.chunk_size, dt_limit=problem.dt_limit,
                        D_per_channel=problem.D_per_channel)


def _costs(problem: Problem, options: dict) -> dict[str, dict[str, float]]:
    """Per stage: the non-SSD stages' floor (models/floor.py: their GEMMs at the matmul ceiling plus the conv's, the
    norm's and the glue's bytes at the copy ceiling) and the SSD's forward (harness/cost_model.py), so that each
    stage's rows carry frac_floor where the ceilings were measured (the GPU)."""
    s = problem.shape
    costs = floor.stage_costs(layer_config(problem, options), s.batch, s.seqlen, getattr(torch, problem.dtype))
    return {**costs, "ssd": cost_model.costs(problem)["forward"]}


def check_glue(options: dict, d_conv: int) -> str:
    """The glue the options name (models/glue.py: how the conv and the gated norm run), checked against the conv's
    width; ValueError naming the option."""
    glue = options["glue"]
    if glue not in GLUES:
        raise ValueError(f"workload.options.glue: expected one of {sorted(GLUES)}, got {glue!r}")
    too_wide = GLUES[glue].width_refusal(d_conv)
    if too_wide:
        raise ValueError(f"workload.options.d_conv: glue={glue!r} cannot run it: {too_wide}")
    return glue


def _check_shape(shape: Shape, options: dict) -> None:
    check_glue(options, layer_config(Problem(shape), options).d_conv)


def _columns(shape: Shape, options: dict) -> dict:
    return {"d_model": shape.nheads * shape.headdim // options["expand"], "expand": options["expand"],
            "d_conv": options["d_conv"], "glue": options["glue"]}


def _refuses(problem: Problem) -> str | None:
    """What the layer cannot take of a problem: it always has dt_bias, softplus and D, gates y in its own norm (no
    z), and is measured here without initial states, packed sequences or a state dtype of its own."""
    fixed = {"has_dt_bias": True, "dt_softplus": True, "has_D": True, "has_z": False, "has_initial_states": False,
             "nseqs": 1, "varlen": False, "state_dtype": None}
    differ = [f"{name}={getattr(problem, name)!r}" for name, value in fixed.items() if getattr(problem, name) != value]
    return f"cannot take {', '.join(differ)} (it has {fixed}; dt_limit and D_per_channel it takes)" if differ else None


def _inputs(point, backend) -> LayerInputs:
    config = layer_config(point.problem, point.workload_options)
    dtype, s = point.problem.torch_dtype, point.problem.shape
    with torch.random.fork_rng(devices=[]):  # parameters drawn on the CPU: one seed, the same on every machine
        torch.manual_seed(point.seed)
        layer = Mamba2(config, backend, device="cpu", dtype=dtype, glue=point.workload_options["glue"])
    gen = torch.Generator().manual_seed(point.seed + 1)
    u = torch.randn(s.batch, s.seqlen, config.d_model, generator=gen).to(point.device, dtype)
    return LayerInputs(layer.to(point.device), u)


def _arguments(inputs: LayerInputs) -> dict:
    return {"layer": inputs.layer, "u": inputs.u}


def _in_proj_conv(backend, kw: dict, got: dict) -> tuple:
    with torch.inference_mode():
        call = kw["layer"].ssd_call(kw["u"])
    a = call.kwargs
    return a["x"], a["dt"], a["B"], a["C"], call.z, call.conv_final_states


def _ssd(backend, kw: dict, got: dict) -> tuple:
    with torch.inference_mode():
        args = kw["layer"].ssd_kwargs(got["x"], got["dt"], got["B"], got["C"])
        out = impls.ssd_forward(**args, backend=backend)
    return out.y, out.final_states


def _norm_out_proj(backend, kw: dict, got: dict) -> tuple:
    with torch.inference_mode():
        return (kw["layer"].finish(got["ssd_y"], got["z"]),)


def _forward(backend, kw: dict, got: dict) -> tuple:
    with torch.inference_mode():
        out = kw["layer"](kw["u"], return_final_states=True)
    return out.out, out.final_states, out.conv_final_states


def _torch_precision(dtype: torch.dtype, device: torch.device) -> str:
    """What torch runs the layer's own projections and conv at: tf32 for float32 on a GPU that allows it."""
    tf32 = device.type == "cuda" and (torch.backends.cuda.matmul.allow_tf32 or torch.backends.cudnn.allow_tf32)
    return "tf32" if dtype == torch.float32 and tf32 else dtype_name(dtype)


def _precision(backend, dtype: torch.dtype, device: torch.device) -> dict[str, str]:
    ssd = "tf32" if any(backend.precision(s, dtype, device) == "tf32" for s in backend.STAGES) else dtype_name(dtype)
    own = _torch_precision(dtype, device)
    return {"in_proj_conv": own, "ssd": ssd, "norm_out_proj": own, "forward": "tf32" if "tf32" in (own, ssd) else own}


def _reference(plan, requested: str) -> FlatTruth:
    inputs = plan.inputs
    with torch.no_grad():
        parts = mamba2_float64_parts(inputs.layer, inputs.u)
    tol = layer_tolerance(inputs.layer, plan.dtype, plan.point.device)
    return FlatTruth("float64", parts, {stage: tol for stage in plan.workload.stage_names}, plan.precision,
                     plan.workload, plan.point.problem.shape.chunk_size)


def _leaves(kw: dict) -> dict[str, torch.Tensor]:
    """u (a fresh leaf) and every parameter of the layer."""
    return {"u": kw["u"].detach().requires_grad_(), **dict(kw["layer"].named_parameters())}


def _differentiable(backend, kw: dict, leaves: dict) -> dict:
    out = kw["layer"](leaves["u"], return_final_states=True)
    return {"out": out.out, "final_states": out.final_states, "conv_final_states": out.conv_final_states}


def _incoming(inputs: LayerInputs, seed: int) -> dict[str, torch.Tensor]:
    """Random, everywhere non-zero gradients flowing into out and the SSD's and conv's final states (float64)."""
    c, (batch, _, _) = inputs.layer.config, inputs.u.shape
    gen = torch.Generator(device="cpu").manual_seed(10_000 + seed)
    shapes = {"out": tuple(inputs.u.shape), "final_states": (batch, c.nheads, c.headdim, c.d_state),
              "conv_final_states": (batch, c.conv_dim, c.d_conv - 1)}
    grads = {}
    for name, shape in shapes.items():
        g = torch.randn(*shape, generator=gen, dtype=torch.float64)
        grads[name] = (g + torch.where(g >= 0, 0.05, -0.05)).to(inputs.u.device)
    return grads


def _reference_gradients(inputs: LayerInputs, grads_in: dict) -> dict[str, torch.Tensor]:
    """Float64 autograd of models/mamba2_reference.py on a float64 copy of the layer: d<leaf> for u and every
    parameter."""
    layer = inputs.layer
    with torch.random.fork_rng(devices=[]):  # its own initialisation is overwritten: leave the generator as it was
        twin = Mamba2(layer.config, "reference", device="cpu", dtype=torch.float64)
    twin.load_state_dict({k: v.detach().double().cpu() for k, v in layer.state_dict().items()})
    twin = twin.to(inputs.u.device)
    leaves = {"u": inputs.u.detach().double().requires_grad_(), **dict(twin.named_parameters())}
    out = mamba2_float64(twin, leaves["u"])
    outputs = {"out": out.out, "final_states": out.final_states, "conv_final_states": out.conv_final_states}
    pairs = [(outputs[name], g) for name, g in grads_in.items() if outputs.get(name) is not None]
    found = torch.autograd.grad([o for o, _ in pairs], list(leaves.values()), [g for _, g in pairs],
                                allow_unused=True)
    unused = [f"d{name}" for name, g in zip(leaves, found) if g is None]
    if unused:  # the gate would skip them: a parameter without a gradient would pass unseen
        raise ValueError(f"reference: the float64 layer's outputs do not depend on {unused}, so the backend's "
                         "gradients of them cannot be checked")
    return {f"d{name}": g for name, g in zip(leaves, found)}


def _gradient_tolerance(plan) -> float:
    return layer_tolerance(plan.inputs.layer, plan.dtype, plan.point.device)


def _rows_chunks(ndim: int):
    """(batch, chunk, the rest) blocks of a (batch, seqlen, ...) tensor."""
    return lambda q, n: ((1, q, *(None,) * (n - 2)), ("batch", "chunk", *("",) * (n - 2)))


def _heads(label: str):
    """(batch, chunk, head or group, the rest) blocks of a (batch, seqlen, heads or groups, ...) tensor."""
    return lambda q, n: ((1, q, 1, *(None,) * (n - 3)), ("batch", "chunk", label, *("",) * (n - 3)))


MAMBA2_LAYER = register(Workload(
    name="mamba2_layer",
    stages=(Stage("in_proj_conv", ("x", "dt", "B", "C", "z", "conv_final_states"), _in_proj_conv),
            Stage("ssd", ("ssd_y", "final_states"), _ssd),
            Stage("norm_out_proj", ("out",), _norm_out_proj)),
    forward=Stage("forward", ("out", "final_states", "conv_final_states"), _forward),
    directions=DIRECTIONS,
    inputs=_inputs,
    arguments=_arguments,
    reference=_reference,
    outputs={"x": _heads("head"), "ssd_y": _heads("head"), "dt": _heads("head"), "B": _heads("group"),
             "C": _heads("group"), "z": _rows_chunks(3), "out": _rows_chunks(3), "du": _rows_chunks(3),
             "final_states": lambda q, n: output_blocks("final_states", q),
             "conv_final_states": lambda q, n: ((1, None, None), ("batch", "", ""))},
    shape=ShapeSchema(check=_check_shape, columns=_columns),
    options=OPTIONS,
    refuses=_refuses,
    cost=_costs,
    cost_model=f"{floor.COST_MODEL}+{cost_model.MODEL_VERSION}",
    backward=Backward(leaves=_leaves, call=_differentiable, incoming=_incoming, reference=_reference_gradients,
                      tolerance=_gradient_tolerance),
    precision=_precision,
))
