"""How every figure draws a backend, a stage, a tuned point and a shape: one color per backend, one marker per stage,
a hatch for points on tuned configs, shapes captioned with the Mamba-2 model whose layer they are.

Point labels (analysis.load.point_label, analysis.speedup.tuned_label) read "backend", "backend[tuned]",
"backend[<ablation>]" or "backend{switch=value,...}"; figures never show them raw: `parse_label` splits them.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

# One color per backend, the same in every figure (matplotlib's tab10 colors, fixed by name).
BACKEND_COLORS: dict[str, str] = {
    "cutile": "#2ca02c",     # green
    "triton": "#ff7f0e",     # orange
    "mamba_ssm": "#1f77b4",  # blue
    "tilegym": "#9467bd",    # purple
    "fla": "#8c564b",        # brown
    "vllm": "#d62728",       # red
    "reference": "#7f7f7f",  # grey
}
STAGE_MARKERS: dict[str, str] = {"chunk_cumsum": "v", "fwd_pass_state": "s", "compute_out": "o", "forward": "*"}
DTYPE_LINESTYLES: dict[str, str] = {"bfloat16": "-", "float16": "--", "float32": ":", "float64": "-."}
TUNED_HATCH = "///"   # points on searched or recorded configs
VARIANT_HATCH = ".."  # points with switches set away from the defaults outside an ablation
SHAPE_DIR = Path(__file__).resolve().parents[1] / "conf" / "shape"


@dataclass(frozen=True)
class Label:
    backend: str
    tuned: bool = False
    variant: str = ""  # "switch=value, ..." or an ablation point

    @property
    def text(self) -> str:
        """For legends and ticks: the backend, with the variant in words, never brackets or braces."""
        return f"{self.backend} ({self.variant})" if self.variant else self.backend


def parse_label(label: str) -> Label:
    m = re.fullmatch(r"(?P<backend>[a-z0-9_]+)(\{(?P<sw>[^}]*)\})?(\[(?P<tag>[^\]]*)\])?", str(label))
    if m is None:
        raise ValueError(f"point label: expected backend, backend[...] or backend{{...}}, got {label!r}")
    tag = m["tag"] or ""
    variant = ", ".join(filter(None, [(m["sw"] or "").replace(",", ", "), "" if tag == "tuned" else tag]))
    return Label(m["backend"], tag == "tuned", variant)


def color(backend_or_label: str) -> str:
    backend = parse_label(backend_or_label).backend
    if backend not in BACKEND_COLORS:
        raise ValueError(f"backend {backend!r} has no color: add it to analysis.palette.BACKEND_COLORS")
    return BACKEND_COLORS[backend]


def hatch(label: str) -> str:
    lab = parse_label(label)
    return TUNED_HATCH if lab.tuned else (VARIANT_HATCH if lab.variant else "")


def marker(stage: str) -> str:
    return STAGE_MARKERS.get(stage, "D")


@functools.cache
def _models_by_heads() -> dict[tuple[int, int], str]:
    """(nheads, headdim) -> "Mamba-2 2.7B", read from conf/shape/mamba2_*.yaml (the published model configs)."""
    out = {}
    for path in sorted(SHAPE_DIR.glob("mamba2_*.yaml")):
        cfg = yaml.safe_load(path.read_text())
        size = cfg["name"].removeprefix("mamba2_").replace("p", ".").upper()
        out[(int(cfg["nheads"]), int(cfg["headdim"]))] = f"Mamba-2 {size}"
    return out


def _conf_shape(shape_name: str) -> str | None:
    """The label ("b8-l4096-...") of conf/shape/<shape_name>.yaml, or None when there is no such file."""
    path = SHAPE_DIR / f"{shape_name}.yaml"
    if not path.is_file():
        return None
    return "b{batch}-l{seqlen}-h{nheads}-p{headdim}-g{ngroups}-n{dstate}-c{chunk_size}".format(
        **yaml.safe_load(path.read_text()))


def shape_caption(shape_name: str, shape: str | None = None) -> str:
    """"S1" and its label "b8-l4096-h80-p64-g1-n128-c256" (default: read from conf/shape/) -> "S1: Mamba-2 2.7B,
    8×4096"; the model whose heads and headdim the shape has, "-like" when groups, state or chunk differ from it."""
    shape = shape or _conf_shape(shape_name)
    if not shape or shape_name == "geomean":
        return str(shape_name)
    dims = dict(re.findall(r"([a-z])(\d+)", shape))
    if not {"b", "l", "h", "p"} <= set(dims):
        return str(shape_name)
    model = _models_by_heads().get((int(dims["h"]), int(dims["p"])))
    if model is None:
        return f"{shape_name}: {dims['h']} heads, {dims['b']}×{dims['l']}"
    like = "" if (dims.get("g"), dims.get("n"), dims.get("c")) == ("1", "128", "256") else "-like"
    return f"{shape_name}: {model}{like}, {dims['b']}×{dims['l']}"


