"""Every config group option and experiment overlay composes; bad overrides fail at start-up, naming the culprit."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

from harness import config as conf
from harness import workloads

pytestmark = pytest.mark.quick  # the quick tier: pytest -m quick

REPO = Path(__file__).resolve().parents[2]
CONF = REPO / "conf"
conf.register_schemas()
conf.register_resolvers()

GROUPS = ["backend", "shape", "problem", "dtype", "bench", "logger", "launch", "workload"]
OPTIONS = [pytest.param(g, p.stem, id=f"{g}-{p.stem}") for g in GROUPS for p in sorted((CONF / g).glob("*.yaml"))]
EXPERIMENTS = [pytest.param(p.stem, id=p.stem) for p in sorted((CONF / "experiment").glob("*.yaml"))]


def _compose(overrides, hydra_cfg=False):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=overrides, return_hydra_config=hydra_cfg)


@pytest.mark.parametrize("group,option", OPTIONS)
def test_every_option_composes(group, option):
    cfg = _compose([f"{group}={option}"])
    assert cfg[group] is not None
    if group == "shape":
        conf.check_shape(conf.shape_of(cfg), option)


def test_groups_are_complete():
    names = {p.stem for p in (CONF / "backend").glob("*.yaml")}
    assert names == {"reference", "mamba_ssm", "cutile", "triton", "tilegym", "fla", "vllm"}
    shapes = {p.stem for p in (CONF / "shape").glob("*.yaml")}
    assert {"S1", "S2", "S3", "S4", "tiny", "long_64k", "long_256k", "mamba2_130m", "mamba2_2p7b"} <= shapes
    assert {p.stem for p in (CONF / "workload").glob("*.yaml")} == set(workloads.names())
    s1 = _compose(["shape=S1"]).shape
    assert (s1.batch, s1.seqlen, s1.nheads, s1.headdim, s1.ngroups, s1.dstate, s1.chunk_size) == \
        (8, 4096, 80, 64, 1, 128, 256)


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_experiment_composes(name):
    cfg = _compose([f"experiment={name}"], hydra_cfg=True)
    assert cfg.sweep_name == name
    assert str(cfg.hydra.mode) == "RunMode.MULTIRUN"
    params = cfg.hydra.sweeper.params
    assert params and all(str(v) for v in params.values())  # resolves (ablation lists read the Switches)


def test_ablation_lists_follow_the_switches():
    from impls.registry import backend_class

    points = conf.ablation_points(backend_class("mamba_ssm").Switches)
    bools = [f for f, d in backend_class("mamba_ssm").Switches.__dataclass_fields__.items() if d.default is True]
    assert points[0] == "none" and set(bools) <= set(points)
    cfg = _compose(["experiment=ablate_mamba_ssm"], hydra_cfg=True)
    assert cfg.hydra.sweeper.params["backend.ablation"] == ",".join(points)


def test_a_switch_that_needs_others_is_ablated_with_them():
    """A switch that cannot run without others is swept with them turned on first; and every off-by-default point of
    the real backends builds a backend (none is refused at construction)."""
    import dataclasses

    from impls.registry import backend_class, switch

    @dataclasses.dataclass(frozen=True)
    class Toy:
        tma: bool = switch(False, "loads")
        ws: bool = switch(False, "split", needs={"tma": True})

    assert conf.ablation_points(Toy) == ["none", "tma:True", "tma:True+ws:True"]
    for name in ("triton", "cutile"):
        cls = backend_class(name)
        for point in [p for p in conf.ablation_points(cls.Switches) if p.endswith(":True")]:
            cls(cls.Switches(**conf.apply_ablation(cls.Switches, {}, point)))  # its checks run in __init__


def test_slurm_launcher_config_only_when_selected():
    cfg = _compose(["hydra/launcher=slurm"], hydra_cfg=True)
    assert cfg.hydra.launcher._target_.endswith("SlurmLauncher")
    assert "Slurm" not in _compose([], hydra_cfg=True).hydra.launcher._target_


@pytest.mark.parametrize("overrides,named", [
    pytest.param(["backend=nope"], "nope", id="unknown-backend-option"),
    pytest.param(["backend.name=nope"], "nope", id="unknown-backend-name"),
    pytest.param(["shape.seqlen=lots"], "lots", id="mistyped-shape"),
    pytest.param(["shape.seqlne=4"], "seqlne", id="misspelt-key"),
    pytest.param(["dtype=float8"], "float8", id="unknown-dtype"),
])
def test_bad_overrides_fail_at_composition(overrides, named):
    with pytest.raises((HydraException, OmegaConfBaseException)) as err:
        _compose(overrides)
    assert named in str(err.value)


@pytest.mark.parametrize("overrides,named", [
    pytest.param(["backend=mamba_ssm", "+backend.switches.bogus=1"], "bogus", id="unknown-switch"),
    pytest.param(["backend=reference", "+backend.switches.fused=false"], "fused", id="switch-backend-lacks"),
    pytest.param(["backend=mamba_ssm", "backend.ablation=nothing"], "nothing", id="unknown-ablation"),
    pytest.param(["backend=cutile", "backend.ablation=heads_first:True+nothing:True"], "nothing",
                 id="unknown-switch-in-combined-ablation"),
    pytest.param(["backend=cutile", "backend.ablation=heads_first:True+"], "empty point", id="dangling-plus"),
    pytest.param(["shape.chunk_size=100"], "chunk_size", id="chunk-not-power-of-two"),
    pytest.param(["shape.nheads=5"], "ngroups", id="heads-not-multiple-of-groups"),
    pytest.param(["shape.seqlen=0"], "seqlen", id="empty-sequence"),
    pytest.param(["problem=varlen", "shape=S1"], "batch", id="varlen-needs-batch-1"),
    # what the public entries refuse is refused at start-up too, not run and stored as a failed point
    pytest.param(["shape.chunk_size=8"], r"chunk_size: expected a power of two >= 16", id="chunk-below-16"),
    pytest.param(["shape.chunk_size=4096"], "chunk_size: expected at most 2048", id="chunk-above-2048"),
    pytest.param(["problem.dt_limit=[-1.0,1.0]"], r"dt_limit: expected 0 <= low < high", id="dt_limit-negative"),
    pytest.param(["problem.dt_limit=[0.1,0.01]"], r"dt_limit: expected 0 <= low < high", id="dt_limit-unordered"),
    pytest.param(["backend=triton", "+backend.switches.decay_factor=maybe"], "decay_factor.*expected a bool",
                 id="bool-switch-given-a-string"),
])
def test_bad_overrides_fail_validation(overrides, named):
    with pytest.raises(conf.ConfigError, match=named):
        conf.validate(_compose(overrides))


def test_good_switch_override_validates():
    _, switches = conf.validate(_compose(["backend=mamba_ssm", "backend.ablation=fused"]))
    assert switches.fused is False


def _bench(args, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "WANDB_MODE": "disabled"}
    return subprocess.run([sys.executable, "-m", "experiments.bench", *args, f"results_dir={tmp_path}/res",
                           f"hydra.run.dir={tmp_path}/run", f"hydra.sweep.dir={tmp_path}/sweep", "logger=local"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


def test_cli_bad_switch_fails_at_start_up(tmp_path):
    out = _bench(["backend=reference", "+backend.switches.fused=false"], tmp_path)
    assert out.returncode != 0 and "fused" in out.stderr
    assert not (tmp_path / "res").exists()


def test_cli_chunk_size_the_entries_refuse_fails_at_start_up(tmp_path):
    out = _bench(["shape.chunk_size=8"], tmp_path)
    assert out.returncode != 0 and "chunk_size: expected a power of two >= 16" in out.stderr
    assert not (tmp_path / "res").exists()


def test_multirun_checks_every_job_before_the_first(tmp_path):
    # the second job (reference has no switch "fused") is bad: the sweep must stop before the first job runs
    out = _bench(["-m", "backend=mamba_ssm,reference", "+backend.switches.fused=false"], tmp_path)
    assert out.returncode != 0 and "fused" in out.stderr and "backend=reference" in out.stderr
    assert not (tmp_path / "res").exists()


def test_cli_switch_without_its_plus_is_told_to_add_it(tmp_path):
    """A backend's switches start empty, so Hydra refuses `backend.switches.tma=...` as a key not in the config;
    the entry adds what to write instead (Hydra's own suggestion keeps only a sweep's first value)."""
    out = _bench(["-m", "backend=cutile", "backend.switches.tma=false,true"], tmp_path)
    assert out.returncode != 0
    assert "with a leading '+': +backend.switches.tma=false,true" in out.stderr
    assert "python -m impls switches cutile" in out.stderr
    assert not (tmp_path / "res").exists()


def test_the_plus_hint_is_for_switch_overrides_only():
    from experiments import bench

    assert bench.plus_hint(["backend=triton", "shape.seqne=3", "+backend.switches.tma=false"]) is None
    assert "+backend.switches.exp2=false (" in bench.plus_hint(["backend=triton", "backend.switches.exp2=false"])


@pytest.mark.parametrize("overrides, name", [
    pytest.param(["shape.seqlen=64"], "tiny[seqlen=64]", id="one-field"),
    pytest.param(["shape.seqlen=192"], "tiny[seqlen=192]", id="another-value"),
    pytest.param(["shape.seqlen=64", "shape.batch=1"], "tiny[batch=1,seqlen=64]", id="two-fields"),
    pytest.param(["shape=S1", "backend=triton"], "S1", id="unchanged"),
    pytest.param(["shape.seqlen=64", "shape.name=mine"], "mine", id="named-by-hand"),
])
def test_a_shape_changed_by_an_override_gets_its_own_name(overrides, name):
    """`shape.seqlen=64,192` sweeps two shapes: each carries its own name in the rows (not both `tiny`)."""
    from experiments import bench

    cfg = _compose(overrides)
    bench.name_the_shape(cfg, overrides)
    assert cfg.shape.name == name


def test_a_renamed_shape_keeps_the_tiles_of_its_own_name():
    """conf/lvt reads cuTile's tiles for ${shape.name}: resolved under the shape's own name before the rename."""
    from experiments import bench

    overrides = ["+lvt=triton_cutile_tiles", "shape=S1", "shape.seqlen=8192"]
    cfg = _compose(overrides)
    bench.name_the_shape(cfg, overrides)
    assert cfg.shape.name == "S1[seqlen=8192]" and cfg.backend.switches.block_rows > 0


def test_terminal_noise_is_off_unless_verbose():
    """Hydra's launch lines and W&B's banners stay off the terminal by default; verbose=true shows them."""
    from harness import record

    quiet, verbose = _compose([], hydra_cfg=True), _compose(["verbose=true"], hydra_cfg=True)
    assert quiet.hydra.hydra_logging.root.level == "WARNING" and verbose.hydra.hydra_logging.root.level == "INFO"
    assert not record.Output.from_config(quiet, REPO).verbose and record.Output.from_config(verbose, REPO).verbose


@pytest.mark.parametrize("ablation, expect", [
    ("heads_first:True+pdl:True", {"heads_first": True, "pdl": True}),
    ("all_off+tma:True", {"tma": True, "exp2": False, "latency_hints": False, "transposed_layout": False}),
    ("tma+tma:True", {"tma": True}),
    ("state_pass:chunk_parallel+skip_first:True", {"state_pass": "chunk_parallel", "skip_first": True}),
], ids=["two-on", "all-off-then-one-on", "later-wins", "choice-and-bool"])
def test_ablation_points_joined_by_plus_apply_left_to_right(ablation, expect):
    from impls.registry import backend_class

    out = conf.apply_ablation(backend_class("cutile").Switches, {}, ablation)
    assert {k: out[k] for k in expect} == expect


ARMS = sorted((REPO / "scripts" / "arms").glob("*.txt"))


@pytest.mark.parametrize("arms_file", ARMS, ids=[p.stem for p in ARMS])
def test_committed_arms_compose_and_validate(arms_file):
    """Every arm of a committed arms file (scripts/rounds.sh) composes with the experiment it is run under and passes
    the start-up checks for each backend and shape it sweeps, its switches included: a bad arm is found here, not
    after the GPU call's first round."""
    import itertools

    arms = [line.split() for line in arms_file.read_text().splitlines() if line.strip() and not line.startswith("#")]
    assert arms
    for overrides in arms:
        choices = [[f"{o.split('=', 1)[0]}={v}" for v in o.split("=", 1)[1].split(",")]
                   if o.split("=", 1)[0] in ("backend", "shape") else [o] for o in overrides]
        for combo in itertools.product(*choices):
            cfg = _compose(["experiment=headline", *combo])
            conf.validate(cfg)


@pytest.mark.parametrize("overrides, match", [
    pytest.param(["bench.kernel_times=true", "device=cpu"], "runs on the CPU", id="on-the-cpu"),
    pytest.param(["bench.kernel_times=true", "direction=train_step", "workload=mamba2_lm", "device=cuda"],
                 "direction 'train_step'", id="a-stepped-direction"),
])
def test_kernel_times_where_there_are_none_are_refused(overrides, match):
    with pytest.raises(conf.ConfigError, match=f"bench.kernel_times: .*{match}"):
        conf.validate(_compose(overrides))
