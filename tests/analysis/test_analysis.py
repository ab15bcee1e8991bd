"""CPU tests of the analysis package on small hand-made frames with known answers (a 2x speedup reads 2.0, a
switch costing 10 % reads -10 %, a no-op switch is labelled and gets no effect), the loaders, the claims
statuses, and the report CLI on the synthetic fixture (every section and table present, figures as PNG+SVG)."""

from __future__ import annotations

import json
import math
import uuid
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis import (
    ablation_table,
    accuracy_table,
    compare_claims,
    compile_table,
    load_claims,
    load_results,
    resolve_results,
    roofline_table,
    seqlen_table,
    speedup_table,
    wide,
)
from analysis.ablation import printable
from analysis.load import MixedRuns, legacy_group, newest_run, runs
from analysis.markdown import fmt
from analysis.noise import WITHIN_NOISE, relative_noise, shown_effect
from analysis.switches import normalise_noop
from harness import store

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "h200_synthetic.parquet"
S1 = (8, 4096, 80, 64, 1, 128, 256)
DIMS = ("batch", "seqlen", "nheads", "headdim", "ngroups", "dstate", "chunk_size")


def point(backend, ms, *, shape_name="S1", dims=S1, stage="forward", spread=0.0, switches=None, ablation="none",
          gpu_cc="9.0", dtype="bfloat16", extra=None, ceilings=None, status="ok", tiles="retuned"):
    """Rows of one point: `stage` timed at `ms` (p20/p80 at ±spread), plus `extra` {(stage, metric): value};
    `tiles`: its tile_protocol."""
    base = {"schema_version": 1, "run_id": uuid.uuid4().hex, "sweep_id": "test", "sweep_name": "test",
            "tile_protocol": tiles,
            "backend": backend, "switches": json.dumps(switches or {}, sort_keys=True), "ablation": ablation,
            "shape_name": shape_name, **dict(zip(DIMS, dims)), "dtype": dtype, "gpu_name": "NVIDIA H200",
            "gpu_cc": gpu_cc, "device_name": "NVIDIA H200", "status": status, "timestamp": "t"}
    values = {}
    if ms is not None:
        values.update({(stage, "median_ms"): ms, (stage, "p20_ms"): ms * (1 - spread),
                       (stage, "p80_ms"): ms * (1 + spread)})
    values.update(extra or {})
    for k, v in (ceilings or {}).items():
        values[("ceiling", k)] = v
    values[("point", "ok")] = 1.0
    return [{**base, "stage": s, "metric": m, "value": float(v)} for (s, m), v in values.items()]


def frame(*points):
    return store.frame([r for p in points for r in p])


# --- speedup ------------------------------------------------------------------------------------------------
def test_twice_as_fast_reads_2():
    t = speedup_table(frame(point("mamba_ssm", 2.0), point("cutile", 1.0)), with_geomean=False)
    row = t[t["backend"] == "cutile"].iloc[0]
    assert row["speedup"] == pytest.approx(2.0)
    assert t[t["backend"] == "mamba_ssm"]["speedup"].iloc[0] == pytest.approx(1.0)


def test_geomean_and_p20_p80_interval():
    s2 = (1, 65536, 80, 64, 1, 128, 256)
    t = speedup_table(frame(point("mamba_ssm", 2.0, spread=0.1), point("cutile", 1.0, spread=0.1),
                            point("mamba_ssm", 8.0, shape_name="S2", dims=s2), point("cutile", 1.0, shape_name="S2",
                                                                                       dims=s2)))
    s1 = t[(t["backend"] == "cutile") & (t["case"] == "S1")].iloc[0]
    assert s1["speedup_lo"] == pytest.approx(1.8 / 1.1) and s1["speedup_hi"] == pytest.approx(2.2 / 0.9)
    assert s1["spread"] == "p20-p80"
    geo = t[(t["backend"] == "cutile") & (t["shape_name"] == "geomean")].iloc[0]
    assert geo["speedup"] == pytest.approx(4.0)  # sqrt(2 * 8)


