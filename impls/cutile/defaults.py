"""The cuTile backend's switch defaults per target (impls/defaults.py): which named sets of its switches run where.

- sm_90 (Hopper): "best_sm90", the set of the fastest committed cuTile rows at S1–S4: compute_out's heads-first
  program order, the skip term before the source loop, and programmatic dependent launch ("version 13" in
  docs/perf-notes.md; results/2026-12-05-h200-fair-fight-rounds/headline.parquet on an H200, round 1's CUDA-graph
  replay 0.840 / 1.892 / 0.680 / 0.224 ms against the declared values' 0.873 / 2.030 / 0.713 / 0.261 at S1–S4; the
  three interleaved rounds of results/2026-12-06-h100-rounds-row-pairs/headline_cutile_targets.parquet on an
  H100). Measured on the tiles of its tuning records; on model shapes without records (fallback tiles) an H100
  measured it 3–6 % slower than the declared values (issue 44): the study run's rows decide the set finally.
  Nothing of it refuses an input the contract accepts, so no next arrangement is declared.
- sm_100 (Blackwell): "published", until measured there.
- the CPU and other GPUs: the declared values (cuTile runs on CUDA devices only; the ahead-of-time tools compile
  the declared values unless told otherwise).

"published" is the arrangement of NVIDIA's CUDA Tile Mamba-2 write-up that this backend reproduces
(docs/cutile-switches.md): every trick of it on — transposed layouts, swapped matmul operands, latency hints, TMA,
exp2 — and the rest as declared. The backend first shipped it as its defaults (impls/README.md, "the published
configuration"); operand_swap went off by default once the H200 measured it 49 % slower at the tuned S1 forward
(docs/perf-notes.md, version 1).
"""

from __future__ import annotations

from impls.defaults import Chosen, Defaults, Preset

H200, H100 = "NVIDIA H200", "NVIDIA H100 80GB HBM3"
CHOSEN_SM90 = (
    Chosen(H200, "results/2026-12-05-h200-fair-fight-rounds/headline.parquet", 2,
           "both sets on the H200's tuning records"),
    Chosen(H100, "results/2026-12-06-h100-rounds-row-pairs/headline_fair_fight_one_round.parquet", 2,
           "one round; the declared values on fallback tiles at S2–S4 (no H100 record for them), this set on its "
           "records"),
    Chosen(H100, "results/2026-12-06-h100-rounds-row-pairs/headline_cutile_targets.parquet", 1,
           "three interleaved rounds"),
)

DEFAULTS = Defaults(
    presets={
        "published": Preset.of(
            "NVIDIA's CUDA Tile Mamba-2 write-up (docs/cutile-switches.md): transposed_layout, operand_swap, "
            "latency_hints, tma, exp2 on", transposed_layout=True, operand_swap=True, latency_hints=True, tma=True,
            exp2=True),
        "best_sm90": Preset.of(
            "results/2026-12-05-h200-fair-fight-rounds/headline.parquet (H200), "
            "results/2026-12-06-h100-rounds-row-pairs/headline_cutile_targets.parquet (H100): version 13's switches",
            chosen_by=CHOSEN_SM90, heads_first=True, skip_first=True, pdl=True),
    },
    targets={"sm_90": ("best_sm90",), "sm_100": ("published",)},
)
