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
  defaults against the point "<trick>:True" (tests/analysis/test_language_vs_trick.py checks both on synthetic rows);
  for a switch with values, not on/off (state_pass), the point "<switch>:<other value>" against the defaults, so a
  positive figure says the language's default arrangement is the faster (cuTile's default is serial, Triton's
  chunk_parallel); Triton's host-built TMA descriptors (tma and tma_descriptors=host,
  conf/lvt/triton_tma_host.yaml) against its point tma:True, whose descriptors are made in the kernel; a trick
  swept with the switches it needs ("tma:True+<trick>:True") against those switches alone ("tma:True");
  "within noise" where the effect is no larger than both points' noise (analysis.noise: round-to-round range, p20–p80);
- the knobs only one language has, with their values (defaults and choices, from the Switches dataclasses).

A trick's figure is read only where both points' tiles were searched for their own code or are the same code's
(the rows' `tile_protocol`: retuned, same-sass); the others (pinned: the point borrowed its baseline's tiles;
fallback; retuned-narrower; unknown in rows written before the column) are shown apart, labelled, with what the
trick's point changes of the stage's lowering where a lowering file beside the rows says (analysis/lowering.py;
nothing is compiled here), "lowering not inspected" otherwise.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from analysis.load import INDEX, TIMED_STAGES, newest_run, one_run, repo_root, results_index, runs, timed, wide
from analysis.lowering import NOT_INSPECTED, SAME, Lowerings, change, stage_configs
from analysis.lowering import load as load_lowerings
from analysis.markdown import table
from analysis.noise import relative_noise, shown_effect
from impls.tuning import COMPARABLE, TILE_PROTOCOLS, join_protocols

DOC = "docs/language-vs-trick.md"
FIGURE_DIR = "docs/figures"
FIGURE = "language_vs_trick"
BEGIN, END = "<!-- language_vs_trick:begin -->", "<!-- language_vs_trick:end -->"
MATCHED, PARTS = "language_vs_trick", {"cutile": "language_vs_trick_cutile", "triton": "language_vs_trick_triton"}
EXPERIMENTS = (MATCHED, *PARTS.values())
MACHINES = ("", "_h100")  # index-entry suffixes: "" the H200's rows, "_h100" an H100's
FALLBACK_HATCH = "xx"  # cuTile's bars on tiles not searched for the point (fallback, pinned, ...)


def markers(suffix: str = "") -> tuple[str, str]:
    """The doc's markers around one machine's tables."""
    return (BEGIN, END) if not suffix else (f"<!-- {MATCHED}{suffix}:begin -->", f"<!-- {MATCHED}{suffix}:end -->")
STAGES = TIMED_STAGES
SHAPES = ("S1", "S2", "S3", "S4")
# the Triton point at cuTile's tiles (each stage at its cuTile record's occupancy: occupancy and state_occupancy)
TRITON_ARM = "triton_cutile_tiles"


# tricks whose point is an arm of the first part (two switches at once): (language, arm, the point of the language's
# part it is measured against). Host-built descriptors need tma on, so their effect is against tma on with the
# descriptors made in the kernel, not against the defaults (tma off): that difference would hold tma's own effect.
ARM_TRICKS = {"tma_descriptors:host": ("triton", "triton_tma_host", "tma:True")}
# a trick that needs other switches is swept as one point, the needs first ("tma:True+warp_specialize:True" in
# rows of Triton's switch warp_specialize, retired since: harness/config.py ablation_points): its effect is
# against the point of its needs alone ("tma:True")


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
    """(the rows the trick is measured against, the trick point's rows): the defaults and the point; for a trick
    swept with its needs the point of its needs alone; for an arm trick the point ARM_TRICKS names."""
    sweep = PARTS[backend]
    if "+" in point:  # against the point of the switches it needs
        return _point(t, sweep, backend, shape, point.rsplit("+", 1)[0]), _point(t, sweep, backend, shape, point)
    if point in ARM_TRICKS:
        _, arm, against = ARM_TRICKS[point]
        return _point(t, sweep, backend, shape, against), _point(t, MATCHED, backend, shape, arm=arm)
    return _point(t, sweep, backend, shape), _point(t, sweep, backend, shape, point)


