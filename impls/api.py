"""The public SSD-forward interface: three stages and their composition, for any registered backend.

Each entry validates its arguments (metadata only, see impls/validate.py), asks the backend whether it can run
the problem, and calls it. The contract — logical shapes, dtypes, what each stage computes — is in
impls/README.md.

A call whose metadata (every tensor's type, shape, dtype, device and strides, the scalar options and the backend
asked for) matches one already validated reuses that call's Problem and the backend's verdict on it: the checks
read nothing else, so they would pass again (the device verdict, which reads TRITON_INTERPRET, is asked again).
Anything that differs (a stride, a device, a dtype, a non-tensor) misses and is checked in full, raising as ever.
Value checks (check_values=True) run on every call. The memo is a small LRU of metadata tuples: it holds no tensor.

A backend asked for by name runs the defaults of the target of the tensors' device (impls/defaults.py); each call
then asks it which of its target's arrangements takes these tensors (`Backend.arranged_for`: a tensor the first
cannot read through a TMA descriptor runs the next one declared, and describe() says so).
"""

from __future__ import annotations

import math
from collections import OrderedDict

import torch

from impls import validate as check
from impls.problem import Problem, Shape, dtype_name
from impls.registry import Backend, BackendUnavailable, ForwardResult, get_backend, require

INF = math.inf


def _backend(backend, problem: Problem, device, entry: str) -> Backend:
    impl = get_backend(backend, device=device)  # by name: the defaults of the device's target
    stage = "forward" if entry == "ssd_forward" else entry
    if stage not in impl.STAGES:  # before supports(), which would judge a stage's partial Problem
        why = getattr(impl, "NO_STAGES", f"it runs {', '.join(impl.STAGES)} only")
        raise BackendUnavailable(f"backend {impl.name!r} has no stage {stage!r} of its own: {why}")
    require(impl, problem, device)
    return impl


MEMO_SIZE = 64  # distinct call signatures remembered (LRU)
_MEMO: OrderedDict = OrderedDict()  # (entry, backend, scalars, tensor metadata) -> (Problem, Backend, device)


def _tensor_key(tensors) -> tuple | None:
    """Each tensor's (type, shape, dtype, device, strides), None for an absent one; None if any is not a tensor."""
    key = []
    for t in tensors:
        if t is None:
            key.append(None)
        elif isinstance(t, torch.Tensor) and t.layout == torch.strided:
            key.append((type(t), t.shape, t.dtype, t.device, t.stride()))
        else:
            return None
    return tuple(key)


def _scalar_key(values) -> tuple | None:
    """The scalar options with their types (16 and 16.0, True and 1 differ); None for anything but None, bool,
    int, float, a torch.dtype or a tuple of those (a list or an iterator is checked in full every time)."""
    key = []
    for v in values:
        if isinstance(v, tuple):
            inner = _scalar_key(v)
            if inner is None:
                return None
            key.append((tuple, inner))
        elif v is None or type(v) in (bool, int, float) or isinstance(v, torch.dtype):
            key.append((type(v), v))
        else:
            return None
    return tuple(key)


def _checked(entry: str, backend, tensors, scalars, metadata, values) -> tuple[Problem, Backend]:
    """-> (Problem, backend) for a call: `metadata()` (the metadata checks, -> (Problem, device)), then `values()`
    (the value checks, a no-op without check_values), then the backend's verdict. A call with the metadata of one
    already checked runs `values()` only."""
    tensor_key, scalar_key = _tensor_key(tensors), _scalar_key(scalars)
    key = None
    if tensor_key is not None and scalar_key is not None and isinstance(backend, (str, Backend)):
        key = (entry, backend, scalar_key, tensor_key)
        hit = _MEMO.get(key)
        # a backend asked for by name: the registry's instance must still be the one that gave the verdict
        if hit is not None and (isinstance(backend, Backend) or get_backend(backend, device=hit[2]) is hit[1]):
            try:
                _MEMO.move_to_end(key)
            except KeyError:  # another thread's insertion evicted it since the get: the verdict still stands
                pass
            values()
            problem, impl, device = hit
            # the device verdict reads process state (TRITON_INTERPRET for the Triton-based backends): asked again
            ok, reason = impl.check_device(device)
            if not ok:
                raise BackendUnavailable(f"backend {impl.name!r} does not support this problem: {reason}")
            return problem, impl
    problem, device = metadata()
    values()
    impl = _backend(backend, problem, device, entry)
    if key is not None:
        _MEMO[key] = (problem, impl, device)
        if len(_MEMO) > MEMO_SIZE:
            _MEMO.popitem(last=False)
    return problem, impl


