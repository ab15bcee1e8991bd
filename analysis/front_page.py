"""`python -m analysis.front_page [--gpu SLUG ...] [--check]`: one front page per GPU model, results/HEADLINE-<slug>.md,
saying where things stand on that card, from the one run results/index.yaml names current for it (`front_page_<slug>`
under `current:`). `--check` exits 1 when a committed page differs from what the rows give.

Per shape and backend: the point at the backend's declared defaults and the backend's fastest point of the run (the
switches it ran away from the defaults; a peer at its own chunk where it has one, `OWN_CHUNKS`), each with its eager
forward median and its CUDA-graph replay, where its stage configs came from, and the pieces of a peer's forward timed
apart (an adapter's preparation: `part:*` stages). Everything on a page is one run (analysis.load.one_run); backends the
run lacks are named at the top, and a model without a current run says so at the top instead of borrowing another's.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from analysis.load import INDEX, SHAPE, index_sections, one_run, repo_root, runs, wide
from analysis.markdown import table
from analysis.switches import explicit_switches

# slug -> the GPU model (gpu_name) whose page it is
MODELS = {"h100": "NVIDIA H100 80GB HBM3", "h200": "NVIDIA H200", "b200": "NVIDIA B200"}
OUTPUT = "results/HEADLINE-{slug}.md"
ENTRY = "front_page_{slug}"
OURS = ("cutile", "triton")
PEERS = ("mamba_ssm", "vllm", "tilegym", "fla")
# the chunks a peer's own tests and benchmark run it at (TileGym: tests/ops/test_mamba2.py and its benchmark of this
# layer use 64 and 128, conf/shape/S1_c128.yaml and tilegym_chunk128.yaml): its best is read there only
OWN_CHUNKS = {"tilegym": (64, 128)}
FORWARD = "forward"
_POINT = ["backend", "switches", "shape", "problem_name", "dtype"]  # one configuration: its rounds pool
_WORKLOAD = [c for c in SHAPE if c != "chunk_size"] + ["problem_name", "dtype"]


@dataclass(frozen=True)
class Page:
    """One model's front page: its slug, its GPU model, the index entry and file of its current run (None: none)."""

    slug: str
    gpu: str
    entry: str
    source: str | None


def page_of(slug: str, root: Path | None = None) -> Page:
    if slug not in MODELS:
        raise ValueError(f"--gpu {slug!r}: expected one of {', '.join(MODELS)} (analysis.front_page.MODELS)")
    entry = ENTRY.format(slug=slug)
    return Page(slug, MODELS[slug], entry, index_sections(root)["current"].get(entry))


def block_gated(w: pd.DataFrame) -> bool:
    """Whether the rows carry the block-wise gate's worst block (`block_err`): rows gated on the whole tensor only
    belong to the archive."""
    return "block_err" in w and bool(w["block_err"].notna().any())


def settings(backend: str, switch_dict: dict) -> str:
    """The switches a point ran away from the backend's declared defaults, or "defaults"."""
    changed = explicit_switches(backend, switch_dict)
    return ", ".join(f"{k}={v}" for k, v in sorted(changed.items())) or "defaults"


def tiles(tuning) -> str:
    """Where a point's stage configs came from (record, search, fallback), as its `tuning` column says."""
    try:
        sources = json.loads(tuning) if isinstance(tuning, str) and tuning.startswith("{") else tuning
    except ValueError:
        return str(tuning)
    if isinstance(sources, dict):
        return "/".join(sorted({str(v) for v in sources.values()})) or "none"
    return "" if sources is None or pd.isna(sources) else str(sources)


def _ms(rows: pd.DataFrame, metric: str = "median_ms") -> str:
    """One point's figure: one round's median [p20, p80], or the median of the rounds' medians [their min, max]."""
    values = rows[metric].dropna()
    if values.empty:
        return ""
    if metric != "median_ms":
        return f"{values.median():.3f}"
    if len(values) == 1:
        r = rows.loc[values.index[0]]
        return f"{r['median_ms']:.3f} [{r['p20_ms']:.3f}, {r['p80_ms']:.3f}]"
    return f"{values.median():.3f} [{values.min():.3f}, {values.max():.3f}]"


