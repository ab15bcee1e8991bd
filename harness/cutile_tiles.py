"""cuTile's tuned tiles as pins for another backend: the value one field of a stage took in cuTile's committed
tuning record for a headline shape (tuning/<gpu>/cutile_<stage>.json, default switches, bf16), so that a Triton
build can run the same arrangement at the same tiles (conf/experiment/language_vs_trick.yaml).

The records read are those of the GPU the run is on, the ones cuTile's own point of the experiment runs with
(conf/lvt/cutile.yaml asks for them with `tuning=record`). Without CUDA (a config composed on a CPU machine, the
tests) they are the H200's, the machine the committed records were searched on. Before this, the H200's records
pinned the Triton point on any card: on an H100 without cuTile records at S2-S4, cuTile ran on its fallback tiles
there while Triton ran at the H200's tuned ones (results/2026-12-05-h100-lvt-v23-rounds/README.md).

Hydra reads it through the resolver `${ssd_cutile_tile:<shape>,<stage>,<field>}` (harness.config); a shape
without a record raises ConfigError naming the record file and key, never a silent default. The field
`cb_mode` is compute_out's `shared_cb` as Triton's switch ("shared" / "inline").
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from impls import tuning
from impls.problem import Shape

CONF = Path(__file__).resolve().parent.parent / "conf"
DEFAULT_GPU = "NVIDIA H200"  # the machine cuTile's committed records were searched on
DTYPE = "bfloat16"


class MissingRecord(LookupError):
    """No cuTile record for the shape and stage (the caller turns it into a ConfigError)."""


def shape_key(shape_name: str, stage: str) -> str:
    """The shape part of cuTile's record key: chunk_cumsum's is (batch, seqlen, heads, chunk), the others' the
    full shape label."""
    s = OmegaConf.load(CONF / "shape" / f"{shape_name}.yaml")
    if stage == "chunk_cumsum":
        return f"b{s.batch}-l{s.seqlen}-h{s.nheads}-c{s.chunk_size}"
    return Shape(s.batch, s.seqlen, s.nheads, s.headdim, s.ngroups, s.dstate, s.chunk_size).label()


def tune_key(shape_name: str, stage: str) -> str:
    """The record key of `stage` at `shape_name` under cuTile's default switches, in bf16."""
    from impls.cutile import tune
    from impls.cutile.switches import CutileSwitches

    return tune.record_key(stage, CutileSwitches(), shape_key(shape_name, stage), DTYPE)


def records_gpu() -> str:
    """The GPU whose records pin the tiles: the one this process runs on, else (no CUDA) DEFAULT_GPU."""
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else DEFAULT_GPU


def tuned(shape_name: str, stage: str, gpu: str | None = None) -> dict:
    """cuTile's tuned config of `stage` at `shape_name` (default switches, bf16) on `gpu` (default: records_gpu())."""
    gpu = gpu or records_gpu()
    key = tune_key(shape_name, stage)
    record = tuning.lookup("cutile", stage, gpu, key)
    if record is None:
        raise MissingRecord(f"no cuTile record for {stage} at {shape_name} on {gpu}: key {key!r} not in "
                            f"{tuning.record_path('cutile', stage, gpu)}")
    return dict(record["config"])


def tile(shape_name: str, stage: str, field: str):
    """One field of cuTile's tuned config, in the Triton switch's terms."""
    config = tuned(shape_name, stage)
    if field == "cb_mode":
        return "shared" if config["shared_cb"] else "inline"
    if field not in config:
        raise MissingRecord(f"cuTile's {stage} record at {shape_name} has no field {field!r} ({sorted(config)})")
    return config[field]