def test_repeats_give_the_median_and_min_max():
    t = speedup_table(frame(point("mamba_ssm", 2.0), point("cutile", 1.0), point("cutile", 1.5),
                            point("cutile", 1.2)), with_geomean=False)
    row = t[t["backend"] == "cutile"].iloc[0]
    assert row["time_ms"] == pytest.approx(1.2) and row["n_runs"] == 3
    assert row["spread"] == "repeats min-max" and (row["time_lo"], row["time_hi"]) == (1.0, 1.5)


def test_ablation_points_and_failed_points_stay_out_of_speedups():
    t = speedup_table(frame(point("mamba_ssm", 2.0), point("cutile", 1.0),
                            point("cutile", 0.1, ablation="tma"), point("cutile", 0.1, status="failed")),
                      with_geomean=False)
    assert t[t["backend"] == "cutile"]["speedup"].tolist() == [pytest.approx(2.0)]


def test_missing_baseline_is_an_error_naming_the_backends():
    with pytest.raises(ValueError, match="cutile"):
        speedup_table(frame(point("cutile", 1.0)), baseline="mamba_ssm")


# --- ablation -----------------------------------------------------------------------------------------------
D = {"costly": True, "good": True, "noop": True, "untested": True, "tile": 0}


def ablation_frame():
    off = dict.fromkeys(["costly", "good", "noop", "untested"], False)
    return frame(
        point("cutile", 1.1, switches=D),                                               # default
        point("cutile", 1.0, switches={**D, "costly": False}, ablation="costly"),       # costs 10 %
        point("cutile", 2.2, switches={**D, "good": False}, ablation="good"),           # halves the time
        point("cutile", 1.1, switches={**D, "noop": False}, ablation="noop"),
        point("cutile", 2.0, switches={**D, **off}, ablation="all_off"),
        point("cutile", 2.2, switches={**D, **off, "costly": True}),                    # costly alone
        point("cutile", 1.21, switches={**D, "tile": 64}, ablation="tile:64"),
        point("cutile", 0.88, switches={**D, "tile": 32, "extra": True}, ablation="tile:32+extra:True"),
    )


def test_switch_costing_10_percent_reads_minus_10():
    t = ablation_table(ablation_frame(), "cutile", noop_switches={"sm_90": {"noop": "identical SASS"}})
    r = t.set_index("switch")
    assert r.loc["costly", "effect_on_top"] == pytest.approx(-0.10)
    assert r.loc["costly", "effect_alone"] == pytest.approx(-0.10)  # 1 - 2.2 / 2.0
    assert r.loc["costly", "status"] == "measured"
    assert r.loc["good", "effect_on_top"] == pytest.approx(0.5)
    assert r.loc["all (default vs all off)", "effect_on_top"] == pytest.approx(1 - 1.1 / 2.0)
    assert r.loc["tile=64", "effect_on_top"] == pytest.approx(1 - 1.1 / 1.21)
    # two settings at once (a point joined by "+"): one row, the defaults over the combination (it is faster)
    assert r.loc["extra=True+tile=32", "effect_on_top"] == pytest.approx(1 - 1.1 / 0.88)
    assert "all_off" not in " ".join(r.index) and len([k for k in r.index if "+" in k]) == 1


def test_a_pinned_ablation_point_is_labelled_apart():
    """The `good` point borrowed the default's tiles (pinned): its figures stay, its status says apart and why;
    rows written before the column read unknown, never measured."""
    points = [point("cutile", 1.1, switches=D), point("cutile", 2.2, switches={**D, "good": False}, ablation="good",
                                                          tiles="pinned"),
              point("cutile", 1.0, switches={**D, "costly": False}, ablation="costly", tiles=None)]
    r = ablation_table(frame(*points), "cutile", noop_switches={}).set_index("switch")
    assert r.loc["good", "status"] == "apart: pinned / retuned (measured (on top); alone not measured)"
    assert r.loc["good", "tiles"] == "pinned / retuned" and r.loc["good", "effect_on_top"] == pytest.approx(0.5)
    assert r.loc["costly", "status"].startswith("apart: unknown / retuned")