def _parts(parts: pd.DataFrame) -> str:
    """The pieces of the forward timed apart ("adapter_prepare 0.002, peer 1.248 ms"), eager medians."""
    if parts.empty:
        return ""
    medians = parts.groupby("stage", sort=True)["median_ms"].median()
    return ", ".join(f"{stage.removeprefix('part:')} {ms:.3f}" for stage, ms in medians.items()) + " ms"


def points(w: pd.DataFrame) -> pd.DataFrame:
    """One row per point of the run at the forward (its rounds pooled): backend, case, chunk, settings, tiles, the
    eager and graph figures, the rounds, the parts, and the eager median to rank by."""
    ok = w[w["status"] == "ok"]
    fwd = ok[(ok["stage"] == FORWARD) & ok["median_ms"].notna()]
    out = []
    pieces = ok[ok["stage"].str.startswith("part:") & ok["median_ms"].notna()]
    for key, g in fwd.groupby(_POINT, sort=False, dropna=False):
        first = g.iloc[0]
        parts = pieces[(pieces[_POINT].astype(str) == pd.Series(key, index=_POINT).astype(str)).all(axis=1)]
        out.append({"backend": first["backend"], **{c: first[c] for c in _WORKLOAD},
                    "shape_name": first["shape_name"], "chunk": int(first["chunk_size"]),
                    "settings": settings(first["backend"], first["switch_dict"]), "tiles": tiles(first["tuning"]),
                    "eager ms": _ms(g), "graph ms": _ms(g, "graph_median_ms"), "rounds": g["run_id"].nunique(),
                    "parts": _parts(parts), "rank_ms": float(g.groupby("run_id")["median_ms"].median().median())})
    return pd.DataFrame(out)


def _case(group: pd.DataFrame) -> str:
    """A workload's name: the shortest of its shape presets' names (S1 before S1_c128)."""
    return min(group["shape_name"].astype(str), key=lambda n: (len(n), n))


def standings(w: pd.DataFrame) -> pd.DataFrame:
    """Per workload (shape, any chunk) and backend: its defaults point and its best point (the fastest eager median;
    a backend in OWN_CHUNKS only at its own chunks), one row each, or one row "defaults, best" when they are one."""
    p = points(w)
    rows = []
    if p.empty:
        return pd.DataFrame(columns=["shape", "backend", "point", "settings", "chunk", "tiles", "eager ms",
                                     "graph ms", "rounds", "parts"])
    for _, g in p.groupby(_WORKLOAD, sort=False, dropna=False):
        case = _case(g)
        for backend in order(g["backend"].unique()):
            mine = g[g["backend"] == backend]
            defaults = mine[mine["settings"] == "defaults"].sort_values("rank_ms").head(1)
            own = OWN_CHUNKS.get(backend)
            candidates = mine[mine["chunk"].isin(own)] if own else mine
            best = candidates.sort_values("rank_ms").head(1)
            same = bool(len(defaults) and len(best)) and defaults.index[0] == best.index[0]
            for label, chosen in (("defaults, best" if same else "defaults", defaults),
                                  *(() if same else (("best", best),))):
                if chosen.empty:
                    why = (f"no point at its own chunk ({', '.join(map(str, own))}) in this run" if label == "best"
                           and own else "not in this run")
                    rows.append({"shape": case, "backend": backend, "point": label, "settings": why})
                    continue
                r = chosen.iloc[0]
                rows.append({"shape": case, "backend": backend, "point": label, "settings": r["settings"],
                             "chunk": r["chunk"], "tiles": r["tiles"], "eager ms": r["eager ms"],
                             "graph ms": r["graph ms"], "rounds": r["rounds"], "parts": r["parts"]})
    out = pd.DataFrame(rows).astype(object).fillna("")
    out["chunk"] = out["chunk"].map(lambda c: str(int(c)) if c != "" else "")
    return out.sort_values("shape", kind="stable").reset_index(drop=True)


