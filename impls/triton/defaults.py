"""The Triton backend's switch defaults per target (impls/defaults.py): which named sets of its switches run where.

- sm_90 (Hopper): "best_sm90", the set composed from the fastest single-switch comparisons of our Triton (the
  rows per card: `chosen_by`, printed by `python -m impls switches triton`): tensor-descriptor loads
  with the descriptors built on the host, stage 2 as one kernel walking the chunks, and the cached launch path
  (results/2026-12-05-h200-rounds-language-vs-trick/headline.parquet, the three interleaved rounds on an H200;
  results/2026-12-05-h100-lvt-v23-rounds/headline.parquet on an H100; results/2026-12-06-h100-rounds-row-pairs and
  results/2026-12-06-h200-row-pairs measured against it as the baseline), and the backward's dcb kernel against the
  whole chunk of sources (bwd_dcb_sources='chunk', chosen by backward rows at S1 on an H100,
  results/2026-12-07-h100-backward-arms-s1/dcb_sources_s1.parquet; the H200 has not measured it). Where TMA refuses a
  call's inputs (a base pointer or a stride that is not a 16-byte multiple, a last dimension that is not contiguous),
  the call runs "best_sm90_no_tma": the same with pointer loads. The study run's rows decide the set finally.
- interpreter (TRITON_INTERPRET=1): the same two, less what the interpreter cannot run: launch_path='cached'
  launches the kernels Triton compiled, and the interpreter compiles none.
- sm_100 (Blackwell): "published", the published tricks on (transposed_layout, operand_swap, exp2: the declared
  values, docs/triton-switches.md), until measured there. Other GPUs and the CPU: the declared values.
"""

from __future__ import annotations

from impls.defaults import Chosen, Defaults, Preset

ROWS = ("results/2026-12-05-h200-rounds-language-vs-trick/headline.parquet (H200), "
        "results/2026-12-05-h100-lvt-v23-rounds/headline.parquet (H100): the set these rows ran our Triton at, S1-S4 "
        "(composed from single-switch comparisons; chosen_by names the rows per card)")
CHOSEN_SM90 = (
    Chosen("NVIDIA H200", "results/2026-12-05-h200-rounds-language-vs-trick/headline.parquet", 1,
           "three interleaved rounds; its tma, descriptors and state_pass were chosen in single-switch comparisons: "
           "tma with host-built descriptors the fastest of 4 sets at S1–S4 in "
           "results/2026-12-05-h200-ablations-search-clusters/ablate_triton.parquet, state_pass=serial the fastest of "
           "14 points at S1 in results/2026-12-05-h200-rounds-language-vs-trick/language_vs_trick_triton.parquet"),
    Chosen("NVIDIA H100 80GB HBM3", "results/2026-12-05-h100-lvt-v23-rounds/headline.parquet", 1,
           "three interleaved rounds"),
    Chosen("NVIDIA H100 80GB HBM3", "results/2026-12-06-h100-rounds-row-pairs/headline_fair_fight_one_round.parquet", 1,
           "one round, the H100 front page's rows"),
    Chosen("NVIDIA H100 80GB HBM3", "results/2026-12-07-h100-backward-arms-s1/dcb_sources_s1.parquet", 2,
           "the backward's bwd_dcb_sources, 'tiles' against 'chunk', each on its own searched records, one run "
           "(3.85 → 3.66 ms)", direction="backward", shapes=("S1",)),
)
# the forward's set, and the backward's dcb kernel walking the heads once against the whole chunk of sources
# (bwd_dcb_sources, backward version 8)
BEST_SM90 = dict(tma=True, tma_descriptors="host", state_pass="serial", launch_path="cached",
                 bwd_dcb_sources="chunk")
NO_TMA = dict(tma=False, tma_descriptors="device")
INTERPRETER_REFUSES = ("launch_path",)  # impls/triton/backend.py: the interpreter compiles no kernel to launch


def _without(values: dict, names) -> dict:
    return {k: v for k, v in values.items() if k not in names}


DEFAULTS = Defaults(
    presets={
        "published": Preset.of("the published tricks on: the declared values (docs/triton-switches.md)"),
        "best_sm90": Preset.of(ROWS, chosen_by=CHOSEN_SM90, **BEST_SM90),
        "best_sm90_no_tma": Preset.of(f"best_sm90 with pointer loads, for inputs TMA refuses; {ROWS}",
                                      **{**BEST_SM90, **NO_TMA}),
        "best_interpreter": Preset.of("best_sm90 less what the Triton interpreter cannot run (launch_path)",
                                      **_without(BEST_SM90, INTERPRETER_REFUSES)),
        "best_interpreter_no_tma": Preset.of("best_interpreter with pointer loads, for inputs TMA refuses",
                                             **_without({**BEST_SM90, **NO_TMA}, INTERPRETER_REFUSES)),
    },
    targets={
        "sm_90": ("best_sm90", "best_sm90_no_tma"),
        "interpreter": ("best_interpreter", "best_interpreter_no_tma"),
        "sm_100": ("published",),
    },
)