def forget_checked() -> None:
    """Forgets the validated call signatures (a test that changes what a backend supports calls it)."""
    _MEMO.clear()


def non_increasing_decay(impl: Backend) -> str:
    """Why the backend needs dA_cumsum non-increasing inside a chunk ("" where it does not): its compute_out's
    factored decay (switch decay_factor), or kernels that assume it (Backend.NON_INCREASING_DECAY)."""
    if getattr(impl.switches, "decay_factor", False):
        return check.DECAY_FACTOR
    return impl.NON_INCREASING_DECAY


def needs_non_negative_dt(impl: Backend) -> str:
    """Why the backend's kernels need dt >= 0 after processing ("" where none does): compute_out's exponent fold
    (switch exp_fold) or the backward's factored decays (switch bwd_decay_factor)."""
    return "; ".join(why for name, (why, _) in check.NEEDS_NON_NEGATIVE_DT.items()
                     if getattr(impl.switches, name, False))


def seq_idx_from_cu_seqlens(cu_seqlens: torch.Tensor, seqlen: int) -> torch.Tensor:
    """(1, seqlen) int32 sequence index of every position, computed on the device without a sync."""
    positions = torch.arange(seqlen, device=cu_seqlens.device)
    return torch.searchsorted(cu_seqlens[1:].contiguous(), positions, right=True).to(torch.int32)[None]


def chunk_cumsum(dt, A, chunk_size: int, dt_bias=None, dt_softplus: bool = False, dt_limit=(0.0, INF), *,
                 backend="reference", check_values: bool = False):
    """dt (batch, seqlen, nheads), A (nheads,) -> (dt processed, dA_cumsum), each (batch, nheads, nchunks,
    chunk_size) fp32."""
    def metadata():
        check.tensor("dt", dt, shape=(None, None, None))
        batch, seqlen, nheads = dt.shape
        if min(batch, seqlen, nheads) < 1:
            check.fail("dt", "non-empty batch, seqlen and nheads", (batch, seqlen, nheads))
        check.tensor("A", A, shape=(nheads,), device=dt.device, device_of="dt")
        check.optional("dt_bias", dt_bias, shape=(nheads,), device=dt.device, device_of="dt")
        check.chunk_size(chunk_size)
        check.flag("dt_softplus", dt_softplus)
        check.dt_limit(dt_limit)
        return Problem(Shape(batch, seqlen, nheads, 0, 0, 0, chunk_size), dtype=dtype_name(dt.dtype),
                       has_dt_bias=dt_bias is not None, dt_softplus=dt_softplus,
                       dt_limit=tuple(float(v) for v in dt_limit), has_D=False), dt.device

    def values():
        if check_values:
            check.values(dt=dt, A=A, dt_bias=dt_bias)

    _, impl = _checked("chunk_cumsum", backend, (dt, A, dt_bias), (chunk_size, dt_softplus, dt_limit), metadata,
                       values)
    if impl.falls_back:  # another arrangement where this one refuses the tensors (impls/defaults.py)
        impl = impl.arranged_for("chunk_cumsum", dt=dt, A=A, dt_bias=dt_bias)
    # kernels that clamp dt at 0 (Backend.NON_INCREASING_DECAY); A > 0 and the factored decay are later stages' concern
    if check_values and impl.NON_INCREASING_DECAY:
        check.non_negative_dt(dt, dt_bias, dt_softplus, dt_limit, impl.NON_INCREASING_DECAY)
    return impl.chunk_cumsum(dt, A, chunk_size, dt_bias, dt_softplus, tuple(float(v) for v in dt_limit))


