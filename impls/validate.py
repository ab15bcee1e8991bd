"""Argument checks shared by every public entry point.

Metadata checks (shapes, dtypes, devices, sizes) read no tensor values: no device sync, safe under CUDA-graph
capture. Value checks (NaN/inf, seq_idx monotone, cu_seqlens consistent with seqlen, the flat padded tail of dt and
dA_cumsum that stage 2 relies on, and what the factored decay (switch decay_factor) assumes) read values and run
only when asked for (`check_values=True`) and in the harness's correctness gate.
Every failure is a ValueError naming the argument, what was expected and what was received.
"""

from __future__ import annotations

import math

import torch

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
INDEX_DTYPES = (torch.int32, torch.int64)


def fail(arg: str, expected: str, got) -> None:
    raise ValueError(f"{arg}: expected {expected}, got {got}")


def positive_int(arg: str, value) -> None:
    """`value` is an int >= 1 (a bool is not), else ValueError naming `arg`."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        fail(arg, "an int >= 1", repr(value))


def tensor(arg: str, t, shape: tuple[int, ...] | None = None, dtypes=FLOAT_DTYPES, device=None,
           device_of: str = "x") -> None:
    """`t` is a tensor of `shape` (None entries are free) with one of `dtypes`, on `device` (that of the argument
    `device_of`)."""
    if not isinstance(t, torch.Tensor):
        fail(arg, "a torch.Tensor", type(t).__name__)
    if t.layout != torch.strided:
        fail(arg, "a dense (strided) tensor", t.layout)
    if shape is not None:
        if t.dim() != len(shape) or any(s is not None and s != d for s, d in zip(shape, t.shape)):
            want = "(" + ", ".join("*" if s is None else str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"
            fail(arg, f"shape {want}", tuple(t.shape))
    if dtypes is not None and t.dtype not in dtypes:
        fail(arg, f"dtype in {[str(d) for d in dtypes]}", t.dtype)
    if device is not None and t.device != device:
        fail(arg, f"a tensor on {device} (the device of {device_of})", t.device)
    if t.numel() > 0 and any(st < 0 for st in t.stride()):
        fail(arg, "non-negative strides", t.stride())


def optional(arg: str, t, **kw) -> None:
    if t is not None:
        tensor(arg, t, **kw)


def initial_states(value, rows: tuple[int, ...] | None, per_row: tuple[int, int, int], device) -> None:
    """initial_states (rows, nheads, headdim, dstate): `rows` the leading sizes allowed (the batch, and with
    cu_seqlens the number of sequences: one initial state per packed sequence); None: any."""
    if value is None:
        return
    tensor("initial_states", value, shape=(None, *per_row), device=device)
    if rows is not None and value.shape[0] not in rows:
        want = " or ".join(str(r) for r in dict.fromkeys(rows))
        per_sequence = ", or one per sequence of cu_seqlens" if len(rows) > 1 else ""
        fail("initial_states", f"{want} rows (the batch{per_sequence})", value.shape[0])


MAX_CHUNK_SIZE = 2048  # the intra-chunk term is quadratic in the chunk: Q×Q per head and chunk


def chunk_size(value, arg: str = "chunk_size") -> None:
    """A power of two in [16, MAX_CHUNK_SIZE]; `arg` names where it was read (a stage reads it off dt's shape)."""
    if not isinstance(value, int) or isinstance(value, bool):  # numpy's and torch's ints, 16.0: say so, not "got 16"
        fail(arg, "a Python int (a power of two >= 16)", f"{value!r} of type {type(value).__name__}")
    if value < 16 or value & (value - 1):
        fail(arg, "a power of two >= 16", value)
    if value > MAX_CHUNK_SIZE:
        fail(arg, f"at most {MAX_CHUNK_SIZE}", value)


def flag(arg: str, value) -> None:
    """A bool switch of the call (dt_softplus): a string such as "no" would otherwise read as true."""
    if not isinstance(value, bool):
        fail(arg, "a bool", repr(value))


def dims(x: torch.Tensor, B: torch.Tensor) -> tuple[int, int, int, int, int, int]:
    """Reads (batch, seqlen, nheads, headdim, ngroups, dstate) off x and B, checking that they agree."""
    tensor("x", x, shape=(None, None, None, None))
    batch, seqlen, nheads, headdim = x.shape
    tensor("B", B, shape=(batch, seqlen, None, None), dtypes=(x.dtype,), device=x.device)
    ngroups, dstate = B.shape[2], B.shape[3]
    if seqlen < 1:
        fail("x", "seqlen >= 1 (dimension 1)", seqlen)
    if min(batch, nheads, headdim) < 1:
        fail("x", "non-empty batch, nheads and headdim (dimensions 0, 2, 3)", tuple(x.shape))
    if min(ngroups, dstate) < 1:
        fail("B", "non-empty ngroups and dstate (dimensions 2, 3)", tuple(B.shape))
    if nheads % ngroups:
        fail("B", f"ngroups (dimension 2) dividing nheads={nheads}", ngroups)
    return batch, seqlen, nheads, headdim, ngroups, dstate


def dt_limit(value) -> None:
    if isinstance(value, (str, bytes)):  # "12" would read as (1, 2)
        fail("dt_limit", "a pair (low, high) of numbers", repr(value))
    try:
        lo, hi = (float(v) for v in value)
    except (TypeError, ValueError):
        fail("dt_limit", "a pair (low, high) of numbers", value)
    if math.isnan(lo) or math.isnan(hi) or not lo < hi or lo < 0:
        fail("dt_limit", "0 <= low < high", value)


def state_dtype(value) -> None:
    if value is not None and value not in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        fail("state_dtype", "None or a float dtype", value)


def seq_idx(value, batch: int, seqlen: int, device) -> None:
    optional("seq_idx", value, shape=(batch, seqlen), dtypes=INDEX_DTYPES, device=device)


def cu_seqlens(value, batch: int, device) -> None:
    if value is None:
        return
    tensor("cu_seqlens", value, shape=(None,), dtypes=INDEX_DTYPES, device=device)
    if value.shape[0] < 2:
        fail("cu_seqlens", "at least 2 entries (0 and seqlen)", value.shape[0])
    if batch != 1:
        fail("cu_seqlens", "batch == 1 (packed sequences share one row of x)", f"batch={batch}")


def nchunks(arg: str, t, seqlen: int) -> None:
    """t's chunk axis (dimension 2) counts ceil(seqlen / chunk_size) chunks, chunk_size being its dimension 3."""
    want = math.ceil(seqlen / t.shape[3])
    if t.shape[2] != want:
        fail(arg, f"nchunks = ceil(seqlen/chunk_size) = {want} (dimension 2)", t.shape[2])


def chunked(arg: str, t, batch: int, nheads: int, nchunks: int, chunk: int, device) -> None:
    """dt or dA_cumsum as chunk_cumsum returns them: (batch, nheads, nchunks, chunk_size), fp32."""
    tensor(arg, t, shape=(batch, nheads, nchunks, chunk), dtypes=(torch.float32, torch.float64), device=device)


def values(**tensors) -> None:
    """Value checks (reads data, syncs): every float tensor finite, seq_idx non-decreasing from 0 per row,
    cu_seqlens starting at 0, non-decreasing and ending at seqlen (passed as `seqlen`)."""
    seqlen = tensors.pop("seqlen", None)
    for arg, t in tensors.items():
        if t is None:
            continue
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            fail(arg, "finite values (no NaN or inf)", "non-finite entries")
        if arg == "seq_idx":
            if bool((t[:, 1:] < t[:, :-1]).any()) or bool((t[:, 0] < 0).any()):
                fail("seq_idx", "non-negative values, non-decreasing along seqlen", "a decrease or a negative value")
        if arg == "cu_seqlens":
            cu_seqlens_bounds(t.tolist(), seqlen)


def cu_seqlens_bounds(bounds: list[int], seqlen: int | None) -> None:
    """cu_seqlens read on the host: 0 = cu_seqlens[0] <= ... <= cu_seqlens[-1] = seqlen (when given). The value
    check, and what a backend that reads cu_seqlens on the host anyway checks on every call: offsets past seqlen
    would index past x and y, offsets short of it leave y's tail unwritten."""
    ordered = bounds[0] == 0 and all(a <= b for a, b in zip(bounds, bounds[1:]))
    if not ordered or (seqlen is not None and bounds[-1] != seqlen):
        fail("cu_seqlens", f"0 = cu_seqlens[0] <= ... <= cu_seqlens[-1] = seqlen ({seqlen})", bounds)


def flat_padded_tail(dt, dA_cumsum, seqlen: int) -> None:
    """Stage 2 reads dA_cumsum at position chunk_size − 1 as the decay of the whole last chunk: past seqlen, dt
    must be 0 and dA_cumsum equal to its value at the last valid position (impls/README.md)."""
    nchunks, chunk = dt.shape[2], dt.shape[3]
    valid = seqlen - (nchunks - 1) * chunk
    if valid == chunk:
        return
    if bool((dt[:, :, -1, valid:] != 0).any()):
        fail("dt", f"0 past seqlen in the last chunk (positions {valid}..{chunk - 1})", "non-zero entries")
    if bool((dA_cumsum[:, :, -1, valid:] != dA_cumsum[:, :, -1, valid - 1:valid]).any()):
        fail("dA_cumsum", f"flat past seqlen in the last chunk (positions {valid}..{chunk - 1} equal to position "
                          f"{valid - 1}: stage 2 reads position {chunk - 1})", "a tail that changes")


DECAY_FACTOR = "switch decay_factor (the factored decay assumes dA_cumsum non-increasing inside a chunk)"


def non_increasing_in_chunks(dA_cumsum, why: str = DECAY_FACTOR) -> None:
    """dA_cumsum never increases along a chunk: what compute_out's factored decay assumes (impls/README.md), or
    the kernels `why` names."""
    if bool((dA_cumsum[..., 1:] > dA_cumsum[..., :-1]).any()):
        fail("dA_cumsum", f"non-increasing inside every chunk with {why}", "an increase (A > 0 or dt < 0)")


def decay_factor_inputs(A, dt, dt_bias, dt_softplus: bool, dt_limit, why: str = DECAY_FACTOR) -> None:
    """The forward's inputs give a non-increasing dA_cumsum: A <= 0, and dt >= 0 after processing (softplus or a
    dt_limit clamp make it so; without them dt + dt_bias must be >= 0 already). `why`: what assumes it."""
    if bool((A > 0).any()):
        fail("A", f"values <= 0 with {why}", "a positive entry")
    non_negative_dt(dt, dt_bias, dt_softplus, dt_limit, why)


EXP_FOLD = "switch exp_fold (q = dA_cumsum·log2(e) − log2(dt) has no value for a negative dt)"
BWD_DECAY_FACTOR = ("switch bwd_decay_factor (the backward's decays below the diagonal as a product of two factors, "
                    "which a dt changing sign inside a chunk can take to inf · 0)")
# The switches whose kernels need dt >= 0 after processing, each with what the value check says (above) and what a
# backend's refusal of a call whose dt may be negative says (impls/cutile/backend.py input_refusal); one table for both
NEEDS_NON_NEGATIVE_DT = {
    "exp_fold": (EXP_FOLD, "exp_fold reads log2(dt)"),
    "bwd_decay_factor": (BWD_DECAY_FACTOR, "bwd_decay_factor factors the backward's decays at a pivot"),
}


def non_negative_processed_dt(dt, why: str = EXP_FOLD) -> None:
    """compute_out's dt (stage 1's output, already processed) >= 0, what the kernels `why` names assume."""
    if bool((dt < 0).any()):
        fail("dt", f"values >= 0 with {why}", "a negative entry")


def processing_makes_dt_non_negative(dt_softplus: bool, dt_limit) -> bool:
    """Whether dt's processing alone makes it >= 0: softplus, or a dt_limit clamp (applied when dt_limit is not
    (0, inf)) whose low bound is >= 0 (as the contract's is)."""
    low, high = (float(v) for v in dt_limit)
    return bool(dt_softplus) or ((low, high) != (0.0, math.inf) and low >= 0.0)


def non_negative_dt(dt, dt_bias, dt_softplus: bool, dt_limit, why: str) -> None:
    """dt >= 0 after processing: softplus or a dt_limit clamp make it so; without them dt + dt_bias must be."""
    if processing_makes_dt_non_negative(dt_softplus, dt_limit):
        return
    v = dt.float() if dt_bias is None else dt.float() + dt_bias.float()
    if bool((v < 0).any()):
        fail("dt", f"dt + dt_bias >= 0 without softplus or dt_limit, with {why}", "a negative entry")
