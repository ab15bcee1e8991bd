"""`python -m analysis.report [<results>] -o <dir> [--baseline mamba_ssm]`: every table and figure as one
Markdown report (<dir>/report.md, figures as PNG and SVG under <dir>/figures/).

<results> is what analysis.load.load_results takes: a Parquet file, a results folder, index:<experiment>[,...]
(results/index.yaml; the default is the current headline), or wandb:<entity>/<project>: the rows of one run
(analysis.load.one_run; a source of several runs is refused, naming them).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from analysis import figures
from analysis.ablation import ablation_table, printable
from analysis.claims import compare_claims
from analysis.load import is_synthetic, load_results, one_run, resolve_results, wide
from analysis.markdown import table
from analysis.roofline import roofline_table
from analysis.scaling import accuracy_matrix, accuracy_table, compile_table, seqlen_table
from analysis.speedup import speedup_matrix, speedup_table

# Section titles, in order: the test checks each appears in the report.
SECTIONS = ("Points", "Speedup", "Ablations", "Roofline", "Sequence-length scaling", "Accuracy", "First-call cost",
            "Published claims")


def tables(results, baseline: str = "mamba_ssm", noop_switches=None) -> dict[str, pd.DataFrame]:
    """Every table of the report, by name (the notebooks show the same ones), from one run's rows."""
    w = one_run(results if "label" in getattr(results, "columns", []) else wide(results), "report")
    out: dict[str, pd.DataFrame] = {}
    pts = w[w["stage"] == "point"]
    out["points"] = pts.groupby(["backend", "status", "sweep_name"], dropna=False).size().rename("points") \
        .reset_index()
    out["failures"] = pts[pts["status"] != "ok"][["backend", "shape_name", "dtype", "ablation", "error"]]
    try:
        out["speedup"] = speedup_table(w, baseline=baseline)
    except ValueError as exc:  # no baseline timing: the report says so instead of failing
        out["speedup"] = pd.DataFrame({"note": [str(exc)]})
    ablation_backends = sorted(w.loc[w["ablation"].fillna("none") != "none", "backend"].dropna().unique())
    abl = [ablation_table(w, b, noop_switches=noop_switches) for b in ablation_backends]
    out["ablation"] = pd.concat(abl, ignore_index=True) if abl else ablation_table(w, "none")
    out["roofline"] = roofline_table(w)
    out["seqlen"] = seqlen_table(w)
    out["accuracy"] = accuracy_table(w)
    out["compile"] = compile_table(w)
    out["claims"] = compare_claims(w)
    return out


def write_report(results, out_dir: str | Path, baseline: str = "mamba_ssm", noop_switches=None) -> Path:
    out_dir = Path(out_dir)
    fig_dir = out_dir / "figures"
    long = load_results(results)
    w = wide(long)
    t = tables(w, baseline, noop_switches)
    source = figures.source_of(w, "DataFrame" if isinstance(results, pd.DataFrame) else str(resolve_results(results)))
    figs = {
        "speedup_forward": figures.speedup_bars(t["speedup"], "forward", source=source) if "speedup" in t["speedup"]
        else None,
        "ablation": figures.ablation_bars(t["ablation"], source),
        "roofline": figures.roofline(t["roofline"], source),
        "seqlen_scaling": figures.seqlen_scaling(t["seqlen"], source),
        "accuracy": figures.accuracy(t["accuracy"], source=source),
        "compile_cost": figures.compile_cost(t["compile"], source),
    }
    for name, fig in figs.items():
        if fig is not None:
            figures.save(fig, fig_dir, name)

    def img(name):
        return f"![{name}](figures/{name}.png)\n" if figs.get(name) is not None else ""

    gpus = ", ".join(sorted(set(w["gpu_name"].dropna()) or set(w["device_name"].dropna())))
    md = ["# Mamba-2 SSD forward: results report\n",
          f"Source: `{'DataFrame' if isinstance(results, pd.DataFrame) else resolve_results(results)}` — "
          f"{w['run_id'].nunique()} "
          f"points on {gpus or 'unknown device'}; baseline for speedups: `{baseline}`.\n"]
    if is_synthetic(w):
        md.append("> **SYNTHETIC FIXTURE** — these rows are hand-made test data (tests/fixtures), not measurements."
                  " Do not quote any number from this report.\n")
    md += ["## Points\n", table(t["points"]), ""]
    if len(t["failures"]):
        md += ["Failed points (status failed, with the recorded reason):\n", table(t["failures"]), ""]
    md += ["## Speedup\n", "speedup = baseline time / backend time (median); interval from p20/p80 or repeats.\n"]
    if "speedup" in t["speedup"]:
        for stage in ("forward", "chunk_cumsum", "fwd_pass_state", "compute_out"):
            if (t["speedup"]["stage"] == stage).any():
                md += [f"### {stage}\n", table(speedup_matrix(t["speedup"], stage), index=True), ""]
        md += ["Full table:\n", table(t["speedup"]), "", img("speedup_forward")]
    else:
        md += [table(t["speedup"]), ""]
    md += ["## Ablations\n", "effect = 1 − t_with / t_without (time saved by the switch; −10 % = it costs 10 %), "
           "on top of the others and alone; \"within noise\" where it is no larger than both points' noise (the "
           "round-to-round range and the p20–p80 spread). Switches that are no-ops on the architecture are labelled, "
           "never given an effect.\n",
           table(printable(t["ablation"])), "", img("ablation")]
    md += ["## Roofline\n", "Achieved rates from the cost model's flops/bytes (harness/cost_model.py) and the "
           "median time; ceilings measured on the same GPU; frac_floor = floor time / measured time.\n",
           table(t["roofline"]), "", img("roofline")]
    md += ["## Sequence-length scaling\n", table(t["seqlen"]), "", img("seqlen_scaling")]
    md += ["## Accuracy\n", "Worst ‖out − ref‖ / ‖ref‖ against the float64 reference (forward):\n",
           table(accuracy_matrix(t["accuracy"]), index=True), "", "All stages:\n", table(t["accuracy"]), "",
           img("accuracy")]
    md += ["## First-call cost\n", "compile_s = wall time of the first call (compile / autotune included); "
           "calls_to_amortize = compile_s / steady median time.\n", table(t["compile"]), "", img("compile_cost")]
    md += ["## Published claims\n", "\"reproduced\" only when measured on comparable hardware and shapes "
           "(analysis/claims.py).\n", table(t["claims"]), ""]
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "report.md"
    path.write_text("\n".join(md))
    return path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m analysis.report", description=__doc__.splitlines()[0])
    p.add_argument("results", nargs="?", default=None,
                   help="Parquet file, results folder, index:<experiment>[,...] or wandb:<entity>/<project>[/<group>] "
                        "(default: $SSD_RESULTS, else index:headline, the current headline of results/index.yaml)")
    p.add_argument("-o", "--out", required=True, help="output folder (report.md, figures/)")
    p.add_argument("--baseline", default="mamba_ssm", help="backend the speedups are relative to")
    a = p.parse_args(argv)
    path = write_report(a.results, a.out, a.baseline)
    print(f"[report] {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