def test_noop_switch_is_labelled_never_measured():
    t = ablation_table(ablation_frame(), "cutile", noop_switches={"sm_90": {"noop": "identical SASS"}}).set_index(
        "switch")
    assert t.loc["noop", "status"].startswith("no-op on sm_90")
    assert math.isnan(t.loc["noop", "effect_on_top"]) and math.isnan(t.loc["noop", "effect_alone"])
    assert t.loc["untested", "status"] == "not measured"
    # the same switch on another architecture is measured as usual
    t100 = ablation_table(ablation_frame(), "cutile", noop_switches={"sm_100": ["noop"]}).set_index("switch")
    assert t100.loc["noop", "effect_on_top"] == pytest.approx(0.0)


def test_noop_table_layouts():
    rows = {"generated_by": "x", "rows": [
        {"stage": s, "dtype": "bfloat16", "switch": "tma", "arch": "sm_90", "effect": "no-op on sm_90"}
        for s in ("chunk_cumsum", "fwd_pass_state", "compute_out")] + [
        {"stage": "chunk_cumsum", "dtype": "bfloat16", "switch": "exp2", "arch": "sm_90", "effect": "no-op on sm_90"},
        {"stage": "compute_out", "dtype": "bfloat16", "switch": "exp2", "arch": "sm_90",
         "effect": "changes sm_90 SASS"}]}
    t = normalise_noop(rows)
    assert t.reason("sm_90", "tma", "forward", "bfloat16")  # a no-op in every stage: a no-op for the forward
    assert t.reason("sm_90", "exp2", "forward", "bfloat16") is None
    assert t.reason("sm_90", "exp2", "chunk_cumsum", "bfloat16")
    assert t.reason("sm_100", "tma", "forward", "bfloat16") is None
    assert normalise_noop({"tma": {"sm90": {"noop": True, "why": "w"}}}).reason("sm_90", "tma") == "w"
    assert normalise_noop({"cutile": {"9.0": ["tma"]}}, "cutile").reason("sm_90", "tma") == "no-op"


# --- roofline, scaling, accuracy, compile -------------------------------------------------------------------
def test_roofline_at_the_compute_ceiling_reads_1():
    f = frame(point("cutile", 10.0, stage="compute_out", ceilings={"matmul_tflops": 100.0, "copy_gbps": 1000.0},
                    extra={("compute_out", "flops"): 1e12, ("compute_out", "bytes"): 1e9}))
    r = roofline_table(f).iloc[0]
    assert r["tflops"] == pytest.approx(100.0) and r["gbps"] == pytest.approx(100.0)
    assert r["floor_ms"] == pytest.approx(10.0) and r["frac_floor"] == pytest.approx(1.0) and r["bound"] == "compute"
    ncu = pd.DataFrame({"run_id": [r.name if False else f["run_id"].iloc[0]], "stage": ["compute_out"],
                        "dram_bytes": [3e9]})
    assert roofline_table(f, ncu=ncu).iloc[0]["traffic_excess"] == pytest.approx(3.0)


def test_seqlen_scaling_linear_reads_1():
    pts = [point("triton", 0.5 * L / 1024, dims=(1, L, 80, 64, 1, 128, 256), shape_name="sl") for L in (1024, 4096)]
    t = seqlen_table(frame(*pts))
    assert t["scaling"].tolist() == pytest.approx([1.0, 1.0])
    assert t["tokens_per_s"].iloc[0] == pytest.approx(1024 / 0.5e-3)


