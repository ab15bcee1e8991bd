"""experiments/layer_bench.py on the CPU (wall clock, tiny shape): a backend that runs is gated then timed, one
that cannot run is refused with its reason, one whose output is wrong fails its gate and is not timed; bad
arguments raise naming them. Speed is never asserted."""

from __future__ import annotations

import json
import math

import pytest
import torch

from experiments import layer_bench
from impls.problem import Shape
from impls.reference.backend import ReferenceBackend

TINY = ["--shape", "tiny", "--device", "cpu", "--seqlen", "64", "--cpu-reps", "1", "--dtype", "float32"]


def test_gated_then_timed_and_refusals_recorded(tmp_path, capsys):
    out = tmp_path / "layer.jsonl"
    results = layer_bench.main(["--backends", "reference,cutile", *TINY, "--json", str(out)])
    ok, refused = results
    assert ok.status == "ok" and ok.backend == "reference" and ok.timer == "cpu-wall"
    assert all(err <= ok.gate.tolerance for err in ok.gate.errors.values()) and "out" in ok.gate.errors
    for times in (ok.layer, ok.ssd):
        assert set(times) == {"median_ms", "p20_ms", "p80_ms"} and all(v > 0 for v in times.values())
    assert math.isfinite(ok.ssd_share) and ok.ssd_share > 0
    assert ok.describe["ssd"]["backend"] == "reference"
    assert refused.status == "refused" and "cutile" in refused.reason and not refused.layer
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["backend"] for r in rows] == ["reference", "cutile"] and rows[0]["shape_sizes"]["seqlen"] == 64
    assert "git_commit" in rows[0] and "v_torch" in rows[0]
    printed = capsys.readouterr().out
    assert "ssd share" in printed and "REFUSED" in printed


def test_a_wrong_output_fails_the_gate_and_is_not_timed(monkeypatch):
    """A planted fault: the reference backend's y plus 1 % of its time-reversed self (a scaled y would pass: the
    RMSNorm after the SSD undoes a scale)."""
    compute_out = ReferenceBackend.compute_out

    def off_by_one_percent(self, *args):
        y = compute_out(self, *args)
        return y + 0.01 * y.flip(1)

    monkeypatch.setattr(ReferenceBackend, "compute_out", off_by_one_percent)
    (result,) = layer_bench.main(["--backends", "reference", *TINY])
    assert result.status == "gate-failed" and "out" in result.gate.failures
    assert not result.layer and not result.ssd and math.isnan(result.ssd_share)


@pytest.mark.parametrize("argv, match", [
    pytest.param(["--backends", "reference", "--shape", "no_such_shape"], "--shape", id="unknown-shape"),
    pytest.param(["--backends", ",", "--shape", "tiny"], "--backends", id="no-backend"),
    pytest.param(["--backends", "reference", "--shape", "tiny", "--switch", "triton.tma=True"], "--switch",
                 id="switch-of-another-backend"),
    pytest.param(["--backends", "triton", "--shape", "tiny", "--switch", "triton.tma"], "--switch",
                 id="switch-without-value"),
    pytest.param(["--backends", "reference", "--shape", "tiny", "--seqlen", "-1"], "--seqlen", id="seqlen-negative"),
])
def test_bad_arguments_raise_naming_them(argv, match):
    with pytest.raises(ValueError, match=f"^{match}"):
        layer_bench.parse_args(argv)


def test_layer_sizes_come_from_the_shape():
    config = layer_bench.layer_config(Shape(1, 2048, 80, 64, 1, 128, 256))
    assert (config.d_model, config.nheads, config.headdim, config.d_state, config.chunk_size) == (2560, 80, 64, 128,
                                                                                                  256)
    with pytest.raises(ValueError, match="^--shape"):
        layer_bench.layer_config(Shape(1, 64, 3, 5, 1, 16, 32), expand=2)
    settings = layer_bench.parse_args(["--backends", "triton", "--shape", "tiny", "--switch", "triton.exp2=False"])
    assert settings.switches == {"triton": {"exp2": False}} and settings.dtype == torch.bfloat16
