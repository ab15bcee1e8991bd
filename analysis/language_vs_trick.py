"""`python -m analysis.language_vs_trick [--check]`: the language-vs-trick tables of docs/language-vs-trick.md
(written between its markers) and their figure, from the committed rows that results/index.yaml names for the
three parts of the experiment (conf/experiment/language_vs_trick*.yaml). `--check` exits 1 when the committed doc
differs from what the rows give.

One machine's rows make one set of tables: the index's entries without a suffix are the H200's (the study's card),
the entries ending in a card's suffix (`MACHINES`, "_h100") another card's, each written between its own markers
and drawn in its own figure. Rows of two cards never share a table, nor rows of two runs: each machine's tables read
the newest run among its parts' rows (`pick_run`; analysis.load.one_run: one card, one source tree, one run group), and
the doc names the runs left out. A point measured in several rounds of that run reads the median of their medians.

Per shape (S1-S4) and stage:
- *language*: cuTile as shipped (its tuned tiles) next to Triton in cuTile's arrangement at cuTile's tuned tiles
  (conf/lvt/triton_cutile_tiles.yaml: one point, each MMA stage at its cuTile record's occupancy), their ratio,
  and each language at its defaults and with every trick off;
- *trick*: each trick's effect in each language, time without it / time with it - 1 (positive: the trick helps):
  for a trick on by default the ablation point "<trick>" against the defaults, for one off by default the
  defaults against the point "<trick>:True" (tests/test_language_vs_trick.py checks both on synthetic rows); for a
  switch with values, not on/off (state_pass), the point "<switch>:<other value>" against the defaults, so a
  positive figure says the language's default arrangement is the faster (cuTile's default is serial, Triton's
  chunk_parallel); Triton's host-built TMA descriptors (tma and tma_descriptors=host,
  conf/lvt/triton_tma_host.yaml) against its point tma:True, whose descriptors are made in the kernel; a trick
  swept with the switches it needs ("tma:True+warp_specialize:True") against those switches alone ("tma:True");
  "within noise" where the effect is no larger than both points' noise (analysis.noise: round-to-round range, p20–p80);
- the knobs only one language has, with their values (defaults and choices, from the Switches dataclasses).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import pandas as pd

from analysis.load import INDEX, newest_run, one_run, repo_root, results_index, runs, timed, wide
from analysis.markdown import table
from analysis.noise import relative_noise, shown_effect

DOC = "docs/language-vs-trick.md"
FIGURE_DIR = "docs/figures"
FIGURE = "language_vs_trick"
BEGIN, END = "<!-- language_vs_trick:begin -->", "<!-- language_vs_trick:end -->"
MATCHED, PARTS = "language_vs_trick", {"cutile": "language_vs_trick_cutile", "triton": "language_vs_trick_triton"}
EXPERIMENTS = (MATCHED, *PARTS.values())
MACHINES = ("", "_h100")  # index-entry suffixes: "" the H200's rows, "_h100" an H100's


def markers(suffix: str = "") -> tuple[str, str]:
    """The doc's markers around one machine's tables."""
    return (BEGIN, END) if not suffix else (f"<!-- {MATCHED}{suffix}:begin -->", f"<!-- {MATCHED}{suffix}:end -->")
STAGES = ("chunk_cumsum", "fwd_pass_state", "compute_out", "forward")
SHAPES = ("S1", "S2", "S3", "S4")
# the Triton point at cuTile's tiles (each stage at its cuTile record's occupancy: occupancy and state_occupancy)
TRITON_ARM = "triton_cutile_tiles"


# tricks whose point is an arm of the first part (two switches at once): (language, arm, the point of the language's
# part it is measured against). Host-built descriptors need tma on, so their effect is against tma on with the
# descriptors made in the kernel, not against the defaults (tma off): that difference would hold tma's own effect.
ARM_TRICKS = {"tma_descriptors:host": ("triton", "triton_tma_host", "tma:True")}
# a trick that needs other switches is swept as one point, the needs first ("tma:True+warp_specialize:True",
# experiments/config.py ablation_points): its effect is against the point of its needs alone ("tma:True")


def trick_name(point: str) -> str:
    """The trick an ablation point turns on or off: its last switch ("warp_specialize" for
    "tma:True+warp_specialize:True", "tma" for "tma:True")."""
    return point.rsplit("+", 1)[-1].partition(":")[0]


class MissingRows(FileNotFoundError):
    """results/index.yaml names no file for a part of the experiment."""


def missing_entries(root: Path | None = None, suffix: str = "") -> list[str]:
    index = results_index(root)
    return [name + suffix for name in EXPERIMENTS if name + suffix not in index]


def load(root: Path | None = None, suffix: str = "") -> pd.DataFrame:
    """The wide rows of the parts the index names for one machine (the matched part at least), each row's `arm`
    (conf/lvt option, '' outside). A language's part not committed yet leaves its columns and tricks empty (`render`
    says so)."""
    root = root or repo_root()
    missing = missing_entries(root, suffix)
    if MATCHED + suffix in missing:
        raise MissingRows(f"{INDEX} has no entry {', '.join(missing)}: run `scripts/gpu_session.sh sweep "
                          f"{' '.join(EXPERIMENTS)}` on the GPU and commit its folder")
    index = results_index(root)
    frames = [wide(str(root / Path(INDEX).parent / index[name + suffix])) for name in EXPERIMENTS
              if name + suffix in index]
    w = pd.concat(frames, ignore_index=True)
    w["arm"] = w["hydra_choices"].map(_arm)
    return w


def pick_run(w: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the rows of the newest run among `w`'s, the other runs: analysis.load.runs of what is left out)."""
    found = runs(w)
    return newest_run(w), found.iloc[1:]