def without_with(t: pd.DataFrame, backend: str, shape: str, point: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(rows without the trick, rows with it) at one shape: `trick_points` in the order the point turns it."""
    against, at = trick_points(t, backend, shape, point)
    turned_on = point.endswith(":True") or point in ARM_TRICKS
    return (against, at) if turned_on else (at, against)


def trick_effect(t: pd.DataFrame, backend: str, shape: str, stage: str, point: str) -> float:
    """Time without the trick / time with it - 1 (positive: the trick helps)."""
    without, with_ = without_with(t, backend, shape, point)
    return _median(without, stage) / _median(with_, stage) - 1


def shown_trick(t: pd.DataFrame, backend: str, shape: str, stage: str, point: str) -> str:
    """`trick_effect` as printed: a signed percentage, or "within noise" where it is no larger than both points'
    noise at the stage (analysis.noise)."""
    without, with_ = without_with(t, backend, shape, point)
    noises = [relative_noise(rows[rows["stage"] == stage]) for rows in (without, with_)]
    return shown_effect(trick_effect(t, backend, shape, stage, point), *noises)


SAME_CODE = "same code"  # a trick cell whose stage ran the same kernels at the same config at both points
UNKNOWN = "unknown"  # the tile protocol of rows written before the column (schema version 5)
# what a protocol says of a point's tiles, where its effect is shown apart (impls/tuning.py TILE_PROTOCOLS)
APART_MEANING = {
    "pinned": "the point borrowed another switch set's tiles (a trick turned off: its baseline's), searched for "
              "other code; the figure holds how those tiles fit this code (registers, stack, spills), not the trick "
              "alone",
    "retuned-narrower": "searched under the point's own switches, over a narrower space than its switch set or the "
                        "baseline declares",
    "fallback": "the backend's fixed fallback tiles (no usable record)",
    "switches": "every tuned field fixed by a switch",
    UNKNOWN: "not recorded: rows written before the tile_protocol column (schema version 5); not guessed",
}


def stage_protocol(rows: pd.DataFrame, stage: str) -> str:
    """Where the point's tiles for `stage` came from (its rows' `tile_protocol`, impls/tuning.py TILE_PROTOCOLS;
    several joined by "+"); UNKNOWN where the rows predate the column; "" without rows."""
    sel = rows[rows["stage"] == stage]
    if sel.empty:
        return ""
    found = sel["tile_protocol"].dropna().unique() if "tile_protocol" in sel else []
    if len(found) == 0:
        return UNKNOWN
    return join_protocols(found)


def comparable(protocol: str) -> bool:
    """Whether an effect may be read from a point whose tiles came this way: every part RETUNED or SAME_SASS."""
    return bool(protocol) and all(p in COMPARABLE for p in protocol.split("+"))


def _rows_configs(rows: pd.DataFrame, stage: str) -> tuple:
    """The configs the point's first recorded `describe` holds for `stage` (lowering.stage_configs)."""
    described = rows["describe"].dropna()
    return stage_configs(described.iloc[0], stage) if len(described) else ()


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
    return _rows_configs(with_, stage) == _rows_configs(defaults, stage)


LANGUAGES = (("cutile", "cuTile"), ("triton", "Triton"))


@dataclass(frozen=True)
class TrickCell:
    """One trick's effect on one stage at one shape in one language, with where both points' tiles came from and
    what the trick's point changes of the lowering."""

    trick: str
    stage: str
    language: str
    shape: str
    # the main table's cell: "n/a", SAME_CODE, "" (no rows), the effect as shown, or "apart: <protocol>"
    text: str
    effect: str = ""  # the effect as shown (a signed percentage or "within noise"), also for a cell shown apart
    point_tiles: str = ""  # the trick point's tile protocol
    baseline_tiles: str = ""  # that of the point it is measured against
    lowering: str = NOT_INSPECTED

    @property
    def apart(self) -> bool:
        return self.text.startswith("apart")


def trick_cells(w: pd.DataFrame, lowerings: Lowerings | None = None) -> list[TrickCell]:
    """Every (trick, stage, language, shape) cell (`trick_table`) of one run's rows (analysis.load.one_run);
    `lowerings`: the lowering files' entries."""
    from analysis.switches import noop_table

    t = timed(one_run(w, "trick table"))
    lowerings = lowerings or Lowerings()
    names = {b: {trick_name(p): p for p in tricks(w, b)} for b in PARTS}
    for point, (backend, _, _) in ARM_TRICKS.items():
        names[backend][point] = point
    noops = {b: noop_table(b) for b in PARTS}
    cells = []
    for trick in dict.fromkeys([*names["cutile"], *names["triton"]]):
        for stage in STAGES:
            for backend, label in LANGUAGES:
                for shape in SHAPES:
                    point = names[backend].get(trick)
                    cell = TrickCell(trick, stage, label, shape, "n/a")
                    if point is not None:
                        cell = _cell(t, cell, backend, point, noops[backend], lowerings)
                    cells.append(cell)
    return cells