def _check_chunked(B, x, dt, dA_cumsum):
    batch, seqlen, nheads, headdim, ngroups, dstate = check.dims(x, B)
    check.tensor("dt", dt, shape=(batch, nheads, None, None), dtypes=(torch.float32, torch.float64),
                 device=x.device)
    nchunks, chunk = dt.shape[2], dt.shape[3]
    check.chunk_size(chunk, "dt (dimension 3: chunk_size)")
    check.nchunks("dt", dt, seqlen)
    check.chunked("dA_cumsum", dA_cumsum, batch, nheads, nchunks, chunk, x.device)
    return batch, seqlen, nheads, headdim, ngroups, dstate, chunk, nchunks


def fwd_pass_state(B, x, dt, dA_cumsum, initial_states=None, seq_idx=None, state_dtype=None, *,
                   backend="reference", check_values: bool = False):
    """-> (states entering every chunk (batch, nchunks, nheads, headdim, dstate) in state_dtype (default: x's
    dtype), final states (batch, nheads, headdim, dstate) fp32)."""
    def metadata():
        batch, seqlen, nheads, headdim, ngroups, dstate, chunk, nchunks = _check_chunked(B, x, dt, dA_cumsum)
        check.seq_idx(seq_idx, batch, seqlen, x.device)
        # one per packed sequence only with seq_idx on one row: any count, each sequence numbered below it
        rows = (batch,) if seq_idx is None or batch != 1 else None
        check.initial_states(initial_states, rows, (nheads, headdim, dstate), x.device)
        check.state_dtype(state_dtype)
        return Problem.from_inputs(x, B, chunk, initial_states=initial_states, seq_idx=seq_idx,
                                   state_dtype=state_dtype), x.device

    def values():
        if check_values:
            check.values(B=B, x=x, dt=dt, dA_cumsum=dA_cumsum, initial_states=initial_states, seq_idx=seq_idx)
            check.flat_padded_tail(dt, dA_cumsum, x.shape[1])

    _, impl = _checked("fwd_pass_state", backend, (B, x, dt, dA_cumsum, initial_states, seq_idx), (state_dtype,),
                       metadata, values)
    if impl.falls_back:  # another arrangement where this one refuses the tensors (impls/defaults.py)
        impl = impl.arranged_for("fwd_pass_state", B=B, x=x, dt=dt, dA_cumsum=dA_cumsum,
                                 initial_states=initial_states, seq_idx=seq_idx, state_dtype=state_dtype)
    if check_values and impl.NON_INCREASING_DECAY:
        check.non_increasing_in_chunks(dA_cumsum, impl.NON_INCREASING_DECAY)
    return impl.fwd_pass_state(B, x, dt, dA_cumsum, initial_states, seq_idx, state_dtype)