def _arm(choices) -> str:
    try:
        return str((json.loads(choices) if isinstance(choices, str) and choices else {}).get("lvt") or "")
    except ValueError:
        return ""


def _median(rows: pd.DataFrame, stage: str) -> float:
    sel = rows[rows["stage"] == stage]["median_ms"]
    return float(sel.median()) if len(sel) else float("nan")


def _point(t: pd.DataFrame, sweep: str, backend: str, shape: str, ablation: str = "none",
           arm: str | None = None) -> pd.DataFrame:
    sel = (t["sweep_name"] == sweep) & (t["backend"] == backend) & (t["shape_name"] == shape)
    sel &= t["ablation"].fillna("none") == ablation
    if arm is not None:
        sel &= t["arm"] == arm
    return t[sel]  # one run's (one_run): a point measured in several rounds has a row per round and stage


def tile_source(rows: pd.DataFrame, stage: str) -> str:
    """Where the point's tiles for `stage` came from (its rows' `tuning`: "record", "fallback", ...; the forward:
    every stage's, "record" when all are); '' when the rows do not say."""
    for text in rows["tuning"].dropna() if "tuning" in rows else ():
        try:
            sources = json.loads(text)
        except (TypeError, ValueError):
            continue
        if not isinstance(sources, dict) or not sources:
            continue
        if stage in sources:
            return str(sources[stage])
        if stage == "forward":
            found = sorted({str(v) for v in sources.values()})
            return found[0] if len(found) == 1 else "/".join(found)
        return ""
    return ""


def language_table(w: pd.DataFrame) -> pd.DataFrame:
    """Per (shape, stage): median ms of cuTile tuned and Triton at cuTile's tiles, their ratio, where cuTile's
    tiles came from (a "fallback" there: no record on that card, so the two are not at the same tiles), and each
    language at its defaults and all-off."""
    t = timed(one_run(w, "language table"))
    out = []
    for shape in SHAPES:
        for stage in STAGES:
            cutile_rows = _point(t, MATCHED, "cutile", shape, arm="cutile")
            cutile = _median(cutile_rows, stage)
            triton = _median(_point(t, MATCHED, "triton", shape, arm=TRITON_ARM), stage)
            out.append({
                "shape": shape, "stage": stage, "cuTile tuned ms": cutile, "Triton at cuTile's tiles ms": triton,
                "Triton / cuTile": triton / cutile, "cuTile's tiles": tile_source(cutile_rows, stage),
                "cuTile defaults ms": _median(_point(t, PARTS["cutile"], "cutile", shape), stage),
                "Triton defaults ms": _median(_point(t, PARTS["triton"], "triton", shape), stage),
                "cuTile all-off ms": _median(_point(t, PARTS["cutile"], "cutile", shape, "all_off"), stage),
                "Triton all-off ms": _median(_point(t, PARTS["triton"], "triton", shape, "all_off"), stage),
            })
    return pd.DataFrame(out)


