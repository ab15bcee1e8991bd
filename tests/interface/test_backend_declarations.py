"""A backend lives in its folder: what impls/<name>/__init__.py declares (impls/declaration.py) is what the
registry, the backend class, conf/backend/<name>.yaml, the experiment overlays, provenance and the store see."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from harness import config as conf
from harness import provenance, store
from impls import declaration
from impls.declaration import DeclarationError, declarations
from impls.registry import Backend, backend_class, list_backends, register

pytestmark = pytest.mark.quick

REPO = Path(__file__).resolve().parents[2]
CONF = REPO / "conf"
NAMES = [pytest.param(name, id=name) for name in declarations()]
EXPERIMENTS = [pytest.param(p.stem, id=p.stem) for p in sorted((CONF / "experiment").glob("*.yaml"))]
conf.register_schemas()
conf.register_resolvers()


def test_every_backend_folder_is_declared():
    folders = {p.parent.name for p in (REPO / "impls").glob("*/__init__.py")}
    assert set(list_backends()) == folders == {"reference", "mamba_ssm", "cutile", "triton", "tilegym", "fla", "vllm"}


@pytest.mark.parametrize("name", NAMES)
def test_the_class_takes_stages_and_pins_from_the_declaration(name):
    decl, cls = declarations()[name], backend_class(name)
    assert cls.STAGES == decl.stages and cls.REQUIRES == decl.requires
    assert cls.__module__.startswith(decl.module + ".")


@pytest.mark.parametrize("name", NAMES)
def test_backend_config_file_matches_its_switches(name):
    """conf/backend/<name>.yaml stays a file (so `+backend.switches.<name>=...` keeps adding a key); it names its
    backend and sets only switches its Switches dataclass has."""
    cfg = OmegaConf.load(CONF / "backend" / f"{name}.yaml")
    fields = {f.name for f in dataclasses.fields(backend_class(name).Switches)}
    assert cfg.name == name and set(cfg) == {"name", "switches", "ablation"}
    assert set(cfg.switches) <= fields


def test_every_backend_config_file_has_a_declared_backend():
    assert {p.stem for p in (CONF / "backend").glob("*.yaml")} == set(declarations())


def _sweep(cfg, key: str) -> list[str] | None:
    value = cfg.hydra.sweeper.params.get(key)
    return None if value is None else str(value).split(",")


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_overlay_switches_exist_in_every_backend_it_sweeps(experiment):
    """Each overlay's backend.switches and ablation points resolve against the Switches of each backend it runs."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        first = compose("config", overrides=[f"experiment={experiment}"], return_hydra_config=True)
        backends = _sweep(first, "backend")
        configs = [first] if backends is None else [
            compose("config", overrides=[f"experiment={experiment}", f"backend={name}"], return_hydra_config=True)
            for name in backends]
    for cfg in configs:
        for ablation in _sweep(cfg, "backend.ablation") or [cfg.backend.ablation]:
            cfg.backend.ablation = ablation
            assert conf.resolved_switches(cfg) is not None, (experiment, cfg.backend.name, ablation)


def test_provenance_and_store_record_every_declared_package():
    for decl in declarations().values():
        for key, (dist, _) in decl.packages.items():
            assert provenance.PACKAGES[key] == dist
            assert f"v_{key}" in store.COLUMNS
    assert {f"v_{key}" for key in store.SCHEMA_4_VERSIONS} <= set(store.COLUMNS)  # committed Parquet loads


def test_a_package_declared_later_is_null_in_older_files(monkeypatch):
    columns = {**store.COLUMNS, "v_newpkg": ("string", "")}
    monkeypatch.setattr(store, "COLUMNS", columns)
    monkeypatch.setattr(store, "LATER_VERSIONS", ["v_newpkg"])
    old = store.frame([{"schema_version": 4, "backend": "reference"}]).drop(columns=["v_newpkg"])
    assert store.conform(old)["v_newpkg"].isna().all()


def _folder(tmp_path, name: str, body: str) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "__init__.py").write_text(body)
    return folder


@pytest.mark.parametrize("name,body,match", [
    pytest.param("foo", 'BACKEND = "bar"\nPACKAGES = {}\n', "folder's name 'foo'", id="name-not-the-folder"),
    pytest.param("foo", 'BACKEND = "foo"\n', "PACKAGES is missing", id="no-packages"),
    pytest.param("foo", 'BACKEND = "foo"\nPACKAGES = {"torch": "torch"}\n', r"PACKAGES\['torch'\]",
                 id="package-not-a-pair"),
    pytest.param("foo", 'BACKEND = "foo"\nSTAGES = ("forwards",)\nPACKAGES = {}\n', "STAGES", id="unknown-stage"),
    pytest.param("foo", 'BACKEND = "foo"\nPACKAGES = dict(torch=("torch", None))\n', "plain literal",
                 id="not-a-literal"),
])
def test_a_malformed_declaration_names_file_and_field(tmp_path, name, body, match):
    with pytest.raises(DeclarationError, match=match):
        declaration.read(_folder(tmp_path, name, body))