def test_accuracy_worst_error_over_tolerance():
    pts = [point("triton", None, extra={("forward", "rel_err"): e, ("forward", "tol"): 0.02}) for e in (0.01, 0.03)]
    t = accuracy_table(frame(*pts))
    r = t[t["stage"] == "forward"].iloc[0]
    assert r["rel_err"] == pytest.approx(0.03) and r["err_over_tol"] == pytest.approx(1.5) and r["n"] == 2


def test_compile_cost_calls_to_amortize():
    t = compile_table(frame(point("cutile", 2.0, extra={("forward", "compile_s"): 4.0})))
    assert t.iloc[0]["calls_to_amortize"] == pytest.approx(2000.0)


def _on(rows, **columns):
    return [{**r, **columns} for r in rows]


# --- one run per table ---------------------------------------------------------------------------------------
def _two_points(**second):
    """A mamba_ssm and a cuTile point (a speedup, an ablation-free table) with the second one's columns changed."""
    return frame(_on(point("mamba_ssm", 2.0, extra={("forward", "compile_s"): 4.0}), gpu_uuid="GPU-a"),
                 _on(point("cutile", 1.0, extra={("forward", "compile_s"): 8.0}), **{"gpu_uuid": "GPU-a", **second}))


TABLES = {"speedup": lambda f: speedup_table(f), "compile": compile_table, "accuracy": accuracy_table,
          "roofline": roofline_table, "seqlen": seqlen_table, "ablation": lambda f: ablation_table(f, "cutile"),
          "claims": lambda f: compare_claims(f, [claim()])}


@pytest.mark.parametrize("make", [pytest.param(m, id=name) for name, m in TABLES.items()])
def test_a_table_from_two_run_groups_is_refused(make):
    """Rows of two runs (scripts/rounds.sh or gpu_session.sh invocations) never share a table: the error names the
    column and both values."""
    make(_two_points(run_group="run-1").assign(run_group="run-1"))  # one run: fine
    two = _two_points(run_group="run-2").assign(run_group=lambda d: d["run_group"].fillna("run-1"))
    with pytest.raises(MixedRuns, match="run_group: run-1, run-2"):
        make(two)


def test_a_table_from_two_gpus_is_refused():
    with pytest.raises(MixedRuns, match="gpu_uuid: GPU-a, GPU-b"):
        compile_table(_two_points(gpu_uuid="GPU-b"))
    with pytest.raises(MixedRuns, match="gpu_name: NVIDIA H100 80GB HBM3, NVIDIA H200"):  # rows without a uuid
        compile_table(_two_points(gpu_uuid=None, gpu_name="NVIDIA H100 80GB HBM3"))


def test_a_table_from_two_source_trees_is_refused():
    """The tree part of code_key (before the first "|"), whichever form code_key takes."""
    with pytest.raises(MixedRuns, match="source_tree: abc\\+d1, def"):
        compile_table(_two_points(code_key="def").assign(code_key=lambda d: d["code_key"].fillna("abc+d1|v:1")))
    compile_table(_two_points(code_key="abc|v:2").assign(code_key=lambda d: d["code_key"].fillna("abc|v:1")))


def test_rows_before_run_group_count_one_group_per_invocation_or_sweep():
    """Rows from before schema version 5: the sweep root a script made for one invocation (rounds.sh's rounds-*, whose
    rounds are several sweeps) is one run; elsewhere each sweep_id is a run of its own."""
    cfg = "results_dir: /tmp/rounds-AbC123/headline\nseed: 0\n"
    assert legacy_group("2026-12-05_21-19-23", cfg) == legacy_group("2026-12-05_21-25-50", cfg) == "rounds-AbC123"
    assert legacy_group("s1", "results_dir: /tmp/sweeps/headline\n") == "sweep s1"
    compile_table(_two_points(sweep_id="other", config=cfg).assign(config=cfg))
    with pytest.raises(MixedRuns, match="run_group: sweep other, sweep test"):
        compile_table(_two_points(sweep_id="other"))