def tricks(w: pd.DataFrame, backend: str) -> list[str]:
    """The single-trick ablation points of a language's part, in sweep order ("<trick>" or "<trick>:True")."""
    rows = w[(w["sweep_name"] == PARTS[backend]) & (w["backend"] == backend)]
    points = rows.sort_values("job_num", kind="stable")["ablation"].fillna("none").unique()
    return [p for p in points if p not in ("none", "all_off") and not p.startswith("only:")]


def trick_points(t: pd.DataFrame, backend: str, shape: str, point: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(rows without the trick, rows with it) at one shape."""
    sweep = PARTS[backend]
    defaults = _point(t, sweep, backend, shape)
    if "+" in point:  # against the point of the switches it needs
        defaults = _point(t, sweep, backend, shape, point.rsplit("+", 1)[0])
        other = _point(t, sweep, backend, shape, point)
    elif point in ARM_TRICKS:
        _, arm, against = ARM_TRICKS[point]
        defaults = _point(t, sweep, backend, shape, against)
        other = _point(t, MATCHED, backend, shape, arm=arm)
    else:
        other = _point(t, sweep, backend, shape, point)
    turned_on = point.endswith(":True") or point in ARM_TRICKS
    return (defaults, other) if turned_on else (other, defaults)


def trick_effect(t: pd.DataFrame, backend: str, shape: str, stage: str, point: str) -> float:
    """Time without the trick / time with it - 1 (positive: the trick helps)."""
    without, with_ = trick_points(t, backend, shape, point)
    return _median(without, stage) / _median(with_, stage) - 1


def shown_trick(t: pd.DataFrame, backend: str, shape: str, stage: str, point: str) -> str:
    """`trick_effect` as printed: a signed percentage, or "within noise" where it is no larger than both points'
    noise at the stage (analysis.noise)."""
    without, with_ = trick_points(t, backend, shape, point)
    noises = [relative_noise(rows[rows["stage"] == stage]) for rows in (without, with_)]
    return shown_effect(_median(without, stage) / _median(with_, stage) - 1, *noises)


SAME_CODE = "same code"  # a trick cell whose stage ran the same kernels at the same config at both points


# the entries of a row's `describe` that hold a stage's configs (our Triton tunes stage 2 as two kernels)
DESCRIBE_STAGES = {"fwd_pass_state": ("fwd_pass_state", "chunk_state", "state_passing")}


def _stage_config(rows: pd.DataFrame, stage: str) -> tuple:
    """The configs the point's `describe` records for `stage` (each entry of DESCRIBE_STAGES; None where absent)."""
    for text in rows["describe"].dropna():
        try:
            info = json.loads(text)
        except (TypeError, ValueError):
            continue
        stages = (info.get("stages") or {}) if isinstance(info, dict) else {}
        entries = [stages.get(name) for name in DESCRIBE_STAGES.get(stage, (stage,))]
        return tuple(e.get("config") if isinstance(e, dict) else None for e in entries)
    return ()


def same_code(t: pd.DataFrame, backend: str, shape: str, stage: str, point: str, noops) -> bool:
    """Whether `stage` ran the same code at the trick's point as at the defaults: the switch is a no-op for the
    stage's kernels in the backend's machine-code table (`analysis.switches.noop_table`: impls/cutile/
    switch_effects.json compares the sm_90 SASS with the switch alone away from its default, impls/triton/
    switch_effects.json the kernel launches), and both points record the same configs for the stage. Such a
    cell's difference is the run's noise, never the trick's effect."""
    if stage == "forward" or "+" in point or point in ARM_TRICKS:
        return False
    with_ = _point(t, PARTS[backend], backend, shape, point)
    defaults = _point(t, PARTS[backend], backend, shape)
    if with_.empty or defaults.empty:
        return False
    arch = str(with_["arch"].iloc[0])
    if not noops.reason(arch, trick_name(point), stage, str(with_["dtype"].iloc[0])):
        return False
    return _stage_config(with_, stage) == _stage_config(defaults, stage)


def trick_table(w: pd.DataFrame) -> pd.DataFrame:
    """Rows (trick, stage); columns "<language> <shape>": each trick's effect, as a signed percentage, or
    SAME_CODE where the stage ran the same kernels at the same config with and without it (`same_code`), or "within
    noise" (`shown_trick`)."""
    from analysis.switches import noop_table

    t = timed(one_run(w, "trick table"))
    names = {b: {trick_name(p): p for p in tricks(w, b)} for b in PARTS}
    for point, (backend, _, _) in ARM_TRICKS.items():
        names[backend][point] = point
    noops = {b: noop_table(b) for b in PARTS}
    out = []
    for trick in dict.fromkeys([*names["cutile"], *names["triton"]]):
        for stage in STAGES:
            row = {"trick": trick, "stage": stage}
            for backend, label in (("cutile", "cuTile"), ("triton", "Triton")):
                for shape in SHAPES:
                    point = names[backend].get(trick)
                    if point is None:
                        row[f"{label} {shape}"] = "n/a"
                    elif same_code(t, backend, shape, stage, point, noops[backend]):
                        row[f"{label} {shape}"] = SAME_CODE
                    else:
                        row[f"{label} {shape}"] = shown_trick(t, backend, shape, stage, point)
            out.append(row)
    return pd.DataFrame(out)


def one_language_knobs() -> pd.DataFrame:
    """Switches only one of the two languages has, with their default and choices."""
    from impls.cutile.switches import CutileSwitches
    from impls.triton.switches import TritonSwitches

    fields = {"cuTile": {f.name: f for f in dataclasses.fields(CutileSwitches)},
              "Triton": {f.name: f for f in dataclasses.fields(TritonSwitches)}}
    out = []
    for language, other in (("cuTile", "Triton"), ("Triton", "cuTile")):
        for name, f in fields[language].items():
            if name not in fields[other]:
                choices = f.metadata.get("choices")
                out.append({"knob": name, "language": language, "default": str(f.default),
                            "values": ", ".join(map(str, choices)) if choices else "bool" if
                            isinstance(f.default, bool) else ""})
    return pd.DataFrame(out)


def run_text(w: pd.DataFrame, left_out: pd.DataFrame | None = None) -> str:
    """Which run the tables read and which runs of the sources they leave out (a table reads one run)."""
    run = runs(w).iloc[0] if len(w) else None
    text = "" if run is None else f"The tables read one run: `{run['run_group']}` on {run['gpu_uuid']}."
    if left_out is not None and len(left_out):
        others = "; ".join(f"`{r['run_group']}` on {r['gpu_uuid']}, {r['first'][:10]}, {r['points']} points"
                           for _, r in left_out.iterrows())
        text += (f" Left out, as rows of other runs ({len(left_out)}): {others}. Only the newest run is read; "
                 "columns and cells its rows do not hold stay empty.")
    return text


def render(w: pd.DataFrame, sources: str, missing: tuple[str, ...] = (), left_out: pd.DataFrame | None = None) -> str:
    """The doc's generated section from one run's rows (`pick_run`); `missing`: the parts not committed yet (their
    columns stay empty and the trick table waits for both); `left_out`: the runs of the sources not read."""
    gpus = ", ".join(sorted(w["gpu_name"].dropna().unique()))
    days = sorted(w["timestamp"].dropna().str[:10].unique())
    return "\n".join([
        f"Generated by `python -m analysis.language_vs_trick` from {sources} ({w['run_id'].nunique()} points on "
        f"{gpus}, {days[0] if days else '?'}{' to ' + days[-1] if len(days) > 1 else ''}; bf16, the headline "
        "problem). Do not edit: regenerate.",
        "",
        run_text(w, left_out),
        "",
        "### Same arrangement, same tiles: the language",
        "",
        table(language_table(w)),
        "",
        "### Each trick in each language (time without it / with it - 1; n/a: the language has no such switch)",
        "",
        "A switch with values, not on/off (`state_pass`, `fused_program`), reads its other value's point against "
        "its default (`fused_program` with `fuse_state_out` on in both): a positive figure says the default value "
        "is the faster. `tma_descriptors:host` reads the other way: the matched part's host-descriptor point "
        "against the Triton part's `tma:True` (descriptors made in the kernel), so a positive figure says host-built "
        "descriptors help. An empty cell: that shape's part has not run in this run. \"within noise\": the effect is "
        "no larger than both points' noise (the round-to-round range and the p20–p80 spread). "
        f"\"{SAME_CODE}\": the switch does not change that stage's code (the backend's "
        "switch-effects table: impls/cutile/switch_effects.json compares the sm_90 SASS, "
        "impls/triton/switch_effects.json the kernel launches) and both points ran it at the same config, so the "
        "two timings differ only by the run's noise; a stage of a few microseconds (chunk_cumsum) moves by more "
        "than 2x between such points.",
        "",
        table(trick_table(w)) if not missing else
        (f"Not run yet: `{INDEX}` has no entry {', '.join(f'`{m}`' for m in missing)} (each language's defaults, "
         "all-off and single-trick points; the columns above that need them are empty until they are committed)."),
        "",
        "### Knobs only one language has",
        "",
        table(one_language_knobs()),
    ])


def write_section(doc: Path, section: str, suffix: str = "", text: str | None = None) -> str:
    """The doc's text (or `text`) with `section` between one machine's markers (ValueError when they are missing)."""
    begin, end = markers(suffix)
    text = doc.read_text() if text is None else text
    if begin not in text or end not in text:
        raise ValueError(f"{doc}: markers {begin} / {end} not found")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{section}\n{end}{tail}"


def figure(lang: pd.DataFrame):
    """Bars per shape and stage: cuTile tuned and Triton at cuTile's tiles (median ms), the languages' colors."""
    import numpy as np

    from analysis import palette
    from analysis.figures import plt

    fig, axes = plt.subplots(1, len(STAGES), figsize=(4 * len(STAGES), 3.2))
    for ax, stage in zip(axes, STAGES):
        rows = lang[lang["stage"] == stage]
        x = np.arange(len(rows))
        for offset, (column, backend, hatch) in enumerate((("cuTile tuned ms", "cutile", ""),
                                                           ("Triton at cuTile's tiles ms", "triton",
                                                            palette.VARIANT_HATCH))):
            ax.bar(x + (offset - 0.5) * 0.4, rows[column], width=0.4, color=palette.color(backend), hatch=hatch,
                   label="cuTile (tuned)" if backend == "cutile" else "Triton (cuTile's arrangement and tiles)",
                   gid=f"backend:{backend}")
        ax.set_xticks(x, rows["shape"])
        ax.set_title(stage)
        ax.set_ylabel("median ms")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    return fig


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m analysis.language_vs_trick", description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="exit 1 if the committed doc differs from the rows")
    a = p.parse_args(argv)
    root = repo_root()
    index = results_index(root)
    doc = root / DOC
    text, tables = doc.read_text(), {}
    for suffix in MACHINES:
        if suffix and MATCHED + suffix not in index:
            continue
        w, left_out = pick_run(load(root, suffix))
        sources = ", ".join(f"`results/{index[n + suffix]}`" for n in EXPERIMENTS if n + suffix in index)
        text = write_section(doc, render(w, sources, tuple(missing_entries(root, suffix)), left_out), suffix, text)
        tables[suffix] = language_table(w)
    if a.check:
        same = doc.read_text() == text
        print(f"[language_vs_trick] {doc} " + ("matches the rows" if same else "differs: regenerate it"))
        return 0 if same else 1
    doc.write_text(text)
    from analysis.figures import save

    paths = [p for suffix, lang in tables.items() for p in save(figure(lang), root / FIGURE_DIR, FIGURE + suffix)]
    print(f"[language_vs_trick] {doc}, {', '.join(map(str, paths))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