def order(backends) -> list[str]:
    """Ours first, then the peers, then any other backend by name."""
    known = [*OURS, *PEERS]
    return sorted(backends, key=lambda b: (known.index(b) if b in known else len(known), b))


def render(page: Page, root: Path | None = None) -> str:
    """The page's Markdown: the standings of its current run, or a first line saying it has none."""
    root = root or repo_root()
    title = f"# Where things stand: {page.gpu}"
    made = f"Generated by `python -m analysis.front_page --gpu {page.slug}`"
    if page.source is None:
        return "\n".join([title, "", f"**No current run on {page.gpu}**: `{INDEX}` names no `{page.entry}` under "
                          "`current:`, so no number on this page; the other models' pages are not this card's.", "",
                          f"{made}. Do not edit: regenerate.", ""])
    w = one_run(wide(root / Path(INDEX).parent / page.source), f"front page {page.slug} ({page.source})")
    gpus = set(w["gpu_name"].dropna())
    if gpus != {page.gpu}:
        raise ValueError(f"{INDEX} `{page.entry}`: {page.source} holds rows of {sorted(gpus)}, not {page.gpu}")
    run = runs(w).iloc[0]
    days = sorted({str(t)[:10] for t in w["timestamp"].dropna()})
    missing = [b for b in order(set(OURS) | set(PEERS)) if b not in set(w["backend"])]
    gate = "block-wise" if block_gated(w) else "whole tensor only (an archive run)"
    lines = [title, "",
             f"{made} from `results/{page.source}` (`{page.entry}` under `current:` in `{INDEX}`): one run, "
             f"`{run['run_group']}` on {run['gpu_uuid']}, source tree `{run['source_tree']}`, "
             f"{' to '.join(dict.fromkeys([days[0], days[-1]]))}, {w['run_id'].nunique()} points; gate: {gate}. "
             "Do not edit: regenerate.", ""]
    if missing:
        lines += [f"Not in this run: {', '.join(missing)} (a page reads one run; their rows elsewhere are other runs).",
                  ""]
    lines += [
        "## Forward: each backend at its defaults and at its best in this run", "",
        "`defaults`: the point run at the backend's declared switches (analysis.switches); `best`: its fastest eager "
        "median here (the switches it ran away from the defaults; a peer at its own chunk, "
        + ", ".join(f"{b} {'/'.join(map(str, c))}" for b, c in OWN_CHUNKS.items()) + "). Eager ms: one round's "
        "median [p20, p80], or the median of the rounds' medians [their min, max]; graph ms: CUDA-graph replay, L2 "
        "flushed. `tiles`: where the stage configs came from (record: a search record for this card; fallback: the "
        "built-in configs). `parts`: pieces of the forward timed apart (a peer's adapter preparation and its own "
        "kernels).", "",
        table(standings(w)), ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m analysis.front_page", description=__doc__.splitlines()[0])
    p.add_argument("--gpu", action="append", choices=list(MODELS), help="a model's slug (default: every model)")
    p.add_argument("--check", action="store_true", help="exit 1 if a committed page differs from the rows")
    a = p.parse_args(argv)
    root, differ = repo_root(), []
    for slug in a.gpu or list(MODELS):
        path = root / OUTPUT.format(slug=slug)
        text = render(page_of(slug, root), root)
        if a.check:
            if not (path.is_file() and path.read_text() == text):
                differ.append(str(path))
            continue
        path.write_text(text)
        print(f"[front_page] {path}")
    if a.check:
        print("[front_page] " + (f"differ: {', '.join(differ)} (python -m analysis.front_page)" if differ else
                                 "every page matches its rows"))
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
