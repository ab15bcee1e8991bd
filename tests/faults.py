"""Planted faults: stand-in backends that wrap the reference and break one small region of an output (one token
per row, one chunk of one head, two heads swapped, the last partial chunk) or one rule of packed sequences
(reading row 0's seq_idx for every row, keeping the initial state of a row whose seq_idx starts above 0).
The gate must fail each (tests/correctness/test_planted_faults.py on CPU, tests/gpu/test_planted_faults.py at full
size)."""

from __future__ import annotations

import math

import torch

from impls.reference.backend import ReferenceBackend
from impls.reference.same_precision import SamePrecisionReference
from impls.tolerance import REL_TOL


class _BreaksY(ReferenceBackend):
    """compute_out of the reference, then `spoil(y, chunk_size)` on its output (in place)."""

    stage = "compute_out"  # the stage whose output the fault breaks (the forward's y too)

    def compute_out(self, C, B, x, dt, dA_cumsum, states, D, z, seq_idx):
        y = super().compute_out(C, B, x, dt, dA_cumsum, states, D, z, seq_idx)
        return self.spoil(y, dt.shape[-1])


class ZeroesOneTokenPerRow(_BreaksY):
    """y of the middle token of every row is zero."""

    def spoil(self, y, chunk_size):
        y[:, y.shape[1] // 2] = 0
        return y


class OneChunkOneHeadWrong(_BreaksY):
    """y of chunk 1, head 1, batch row 0 is 5% too large."""

    def spoil(self, y, chunk_size):
        y[0, chunk_size:2 * chunk_size, 1] *= 1.05
        return y


class SwapsTwoHeads(_BreaksY):
    """y of heads 0 and 1 exchanged."""

    def spoil(self, y, chunk_size):
        return y[:, :, [1, 0, *range(2, y.shape[2])]].contiguous()


class LastPartialChunkUnwritten(_BreaksY):
    """y's last, partial chunk is never written (a fresh torch.empty: NaN under the gate's poisoning)."""

    def spoil(self, y, chunk_size):
        out = torch.empty_like(y)
        end = (y.shape[1] - 1) // chunk_size * chunk_size
        out[:, :end] = y[:, :end]
        return out


class LastPartialChunkZero(_BreaksY):
    """y's last, partial chunk is left at zero (memory that happened to be zeroed)."""

    def spoil(self, y, chunk_size):
        y[:, (y.shape[1] - 1) // chunk_size * chunk_size:] = 0
        return y


class OneChunkOneHeadStateWrong(ReferenceBackend):
    """The state entering chunk 1 of head 1 (batch row 0) is 5% too large (compute_out reads it: y of that chunk
    and head is off too, by less)."""

    stage = "fwd_pass_state"

    def fwd_pass_state(self, B, x, dt, dA_cumsum, initial_states, seq_idx, state_dtype):
        states, final = super().fwd_pass_state(B, x, dt, dA_cumsum, initial_states, seq_idx, state_dtype)
        states[0, 1, 1] *= 1.05
        return states, final


class _RewritesSeqIdx(ReferenceBackend):
    """Stages 2 and 3 of the reference on `wrong(seq_idx)` instead of seq_idx."""

    stage = "fwd_pass_state"

    def fwd_pass_state(self, B, x, dt, dA_cumsum, initial_states, seq_idx, state_dtype):
        return super().fwd_pass_state(B, x, dt, dA_cumsum, initial_states, self._wrong(seq_idx), state_dtype)

    def compute_out(self, C, B, x, dt, dA_cumsum, states, D, z, seq_idx):
        return super().compute_out(C, B, x, dt, dA_cumsum, states, D, z, self._wrong(seq_idx))

    def _wrong(self, seq_idx):
        return None if seq_idx is None else self.wrong(seq_idx)


class ReadsRowZeroSeqIdx(_RewritesSeqIdx):
    """Every batch row uses row 0's seq_idx."""

    def wrong(self, seq_idx):
        return seq_idx[:1].expand_as(seq_idx).contiguous()


class KeepsInitialStateOfLaterSequence(_RewritesSeqIdx):
    """Numbers every row's sequences from 0, so a row whose seq_idx starts above 0 keeps its initial state."""

    def wrong(self, seq_idx):
        return seq_idx - seq_idx[:, :1]


LOCAL_FAULTS = {
    "one-token-per-row-zeroed": ZeroesOneTokenPerRow,
    "one-chunk-one-head-y-wrong": OneChunkOneHeadWrong,
    "one-chunk-one-head-state-wrong": OneChunkOneHeadStateWrong,
    "two-heads-swapped": SwapsTwoHeads,
    "last-partial-chunk-unwritten": LastPartialChunkUnwritten,
    "last-partial-chunk-zero": LastPartialChunkZero,
}
SEQ_IDX_FAULTS = {
    "reads-row-0-seq_idx": ReadsRowZeroSeqIdx,
    "keeps-initial-state-when-seq_idx-starts-above-0": KeepsInitialStateOfLaterSequence,
}


def whole_tensor_passes(report: dict, dtype: torch.dtype) -> bool:
    """Whether every stage's whole-tensor error alone is within the dtype's flat tolerance (impls.tolerance.REL_TOL;
    the block-wise errors and the same-precision bound ignored)."""
    return all(math.isfinite(r["rel_err"]) and r["rel_err"] <= REL_TOL[dtype] for r in report.values())


# --- faults small enough for a flat bf16 bound (2e-2 per block): each stays under it at S1's block size (chunk 256 ×
# headdim 64, dstate 128) and must fail the same-precision bound. They wrap a correct bf16 computation (the
# same-precision reference), as a kernel that is right everywhere else would be.
class _SubtleFault(SamePrecisionReference):
    stage = "compute_out"

    def __init__(self):
        super().__init__({"fwd_pass_state": "bfloat16", "compute_out": "bfloat16"})

    def compute_out(self, C, B, x, dt, dA_cumsum, states, D, z, seq_idx):
        y = super().compute_out(C, B, x, dt, dA_cumsum, states, D, z, seq_idx)
        return self.spoil(y, dt.shape[-1])

    def spoil(self, y, chunk_size):
        return y


class CorrectBf16(_SubtleFault):
    """No fault: the bf16 computation itself (it must pass)."""


class OneHeadScaled(_SubtleFault):
    """y of head 1 is 1.5% too large everywhere."""

    def spoil(self, y, chunk_size):
        y[:, :, 1] *= 1.015
        return y


class OneHeadsLastTokenOfEveryChunkScaled(_SubtleFault):
    """y of head 1 at the last token of every chunk is 20% too large."""

    def spoil(self, y, chunk_size):
        y[:, chunk_size - 1::chunk_size, 1] *= 1.20
        return y


class FourElementsOfEveryBlockZeroed(_SubtleFault):
    """Four elements of y in every (batch, chunk, head 1) block are zero: those of magnitude nearest 0.9 × the
    block's RMS (a typical element, not an outlier)."""

    def spoil(self, y, chunk_size):
        for b in range(y.shape[0]):
            for start in range(0, y.shape[1], chunk_size):
                block = y[b, start:start + chunk_size, 1]  # a view: zeroing it zeroes y
                rms = block.float().square().mean().sqrt()
                typical = (block.float().abs() - 0.9 * rms).abs().flatten().argsort()[:4]
                rows, cols = typical // block.shape[1], typical % block.shape[1]
                block[rows, cols] = 0
        return y


class FirstFiveHeadsOfTheLastChunkScaled(_SubtleFault):
    """y of heads 0-4 in the last chunk is 1.8% too large."""

    def spoil(self, y, chunk_size):
        y[:, (y.shape[1] - 1) // chunk_size * chunk_size:, :5] *= 1.018
        return y


class OneHeadsEnteringStatesScaled(_SubtleFault):
    """The states entering every chunk of head 1 are 1.8% too small (y reads them)."""

    stage = "fwd_pass_state"

    def fwd_pass_state(self, B, x, dt, dA_cumsum, initial_states, seq_idx, state_dtype):
        states, final = super().fwd_pass_state(B, x, dt, dA_cumsum, initial_states, seq_idx, state_dtype)
        states[:, :, 1] *= 0.982
        return states, final


SUBTLE_FAULTS = {
    "one-head-x1.015": OneHeadScaled,
    "one-heads-last-token-per-chunk-x1.2": OneHeadsLastTokenOfEveryChunkScaled,
    "four-elements-per-block-zeroed": FourElementsOfEveryBlockZeroed,
    "heads-0-4-of-last-chunk-x1.018": FirstFiveHeadsOfTheLastChunkScaled,
    "one-heads-entering-states-x0.982": OneHeadsEnteringStatesScaled,
}


# --- gradient faults (tests/correctness/test_gradients.py): a correct bf16 backward (autograd through the
# same-precision reference) with one gradient spoiled
class _SpoilsGradients(SamePrecisionReference):
    def __init__(self):
        super().__init__({"fwd_pass_state": "bfloat16", "compute_out": "bfloat16"})

    def forward_for_backward(self, args, needs):
        self.chunk_size = args["chunk_size"]  # where a spoil picks out one chunk
        return _Spoiled(super().forward_for_backward(args, needs), self.spoil)

    def spoil(self, grads, run, grads_in):
        return grads


class _Spoiled:
    def __init__(self, run, spoil):
        self.run, self.spoil, self.outputs = run, spoil, run.outputs

    def backward(self, grads_in):
        return self.spoil(self.run.backward(grads_in), self.run, grads_in)


class CorrectBf16Backward(_SpoilsGradients):
    """No fault."""


class DropsOneHeadsShareOfdB(_SpoilsGradients):
    """dB without head 1's contribution (what a reduction over the heads of a group that skips one gives)."""

    def spoil(self, grads, run, grads_in):
        without = dict(grads_in)
        without["y"] = grads_in["y"].clone()
        without["y"][:, :, 1] = 0
        without["final_states"] = grads_in["final_states"].clone()
        without["final_states"][:, 1] = 0
        grads["B"] = run.backward(without)["B"]
        return grads


class ScalesOneChunkOfOneHeadsdx(_SpoilsGradients):
    """dx of chunk 1, head 1, batch row 0 is 2% too large."""

    def spoil(self, grads, run, grads_in):
        q = self.chunk_size
        grads["x"][0, q:2 * q, 1] *= 1.02
        return grads


class ScalesOneSequencesdInitialStates(_SpoilsGradients):
    """d initial_states of sequence 1 (one initial state per packed sequence) is 5% too large."""

    def spoil(self, grads, run, grads_in):
        grads["initial_states"][1] *= 1.05
        return grads


class _DropsOneChunkOfOneHead(_SpoilsGradients):
    """GRADIENT (a sum over batch and time, floored by its terms' error, harness/gradient_gate.py sum_floor) of head 1
    without what chunk 1 of batch row 0 gives it: a reduction over the chunks that skips one."""

    GRADIENT = ""

    def spoil(self, grads, run, grads_in):
        without = dict(grads_in)
        without["y"] = grads_in["y"].clone()
        without["y"][0, self.chunk_size:2 * self.chunk_size, 1] = 0
        grads[self.GRADIENT] = run.backward(without)[self.GRADIENT]
        return grads


class DropsOneChunkOfOneHeadsdA(_DropsOneChunkOfOneHead):
    """dA of head 1 without what chunk 1's outputs of batch row 0 give it."""

    GRADIENT = "A"


class DropsOneChunkOfOneHeadsdD(_DropsOneChunkOfOneHead):
    """dD of head 1 without what chunk 1 of batch row 0 gives it, as a kernel skipping its last source tile would."""

    GRADIENT = "D"


GRADIENT_FAULTS = {
    "one-heads-share-of-dB-dropped": DropsOneHeadsShareOfdB,
    "one-chunk-of-one-heads-dx-x1.02": ScalesOneChunkOfOneHeadsdx,
    "one-sequences-dinitial_states-x1.05": ScalesOneSequencesdInitialStates,
    "one-chunk-of-one-heads-dA-dropped": DropsOneChunkOfOneHeadsdA,
    "one-chunk-of-one-heads-dD-dropped": DropsOneChunkOfOneHeadsdD,
}
