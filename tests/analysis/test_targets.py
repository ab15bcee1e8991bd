"""analysis.targets: a target holds only when it holds in every round and enough rounds are there; a subject that
matches two configurations is refused; the committed targets file parses."""

from __future__ import annotations

import pandas as pd
import pytest
import yaml

from analysis.targets import check, load_targets


def rows(backend: str, times: list[float], shape: str = "S1", ablation: str = "none", switches=None,
         config: str | None = None, status: str = "ok", second: int = 0, stage: str = "forward",
         frac_floor: float = float("nan")) -> list[dict]:
    return [{"stage": stage, "median_ms": t, "graph_median_ms": t * 0.9, "status": status, "backend": backend,
             "frac_floor": frac_floor,
             "ablation": ablation, "switch_dict": dict(switches or {}), "shape_name": shape,
             "config_hash": config or f"{backend}-{ablation}-{shape}", "timestamp": f"2026-12-05T04:0{k}:{second:02d}",
             "run_id": f"{config or backend}-{shape}-{status}-{k}"}
            for k, t in enumerate(times)]


SPEC = {"rounds": 3,
        "subjects": {"ours": {"backend": "triton", "switches": {"tma": True}}, "theirs": {"backend": "vllm"}},
        "targets": [{"id": "faster", "text": "t", "subject": "ours", "baseline": "theirs", "factor": 1.0,
                     "shapes": ["S1"]},
                    {"id": "bound", "text": "t", "subject": "ours", "at_most_ms": 1.0, "shapes": ["S1"]}]}


@pytest.mark.parametrize("ours, theirs, verdicts", [
    ([0.9, 0.95, 0.92], [1.0, 1.0, 1.0], ["holds", "holds"]),
    ([0.9, 1.05, 0.92], [1.0, 1.0, 1.0], ["fails in 1 of 3 rounds", "fails in 1 of 3 rounds"]),
    ([0.9, 0.95], [1.0, 1.0], ["too few rounds (2 of 3)", "too few rounds (2 of 3)"]),
], ids=["all-rounds-hold", "one-round-fails", "two-rounds-only"])
def test_verdict_per_round(ours, theirs, verdicts):
    w = pd.DataFrame(rows("triton", ours, switches={"tma": True, "exp2": True}) + rows("vllm", theirs))
    got = check(w, SPEC)
    assert got["verdict"].tolist() == verdicts


def test_subject_switches_and_failed_points_select():
    # the untuned Triton (tma off) and a failed point are not the subject
    w = pd.DataFrame(rows("triton", [0.5, 0.5, 0.5], switches={"tma": False}, config="off")
                     + rows("triton", [1.2, 1.2, 1.2], switches={"tma": True}, config="on")
                     + rows("triton", [0.1], switches={"tma": True}, config="on", status="failed")
                     + rows("vllm", [1.0, 1.0, 1.0]))
    got = check(w, SPEC).set_index("target")
    assert got.loc["bound", "verdict"] == "fails in 3 of 3 rounds"
    assert got.loc["faster", "rounds"].startswith("0.83×")


def test_a_subject_matching_two_configurations_is_refused():
    w = pd.DataFrame(rows("triton", [0.9] * 3, switches={"tma": True}, config="a")
                     + rows("triton", [0.8] * 3, switches={"tma": True, "exp2": False}, config="b")
                     + rows("vllm", [1.0] * 3))
    with pytest.raises(ValueError, match="matches 2 configurations at S1"):
        check(w, SPEC)


def test_committed_targets_parse():
    spec = load_targets()
    assert {t["id"] for t in spec["targets"]} >= {"triton_at_most_vllm", "cutile_s1"}


def failed_in_round_2(rows_: list[dict]) -> list[dict]:
    rows_[1]["status"] = "failed"
    return rows_


def no_graph_figure_in_round_2(rows_: list[dict]) -> list[dict]:
    rows_[1]["graph_median_ms"] = float("nan")
    return rows_


