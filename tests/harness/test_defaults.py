"""Switch defaults per target (impls/defaults.py): which preset runs where, the target read off the device, the next
arrangement for inputs the first refuses (run and recorded), the caller's switches over the defaults (never
replaced: their refusal raises), the published preset by name, in Hydra and as a row of the ablation sweeps."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

import impls
from harness import config as conf
from harness import plan
from impls import defaults
from impls.inputs import make_inputs
from impls.problem import Problem, Shape
from impls.registry import backend_class, get_backend, resolve_switches
from impls.tolerance import rel_err, tolerance
from impls.triton.target import interpreting
from tests.common import float64_forward

TRITON_SM90 = {"tma": True, "tma_descriptors": "host", "state_pass": "serial", "launch_path": "cached"}
TRITON_DECLARED = {"tma": False, "tma_descriptors": "device", "state_pass": "chunk_parallel", "launch_path": "triton"}
CUTILE_SM90 = {"heads_first": True, "skip_first": True, "pdl": True, "operand_swap": False, "exp2_ftz": True,
               "exp_fold": True, "cb_occupancy": 4, "cb_lower_triangle": True}
CUTILE_PUBLISHED = {"heads_first": False, "skip_first": False, "pdl": False, "operand_swap": True, "tma": True,
                    "latency_hints": True, "exp2": True, "transposed_layout": True}
SMALL = Shape(1, 32, 2, 16, 1, 16, 16)  # two chunks of 16, fp32: the interpreter's cheapest forward
conf.register_schemas()
needs_interpreter = pytest.mark.skipif(not interpreting(), reason="impls.triton imported without TRITON_INTERPRET=1")


def _values(switches, like: dict) -> dict:
    return {name: getattr(switches, name) for name in like}


def _presets(resolved) -> list[str]:
    return [a.preset for a in resolved.arrangements]


@pytest.mark.parametrize("backend, target, presets, first", [
    pytest.param("triton", "sm_90", ["best_sm90", "best_sm90_no_tma"], TRITON_SM90, id="triton-sm_90"),
    pytest.param("triton", "interpreter", ["best_interpreter", "best_interpreter_no_tma"],
                 {**TRITON_SM90, "launch_path": "triton"}, id="triton-interpreter"),
    pytest.param("triton", "sm_100", ["published"], TRITON_DECLARED, id="triton-sm_100"),
    pytest.param("triton", "cpu", ["declared"], TRITON_DECLARED, id="triton-cpu"),
    pytest.param("cutile", "sm_90", ["best_sm90", "best_sm90_no_fold"], CUTILE_SM90, id="cutile-sm_90"),
    pytest.param("cutile", "sm_100", ["published"], CUTILE_PUBLISHED, id="cutile-sm_100"),
    pytest.param("cutile", "cpu", ["declared"], {**CUTILE_PUBLISHED, "operand_swap": False}, id="cutile-cpu"),
])
def test_defaults_resolve_per_target(backend, target, presets, first):
    resolved = resolve_switches(backend_class(backend), target)
    assert _presets(resolved) == presets and resolved.target == target
    assert _values(resolved.first.switches, first) == first
    assert all(not a.yielded for a in resolved.arrangements)  # each declared set holds together as declared


def test_the_next_arrangement_differs_only_in_tma():
    first, then = resolve_switches(backend_class("triton"), "sm_90").arrangements
    assert _values(then.switches, TRITON_SM90) == {**TRITON_SM90, "tma": False, "tma_descriptors": "device"}
    assert dataclasses.replace(then.switches, tma=True, tma_descriptors="host") == first.switches


def test_cutiles_next_arrangement_differs_only_in_what_needs_a_non_negative_dt():
    """exp_fold (log2 dt) and bwd_decay_factor (the backward's decays factored at a pivot: monotone dA_cumsum)."""
    first, then = resolve_switches(backend_class("cutile"), "sm_90").arrangements
    assert then.switches.exp_fold is False and then.switches.bwd_decay_factor is False
    assert dataclasses.replace(then.switches, exp_fold=True, bwd_decay_factor=True) == first.switches


@pytest.mark.parametrize("dt_softplus, dt_limit, runs", [
    pytest.param(True, (0.0, float("inf")), "best_sm90", id="softplus"),
    pytest.param(False, (0.0, 5.0), "best_sm90", id="clamped-at-zero"),
    pytest.param(False, (0.0, float("inf")), "best_sm90_no_fold", id="raw-dt"),
    pytest.param(False, (-1.0, 5.0), "best_sm90_no_fold", id="clamped-below-zero"),
])
def test_a_cutile_forward_whose_dt_may_be_negative_runs_without_the_fold(dt_softplus, dt_limit, runs, monkeypatch):
    """sm_90's defaults fold dt into the exponent (log2 dt); a call whose dt may be negative runs the next
    arrangement, and says why; compute_out called on its own is refused by the fold too (its dt's sign unseen).
    The backends are built, not called (no CUDA device here)."""
    from impls import registry

    monkeypatch.setattr(registry, "availability", lambda cls: (True, ""))
    backend = get_backend("cutile", resolve_switches(backend_class("cutile"), "sm_90"))
    x = torch.zeros(1, 32, 2, 16)
    B = torch.zeros(1, 32, 1, 16)
    args = dict(x=x, dt=torch.zeros(1, 32, 2), A=torch.zeros(2), B=B, C=B, D=None, z=None, dt_bias=None,
                initial_states=None, seq_idx=None, cu_seqlens=None, dt_softplus=dt_softplus, dt_limit=dt_limit,
                state_dtype=None)
    ran = backend.arranged_for("ssd_forward", **args)
    assert ran.resolved.first.preset == runs
    if runs == "best_sm90_no_fold":
        why = str(ran.describe()["arrangement"])
        assert "exp_fold reads log2(dt)" in why and "bwd_decay_factor" in why
    assert backend.input_refusal("compute_out", {}) is not None
    assert backend.input_refusal("chunk_cumsum", {}) is None


def test_the_target_comes_from_the_device(monkeypatch):
    """Asked when a backend is built or called, never at import: the CPU here (Triton's interpreter, cuTile's CPU
    target), a CUDA device by its compute capability."""
    assert backend_class("cutile").target(torch.device("cpu")) == "cpu"
    if interpreting():
        assert backend_class("triton").target(torch.device("cpu")) == "interpreter"
    capability = {0: (9, 0), 1: (10, 0), 2: (8, 9)}
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: capability[index])
    defaults._cuda_target.cache_clear()
    try:
        assert [defaults.device_target(torch.device("cuda", i)) for i in capability] == ["sm_90", "sm_100", "other"]
    finally:
        defaults._cuda_target.cache_clear()


