"""The Mamba-2 language model as a workload: models/mamba2_lm.py with every layer's SSD on the point's backend,
prefill (direction forward: the logits of input_ids) and a training step (direction train_step: forward, backward
and one AdamW step), gated against the float64 model (`lm_float64`) and timed as tokens per second.

Its sizes come from the shape as the layer's do (d_model = nheads·headdim / expand, d_state = dstate, headdim,
ngroups, chunk_size, batch, seqlen) and from its options (conf/workload/mamba2_lm.yaml): n_layer and vocab_size
(DEFAULT_N_LAYER, DEFAULT_VOCAB_SIZE), or `size` a released model's name (models.mamba2_lm.PRESETS: its n_layer and
vocabulary, its d_model required of the shape), glue (models/glue.py), expand and d_conv. Parameters are drawn on
the CPU from the point's seed, the token ids from the seed + 1. The gate: the logits per (batch, chunk) block, the
gradient of the mean next-token loss w.r.t. every parameter (float64 autograd of `lm_float64`'s loss), and the
parameters after one AdamW step (ADAMW) against the same step applied to those float64 gradients, each within the
flat tolerance of the dtype (tf32's where the backend or torch runs tf32 matmuls); a gradient orders below the
rest relative to its share of the model's gradient norm (`_check_gradients`)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import torch

from harness.correctness import FlatTruth, _stage_report, flat_judge
from harness.gradient_gate import _entry, autograd_gradients
from harness.workloads import Backward, ShapeSchema, Step, Workload, register
from harness.workloads.mamba2_layer import _precision as layer_precision
from harness.workloads.mamba2_layer import _refuses as layer_refuses
from harness.workloads.mamba2_layer import check_glue, layer_config
from impls import tolerance as tolerances
from impls.problem import Problem, Shape
from impls.stages import Stage
from impls.tolerance import poisoned_allocations
from models.mamba2_lm import PRESETS, Mamba2LM, Mamba2LMConfig, lm_float64, next_token_loss
from models.mamba2_reference import layer_tolerance
from models.train import FLOAT16_ADAMW

DEFAULT_N_LAYER = 2  # a sweep's model: two blocks show the residual stream and the tied head at a layer's cost
DEFAULT_VOCAB_SIZE = 512
PRESET_VOCAB_SIZE = 50277  # the released models' (GPT-NeoX's tokenizer), as models.mamba2_lm.preset has it
OPTIONS = {"size": None, "n_layer": None, "vocab_size": None, "glue": "torch", "expand": 2, "d_conv": 4,
           "gate_tokens": None, "compile": None, "autocast": False}
# Mixed precision (option autocast): the parameters, their gradients and AdamW's moments in float32 (the master
# weights), the model's forward under torch.autocast in the problem's dtype (its matrix products and the SSD's inputs
# in it), the backward outside it, as torch.autocast asks; the gate's tolerance is the problem dtype's
AUTOCAST_DTYPES = (torch.bfloat16, torch.float16)
# torch.compile modes the model may run under (option compile). "reduce-overhead" is left out: it captures CUDA
# graphs, which the timing's own graph replay (bench.cuda_graph) measures apart, and the training step's optimizer
# is outside the compiled call.
COMPILE_MODES = ("default", "max-autotune-no-cudagraphs")
# The training step's optimizer: torch.optim.AdamW on the parameters in their own dtype, these settings. In bf16 an
# update of about lr is below half the spacing of bf16 numbers near 1 (2⁻⁸): the norm weights (ones at the start)
# come out of a step unchanged, as they would in any pure-bf16 AdamW step (the time is the step's all the same); the
# step's gate, relative to each parameter's norm, cannot see that (float16 is refused: models.train.FLOAT16_ADAMW).
ADAMW = {"lr": 1e-3, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1}


@dataclass(frozen=True)
class LMInputs:
    """The model (parameters drawn from the seed, its SSDs on the backend), its token ids (batch, seqlen), and the
    dtype its forward runs under torch.autocast in (None: none, the parameters' own)."""

    model: Mamba2LM
    input_ids: torch.Tensor
    autocast: torch.dtype | None = None

    def precision(self) -> contextlib.AbstractContextManager:
        """The forward's context (option autocast)."""
        return precision_context(self.model, self.autocast)


def _positive_int(options: dict, name: str, default: int) -> int:
    value = options[name]
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"workload.options.{name}: expected null or an int >= 1, got {value!r}")
    return value


