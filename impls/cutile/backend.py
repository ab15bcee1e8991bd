"""The "cutile" backend: the three SSD stages as cuTile kernels, launched on the current torch stream."""

from __future__ import annotations

import importlib
import math

import torch

from impls import validate as check
from impls.cutile.defaults import DEFAULTS as CUTILE_DEFAULTS
from impls.cutile.switches import NOT_READ_BY_FUSED, CutileSwitches, subblock_refusal
from impls.inner_chunk import InnerChunked, InnerRuns
from impls.problem import Problem
from impls.registry import Backend, ForwardResult, cuda_only, register

MIN_DIM, MAX_DIM = 32, 256  # headdim and dstate the kernels are built and tested for
FUSED_NO_SEQ = ("switch fuse_state_out: the fused state/output kernel has no packed sequences (seq_idx, "
                "cu_seqlens); run the three stages (fuse_state_out=False)")


def _stage(name: str):
    return importlib.import_module(f"impls.cutile.{name}")


def fold_refusal(dt_softplus: bool, dt_limit, needs: str) -> str | None:
    """Why dt may be negative in a call with these options (what `needs` names cannot take it), or None where its
    processing makes it non-negative (impls/validate.py processing_makes_dt_non_negative)."""
    if check.processing_makes_dt_non_negative(dt_softplus, dt_limit):
        return None
    return (f"{needs}, and with dt_softplus off and dt_limit={dt_limit!r} (no clamp at or above zero) "
            "dt may be negative")