def test_the_newest_run_is_the_one_measured_last():
    rows = _two_points(run_group="run-2", timestamp="u").assign(run_group=lambda d: d["run_group"].fillna("run-1"))
    assert set(newest_run(wide(rows))["run_group"]) == {"run-2"}
    assert runs(rows)["run_group"].tolist() == ["run-2", "run-1"]


# --- noise ----------------------------------------------------------------------------------------------------
def test_an_effect_inside_noise_prints_within_noise():
    """A switch costing 10 %: printed when both points' p20–p80 spreads are narrower, "within noise" when one
    point's spread (or its rounds' range) is wider than the effect."""
    assert shown_effect(-0.10, 0.02, 0.001) == "-10.0 %" and shown_effect(-0.10, 0.02, 0.12) == WITHIN_NOISE
    assert relative_noise(pd.DataFrame({"run_id": ["a", "b"], "median_ms": [1.0, 1.2], "p20_ms": [0.99, 1.19],
                                        "p80_ms": [1.01, 1.21]})) == pytest.approx(0.2 / 1.1)
    narrow = ablation_table(ablation_frame(), "cutile").set_index("switch")
    assert narrow.loc["costly", "on_top"] == "-10.0 %"
    wide_spread = frame(point("cutile", 1.1, switches=D, spread=0.06),
                        point("cutile", 1.0, switches={**D, "costly": False}, ablation="costly", spread=0.06))
    t = ablation_table(wide_spread, "cutile").set_index("switch")
    assert t.loc["costly", "effect_on_top"] == pytest.approx(-0.10) and t.loc["costly", "on_top"] == WITHIN_NOISE
    assert "-10.0 %" not in printable(t).to_string()


def test_time_summary_keeps_problems_apart():
    """The same shape under two problems (plain, with initial states) is two workloads, not two repeats."""
    from analysis.speedup import time_summary

    rows = frame(_on(point("triton", 1.0), problem_name="headline"),
                 _on(point("triton", 3.0), problem_name="with_initial_states"))
    t = time_summary(wide(rows)).set_index("problem_name")
    assert t.loc["headline", "time_ms"] == 1.0 and t.loc["with_initial_states", "time_ms"] == 3.0
    assert (t["n_runs"] == 1).all()


def test_speedups_of_two_problems_are_not_pooled():
    """Two problems at one shape: a case each, and a geomean each (2x and 6x), never one 3.46x over both."""
    rows = frame(*(_on(point(backend, ms), problem_name=problem) for problem, base in (("headline", 2.0), ("init", 6.0))
                   for backend, ms in (("mamba_ssm", base), ("cutile", 1.0))))
    t = speedup_table(rows)
    cutile = t[(t["backend"] == "cutile") & (t["stage"] == "forward")].set_index("case")["speedup"]
    assert cutile.to_dict() == pytest.approx({"S1/headline": 2.0, "S1/init": 6.0, "geomean/headline": 2.0,
                                              "geomean/init": 6.0})
    from analysis.speedup import speedup_matrix

    assert speedup_matrix(t)["cutile"].to_dict() == pytest.approx(cutile.to_dict())


# --- claims -------------------------------------------------------------------------------------------------
def claim(**kw):
    return {"id": "c", "source": "s", "url": "https://example.org", "quote": "q", "kind": "speedup",
            "claimed": {"low": 2.0, "high": 2.0}, "comparable_arch": ["sm_90"],
            "ours": {"backend": "cutile", "baseline": "mamba_ssm", "stage": "forward"}, **kw}


@pytest.mark.parametrize("kw, status", [
    pytest.param({}, "reproduced", id="reproduced"),
    pytest.param({"claimed": {"low": 3.0, "high": 3.5}}, "not reproduced", id="not-reproduced"),
    pytest.param({"comparable_arch": ["sm_100"]}, "not comparable", id="other-arch"),
    pytest.param({"blackwell_only": True}, "not reproducible here: Blackwell-only", id="blackwell"),
    pytest.param({"proxy": "not their kernel"}, "context only", id="proxy"),
    pytest.param({"url": None}, "source not located", id="no-source"),
    pytest.param({"ours": {"backend": "fla", "baseline": "mamba_ssm"}}, "not measured", id="not-measured"),
])
def test_claim_status(kw, status):
    t = compare_claims(frame(point("mamba_ssm", 2.0), point("cutile", 1.0)), [claim(**kw)])
    assert t["status"].iloc[0].startswith(status)