def lm_config(problem: Problem, options: dict) -> Mamba2LMConfig:
    """The model whose layers' SSD has the problem's sizes; ValueError naming the shape or option that does not
    fit."""
    layer = layer_config(problem, options)
    size = options["size"]
    if size is not None and size not in PRESETS:
        raise ValueError(f"workload.options.size: expected null or one of {sorted(PRESETS)}, got {size!r}")
    check_glue(options, layer.d_conv)
    if size is None:
        return Mamba2LMConfig(vocab_size=_positive_int(options, "vocab_size", DEFAULT_VOCAB_SIZE),
                              n_layer=_positive_int(options, "n_layer", DEFAULT_N_LAYER), layer=layer)
    given = [name for name in ("n_layer", "vocab_size") if options[name] is not None]
    if given:
        raise ValueError(f"workload.options.{given[0]}: set by workload.options.size={size!r}; give one or the other")
    d_model, n_layer = PRESETS[size]
    if layer.d_model != d_model:
        raise ValueError(f"shape: workload.options.size={size!r} has d_model {d_model}, the shape gives "
                         f"nheads·headdim / expand = {layer.d_model}")
    return Mamba2LMConfig(vocab_size=PRESET_VOCAB_SIZE, n_layer=n_layer, layer=layer)


def _check_shape(shape: Shape, options: dict) -> None:
    lm_config(Problem(shape), options)
    gate_tokens(shape, options)
    compile_mode(options)
    autocast(options)


def compile_mode(options: dict) -> str | None:
    """The torch.compile mode of the model's call (None: eager); ValueError naming the option."""
    mode = options["compile"]
    if mode is not None and mode not in COMPILE_MODES:
        raise ValueError(f"workload.options.compile: expected null (eager) or one of {list(COMPILE_MODES)}, "
                         f"got {mode!r}")
    return mode


def autocast(options: dict) -> bool:
    """Whether the model runs in mixed precision (option autocast); ValueError naming the option."""
    value = options["autocast"]
    if not isinstance(value, bool):
        raise ValueError(f"workload.options.autocast: expected true or false, got {value!r}")
    return value


def autocast_refuses(problem: Problem, options: dict) -> str | None:
    """Why option autocast cannot take the problem's dtype (None: it can, or it is off)."""
    if autocast(options) and problem.torch_dtype not in AUTOCAST_DTYPES:
        return (f"workload.options.autocast: runs the forward in the problem's dtype over float32 parameters, which "
                f"needs dtype bfloat16 or float16, got {problem.dtype}")
    return None


def autocast_dtype(problem: Problem, options: dict) -> torch.dtype | None:
    """The dtype the model's forward runs under torch.autocast in: the problem's under option autocast, else None;
    ValueError naming workload.options.autocast where the problem's dtype is not one autocast runs in."""
    why = autocast_refuses(problem, options)
    if why:
        raise ValueError(why)
    return problem.torch_dtype if autocast(options) else None


def parameter_dtype(problem: Problem, options: dict) -> torch.dtype:
    """The parameters' dtype: float32 under autocast (the master weights), else the problem's."""
    return problem.torch_dtype if autocast_dtype(problem, options) is None else torch.float32