@register
class CutileBackend(InnerChunked, Backend):
    """cuTile 1.7 kernels; GPU (sm_90 / sm_100) only. Switches: see impls/cutile/switches.py."""

    name = "cutile"
    Switches = CutileSwitches
    TUNED = True
    DEFAULTS = CUTILE_DEFAULTS  # per target (impls/cutile/defaults.py)
    TILE_PROTOCOL = None  # per stage, in describe()["stages"] (impls/tuning.py Resolution)
    BACKWARD = ("cuTile kernels (impls/cutile/backward/; gated and timed on H100s, compiled for sm_90 and sm_100 "
                "and through the gradient gate on CPU with torch standing in for cuda.tile): the "
                "forward keeps stage 1's dt and dA_cumsum, the final states and the states entering every chunk "
                "(switch bwd_recompute_states, or fuse_state_out's serial program: none, stage 2 runs again); the "
                "backward walks the chunks in reverse carrying the state gradient, then per-head chunk, per-group "
                "d(C·Bᵀ)/dC and dB, and chunk_cumsum's backward kernels, every reduction by partials summed in a fixed "
                "order (no atomics; switch bwd_group_split spreads a group's heads over several programs whose "
                "partials are summed without atomics, bwd_atomics adds them atomically); with z, compute_out runs "
                "again without it (ŷ, for dz); with cu_seqlens, the per-sequence states' gradient goes back through "
                "the forward's PyTorch varlen_states by autograd")

    def __init__(self, switches=None, **overrides):
        super().__init__(switches, **overrides)
        self._sources: dict[str, dict] = {}
        self._resolved: dict = {}  # (stage, record key) -> tuning.Resolution
        self._keys: dict = {}  # (stage, shape label, dtype) -> record key (the switches are fixed per instance)
        self._inner = InnerRuns(self._sources)  # the forward at the inner chunk (switch inner_chunk)

    # --- capability -------------------------------------------------------------------------------------
    @classmethod
    def available(cls) -> tuple[bool, str]:
        try:
            import cuda.tile  # noqa: F401
        except Exception as exc:  # ImportError, or a broken install raising at import
            return False, f"cuda.tile cannot be imported: {exc}"
        if not torch.cuda.is_available():
            return False, "no CUDA device visible to torch"
        return True, ""

    def check_device(self, device) -> tuple[bool, str]:
        return cuda_only(device, "cuTile kernels")

    def input_refusal(self, entry: str, args: dict) -> str | None:
        """With exp_fold or bwd_decay_factor on, why this call's dt may be negative (fold_refusal), which neither
        can take (the fold reads log2 dt; the backward's factored decays assume dA_cumsum monotone inside a chunk):
        sm_90's defaults then run their next arrangement, the same set without either (impls/cutile/defaults.py).
        compute_out called on its own is given a processed dt whose sign the call cannot see without reading it, so
        exp_fold refuses it too."""
        needs = [text for name, (_, text) in check.NEEDS_NON_NEGATIVE_DT.items() if getattr(self.switches, name)]
        if not needs:
            return None
        if entry == "ssd_forward":
            return fold_refusal(args["dt_softplus"], args["dt_limit"], " and ".join(needs))
        if entry == "compute_out" and self.switches.exp_fold:
            return ("exp_fold reads log2(dt), and compute_out called on its own takes a processed dt whose sign this "
                    "call cannot see without reading it")
        return None

    def supports(self, problem: Problem) -> tuple[bool, str]:
        s = problem.shape
        if problem.dtype not in ("float32", "float16", "bfloat16"):
            return False, f"dtype {problem.dtype}: the kernels take float32, float16 or bfloat16"
        if problem.state_dtype not in (None, "float32", "float16", "bfloat16"):
            return False, f"state_dtype {problem.state_dtype} is not supported"
        if s.headdim and not MIN_DIM <= s.headdim <= MAX_DIM:
            return False, f"headdim {s.headdim} outside {MIN_DIM}..{MAX_DIM}"
        if s.dstate and not MIN_DIM <= s.dstate <= MAX_DIM:
            return False, f"dstate {s.dstate} outside {MIN_DIM}..{MAX_DIM}"
        if s.ngroups and s.nheads % s.ngroups:
            return False, f"ngroups {s.ngroups} does not divide nheads {s.nheads}"
        if s.chunk_size & (s.chunk_size - 1) or not 16 <= s.chunk_size <= 256:
            return False, f"chunk_size {s.chunk_size}: the kernels take powers of two 16..256"
        sub = self.switches.state_subblock
        if sub and s.chunk_size % sub:
            return False, subblock_refusal(sub, s.chunk_size)
        if self.switches.fuse_state_out and problem.has_seq_idx:
            return False, FUSED_NO_SEQ
        return True, ""

    # --- stages -----------------------------------------------------------------------------------------
    def _config(self, stage: str, key_shape: str, dtype, device, make_call, heads_per_group: int | None = None,
                run_config=None, output=None):
        from impls import tuning
        from impls.cutile import tune

        dtype = str(dtype).replace("torch.", "")
        key = self._keys.get((stage, key_shape, dtype))
        if key is None:
            key = self._keys[(stage, key_shape, dtype)] = tune.record_key(stage, self.switches, key_shape, dtype)
        # resolved once per (stage, key): a search runs once, and no call reads the record file again
        if (stage, key) not in self._resolved:
            self._resolved[(stage, key)] = tuning.resolve(tune.tunable(
                stage, self.switches, device, key_shape, dtype, make_call, heads_per_group, run_config, output))
        resolution = self._resolved[(stage, key)]
        self._sources[stage] = resolution.as_dict()
        return dict(resolution.config)

    def chunk_cumsum(self, dt, A, chunk_size, dt_bias, dt_softplus, dt_limit):
        mod = _stage("chunk_cumsum")
        batch, seqlen, nheads = dt.shape
        label = f"b{batch}-l{seqlen}-h{nheads}-c{chunk_size}"

        def make(cfg):
            from impls.cutile.common import dummy

            nchunks = math.ceil(seqlen / chunk_size)
            out = torch.empty(2, batch, nheads, nchunks, chunk_size, device=dt.device)
            bias = dt_bias if dt_bias is not None else dummy(dt.device)
            return mod.make_call((dt, A, bias, out[0], out[1]), (batch, seqlen, nheads), chunk_size,
                                 dt_bias is not None, dt_softplus, dt_limit, self.switches, cfg)

        def run(cfg):
            return mod.run(dt, A, chunk_size, dt_bias, dt_softplus, dt_limit, self.switches, cfg)

        return run(self._config("chunk_cumsum", label, dt.dtype, dt.device, make, output=run))

    def fwd_pass_state(self, B, x, dt, dA_cumsum, initial_states, seq_idx, state_dtype):
        mod = _stage("fwd_pass_state")
        label = _label(x, B, dt.shape[-1])

        def make(cfg):
            from impls.cutile.common import dummy

            batch, seqlen, nheads, headdim = x.shape
            nchunks = dt.shape[2]
            st = torch.empty(batch, nchunks, nheads, headdim, B.shape[3], device=x.device,
                             dtype=state_dtype or x.dtype)
            if self.switches.transposed_layout:
                st = st.transpose(-1, -2).contiguous()
            final = torch.empty(batch, nheads, headdim, B.shape[3], device=x.device)
            init = initial_states if initial_states is not None else dummy(x.device, ndim=4)
            seq = seq_idx if seq_idx is not None else dummy(x.device, torch.int32, ndim=2)
            return mod.make_call((x, B, dt, dA_cumsum, init, seq, st, final),
                                 (batch, seqlen, nheads, headdim, B.shape[2], B.shape[3]), dt.shape[-1],
                                 initial_states is not None, seq_idx is not None, self._tf32(x), self.switches, cfg)

        def make_local(cfg):  # state_pass chunk_parallel: the search times the local-state kernel
            return mod.local_call(B, x, dt, dA_cumsum, seq_idx, self._tf32(x), self.switches, cfg)

        def run(cfg):  # the whole stage (both kernels), for the search's confirmation
            return mod.run(B, x, dt, dA_cumsum, initial_states, seq_idx, state_dtype, self.switches, cfg)

        parallel = self.switches.state_pass == "chunk_parallel"
        cfg = self._config("fwd_pass_state", label, x.dtype, x.device, make_local if parallel else make,
                           run_config=run if parallel else None, output=run)
        return mod.run(B, x, dt, dA_cumsum, initial_states, seq_idx, state_dtype, self.switches, cfg)

    def compute_out(self, C, B, x, dt, dA_cumsum, states, D, z, seq_idx):
        mod = _stage("compute_out")
        label = _label(x, B, dt.shape[-1])

        def make(cfg):  # for the search: the stage's kernels (cb_kernel first when the config shares C·Bᵀ), each
            # timed alone; its best configs are confirmed as whole stages by `run`
            return mod.search_calls(C, B, x, dt, dA_cumsum, states, D, z, seq_idx, torch.empty_like(x),
                                    self.switches, cfg)

        def run(cfg):  # the whole stage (cb_kernel included with shared_cb), for the search's confirmation
            return mod.run(C, B, x, dt, dA_cumsum, states, D, z, seq_idx, self.switches, cfg)

        cfg = self._config("compute_out", label, x.dtype, x.device, make, x.shape[2] // B.shape[2], run)
        if self.switches.head_loop:  # what ran: a program walks at most its group's heads, fewer than the loop's
            self._sources["compute_out"]["head_loop_heads"] = min(self.switches.head_loop, x.shape[2] // B.shape[2])
        return mod.run(C, B, x, dt, dA_cumsum, states, D, z, seq_idx, self.switches, cfg)

    # --- the fused arrangement (switch fuse_state_out): chunk_cumsum, then stages 2 and 3 in one kernel ----------
    def fused_state_out(self, C, B, x, dt, dA_cumsum, initial_states, D, z, state_dtype=None):
        """-> (y, per-chunk states or None, final states) on stage 1's outputs: impls/cutile/fused.py (switch
        fused_program 'serial': no states), or impls/cutile/fused_chunk.py ('chunk': states in state_dtype)."""
        if self.switches.fused_program == "chunk":
            return self._fused_chunk(C, B, x, dt, dA_cumsum, initial_states, D, z, state_dtype)
        mod = _stage("fused")
        label = _label(x, B, dt.shape[-1])

        def make(cfg):
            final = torch.empty(x.shape[0], x.shape[2], x.shape[3], B.shape[3], device=x.device)
            return mod.stage_call(C, B, x, dt, dA_cumsum, initial_states, D, z, torch.empty_like(x), final,
                                  self.switches, cfg)

        def run(cfg):
            return mod.run(C, B, x, dt, dA_cumsum, initial_states, D, z, self.switches, cfg)

        y, final = run(self._config("fused", label, x.dtype, x.device, make, output=run))
        return y, None, final

    def _fused_chunk(self, C, B, x, dt, dA_cumsum, initial_states, D, z, state_dtype):
        mod = _stage("fused_chunk")

        def make(cfg):  # its sync array is left zero by every launch: the timer may repeat the call
            y, states, final, sync = mod.outputs(x, B, dt, state_dtype, cfg)
            return mod.stage_call(C, B, x, dt, dA_cumsum, initial_states, D, z, y, states, final, sync,
                                  self.switches, cfg)

        def run(cfg):
            return mod.run(C, B, x, dt, dA_cumsum, initial_states, D, z, state_dtype, self.switches, cfg)

        return run(self._config("fused", _label(x, B, dt.shape[-1]), x.dtype, x.device, make, output=run))

    def _forward(self, x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens,
                 dt_softplus, dt_limit, state_dtype):
        if not self.switches.fuse_state_out:
            return Backend.ssd_forward(self, x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx,
                                       cu_seqlens, dt_softplus, dt_limit, state_dtype)
        if seq_idx is not None or cu_seqlens is not None:
            raise ValueError(f"seq_idx / cu_seqlens: {FUSED_NO_SEQ}")
        dt_out, dA_cumsum = self.chunk_cumsum(dt, A, chunk_size, dt_bias, dt_softplus, dt_limit)
        # fused_program 'serial' keeps the per-chunk states in registers: none to return (state_dtype has nothing
        # to apply to); 'chunk' writes them in state_dtype
        y, states, final = self.fused_state_out(C, B, x, dt_out, dA_cumsum, initial_states, D, z, state_dtype)
        return ForwardResult(y, final, None, dt_out, dA_cumsum, states)

    def _own_parts(self, x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens,
                   dt_softplus, dt_limit, state_dtype):
        if not self.switches.fuse_state_out:
            return {}
        dt_out, dA_cumsum = self.chunk_cumsum(dt, A, chunk_size, dt_bias, dt_softplus, dt_limit)
        return {"fused_state_out": lambda: self.fused_state_out(C, B, x, dt_out, dA_cumsum, initial_states, D, z,
                                                                state_dtype)}

    def forward_for_backward(self, args, needs):
        from impls.cutile.backward.run import forward_for_backward

        return forward_for_backward(self, args, needs)

    def _tf32(self, x) -> bool:
        return x.dtype == torch.float32 and self.switches.cb_precision == "tf32"

    def tf32_matmuls(self, stage, device) -> bool:
        return self.switches.cb_precision == "tf32"  # every MMA of stages 2 and 3 and of the fused kernel

    def describe(self) -> dict:
        out = super().describe()
        out["stages"] = {k: dict(v) for k, v in self._sources.items()}  # which config source ran per stage
        out.update(self._inner.describe())  # switch inner_chunk: what ran at the inner chunk
        if self.switches.fuse_state_out:  # the fused forward does not read them (refused away from defaults)
            out["switches"].update({name: "n/a" for name in NOT_READ_BY_FUSED})
        return out


def _label(x, B, chunk) -> str:
    from impls.problem import Shape

    b, l, h, p = x.shape
    return Shape(b, l, h, p, B.shape[2], B.shape[3], chunk).label()