def test_a_claim_can_name_the_switches_of_its_point():
    """ours.switches keeps only the backend's points run with those switches (the fused Triton arrangement beside
    the staged one of the same run); the baseline's rows are untouched."""
    rows = frame(point("mamba_ssm", 2.0), point("triton", 1.0, switches={"fuse_state_out": False}),
                 point("triton", 4.0, switches={"fuse_state_out": True}))
    ours = {"backend": "triton", "baseline": "mamba_ssm", "stage": "forward", "switches": {"fuse_state_out": True}}
    t = compare_claims(rows, [claim(ours=ours, claimed={"low": 1.5, "high": 2.5})])
    assert t["measured"].iloc[0].startswith("0.5× (triton fuse_state_out=True over mamba_ssm")
    assert t["status"].iloc[0] == "not reproduced"


def test_a_claim_can_name_the_switches_of_its_baseline():
    """ours.baseline_switches keeps only the baseline's points run with those switches (a tuned Triton beside an
    untuned one of the same run), and the description names them; a point of an ablation sweep counts when the
    claim names its switches (cuTile's switches run as an arm's ablation), and not otherwise."""
    rows = frame(point("cutile", 2.0), point("cutile", 1.0, switches={"heads_first": True}, ablation="heads_first:True"),
                 point("triton", 3.0, switches={"tma": False}), point("triton", 1.5, switches={"tma": True}),
                 point("triton", 0.5, switches={"tma": True}, ablation="exp2"))
    ours = {"backend": "cutile", "baseline": "triton", "stage": "forward", "switches": {"heads_first": True},
            "baseline_switches": {"tma": True}}
    t = compare_claims(rows, [claim(ours=ours, claimed={"low": 1.4, "high": 1.6})])
    assert t["measured"].iloc[0].startswith("1.5× (cutile heads_first=True over triton tma=True")
    assert t["status"].iloc[0] == "reproduced"


def test_claims_file_has_sources_and_quotes():
    claims = load_claims()
    assert {"megatron_cutedsl_ssd", "pytorch_fused_triton_ssd", "tilelang_chunk_scan_h800"} <= {c["id"] for c in claims}
    for c in claims:
        assert c.get("url") or "not" in str(c.get("note", "")), c["id"]
        if c.get("url"):
            assert c["url"].startswith("https://") and c.get("quote") and c.get("gpu"), c["id"]


# --- loading and the report -----------------------------------------------------------------------------------
def test_missing_results_path_is_an_error(tmp_path, monkeypatch):
    monkeypatch.delenv("SSD_RESULTS", raising=False)
    with pytest.raises(FileNotFoundError, match="nowhere"):
        resolve_results(tmp_path / "nowhere")


def test_folder_of_parquet_and_real_cpu_bench_rows(tmp_path):
    f = frame(point("mamba_ssm", 2.0), point("cutile", 1.0))
    store.write_atomic(f.iloc[:5], tmp_path / "a" / "x.parquet")
    store.write_atomic(f.iloc[5:], tmp_path / "b" / "y.parquet")
    assert len(load_results(tmp_path)) == len(f)
    w = wide(ROOT / "tests" / "fixtures" / "cpu_bench")  # two real points from `experiments.bench experiment=cpu`
    assert set(w["backend"]) == {"reference", "mamba_ssm"} and (w["arch"] == "cpu").all()
    assert not w.duplicated(["run_id", "stage"]).any() and w["median_ms"].notna().sum() == 8
    assert speedup_table(w, baseline="reference")["speedup"].notna().all()