def precision_context(model: Mamba2LM, dtype: torch.dtype | None) -> contextlib.AbstractContextManager:
    """The forward's context: torch.autocast on the model's device in `dtype`, or nothing where None."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(model.embedding.weight.device.type, dtype=dtype)


def compiled(model: Mamba2LM, options: dict) -> Mamba2LM:
    """`model` with its call compiled in place under the options' torch.compile mode (`compile_mode`), or as it is:
    prefill, the loss's forward and the gate all go through the compiled call."""
    mode = compile_mode(options)
    if mode is not None:
        model.compile(mode=mode)
    return model


def gate_tokens(shape: Shape, options: dict) -> int | None:
    """How many tokens of the batch's first row the gate runs on (None: the whole batch). The model is causal, so
    the logits of a row's first N tokens are those of that prefix alone: at a released size, whose float64 twin of the
    whole batch would not fit the card, the timed prefill's own logits are judged on that prefix, and the gradients
    and the training step are checked on it (the same code at a smaller size); ValueError naming the option."""
    value = options["gate_tokens"]
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= shape.seqlen:
        raise ValueError(f"workload.options.gate_tokens: expected null or an int in [1, seqlen={shape.seqlen}], "
                         f"got {value!r}")
    return value


def gate_ids(plan) -> torch.Tensor:
    """The token ids the gate runs on: all of them, or the first row's prefix `gate_tokens` long."""
    n = gate_tokens(plan.point.problem.shape, plan.point.workload_options)
    ids = plan.inputs.input_ids
    return ids if n is None else ids[:1, :n]


def _scope(plan) -> str:
    n = gate_tokens(plan.point.problem.shape, plan.point.workload_options)
    return "" if n is None else f"on the first row's first {n} tokens (workload.options.gate_tokens)"


def _scoped(bound: str, plan) -> str:
    """`bound` with what of the outputs the gate covered, where not all of them."""
    scope = _scope(plan)
    return f"{bound}, {scope}" if scope else bound


def _columns(shape: Shape, options: dict) -> dict:
    config = lm_config(Problem(shape), options)
    return {"d_model": config.d_model, "expand": options["expand"], "d_conv": options["d_conv"],
            "n_layer": config.n_layer, "vocab_size": config.vocab_size, "glue": options["glue"],
            "compile": compile_mode(options), "autocast": autocast(options)}


def _inputs(point, backend) -> LMInputs:
    config = lm_config(point.problem, point.workload_options)
    s = point.problem.shape
    with torch.random.fork_rng(devices=[]):  # parameters drawn on the CPU: one seed, the same on every machine
        torch.manual_seed(point.seed)
        model = Mamba2LM(config, backend, device="cpu", dtype=parameter_dtype(point.problem, point.workload_options),
                         glue=point.workload_options["glue"])
    gen = torch.Generator().manual_seed(point.seed + 1)
    ids = torch.randint(0, config.vocab_size, (s.batch, s.seqlen), generator=gen)
    return LMInputs(compiled(model.to(point.device), point.workload_options), ids.to(point.device),
                    autocast_dtype(point.problem, point.workload_options))


def _arguments(inputs: LMInputs) -> dict:
    return {"model": inputs.model, "input_ids": inputs.input_ids, "precision": inputs.precision}


def _forward(backend, kw: dict, got: dict) -> tuple:
    with torch.inference_mode(), kw["precision"]():
        return (kw["model"](kw["input_ids"]),)


def _tolerance(model: Mamba2LM, dtype: torch.dtype, device) -> float:
    return layer_tolerance(model.layers[0].mixer, dtype, device)


def _precision(backend, dtype: torch.dtype, device: torch.device) -> dict[str, str]:
    forward = layer_precision(backend, dtype, device)["forward"]
    return {"forward": forward, "train_step": forward}


