"""The cuTile backend's switch defaults per target (impls/defaults.py): which named sets of its switches run where.

- sm_90 (Hopper): "best_sm90", then "best_sm90_no_fold". "best_sm90" is version 13's switches (compute_out's
  heads-first program order, the skip term before the source loop, programmatic dependent launch; docs/perf-notes.md)
  with issue 51's winners: flush-to-zero exp2 (exp2_ftz), dt folded into the scores' exponent (exp_fold) and the C·Bᵀ
  kernel at occupancy 4 on its lower triangle (cb_occupancy, cb_lower_triangle). Chosen on three rounds of one run
  group on an H100 (results/2026-12-07-h100-switches-backward-first/cutile_best_rounds.parquet): forward 0.827 →
  0.753 ms at S1, 1.714 → 1.527 at S2, 0.709 → 0.654 at S3, S4 unchanged (0.252 → 0.254), all on version 13's
  records (the four switches borrow them: impls/cutile/tune.py near_key; rows `pinned`). Version 13's switches alone
  were chosen earlier on both cards (results/2026-12-05-h200-fair-fight-rounds/headline.parquet on an H200,
  results/2026-12-06-h100-rounds-row-pairs/headline_cutile_targets.parquet on an H100); the H200 has not measured
  the four switches yet, and an H100 measured version 13's set 3–6 % slower than the declared values on shapes
  without records (issue 44): the study run's rows decide the set finally.
  exp_fold reads log2(dt), which a negative dt (the contract allows one without softplus or a clamp at zero) has not:
  a call whose dt may be negative (`FOLD_REFUSAL`: dt_softplus off and no dt_limit clamping at or above zero) runs
  "best_sm90_no_fold", the same set without exp_fold and bwd_decay_factor (not measured as a whole: exp2_ftz alone
  −3.6 %, the C·Bᵀ switches alone −2.4 % at S1, results/2026-12-07-h100-switches-backward-first/switches_s1_s3.parquet).
  The backward's own switches in the set were chosen by backward rows, each arrangement on its own searched records
  at S1 in one run on an H100: bwd_dcb_sources='chunk' (the dcb kernel walks the group's heads once against the whole
  chunk of sources; 3.81 → 3.25 ms, results/2026-12-07-h100-backward-arms-s1/dcb_sources_s1.parquet), then
  bwd_exp2_ftz with bwd_decay_factor (flush-to-zero exp2 in every backward kernel, the chunk kernel's decays below the
  diagonal as an outer product; 3.03–3.07 → 2.96 ms, bwd_decay_factor alone 3.01–3.02,
  results/2026-12-07-h100-backward-v13-s1/backward_s1.parquet). bwd_decay_factor assumes dA_cumsum monotone inside a
  chunk, so a call whose dt may be negative runs the next arrangement, which drops it with exp_fold.
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

H100 = "NVIDIA H100 80GB HBM3"
CHOSEN_SM90 = (
    Chosen(H100, "results/2026-12-07-h100-switches-backward-first/cutile_best_rounds.parquet", 4,
           "round 1 of four sets, rounds 2 and 3 of two: version 13's switches against them with exp2_ftz, "
           "exp_fold, cb_occupancy 4 and cb_lower_triangle, on version 13's H100 records"),
    Chosen(H100, "results/2026-12-07-h100-backward-v13-s1/backward_s1.parquet", 3,
           "the backward's bwd_exp2_ftz with bwd_decay_factor, bwd_decay_factor alone and neither (bwd_dcb_sources "
           "'chunk' in all three: results/2026-12-07-h100-backward-arms-s1/dcb_sources_s1.parquet chose it over "
           "'tiles', 3.81 → 3.25 ms), each on its own searched records, one run (3.03–3.07 → 2.96 ms)",
           direction="backward", shapes=("S1",)),
)

# version 13's switches (heads_first, skip_first, pdl), issue 51's winners, and the backward's: the dcb kernel walking
# the heads once against the whole chunk of sources (bwd_dcb_sources, backward version 8), flush-to-zero exp2 and the
# chunk kernel's factored decays (bwd_exp2_ftz, bwd_decay_factor: backward versions 5 and 10)
BEST_SM90 = dict(heads_first=True, skip_first=True, pdl=True, exp2_ftz=True, exp_fold=True, cb_occupancy=4,
                 cb_lower_triangle=True, bwd_dcb_sources="chunk", bwd_exp2_ftz=True, bwd_decay_factor=True)

DEFAULTS = Defaults(
    presets={
        "published": Preset.of(
            "NVIDIA's CUDA Tile Mamba-2 write-up (docs/cutile-switches.md): transposed_layout, operand_swap, "
            "latency_hints, tma, exp2 on", transposed_layout=True, operand_swap=True, latency_hints=True, tma=True,
            exp2=True),
        "best_sm90": Preset.of(
            "results/2026-12-07-h100-switches-backward-first/cutile_best_rounds.parquet (H100): version 13's "
            "switches with exp2_ftz, exp_fold and the C·Bᵀ kernel at occupancy 4 on its lower triangle; "
            "results/2026-12-07-h100-backward-arms-s1/dcb_sources_s1.parquet (H100): the backward's dcb kernel "
            "against the whole chunk of sources (bwd_dcb_sources='chunk'); "
            "results/2026-12-07-h100-backward-v13-s1/backward_s1.parquet (H100): flush-to-zero exp2 in the "
            "backward and the chunk kernel's factored decays (bwd_exp2_ftz, bwd_decay_factor)",
            chosen_by=CHOSEN_SM90, **BEST_SM90),
        "best_sm90_no_fold": Preset.of(
            "best_sm90 without exp_fold and bwd_decay_factor, for calls whose dt may be negative (no softplus, no "
            "clamp at zero)", **{**BEST_SM90, "exp_fold": False, "bwd_decay_factor": False}),
    },
    targets={"sm_90": ("best_sm90", "best_sm90_no_fold"), "sm_100": ("published",)},
)