def _cell(t: pd.DataFrame, cell: TrickCell, backend: str, point: str, noops, lowerings: Lowerings) -> TrickCell:
    if same_code(t, backend, cell.shape, cell.stage, point, noops):
        return dataclasses.replace(cell, text=SAME_CODE)
    effect = shown_trick(t, backend, cell.shape, cell.stage, point)
    against, at = trick_points(t, backend, cell.shape, point)
    tiles = (stage_protocol(at, cell.stage), stage_protocol(against, cell.stage))
    lowering = change(lowerings.of(against, cell.stage), lowerings.of(at, cell.stage))
    cell = dataclasses.replace(cell, effect=effect, point_tiles=tiles[0], baseline_tiles=tiles[1], lowering=lowering)
    if not effect or all(comparable(p) for p in tiles):
        return dataclasses.replace(cell, text=effect)
    shown = [p for p in tiles if not comparable(p)]
    return dataclasses.replace(cell, text=f"apart: {shown[0]}")


def trick_table(w: pd.DataFrame, lowerings: Lowerings | None = None) -> pd.DataFrame:
    """Rows (trick, stage); columns "<language> <shape>": each trick's effect, as a signed percentage or "within
    noise" (`shown_trick`), where both points' tiles were searched for their own code or are the same code's (tile
    protocols retuned, same-sass); SAME_CODE where the stage ran the same kernels at the same config with and
    without it (`same_code`); "apart: <protocol>" where a point's tiles came another way (pinned, fallback, ...,
    unknown in rows written before the column): its figure is in `apart_table`, not here."""
    return _wide(trick_cells(w, lowerings), "text")


def apart_table(cells: list[TrickCell]) -> pd.DataFrame:
    """The effects `trick_table` shows apart: rows (trick, stage, language), columns the shapes, each cell the
    figure with where the tiles came from, "<effect> (<point's protocol> / <baseline's>)", one protocol where both
    agree ("+412.8 % (unknown)"); `apart_legend` says what each protocol means."""
    rows: dict[tuple[str, str, str], dict] = {}
    for c in cells:
        if c.apart:
            row = rows.setdefault((c.trick, c.stage, c.language),
                                  {"trick": c.trick, "stage": c.stage, "language": c.language,
                                   **dict.fromkeys(SHAPES, "")})
            row[c.shape] = f"{c.effect} ({tiles_label(c)})"
    return pd.DataFrame(list(rows.values()), columns=["trick", "stage", "language", *SHAPES])


def tiles_label(cell: TrickCell) -> str:
    """"<point's protocol> / <baseline's>", one protocol where both agree."""
    if cell.point_tiles == cell.baseline_tiles:
        return cell.point_tiles
    return f"{cell.point_tiles} / {cell.baseline_tiles}"


def apart_legend(cells: list[TrickCell]) -> list[str]:
    """One line per protocol the cells shown apart hold that is not comparable: what it means."""
    found = {p for c in cells if c.apart for tiles in (c.point_tiles, c.baseline_tiles)
             for p in tiles.split("+") if p and p not in COMPARABLE}
    order = [p for p in APART_MEANING if p in found] + sorted(found - set(APART_MEANING))
    return [f"- `{p}`: {APART_MEANING.get(p) or TILE_PROTOCOLS.get(p, p)}" for p in order]


def lowering_table(cells: list[TrickCell]) -> pd.DataFrame:
    """Rows (trick, stage); columns "<language> <shape>": what the trick's point changes of the stage's lowering
    against its baseline (analysis/lowering.py: registers, stack, local loads/stores, warp specialisation), "same
    lowering" (lowering.SAME), or NOT_INSPECTED where no lowering file holds both points; empty where the trick
    table has no figure; no rows for the forward (its stages' rows say) or where every cell is empty."""
    def shown(c: TrickCell) -> bool:
        return c.text not in ("n/a", SAME_CODE, "")

    out = _wide([c if shown(c) else dataclasses.replace(c, lowering="") for c in cells if c.stage != "forward"],
                "lowering")
    return out[(out.drop(columns=["trick", "stage"]) != "").any(axis=1)].reset_index(drop=True) if len(out) else out