def _reference(plan, requested: str) -> FlatTruth:
    inputs, ids = plan.inputs, gate_ids(plan)
    with torch.no_grad():
        logits = lm_float64(inputs.model, ids)
    tol = _tolerance(inputs.model, plan.dtype, plan.point.device)
    rows, tokens = ids.shape

    def prefix(name: str, actual: torch.Tensor) -> torch.Tensor:
        return actual[:rows, :tokens]

    return FlatTruth("float64", {"logits": logits}, {"forward": tol}, plan.precision, plan.workload,
                     plan.point.problem.shape.chunk_size, select=prefix, scope=_scope(plan))


def _leaves(kw: dict) -> dict[str, torch.Tensor]:
    """Every parameter of the model (the tied embedding and head once, as embedding.weight)."""
    return dict(kw["model"].named_parameters())


def _loss(backend, kw: dict, leaves: dict) -> dict:
    with kw["precision"]():
        return {"loss": kw["model"].loss(kw["input_ids"])}


def _incoming(inputs: LMInputs, seed: int) -> dict[str, torch.Tensor]:
    """d loss = 1: the gradients are those of the loss itself."""
    return {"loss": torch.ones((), dtype=torch.float64, device=inputs.input_ids.device)}


def reference_twin(model: Mamba2LM, dtype: torch.dtype, glue: str = "torch") -> Mamba2LM:
    """A copy of `model` (its parameters as they stand, cast to `dtype`) with every layer's SSD on the reference
    backend and the conv and norm in `glue`, on the model's device."""
    with torch.random.fork_rng(devices=[]):  # its own initialisation is overwritten: leave the generator as it was
        twin = Mamba2LM(model.config, "reference", device="cpu", dtype=dtype, glue=glue)
    twin.load_state_dict({k: v.detach().to(dtype).cpu() for k, v in model.state_dict().items()})
    return twin.to(model.embedding.weight.device)


def float64_twin(model: Mamba2LM) -> Mamba2LM:
    """A float64 copy of `model` (its parameters as they stand), on the model's device."""
    return reference_twin(model, torch.float64)


def float64_gradients(model: Mamba2LM, input_ids: torch.Tensor) -> tuple[dict[str, torch.Tensor], Mamba2LM]:
    """Float64 autograd of the mean next-token loss of `lm_float64` on a float64 copy of `model`: parameter name ->
    gradient, and the copy (its parameters carry them in .grad)."""
    twin = float64_twin(model)
    params = dict(twin.named_parameters())
    loss = next_token_loss(lm_float64(twin, input_ids), input_ids)
    loss.backward()
    return {name: p.grad for name, p in params.items()}, twin