@needs_interpreter
def test_by_name_on_the_cpu_runs_the_interpreter_defaults():
    backend = get_backend("triton")
    assert _values(backend.switches, TRITON_SM90) == {**TRITON_SM90, "launch_path": "triton"}
    assert backend.describe()["arrangement"] == {"target": "interpreter", "preset": "best_interpreter",
                                                 "then": ["best_interpreter_no_tma"]}


def _unaligned(inputs):
    """x, B and C moved 4 bytes off a 16-byte boundary: contiguous views the contract accepts, TMA does not."""
    for name in ("x", "B", "C"):
        t = getattr(inputs, name)
        storage = torch.empty(t.numel() + 1, dtype=t.dtype)
        view = storage[1:].view(t.shape)
        view.copy_(t)
        setattr(inputs, name, view)
    return inputs


@needs_interpreter
def test_an_input_the_first_arrangement_refuses_runs_the_next_and_describe_says_so():
    inputs = _unaligned(make_inputs(Problem(SMALL), seed=1, dtype=torch.float32))
    out = impls.ssd_forward(**inputs.forward_kwargs(), backend="triton")
    assert rel_err(out.y, float64_forward(inputs).y) <= tolerance(torch.float32)
    said = get_backend("triton", device="cpu").describe()
    assert said["arrangement"]["preset"] == "best_interpreter_no_tma"
    assert "x: its data pointer is not 16-byte aligned" in said["arrangement"]["refused"]["best_interpreter"]
    assert said["switches"]["tma"] is False and said["switches"]["state_pass"] == "serial"
    assert set(said["stages"]) == {"chunk_cumsum", "chunk_state", "compute_out"}  # what ran: the serial stage 2
    aligned = make_inputs(Problem(SMALL), seed=1, dtype=torch.float32)  # the next call takes the first again
    impls.ssd_forward(**aligned.forward_kwargs(), backend="triton")
    assert get_backend("triton", device="cpu").describe()["arrangement"]["preset"] == "best_interpreter"


@needs_interpreter
def test_impls_ssd_runs_the_arrangement_that_takes_its_inputs():
    """The differentiable twin shares ssd_forward's checks (impls.api.forward_call), the arrangement's choice too."""
    inputs = _unaligned(make_inputs(Problem(SMALL), seed=1, dtype=torch.float32))
    out = impls.ssd(**inputs.forward_kwargs(), backend="triton")
    assert rel_err(out.y, float64_forward(inputs).y) <= tolerance(torch.float32)
    assert get_backend("triton", device="cpu").describe()["arrangement"]["preset"] == "best_interpreter_no_tma"


def test_describe_says_the_tile_protocol_and_the_arrangement():
    said = get_backend("reference").describe()
    assert (said["tile_protocol"], said["arrangement"]["preset"]) == ("untuned", "declared")