def _wide(cells: list[TrickCell], field: str) -> pd.DataFrame:
    rows: dict[tuple[str, str], dict] = {}
    for c in cells:
        rows.setdefault((c.trick, c.stage), {"trick": c.trick, "stage": c.stage})[f"{c.language} {c.shape}"] = \
            getattr(c, field)
    return pd.DataFrame(list(rows.values()))


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


def lowering_entries(root: Path | None = None, suffix: str = "") -> Lowerings:
    """The lowering files' entries (analysis/lowering.py) beside the results files the index names for one
    machine's parts."""
    root = root or repo_root()
    index = results_index(root)
    return load_lowerings(root / Path(INDEX).parent / index[name + suffix] for name in EXPERIMENTS
                          if name + suffix in index)


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


def render(w: pd.DataFrame, sources: str, missing: tuple[str, ...] = (), left_out: pd.DataFrame | None = None,
           lowered: Lowerings | None = None) -> str:
    """The doc's generated section from one run's rows (`pick_run`); `missing`: the parts not committed yet (their
    columns stay empty and the trick table waits for both); `left_out`: the runs of the sources not read;
    `lowered`: the lowering files' entries (none: the lowering is not inspected)."""
    cells = trick_cells(w, lowered) if not missing else []
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
        "switch-effects table: impls/cutile/switch_sass_effects.json compares the sm_90 SASS, "
        "impls/triton/switch_launch_effects.json the kernel launches) and both points ran it at the same config, "
        "so the two timings differ only by the run's noise; a stage of a few microseconds (chunk_cumsum) moves by more "
        "than 2x between such points. A figure is shown here only where both points' tiles were searched for their "
        "own code or are the same code's (column `tile_protocol`: retuned, same-sass); \"apart: <protocol>\": a "
        "point's tiles came another way (pinned: borrowed its baseline's tiles; fallback; retuned-narrower; "
        "unknown: rows written before the column), its figure is in the next table, labelled.",
        "",
        _trick_sections(cells) if not missing else
        (f"Not run yet: `{INDEX}` has no entry {', '.join(f'`{m}`' for m in missing)} (each language's defaults, "
         "all-off and single-trick points; the columns above that need them are empty until they are committed)."),
        "",
        "### Knobs only one language has",
        "",
        table(one_language_knobs()),
    ])