def same_precision_gradients(model: Mamba2LM, input_ids: torch.Tensor,
                             autocast_dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """The loss's gradients of a copy of `model` in its own dtype and glue with every layer's SSD on the reference
    backend (torch autograd through the chunked stages in that dtype; its forward under torch.autocast in
    `autocast_dtype` where given, as the model's runs): what a computation of the model's precision achieves,
    parameter name -> gradient (float64)."""
    twin = reference_twin(model, model.dtype, model.layers[0].mixer.glue.NAME)
    with precision_context(twin, autocast_dtype):
        loss = twin.loss(input_ids)
    loss.backward()
    return {f"d{name}": p.grad.to(torch.float64) for name, p in twin.named_parameters()}


def _reference_gradients(inputs: LMInputs, grads_in: dict) -> dict[str, torch.Tensor]:
    grads, _ = float64_gradients(inputs.model, inputs.input_ids)
    scale = grads_in["loss"]
    return {f"d{name}": g * scale for name, g in grads.items()}


def share_judge(actual: torch.Tensor, expected: torch.Tensor, share: float, tol: float,
                same: torch.Tensor | None = None) -> tolerances.Judged:
    """One parameter's gradient: ‖Δ‖ / max(‖expected‖, `share`) within `tol`, and, whatever the floor, nearer the
    truth than no gradient is (‖Δ‖ < ‖expected‖; where not, the error is ‖Δ‖ / ‖expected‖ >= 1, over any
    tolerance): a gradient far below its share (dA_log, ddt_bias) would otherwise pass zeroed or negated, the share
    bound accepting any error of its size (in bf16 a zeroed dA_log of the tiny model erred 3.5e-4 of the share's
    0.02). A gradient below its share is also held to what a computation of its precision achieves where `same` (that
    computation's gradient, `same_precision_gradients`) is given: ‖Δ‖ ≤ max(SAME_PRECISION_K·‖same − expected‖,
    tol·‖expected‖), reported as the error that bound makes of it (a dA_log scaled by 0.5 passed the share bound in
    bf16). NaN or inf anywhere: inf."""
    diff = actual.detach().to(torch.float64) - expected
    norm = torch.linalg.vector_norm(expected).item()
    off = torch.linalg.vector_norm(diff).item()
    near_zero = norm < share
    err = off / max(norm, share, 1e-300)
    if norm > 0 and off >= norm:  # no better than a zero gradient
        err = max(err, off / norm)
    if near_zero and same is not None:
        achieved = torch.linalg.vector_norm(same.to(torch.float64) - expected).item()
        allowed = max(tolerances.SAME_PRECISION_K * achieved, tol * norm, 1e-300)
        err = max(err, tol * off / allowed)
    if not bool(torch.isfinite(diff).all()):
        err = float("inf")
    where = (0,) * expected.dim()
    return tolerances.Judged(err, tol, tolerances.BlockErr(err, where, near_zero),
                             tolerances.BlockErr(err / tol, where, near_zero))


def _check_gradients(plan) -> dict[str, dict]:
    """The gradient of the loss w.r.t. every parameter (the backend's, allocations poisoned) against float64
    autograd of `lm_float64`'s loss, within the flat tolerance of the dtype relative to the larger of the
    gradient's norm and its share of the whole model's gradient norm, ‖g‖·sqrt(numel_p / numel): a parameter whose
    gradient is orders below the rest (A_log, dt_bias: sums over every token that nearly cancel) is held to the
    model gradient's scale, as the near-zero blocks of impls.tolerance are to their tensor's, and must still be
    nearer its float64 value than a zero gradient is and within SAME_PRECISION_K × the error a copy of the model
    with the reference SSD in the same dtype makes of it (`share_judge`, `same_precision_gradients`)."""
    workload, inputs = plan.workload, plan.inputs
    inputs = LMInputs(inputs.model, gate_ids(plan), inputs.autocast)
    kw = workload.arguments(inputs)
    grads_in = _incoming(inputs, plan.point.seed)
    truth = _reference_gradients(inputs, grads_in)
    leaves = _leaves(kw)
    with poisoned_allocations():
        got = autograd_gradients(_loss(plan.backend, kw, leaves), leaves, grads_in)
    same = same_precision_gradients(inputs.model, inputs.input_ids, inputs.autocast)
    tol = _tolerance(inputs.model, plan.dtype, plan.point.device)
    total = sum(g.square().sum() for g in truth.values()).sqrt().item()
    count = sum(g.numel() for g in truth.values())
    how = _scoped(f"flat: the dtype's tolerance ({tol:g}) of the larger of the gradient's norm and its share of the "
                  f"model's; below its share also {tolerances.SAME_PRECISION_K:g} x the error of the reference SSD "
                  "in the same dtype", plan)
    precision = plan.precision.get("train_step", "none")
    report = {}
    for name, expected in truth.items():
        actual = got.get(name)
        share = total * (expected.numel() / count) ** 0.5
        judged = None if actual is None else share_judge(actual, expected, share, tol, same.get(name))
        report[name] = _entry(judged, ("",) * expected.dim(), how, precision)
    return report


def adamw_step(model: Mamba2LM, input_ids: torch.Tensor, optimizer: torch.optim.Optimizer,
               precision: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext) -> None:
    """One training step: the loss's gradients (set afresh; its forward in `precision`'s context, the backward
    outside it), then the optimizer's step."""
    optimizer.zero_grad(set_to_none=True)
    with precision():
        loss = model.loss(input_ids)
    loss.backward()
    optimizer.step()


def _step_calls(backend, inputs: LMInputs, seed: int) -> dict:
    """train_step: one forward, backward and AdamW step; repeated calls go on training (the optimizer's state
    carried over), as a training loop's steps do."""
    optimizer = torch.optim.AdamW(inputs.model.parameters(), **ADAMW)
    return {"train_step": lambda: adamw_step(inputs.model, inputs.input_ids, optimizer, inputs.precision)}


def _check_step(plan) -> dict[str, dict]:
    """Stage train_step: every parameter after one AdamW step from the point's parameters against the same step
    applied to the float64 gradients of a float64 copy, within the flat tolerance; the model is left as it was."""
    model, ids = plan.inputs.model, gate_ids(plan)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    try:
        adamw_step(model, ids, torch.optim.AdamW(model.parameters(), **ADAMW), plan.inputs.precision)
        after = {name: p.detach().clone() for name, p in model.named_parameters()}
    finally:
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.copy_(before[name])
                p.grad = None
    _, twin = float64_gradients(model, ids)
    torch.optim.AdamW(twin.parameters(), **ADAMW).step()
    expected = dict(twin.named_parameters())
    tol = _tolerance(model, plan.dtype, plan.point.device)
    judged = {name: flat_judge(after[name], expected[name].detach(), tol, (None,) * expected[name].dim())
              for name in after}
    bound = _scoped(f"flat: the dtype's tolerance ({tol:g}) on the parameters after one AdamW step {ADAMW}", plan)
    report = _stage_report("train_step", judged, plan.precision.get("train_step", "none"), bound,
                           lambda name: ("",) * expected[name].dim())
    return {"train_step": report}


def _step_refuses(problem: Problem, options: dict) -> str | None:
    """What train_step cannot take, naming the setting (None: it can). Its loss predicts each token from those before
    it: a sequence of one token has no target (its mean loss is 0/0, its gradients zero, and a gate on them cannot
    fail). Its AdamW step in float16 divides by zero (models.train.FLOAT16_ADAMW)."""
    shape = problem.shape
    n = gate_tokens(shape, options)
    if shape.seqlen < 2:
        return (f"shape.seqlen: direction train_step needs >= 2 tokens per sequence (a next-token loss), got "
                f"{shape.seqlen}")
    if n is not None and n < 2:
        return (f"workload.options.gate_tokens: direction train_step needs >= 2 tokens to gate its loss's gradients "
                f"on, got {n}")
    if problem.torch_dtype == torch.float16:
        if autocast(options):
            return ("dtype: direction train_step under workload.options.autocast in float16 needs a gradient scaler "
                    "(torch.amp.GradScaler: float16 gradients underflow unscaled), which its step does not run; use "
                    "bfloat16")
        return f"dtype: direction train_step cannot take {FLOAT16_ADAMW}"
    return None


def _tokens(problem: Problem) -> int:
    return problem.shape.batch * problem.shape.seqlen


MAMBA2_LM = register(Workload(
    name="mamba2_lm",
    stages=(),
    forward=Stage("forward", ("logits",), _forward),
    directions=("forward", "train_step"),
    inputs=_inputs,
    arguments=_arguments,
    reference=_reference,
    outputs={"logits": lambda q, n: ((1, q, None), ("batch", "chunk", ""))},
    shape=ShapeSchema(check=_check_shape, columns=_columns),
    options=OPTIONS,
    refuses=layer_refuses,
    options_refuse=autocast_refuses,
    backward=Backward(leaves=_leaves, call=_loss, incoming=_incoming, reference=_reference_gradients,
                      check=_check_gradients),
    precision=_precision,
    steps={"train_step": Step(calls=_step_calls, check=_check_step, refuses=_step_refuses)},
    tokens=_tokens,
))