def test_schema_is_checked():
    with pytest.raises(ValueError, match="schema columns"):
        load_results(pd.DataFrame({"stage": ["forward"]}))


def test_markdown_formats_effects_as_signed_percent():
    assert fmt(-0.1, "effect_on_top") == "-10.0 %" and fmt(np.nan, "x") == ""


def test_report_contains_every_table_and_figure(tmp_path):
    from analysis import report

    assert report.main([str(FIXTURE), "-o", str(tmp_path)]) == 0
    md = (tmp_path / "report.md").read_text()
    for section in report.SECTIONS:
        assert f"## {section}" in md, section
    assert "SYNTHETIC FIXTURE" in md
    tables = report.tables(wide(load_results(FIXTURE)))
    tables["ablation"] = printable(tables["ablation"])  # as printed: the effects within noise or as percentages
    for name, t in tables.items():
        if len(t.columns) and len(t):
            header = "| " + " | ".join(str(c) for c in t.columns if c != "meaning") + " |"
            assert header in md or name == "speedup", name  # the speedup table appears as matrices and in full
    for fig in ("speedup_forward", "ablation", "roofline", "seqlen_scaling", "accuracy", "compile_cost"):
        assert (tmp_path / "figures" / f"{fig}.png").stat().st_size > 1000
        assert (tmp_path / "figures" / f"{fig}.svg").is_file()
    assert "| megatron_cutedsl_ssd |" in md and "not reproducible here: Blackwell-only" in md


def test_tuned_points_are_not_pooled_with_fallback_points():
    """A backend's points on searched/recorded configs form their own "[tuned]" column
    (results/2026-12-02-h200-headline-ablations has both)."""
    import pandas as pd

    from analysis.speedup import tuned_label

    w = pd.DataFrame({"backend": ["cutile", "cutile", "cutile", "mamba_ssm"],
                      "tuning": ['{"compute_out": "fallback"}', '{"compute_out": "search"}',
                                 '{"compute_out": "record"}', "none"]})
    assert tuned_label(w).tolist() == ["cutile", "cutile[tuned]", "cutile[tuned]", "mamba_ssm"]


@pytest.mark.parametrize("ablation, switches, expect", [
    pytest.param("none", {"exp2": True, "operand_swap": True}, "triton", id="declared-defaults"),
    pytest.param("none", {"exp2": True, "tuning": "search"}, "triton", id="tuning-mode-is-not-a-variant"),
    pytest.param("none", {"decay_factor": None}, "triton", id="not-recorded-is-the-default"),
    pytest.param("none", {"decay_factor": True, "block_rows": 64}, "triton{block_rows=64,decay_factor=True}",
                 id="switches-set-outside-an-ablation"),
    pytest.param("exp2", {"exp2": False}, "triton[exp2]", id="ablation-point"),
    pytest.param("none", {"warp_specialize": True, "tma": True}, "triton{tma=True,warp_specialize=True}",
                 id="a-retired-switch-in-committed-rows"),
    pytest.param("none", {"warp_specialize": False}, "triton", id="a-retired-switch-at-its-default"),
])
def test_point_label_keeps_variants_apart(ablation, switches, expect):
    """Points run with switches away from the defaults (outside an ablation) are never pooled with the defaults;
    committed rows of a switch retired since (analysis/retired_switches.json) keep their label."""
    from analysis.load import point_label

    assert point_label("triton", ablation, switches) == expect


def test_a_retired_switch_keeps_its_no_op_stages():
    """The switch-effects rows of a retired switch (analysis/retired_switches.json) still mark the stages whose code
    it left as the defaults' (two_warpgroups changed compute_out's kernel only)."""
    from analysis.switches import noop_table

    table = noop_table("cutile")
    assert table.reason("sm_90", "two_warpgroups", "chunk_cumsum", "bfloat16")
    assert table.reason("sm_90", "two_warpgroups", "compute_out", "bfloat16") is None
