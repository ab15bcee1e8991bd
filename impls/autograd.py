"""`impls.ssd`: the differentiable twin of `impls.ssd_forward` (same arguments, same result), through one
torch.autograd.Function whose backward is the backend's (impls/README.md, "The backward")."""

from __future__ import annotations

import math

import torch

from impls.api import GRAD_INPUTS, forward_call, wants_gradients
from impls.graph_backward import OUTPUTS
from impls.registry import ForwardResult

INF = math.inf


class _SSD(torch.autograd.Function):
    """Inputs: the backend, its ssd_forward arguments without the differentiable tensors, their names, then those
    tensors. Outputs: y, final_states, varlen_states (None without cu_seqlens)."""

    @staticmethod
    def forward(ctx, impl, args, names, *tensors):
        needs = dict(zip(names, ctx.needs_input_grad[3:]))
        run = impl.forward_for_backward({**args, **dict(zip(names, tensors))}, needs)
        out = run.outputs
        # The returned tensors become this node's outputs (their grad_fn is the node): kept in ctx through `run`
        # they would make a reference cycle through C++ that the garbage collector cannot free, and every step's
        # graph would stay alive. They are saved as outputs instead and handed back to `run` for its backward.
        run.outputs = None
        ctx.save_for_backward(out.y, out.final_states, out.varlen_states)
        ctx.run, ctx.names = run, names
        ctx.versions = input_versions({**args, **dict(zip(names, tensors))})
        return out.y, out.final_states, out.varlen_states

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy, dfinal, dvarlen):
        check_unchanged(ctx.versions)
        run = ctx.run
        run.outputs = ForwardResult(*ctx.saved_tensors)
        try:
            grads = run.backward(dict(zip(OUTPUTS, (dy, dfinal, dvarlen))))
        finally:
            run.outputs = None  # no cycle after the backward either (a retained graph is walked again)
        return (None, None, None, *(grads.get(name) for name in ctx.names))


def input_versions(args: dict) -> tuple:
    """(name, tensor, its version counter) of every tensor argument of the forward. The backward reads them again as
    they are when it runs (our kernels' backwards read x, dt, z, seq_idx, ...; a run keeps the tensors, not copies):
    one changed in place in between would give the gradients at its new values, silently. Recorded, not saved for
    backward: saving would route the inputs through saved-tensor hooks (save_on_cpu would copy them) for a check.
    Inference tensors keep no version counter (nor can they change in place outside inference mode): not recorded."""
    return tuple((name, t, t._version) for name, t in args.items()
                 if isinstance(t, torch.Tensor) and not t.is_inference())


def check_unchanged(versions: tuple) -> None:
    """Raises, as autograd does for its own saved tensors, where an input changed in place since the forward."""
    for name, t, version in versions:
        if t._version != version:
            raise RuntimeError(f"impls.ssd: {name} was modified by an inplace operation after the forward (its version "
                               f"is {t._version}, the forward saw {version}); the backward reads it again, so it "
                               f"would give the gradients at the new values: clone it before changing it in place")


def ssd(x, dt, A, B, C, chunk_size: int, D=None, z=None, dt_bias=None, initial_states=None, seq_idx=None,
        cu_seqlens=None, dt_softplus: bool = False, dt_limit=(0.0, INF), state_dtype=None, *,
        backend="reference", check_values: bool = False) -> ForwardResult:
    """`impls.ssd_forward`, differentiable: gradients flow to x, dt, A, B, C, D, z, dt_bias and initial_states
    from y, the final states and (with cu_seqlens) the per-sequence states. Without gradients wanted (grad mode off,
    or no input requiring grad) it is `ssd_forward`: nothing is kept. A backend without a backward raises, naming
    itself; nothing falls back."""
    impl, args = forward_call(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens,
                              dt_softplus, dt_limit, state_dtype, backend, check_values)
    if not wants_gradients(args):
        return impl.ssd_forward(**args)
    names = tuple(name for name in GRAD_INPUTS if args[name] is not None)
    rest = {k: v for k, v in args.items() if k not in names}
    y, final_states, varlen_states = _SSD.apply(impl, rest, names, *(args[name] for name in names))
    return ForwardResult(y, final_states, varlen_states)