@pytest.mark.parametrize("metric, spoil", [
    ("median_ms", failed_in_round_2),
    ("graph_median_ms", no_graph_figure_in_round_2),
], ids=["baseline-failed-in-round-2", "baseline-without-the-metric-in-round-2"])
def test_rounds_pair_by_number_when_the_baseline_lacks_one(metric, spoil):
    """Round 3 of the subject is compared with round 3 of the baseline, never with the next round the baseline has
    (its drift is what the interleaving evens out): here the subject's slow round 2 has no baseline to meet."""
    spec = {"rounds": 2, "subjects": SPEC["subjects"],
            "targets": [{**SPEC["targets"][0], "metric": metric}]}
    w = pd.DataFrame(rows("triton", [0.9, 2.1, 1.8], switches={"tma": True}, second=1)
                     + spoil(rows("vllm", [1.0, 2.0, 2.0])))
    got = check(w, spec)
    assert got["verdict"].tolist() == ["holds"]
    assert got["rounds"].str.count(";").tolist() == [1]


@pytest.mark.parametrize("change, message", [
    ({"factor": None}, "give one of at_most_ms, at_least, or baseline \\+ factor"),
    ({"at_least": 0.5}, "give one of at_most_ms, at_least"),
    ({"stages": ["compute"]}, "stages \\['compute'\\]"),
    ({"metric": "graph_median"}, "metric 'graph_median'"),
], ids=["baseline-without-factor", "unknown-metric", "two-bounds", "unknown-stage"])
def test_bad_targets_are_refused_naming_them(tmp_path, change, message):
    target = {k: v for k, v in {**SPEC["targets"][0], **change}.items() if v is not None}
    path = tmp_path / "targets.yaml"
    path.write_text(yaml.safe_dump({**SPEC, "targets": [target]}))
    with pytest.raises(ValueError, match=f"target 'faster': {message}"):
        load_targets(path)


def test_stage_targets_from_below_and_the_20_us_cut():
    """A floor-fraction target per stage: at_least bounds frac_floor from below, per stage and round; a stage whose
    median is under min_median_ms in every round is not counted; the forward rows do not stand in for a stage."""
    spec = {"rounds": 2, "subjects": {"cu": {"backend": "cutile"}},
            "targets": [{"id": "floor", "text": "t", "subject": "cu", "metric": "frac_floor", "at_least": 0.6,
                         "stages": ["chunk_cumsum", "fwd_pass_state", "compute_out"], "min_median_ms": 0.02,
                         "host_note_below_ms": 0.05, "shapes": ["S1"]}]}
    w = pd.DataFrame(rows("cutile", [0.010, 0.011], stage="chunk_cumsum", frac_floor=0.3, config="cs")
                     + rows("cutile", [0.21, 0.21], stage="fwd_pass_state", frac_floor=0.62, config="fs")
                     + rows("cutile", [0.63, 0.64], stage="compute_out", frac_floor=0.33, config="co")
                     + rows("cutile", [0.85, 0.86], frac_floor=0.9, config="fw")
                     + rows("cutile", [0.030, 0.031], shape="S2", stage="chunk_cumsum", frac_floor=0.42, config="c2"))
    spec["targets"][0]["shapes"] = ["S1", "S2"]
    got = check(w, spec).set_index(["stage", "shape"])
    assert got.loc[("chunk_cumsum", "S1"), "verdict"] == "not counted (median under 20 µs)"
    assert got.loc[("fwd_pass_state", "S1"), "verdict"] == "holds"
    assert got.loc[("compute_out", "S1"), "verdict"] == "fails in 2 of 2 rounds"  # 0.63 ms: no host note
    assert got.loc[("compute_out", "S1"), "rounds"] == "0.330; 0.330"
    assert got.loc[("chunk_cumsum", "S2"), "verdict"].startswith("fails in 2 of 2 rounds (an eager median under 50")