@needs_interpreter
def test_the_harness_plan_runs_the_arrangement_that_takes_its_inputs():
    """Rows 18 fp32 elements wide (72 bytes): the drawn inputs' strides are no 16-byte multiple."""
    point = plan.point("triton", Problem(Shape(1, 32, 2, 18, 1, 16, 16), dtype="float32"), device="cpu")
    assert point.switches.tma and point.resolved.target == "interpreter"
    built = plan.build(point)
    assert built.backend.switches.tma is False
    arrangement = built.backend.describe()["arrangement"]
    assert arrangement["preset"] == "best_interpreter_no_tma"
    assert "x: strides (1152, 36, 18, 1) (4-byte elements) are not all 16-byte multiples" in \
        arrangement["refused"]["best_interpreter"]
    from harness import record

    row = record.rows(point, built, None, None, None).rows[0]  # the row's switches: what ran
    assert json.loads(row["switches"])["tma"] is False


@needs_interpreter
def test_a_switch_the_caller_set_is_not_replaced_but_its_refusal_raises():
    backend = get_backend("triton", tma=True)
    assert _presets(backend.resolved) == ["best_interpreter"]  # no next arrangement would keep tma=True
    inputs = _unaligned(make_inputs(Problem(SMALL), seed=1, dtype=torch.float32))
    with pytest.raises(ValueError, match=r"switch 'tma'.* x: its data pointer is not 16-byte aligned"):
        impls.ssd_forward(**inputs.forward_kwargs(), backend=backend)


def test_the_callers_switches_win_and_what_they_displace_is_recorded():
    cls = backend_class("triton")
    off = resolve_switches(cls, "sm_90", overrides={"tma": False})
    assert _presets(off) == ["best_sm90"] and _values(off.first.switches, TRITON_SM90) == {
        **TRITON_SM90, "tma": False, "tma_descriptors": "device"}
    assert "with tma=False there are none" in dict(off.first.yielded)["tma_descriptors"]
    fused = resolve_switches(cls, "sm_90", overrides={"fuse_state_out": True})
    assert fused.first.switches.state_pass == "chunk_parallel" and "state_pass" in dict(fused.first.yielded)
    with pytest.raises(ValueError, match="does not read heads_first"):  # the caller's own refusal raises as before
        resolve_switches(cls, "sm_90", overrides={"fuse_state_out": True, "heads_first": True})


def test_the_published_preset_resolves_by_name_and_in_hydra():
    cutile = resolve_switches(backend_class("cutile"), "sm_90", preset="published")
    assert _presets(cutile) == ["published"] and _values(cutile.first.switches, CUTILE_PUBLISHED) == CUTILE_PUBLISHED
    triton = resolve_switches(backend_class("triton"), "sm_90", preset="published")
    assert triton.first.switches == backend_class("triton").Switches()  # Triton's published tricks: as declared
    presets = r"\['best_sm90', 'best_sm90_no_fold', 'declared', 'published'\]"
    with pytest.raises(ValueError, match=r"preset: expected one of " + presets):
        resolve_switches(backend_class("cutile"), "sm_90", preset="fastest")
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
        cfg = compose("config", overrides=["backend=cutile", "backend.preset=published", "device=cpu"])
    assert conf.validate(cfg)[1].operand_swap is True


@needs_interpreter
def test_the_preset_by_name_builds_it():
    backend = get_backend("triton", preset="published")
    assert backend.switches == backend_class("triton").Switches()
    assert backend.describe()["arrangement"]["preset"] == "published"


def test_the_ablation_sweeps_start_from_the_defaults_and_hold_the_published_row():
    cutile = backend_class("cutile")
    sm90 = dataclasses.asdict(resolve_switches(cutile, "sm_90").first.switches)
    points = conf.ablation_points(cutile.Switches, sm90)
    assert {"heads_first", "skip_first", "pdl"} <= set(points) and "heads_first:True" not in points
    triton = backend_class("triton")
    points = conf.ablation_points(triton.Switches, dataclasses.asdict(resolve_switches(triton, "sm_90").first.switches))
    assert {"tma", "state_pass:chunk_parallel", "tma_descriptors:device", "launch_path:triton"} <= set(points)
    published = conf.resolution(cutile, "sm_90", {}, "preset:published", None)
    assert _presets(published) == ["published"] and published.first.switches.operand_swap
    for name in ("cutile", "triton"):
        overlay = (conf_dir() / "experiment" / f"ablate_{name}.yaml").read_text()
        assert overlay.rstrip().endswith(",preset:published"), name


def conf_dir():
    from pathlib import Path

    return Path(__file__).resolve().parents[2] / "conf"


def test_switches_cli_says_the_default_on_each_target(capsys):
    from impls import cli

    assert cli.main(["switches", "cutile"]) == 0
    out = capsys.readouterr().out
    assert "  sm_90: best_sm90 (then, for inputs it refuses: best_sm90_no_fold)\n" in out
    assert "  sm_100: published\n" in out
    assert "pdl (default False, on sm_90 True)" in out and "operand_swap (default False, on sm_100 True)" in out