def _trick_sections(cells: list[TrickCell]) -> str:
    """The trick table, the effects shown apart and the lowering changes, as markdown."""
    apart = apart_table(cells)
    lowering = lowering_table(cells)
    inspected = any(c.lowering not in (NOT_INSPECTED, "") for c in cells)
    return "\n".join([
        table(_wide(cells, "text")),
        "",
        "#### Effects shown apart: a point's tiles not searched for its own code (not the trick's effect alone)",
        "",
        *(["Each figure with where the tiles came from (column `tile_protocol`; the trick's point / its baseline, "
           "one word where both agree):", "", *apart_legend(cells), "", table(apart)] if len(apart) else
          ["None: every figure above compares retuned or same-sass tiles."]),
        "",
        "#### Lowering: what each trick's point changes of the stage's sm_90 SASS against its baseline",
        "",
        *(["Registers and stack per thread, local loads/stores (LDL/STL: the spill traffic) and warp specialisation "
           "(USETMAXREG) of each kernel of the stage, both points compiled for sm_90 at the tiles their rows "
           f"recorded (the lowering files beside the rows); \"{SAME}\": none of these changes (the SASS may differ "
           f"elsewhere); \"{NOT_INSPECTED}\": no entry for a point (chunk_cumsum is not compiled).", "",
           table(lowering)] if inspected else
          [f"{NOT_INSPECTED.capitalize()}: no lowering file beside these rows (`python -m instruments.lowering "
           "<rows file>` writes one, compiling each point's kernels for sm_90 on the CPU at the tiles its rows "
           "recorded: registers, stack, local loads/stores, warp specialisation)."]),
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


def figure(lang: pd.DataFrame, source=None):
    """Bars per shape and stage: cuTile and Triton at cuTile's tiles (median ms), the languages' colors; cuTile's
    legend and hatch read where its tiles came from (the table's "cuTile's tiles": "tuned" only for a record or a
    search for the point, else "fallback tiles" and so on, analysis.palette.tile_words); shapes the run lacks are
    named in the title, not drawn. `source`: analysis.figures.Source, the card, dates and rows in the title."""
    import numpy as np
    from matplotlib.patches import Patch

    from analysis import palette
    from analysis.figures import DOC_WIDTH_IN, _finish, plt

    drawn = lang.dropna(subset=["cuTile tuned ms", "Triton at cuTile's tiles ms"], how="all")
    shapes = [s for s in SHAPES if s in set(drawn["shape"])]
    if not shapes:
        fig, ax = plt.subplots(figsize=(DOC_WIDTH_IN, 1.6))
        ax.axis("off")
        ax.text(0.5, 0.5, "No point of the matched part (cuTile, and Triton at cuTile's tiles) in the run these "
                "tables read:\nnothing to draw.", ha="center", va="center", fontsize=8)
        return _finish(fig, "The language at the same arrangement and tiles", source)
    words = {s: palette.tile_words(palette.tile_sources(None, t)) or "tiles not recorded"
             for s, t in zip(drawn["shape"], drawn["cuTile's tiles"].fillna(""))}
    fig, axes = plt.subplots(2, 2, figsize=(DOC_WIDTH_IN, 5.2), squeeze=False)
    for ax, stage in zip(axes.flat, STAGES):
        rows = drawn[drawn["stage"] == stage].set_index("shape").reindex(shapes)
        x = np.arange(len(shapes))
        tuned = [palette.is_tuned(None, t) for t in rows["cuTile's tiles"].fillna("")]
        ax.bar(x - 0.2, rows["cuTile tuned ms"], width=0.4, color=palette.color("cutile"),
               hatch=["" if t else FALLBACK_HATCH for t in tuned], edgecolor="white", gid="backend:cutile")
        ax.bar(x + 0.2, rows["Triton at cuTile's tiles ms"], width=0.4, color=palette.color("triton"),
               hatch=palette.VARIANT_HATCH, edgecolor="white", gid="backend:triton")
        ax.set_xticks(x, shapes, fontsize=7)
        ax.set_title(stage, fontsize=8)
        ax.set_ylabel("median ms", fontsize=7)
        ax.tick_params(axis="y", labelsize=7)
    handles = [Patch(facecolor=palette.color("cutile"), edgecolor="white",
                     hatch="" if palette.is_tuned(None, t) else FALLBACK_HATCH,
                     label=f"cuTile, {w} ({', '.join(s for s in shapes if words[s] == w)})")
               for w, t in {w: t for s, t, w in zip(drawn["shape"], drawn["cuTile's tiles"].fillna(""),
                                                     drawn["shape"].map(words))}.items()]
    handles.append(Patch(facecolor=palette.color("triton"), hatch=palette.VARIANT_HATCH, edgecolor="white",
                         label="Triton in cuTile's arrangement, pinned to cuTile's record tiles"))
    fig.legend(handles=handles, fontsize=7, loc="lower center", ncol=2, bbox_to_anchor=(0.5, 0))
    absent = [s for s in SHAPES if s not in shapes]
    what = "The language at the same arrangement and tiles: median ms per stage" + (
        f" ({', '.join(absent)}: not in this run)" if absent else "")
    return _finish(fig, what, source, bottom=0.25 + 0.17 * len(handles) / 2)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m analysis.language_vs_trick", description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="exit 1 if the committed doc differs from the rows")
    a = p.parse_args(argv)
    from analysis import figures

    root = repo_root()
    index = results_index(root)
    doc = root / DOC
    text, tables = doc.read_text(), {}
    for suffix in MACHINES:
        if suffix and MATCHED + suffix not in index:
            continue
        w, left_out = pick_run(load(root, suffix))
        sources = ", ".join(f"`results/{index[n + suffix]}`" for n in EXPERIMENTS if n + suffix in index)
        section = render(w, sources, tuple(missing_entries(root, suffix)), left_out, lowering_entries(root, suffix))
        text = write_section(doc, section, suffix, text)
        tables[suffix] = (language_table(w), figures.source_of(w, sources.replace("`", "")))
    if a.check:
        same = doc.read_text() == text
        print(f"[language_vs_trick] {doc} " + ("matches the rows" if same else "differs: regenerate it"))
        return 0 if same else 1
    doc.write_text(text)
    paths = [p for suffix, (lang, source) in tables.items()
             for p in figures.save(figure(lang, source), root / FIGURE_DIR, FIGURE + suffix)]
    print(f"[language_vs_trick] {doc}, {', '.join(map(str, paths))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