# Where a point's tiles came from, in the words a legend uses: the rows' `tile_protocol` (impls/tuning.py
# TILE_PROTOCOLS), else, in rows written before that column, their `tuning` sources (a record looked up by the
# point's own key, a search now, the fallback tiles). "tuned" only for tiles searched for the point itself.
TILE_WORDS: dict[str, str] = {
    "retuned": "tuned", "retuned-narrower": "tuned (narrower space)", "record": "tuned (record)",
    "search": "tuned (searched)", "same-sass": "baseline's tiles (same code)", "pinned": "pinned (borrowed tiles)",
    "fallback": "fallback tiles", "switches": "tiles set by switches", "peer-autotune": "its own autotuner",
    "untuned": "no tiles to choose", "none": "its own configs (not chosen by this study)",
}
TUNED_SOURCES = ("retuned", "retuned-narrower")  # the protocols of tiles searched under the point's own switch set


def _protocols(protocol) -> tuple[str, ...]:
    if isinstance(protocol, str) and protocol and protocol != "unknown":
        return tuple(sorted(set(protocol.split("+"))))
    return ()


def _tuning(tuning) -> tuple[str, ...]:
    if not isinstance(tuning, str) or not tuning:
        return ()
    try:
        parsed = json.loads(tuning) if tuning.startswith("{") else tuning
    except ValueError:
        parsed = tuning
    values = parsed.values() if isinstance(parsed, dict) else [parsed]
    return tuple(sorted({str(v) for v in values}))


def tile_sources(protocol, tuning) -> tuple[str, ...]:
    """The distinct tile sources of one row: its `tile_protocol` ("+"-joined), else its `tuning` (a JSON dict of
    stage -> source, or one word); () when the row says neither."""
    return _protocols(protocol) or _tuning(tuning)


def tile_words(sources) -> str:
    """A legend's words for a row's tile sources (`tile_sources`): "tuned", "fallback tiles", "pinned (borrowed
    tiles)", joined with " + " where the stages differ; "" for none."""
    return " + ".join(dict.fromkeys(TILE_WORDS.get(s, s) for s in sources))


def is_tuned(protocol, tuning) -> bool:
    """Whether every stage's tiles were searched for the point itself: its `tuning` sources all a stored record or
    a search now, and its `tile_protocol` (where the row has one) retuned for the point's own switch set, not
    pinned (borrowed) nor the baseline's (same-sass)."""
    sources = _tuning(tuning)
    protocols = _protocols(protocol)
    return (bool(sources) and all(s in ("record", "search") for s in sources)
            and all(p in TUNED_SOURCES[:2] for p in protocols))

# A marker and a line style per backend as well as its color: lines that coincide (equal errors) stay told apart.
BACKEND_MARKERS: dict[str, str] = {"cutile": "o", "triton": "s", "mamba_ssm": "^", "tilegym": "D", "fla": "v",
                                   "vllm": "P", "reference": "x"}
BACKEND_LINESTYLES: dict[str, str | tuple] = {"cutile": "-", "triton": "--", "mamba_ssm": "-.", "tilegym": ":",
                                              "fla": (0, (5, 1, 1, 1)), "vllm": (0, (1, 1)), "reference": "-"}


def backend_marker(backend_or_label: str) -> str:
    return BACKEND_MARKERS.get(parse_label(backend_or_label).backend, "D")


def backend_linestyle(backend_or_label: str):
    return BACKEND_LINESTYLES.get(parse_label(backend_or_label).backend, "-")
