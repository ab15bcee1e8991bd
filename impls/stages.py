"""The forward's stages declared once: each stage's name, the outputs it hands on, and how it is called on a
backend from the forward's arguments and the earlier stages' outputs (impls/README.md, "The chunked
decomposition"). What composes them — a backend's default `ssd_forward`, the harness's gate (each stage on the
backend's own outputs) and its timing (each stage on ready inputs) — iterates over `FORWARD_STAGES` (the harness
through the SSD's workload declaration, harness/workloads/ssd.py, which other workloads' chains sit beside).
Every list of the stages' names (a backend's declaration, the configs, the cost model, the rows, the analysis) is
`FORWARD_STAGE_NAMES`; this module imports no torch, so that the light readers of it (impls/declaration.py,
analysis/) stay light."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Stage:
    """One stage: `call(backend, kw, got)` with the forward's keyword arguments `kw` (ssd_forward's) and the
    earlier stages' outputs by name `got`; it returns `outputs`, in that order."""

    name: str
    outputs: tuple[str, ...]
    call: Callable[[object, dict, dict], tuple]


def _chunk_cumsum(backend, kw: dict, got: dict) -> tuple:
    return backend.chunk_cumsum(kw["dt"], kw["A"], kw["chunk_size"], kw["dt_bias"], kw["dt_softplus"],
                                kw["dt_limit"])


def _fwd_pass_state(backend, kw: dict, got: dict) -> tuple:
    return backend.fwd_pass_state(kw["B"], kw["x"], got["dt"], got["dA_cumsum"], kw["initial_states"],
                                  kw["seq_idx"], kw["state_dtype"])


def own_initial_states(kw: dict) -> dict:
    """{"initial_states": ...} where they are one per packed sequence (the later stages read them too), else {}."""
    from impls.problem import per_sequence_initial_states  # here: the stage names are read without torch

    own = per_sequence_initial_states(kw["initial_states"], kw["x"])
    return {"initial_states": kw["initial_states"]} if own else {}


def _compute_out(backend, kw: dict, got: dict) -> tuple:
    return (backend.compute_out(kw["C"], kw["B"], kw["x"], got["dt"], got["dA_cumsum"], got["states"], kw["D"],
                                kw["z"], kw["seq_idx"], **own_initial_states(kw)),)


FORWARD_STAGES = (
    Stage("chunk_cumsum", ("dt", "dA_cumsum"), _chunk_cumsum),
    Stage("fwd_pass_state", ("states", "final_states"), _fwd_pass_state),
    Stage("compute_out", ("y",), _compute_out),
)


FORWARD_STAGE_NAMES = tuple(stage.name for stage in FORWARD_STAGES)


def run_chain(backend, kw: dict, call: Callable[[str, Callable[[], tuple]], tuple] | None = None,
              stages: tuple[Stage, ...] = FORWARD_STAGES) -> dict:
    """Every stage of `stages` in order, each on the previous stages' outputs of the same backend: stage ->
    {output: tensor}. `call(stage name, thunk)` runs each (to time or wrap it); by default it just calls the thunk."""
    got, out = {}, {}
    for stage in stages:
        thunk = functools.partial(stage.call, backend, kw, got)
        values = call(stage.name, thunk) if call is not None else thunk()
        out[stage.name] = dict(zip(stage.outputs, values))
        got.update(out[stage.name])
    return out