def compute_out(C, B, x, dt, dA_cumsum, states, D=None, z=None, seq_idx=None, *, backend="reference",
                check_values: bool = False, initial_states=None):
    """-> y (batch, seqlen, nheads, headdim) in x's dtype. `initial_states`: only one per packed sequence (seq_idx on
    one row), which the tokens of a sequence starting inside a chunk read."""
    def metadata():
        batch, seqlen, nheads, headdim, ngroups, dstate, chunk, nchunks = _check_chunked(B, x, dt, dA_cumsum)
        check.tensor("C", C, shape=tuple(B.shape), dtypes=(x.dtype,), device=x.device)
        check.tensor("states", states, shape=(batch, nchunks, nheads, headdim, dstate), device=x.device)
        _check_D_z(D, z, x)
        check.seq_idx(seq_idx, batch, seqlen, x.device)
        if initial_states is not None and (seq_idx is None or batch != 1 or initial_states.shape[0] == batch):
            check.fail("initial_states", "None, or one per packed sequence (seq_idx on one row of x: its rows count "
                       "the sequences; the batch rows' initial states are fwd_pass_state's alone)",
                       tuple(initial_states.shape))
        check.initial_states(initial_states, None, (nheads, headdim, dstate), x.device)
        return Problem.from_inputs(x, B, chunk, D=D, z=z, seq_idx=seq_idx, initial_states=initial_states), x.device

    def values():
        if check_values:
            check.values(C=C, B=B, x=x, dt=dt, dA_cumsum=dA_cumsum, states=states, D=D, z=z, seq_idx=seq_idx)

    _, impl = _checked("compute_out", backend, (C, B, x, dt, dA_cumsum, states, D, z, seq_idx, initial_states), (),
                       metadata, values)
    if impl.falls_back:  # another arrangement where this one refuses the tensors (impls/defaults.py)
        impl = impl.arranged_for("compute_out", C=C, B=B, x=x, dt=dt, dA_cumsum=dA_cumsum, states=states, D=D,
                                 z=z, seq_idx=seq_idx, initial_states=initial_states)
    why = non_increasing_decay(impl)
    if check_values and why:
        check.non_increasing_in_chunks(dA_cumsum, why)
    if check_values and getattr(impl.switches, "exp_fold", False):  # the backward's switches do not run here
        check.non_negative_processed_dt(dt)
    own = {} if initial_states is None else {"initial_states": initial_states}
    return impl.compute_out(C, B, x, dt, dA_cumsum, states, D, z, seq_idx, **own)


def _check_D_z(D, z, x):
    nheads, headdim = x.shape[2], x.shape[3]
    if D is not None:
        check.tensor("D", D, device=x.device)
        if tuple(D.shape) not in ((nheads,), (nheads, headdim)):
            check.fail("D", f"shape ({nheads},) or ({nheads}, {headdim})", tuple(D.shape))
    check.optional("z", z, shape=tuple(x.shape), dtypes=(x.dtype,), device=x.device)


def ssd_forward(x, dt, A, B, C, chunk_size: int, D=None, z=None, dt_bias=None, initial_states=None, seq_idx=None,
                cu_seqlens=None, dt_softplus: bool = False, dt_limit=(0.0, INF), state_dtype=None, *,
                backend="reference", check_values: bool = False) -> ForwardResult:
    """The whole forward: y (batch, seqlen, nheads, headdim) and final states (batch, nheads, headdim, dstate),
    plus the final state of every sequence (nseqs, nheads, headdim, dstate) when cu_seqlens is given. Without
    seq_idx, cu_seqlens also defines it. Not differentiable unless the backend's forward is plain torch ops
    (`Backend.DIFFERENTIABLE`): with gradients wanted, call `impls.ssd` (its differentiable twin)."""
    impl, args = forward_call(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens,
                              dt_softplus, dt_limit, state_dtype, backend, check_values)
    if not impl.DIFFERENTIABLE and wants_gradients(args):
        wanting = ", ".join(name for name in GRAD_INPUTS if args[name] is not None and args[name].requires_grad)
        raise RuntimeError(f"ssd_forward(backend={impl.name!r}): {wanting} require grad, but ssd_forward is not "
                           f"differentiable on this backend; call impls.ssd(...) (the same arguments) for gradients, "
                           f"or detach the inputs / run under torch.no_grad()")
    return impl.ssd_forward(**args)


# The forward's tensor arguments that gradients flow to (impls.ssd)
GRAD_INPUTS = ("x", "dt", "A", "B", "C", "D", "z", "dt_bias", "initial_states")


def wants_gradients(args: dict) -> bool:
    """Whether autograd would record a call on these arguments: grad mode on and an input requiring grad."""
    return torch.is_grad_enabled() and any(args[n] is not None and args[n].requires_grad for n in GRAD_INPUTS)


