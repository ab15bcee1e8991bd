"""Loss curves per backend against the band of the reference backend's seeds (rows of experiments/train_curves.py):
the band, the check of every backend against it, and its figure; `python -m analysis.curves <rows folder>` prints
each backend's verdict and saves the figure (`main`).

Band: each run's loss smoothed by a trailing mean over SMOOTH_STEPS steps; at each step the min and max over the
reference backend's seeds (at least MIN_SEEDS of them). A backend is inside when the mean over its seeds of its
smoothed curves lies within the band at every step from FROM_STEP on (the mean, not each seed: a backend's seed s
tracks the reference's seed s, which is itself the band's edge at some steps, so a single seed would leave the band
by rounding alone), and the mean of its seeds' final recall accuracies lies within the reference seeds' range.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # before pyplot: headless CI and report runs
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from analysis import palette  # noqa: E402
from analysis.load import one_run  # noqa: E402

SMOOTH_STEPS = 20
FROM_STEP = 50
MIN_SEEDS = 3
BAND_BACKEND = "reference"
SUFFIX = ".curves.parquet"  # experiments/train_curves.py SUFFIX


def load_curves(source: str | Path) -> pd.DataFrame:
    """The curve rows of a `*.curves.parquet` file or of every one under a folder, with a column `source` (the
    file's name); a source with none raises, naming it."""
    source = Path(source)
    files = [source] if source.is_file() else sorted(source.rglob(f"*{SUFFIX}"))
    if not files:
        raise FileNotFoundError(f"source: no *{SUFFIX} file at {source}")
    return pd.concat([pd.read_parquet(f).assign(source=f.name) for f in files], ignore_index=True)


def load_curves_beside(sources) -> pd.DataFrame:
    """The curve rows beside resolved result sources (analysis.end_to_end.beside: under a folder source or in the
    folder of a file source), one run of them (analysis.load.one_run)."""
    from analysis.end_to_end import read_beside

    return one_run(read_beside(sources, SUFFIX), "loss curves beside the rows")


def smoothed(rows: pd.DataFrame, window: int = SMOOTH_STEPS) -> pd.DataFrame:
    """Each (backend, seed) run's loss smoothed by a trailing mean over `window` steps (fewer at the start):
    index step, columns (backend, seed). Two runs of one (backend, seed) raise (select one run group first)."""
    twice = rows.duplicated(["backend", "seed", "step"])
    if twice.any():
        first = rows[twice].iloc[0]
        raise ValueError(f"rows: backend {first['backend']} seed {first['seed']} has step {first['step']} twice; "
                         "give one run of each (backend, seed)")
    table = rows.pivot(index="step", columns=["backend", "seed"], values="loss").sort_index()
    return table.rolling(window, min_periods=1).mean()


def final_accuracy(rows: pd.DataFrame) -> pd.Series:
    """Each (backend, seed) run's recall accuracy after its last step."""
    return rows.dropna(subset=["accuracy"]).set_index(["backend", "seed"])["accuracy"].sort_index()


@dataclass(frozen=True)
class Band:
    """The min/max envelope (index step) of `backend`'s smoothed curves over `seeds`, and their accuracies' range."""

    backend: str
    seeds: tuple[int, ...]
    low: pd.Series
    high: pd.Series
    accuracy: tuple[float, float]


def band(rows: pd.DataFrame, backend: str = BAND_BACKEND, window: int = SMOOTH_STEPS,
         min_seeds: int = MIN_SEEDS) -> Band:
    """The band of `backend`'s seeds; fewer than `min_seeds` of them raise, naming the backend."""
    mine = rows[rows["backend"] == backend]
    seeds = tuple(sorted(int(s) for s in mine["seed"].unique()))
    if len(seeds) < min_seeds:
        raise ValueError(f"backend: the band needs {min_seeds} seeds of {backend!r}, the rows have {list(seeds)}")
    curves = smoothed(mine, window)[backend]
    acc = final_accuracy(mine)
    return Band(backend, seeds, curves.min(axis=1), curves.max(axis=1), (float(acc.min()), float(acc.max())))


@dataclass(frozen=True)
class Verdict:
    """One backend against the band: the mean of its seeds' smoothed curves (`inside` from `from_step`, the first
    step outside, the largest distance outside), the mean of its seeds' final accuracies (within the band's range),
    and why it fails (empty when it passes)."""

    backend: str
    seeds: tuple[int, ...]
    from_step: int
    inside: bool
    first_outside: int | None
    worst_excess: float
    accuracy: float
    accuracy_inside: bool
    reason: str

    @property
    def ok(self) -> bool:
        return self.inside and self.accuracy_inside


def _outside(curve: pd.Series, measured: pd.Index, b: Band, from_step: int) -> tuple[int | None, float, str]:
    """(first step outside, largest distance outside, why) of `curve` against the band from `from_step`;
    `measured`: the steps at which every seed of the backend has a loss (the smoothed curve fills gaps)."""
    steps = b.low.index[b.low.index >= from_step]
    if len(steps) == 0:
        return None, 0.0, f"the band has no step >= {from_step}"
    missing = steps.difference(measured)
    if len(missing):
        return int(missing[0]), float("inf"), f"no loss at step {int(missing[0])} (the band's runs have it)"
    values = curve.loc[steps]
    excess = pd.concat([b.low.loc[steps] - values, values - b.high.loc[steps]], axis=1).max(axis=1).clip(lower=0)
    if not (excess > 0).any():
        return None, 0.0, ""
    first = int(excess[excess > 0].index[0])
    return first, float(excess.max()), (f"smoothed loss outside the band from step {first} (by up to "
                                        f"{excess.max():.4g})")


def check(rows: pd.DataFrame, b: Band, from_step: int = FROM_STEP, window: int = SMOOTH_STEPS) -> list[Verdict]:
    """Every backend in `rows` (the band's own among them) against the band, in name order."""
    curves, acc = smoothed(rows, window), final_accuracy(rows)
    raw = rows.pivot(index="step", columns=["backend", "seed"], values="loss")
    verdicts = []
    for backend in sorted(rows["backend"].unique()):
        mine = curves[backend]
        seeds = tuple(sorted(int(s) for s in mine.columns))
        measured = raw[backend].dropna(how="any").index
        first, worst, why = _outside(mine.mean(axis=1), measured, b, from_step)
        accuracy = float(acc[backend].mean()) if backend in acc.index.get_level_values(0) else float("nan")
        acc_inside = b.accuracy[0] <= accuracy <= b.accuracy[1]
        reasons = [why] if why else []
        if not acc_inside:
            reasons.append(f"accuracy {accuracy:.4f} outside the {b.backend} seeds' range "
                           f"[{b.accuracy[0]:.4f}, {b.accuracy[1]:.4f}]")
        verdicts.append(Verdict(backend, seeds, from_step, not why, first, worst, accuracy, acc_inside,
                                "; ".join(reasons)))
    return verdicts


def title(rows: pd.DataFrame) -> str:
    """The card(s), the date(s) and the rows' files, for the figure's title."""
    cards = ", ".join(sorted(rows["gpu_name"].dropna().unique())) or ", ".join(sorted(rows["device_name"].unique()))
    dates = sorted(str(t)[:10] for t in rows["timestamp"].unique())
    when = dates[0] if dates[0] == dates[-1] else f"{dates[0]} – {dates[-1]}"
    files = sorted(rows["source"].unique()) if "source" in rows else []
    shown = ", ".join(files[:3]) + (f" and {len(files) - 3} more" if len(files) > 3 else "")
    return f"Loss curves on {cards}, {when}\nrows: {shown or 'given frame'}"


def figure(rows: pd.DataFrame, b: Band, verdicts: list[Verdict], window: int = SMOOTH_STEPS):
    """The band (grey), each backend's mean smoothed curve in its color (its seeds thin), the check's first step;
    the legend says each backend's verdict and accuracy. The rows must come from one run (analysis.load.one_run)."""
    rows = one_run(rows, "loss-curve figure")
    curves = smoothed(rows, window)
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ax.fill_between(b.low.index, b.low.values, b.high.values, color="0.85",
                    label=f"{b.backend} band: seeds {list(b.seeds)}, min/max of {window}-step means")
    for v in verdicts:
        color = palette.color(v.backend)
        mine = curves[v.backend]
        for seed in mine.columns:
            ax.plot(mine.index, mine[seed], color=color, lw=0.6, alpha=0.35, gid=f"backend:{v.backend}")
        verdict = "inside" if v.ok else "OUTSIDE"
        ax.plot(mine.index, mine.mean(axis=1), color=color, lw=1.6, gid=f"backend:{v.backend}",
                label=f"{v.backend}: {verdict}, accuracy {v.accuracy:.3f}")
    ax.axvline(verdicts[0].from_step if verdicts else FROM_STEP, color="k", lw=0.6, ls="--")
    ax.set_xlabel("step")
    ax.set_ylabel(f"recall loss ({window}-step trailing mean)")
    ax.set_title(title(rows), fontsize=9)
    ax.legend(fontsize=7)
    return fig


def main(argv: list[str] | None = None) -> int:
    """`python -m analysis.curves <rows file or folder> [--out <folder>]`: one line per backend's verdict, the
    figure saved as loss_curves.png/.svg under --out (default: beside the rows); exit status 1 when any fails."""
    import argparse

    from analysis.figures import save

    parser = argparse.ArgumentParser(prog="python -m analysis.curves", description=main.__doc__)
    parser.add_argument("source")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    rows = one_run(load_curves(args.source), "loss-curve band")
    b = band(rows)
    verdicts = check(rows, b)
    for v in verdicts:
        print(f"{v.backend} seeds {list(v.seeds)}: {'inside' if v.ok else 'FAILS'}, accuracy {v.accuracy:.4f} "
              f"(band {b.accuracy[0]:.4f} … {b.accuracy[1]:.4f}){'; ' + v.reason if v.reason else ''}")
    source = Path(args.source)
    folder = Path(args.out) if args.out else (source if source.is_dir() else source.parent)
    for path in save(figure(rows, b, verdicts), folder, "loss_curves"):
        print(f"wrote {path}")
    return 0 if all(v.ok for v in verdicts) else 1


if __name__ == "__main__":
    raise SystemExit(main())