def test_a_folder_without_backend_is_not_a_backend(tmp_path):
    assert declaration.read(_folder(tmp_path, "helpers", '"""Shared code."""\nX = 1\n')) is None


def test_register_refuses_an_undeclared_name_and_a_class_level_declaration():
    with pytest.raises(ValueError, match="no impls/nope/__init__.py declares"):
        register(type("Nope", (Backend,), {"name": "nope"}))
    with pytest.raises(ValueError, match="STAGES is declared in impls/reference/__init__.py"):
        register(type("Twice", (Backend,), {"name": "reference", "STAGES": ("forward",)}))


def test_register_refuses_a_declared_stage_the_class_lacks(monkeypatch):
    decl = dataclasses.replace(declarations()["reference"], stages=declaration.ALL_STAGES)
    monkeypatch.setattr("impls.registry.declarations", lambda: {"reference": decl})
    with pytest.raises(ValueError, match="does not implement"):
        register(type("Half", (Backend,), {"name": "reference"}))


# --- a one-folder backend written against the interface as it stands (three stages, @register, the declaration) ----
TOY_INIT = '''"""A backend of one folder: the reference's stages under another name."""

from impls.toykernels.backend import ToyBackend  # noqa: F401  (registers "toykernels")

BACKEND = "toykernels"
STAGES = ("chunk_cumsum", "fwd_pass_state", "compute_out", "forward")
PACKAGES = {"torch": ("torch", None)}
'''
TOY_BACKEND = '''"""The three stages, each the reference's."""

from impls.reference.chunk_cumsum import chunk_cumsum
from impls.reference.compute_out import compute_out
from impls.reference.fwd_pass_state import fwd_pass_state
from impls.registry import Backend, register


@register
class ToyBackend(Backend):
    name = "toykernels"

    def chunk_cumsum(self, dt, A, chunk_size, dt_bias, dt_softplus, dt_limit):
        return chunk_cumsum(dt, A, chunk_size, dt_bias, dt_softplus, dt_limit)

    def fwd_pass_state(self, B, x, dt, dA_cumsum, initial_states, seq_idx, state_dtype):
        return fwd_pass_state(B, x, dt, dA_cumsum, initial_states, seq_idx, state_dtype)

    def compute_out(self, C, B, x, dt, dA_cumsum, states, D, z, seq_idx):
        return compute_out(C, B, x, dt, dA_cumsum, states, D, z, seq_idx)
'''


@pytest.fixture
def toy_backend_folder(tmp_path, monkeypatch):
    """impls/toykernels/ as a folder outside the checkout, found as the registry finds every backend folder."""
    import sys

    import impls
    from impls import registry

    folder = tmp_path / "toykernels"
    folder.mkdir()
    (folder / "__init__.py").write_text(TOY_INIT)
    (folder / "backend.py").write_text(TOY_BACKEND)
    decl = declaration.read(folder)
    monkeypatch.setattr(impls, "__path__", [*impls.__path__, str(tmp_path)])
    monkeypatch.setitem(registry.BACKEND_MODULES, decl.name, decl.module)
    monkeypatch.setattr(registry, "declarations", lambda: {**declarations(), decl.name: decl})
    yield decl
    registry._REGISTRY.pop(decl.name, None)
    registry.clear_cache()
    for module in ("impls.toykernels.backend", "impls.toykernels"):
        sys.modules.pop(module, None)


def test_a_one_folder_backend_registers_and_runs_as_an_ssd_forward_backend(toy_backend_folder):
    """Written against today's interface, it needs nothing of the workloads: the SSD's forward goes through the same
    steps as for the backends in impls/ (gated stage by stage and whole, each stage and the forward timed)."""
    from experiments import bench
    from harness import plan
    from impls.problem import Problem, Shape

    cls = backend_class("toykernels")
    assert cls.STAGES == toy_backend_folder.stages and cls.__module__ == "impls.toykernels.backend"
    point = plan.point("toykernels", Problem(Shape(1, 32, 2, 8, 1, 8, 16), dtype="float32"),
                       bench=plan.BenchSettings(cpu_warmup=0, cpu_reps=1))
    assert point.workload == "ssd" and point.direction == "forward"
    rows = bench.measure(point)
    assert rows.status == "ok", rows.error
    df = rows.frame()
    assert set(df["backend"]) == {"toykernels"} and set(df["workload"]) == {"ssd"}
    assert (df.query("metric == 'ok'")["value"] == 1).all()
    assert set(df.query("metric == 'median_ms'")["stage"]) == {"chunk_cumsum", "fwd_pass_state", "compute_out",
                                                                "forward"}