def forward_call(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens, dt_softplus,
                 dt_limit, state_dtype, backend, check_values) -> tuple[Backend, dict]:
    """The checks of a whole-forward call (`ssd_forward`, `impls.ssd`) -> (the backend, the keyword arguments of
    its `ssd_forward`: seq_idx derived from cu_seqlens where absent, dt_limit as floats)."""
    def metadata():
        batch, seqlen, nheads, headdim, ngroups, dstate = check.dims(x, B)
        check.tensor("dt", dt, shape=(batch, seqlen, nheads), device=x.device)
        check.tensor("A", A, shape=(nheads,), device=x.device)
        check.tensor("C", C, shape=tuple(B.shape), dtypes=(x.dtype,), device=x.device)
        check.chunk_size(chunk_size)
        check.flag("dt_softplus", dt_softplus)
        check.dt_limit(dt_limit)
        check.optional("dt_bias", dt_bias, shape=(nheads,), device=x.device)
        _check_D_z(D, z, x)
        check.seq_idx(seq_idx, batch, seqlen, x.device)
        check.cu_seqlens(cu_seqlens, batch, x.device)
        rows = (batch, cu_seqlens.shape[0] - 1) if cu_seqlens is not None else (batch,)
        check.initial_states(initial_states, rows, (nheads, headdim, dstate), x.device)
        check.state_dtype(state_dtype)
        # with cu_seqlens the Problem counts the sequences from it, whether seq_idx is given or derived
        return Problem.from_inputs(x, B, chunk_size, dt_bias=dt_bias, dt_softplus=dt_softplus, dt_limit=dt_limit,
                                   D=D, z=z, initial_states=initial_states, seq_idx=seq_idx,
                                   cu_seqlens=cu_seqlens, state_dtype=state_dtype), x.device

    def values():
        if check_values:
            seqlen = x.shape[1]
            check.values(x=x, dt=dt, A=A, B=B, C=C, D=D, z=z, dt_bias=dt_bias, initial_states=initial_states,
                         seq_idx=seq_idx, cu_seqlens=cu_seqlens, seqlen=seqlen)
            if seq_idx is not None and cu_seqlens is not None:
                if not torch.equal(seq_idx.long(), seq_idx_from_cu_seqlens(cu_seqlens, seqlen).long()):
                    check.fail("seq_idx", "the sequence index that cu_seqlens defines", "a different one")

    _, impl = _checked("ssd_forward", backend, (x, dt, A, B, C, D, z, dt_bias, initial_states, seq_idx, cu_seqlens),
                       (chunk_size, dt_softplus, dt_limit, state_dtype), metadata, values)
    if impl.falls_back:  # another arrangement where this one refuses the tensors (impls/defaults.py)
        impl = impl.arranged_for("ssd_forward", x=x, dt=dt, A=A, B=B, C=C, D=D, z=z, dt_bias=dt_bias,
                                 initial_states=initial_states, seq_idx=seq_idx, cu_seqlens=cu_seqlens,
                                 dt_softplus=dt_softplus, dt_limit=dt_limit, state_dtype=state_dtype)
    if cu_seqlens is not None and seq_idx is None:
        seq_idx = seq_idx_from_cu_seqlens(cu_seqlens, x.shape[1])
    why = non_increasing_decay(impl)
    if check_values and why:
        check.decay_factor_inputs(A, dt, dt_bias, dt_softplus, dt_limit, why)
    needs = needs_non_negative_dt(impl)
    if check_values and needs:
        check.non_negative_dt(dt, dt_bias, dt_softplus, dt_limit, needs)
    return impl, dict(x=x, dt=dt, A=A, B=B, C=C, chunk_size=chunk_size, D=D, z=z, dt_bias=dt_bias,
                      initial_states=initial_states, seq_idx=seq_idx, cu_seqlens=cu_seqlens, dt_softplus=dt_softplus,
                      dt_limit=tuple(float(v) for v in dt_limit), state_dtype=state_dtype)
