"""The "tilegym" backend: TileGym 1.5.1's cuTile Mamba-2 forward (NVIDIA's own) behind the stage contract.

The peer's three kernels run unchanged (`loader.py` loads its module; `tune.py` picks their configs); what the
peer lacks is done by the adapter in separately callable steps (`prepare`, `finish`; see adapter.STEPS), so a
harness can time the peer's kernels alone and the adapter's work apart. docs/peers.md has the exact mapping.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from impls import tuning
from impls.problem import Problem, Shape, dtype_name
from impls.registry import Backend, ForwardResult, cuda_only, pinned_version, register, switch
from impls.tilegym import adapter, loader, tune
from impls.tilegym.chunk_cumsum import chunk_cumsum, peer_chunk_cumsum
from impls.tilegym.compute_out import compute_out, peer_compute_out
from impls.tilegym.fwd_pass_state import fwd_pass_state, peer_fwd_pass_state
from impls.tilegym.precompile import precompile

FLOAT_DTYPES = ("float32", "float16", "bfloat16")
BOOL_OR_TUNED = (None, True, False)


@dataclass(frozen=True)
class TilegymSwitches:
    tuning: str = switch(
        "auto", "where each stage's config comes from: search (TileGym's exhaustive search, minutes per shape, "
                "stored), record (stored result, error if none), fallback (TileGym's first config, what it runs "
                "with TILEGYM_DISABLE_AUTOTUNE=1), auto (record if stored else fallback), resume (record if stored "
                "else search)", choices=tuning.MODES)
    swap: bool | None = switch(
        None, "fwd_pass_state kernel's SWAP variant: None = whatever tuning picks; True = state kept transposed "
              "(dstate × headdim), computed as (B·dt·decay)ᵀ·x; False = headdim × dstate, xᵀ·(B·dt·decay)",
        choices=BOOL_OR_TUNED)
    bht: bool | None = switch(
        None, "fwd_pass_state kernel's BHT variant: None = whatever tuning picks; True = read dt/decays in "
              "(b, h, t) layout; False = (b, t, h) (in TileGym's search space only for chunk_size >= 128)",
        choices=BOOL_OR_TUNED)
    precompile_workers: int = switch(
        0, "before a search: compile the stage's whole search space in this many worker processes (cuTile's disk "
           "cache), so that the search itself only times; 0 = the search compiles each config in turn "
           "(impls/tilegym/precompile.py). Changes nothing but the search's duration", choices=(0, 2, 4, 8, 12, 16))


def _variants(chunk_size: int) -> list[tuple[bool, bool]]:
    """(SWAP, BHT) pairs in TileGym 1.5.1's fwd_pass_state search space (`_fwd_pass_state_autotune_configs`)."""
    return [(False, True), (True, True)] + ([(False, False)] if chunk_size >= 128 else [])


def _power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


@dataclass
class Prepared:
    """The peer's arguments after the adapter's `prepare` step."""

    shape: Shape
    dtype: str
    x: torch.Tensor
    B: torch.Tensor
    C: torch.Tensor
    A: torch.Tensor
    dt32: torch.Tensor  # processed dt (b, t, h) fp32
    init32: torch.Tensor  # (b, h, p, n) fp32
    d: torch.Tensor  # (h,) what the kernel adds as D_h·x
    D: torch.Tensor | None
    z: torch.Tensor | None
    state_dtype: torch.dtype


@register
class TilegymBackend(Backend):
    """TileGym 1.5.1 cuTile Mamba-2 forward; CUDA only. Needs seqlen % chunk_size == 0, no seq_idx."""

    NO_PER_SEQUENCE_INITIAL_STATES = "TileGym 1.5.1's mamba2 ops take no packed sequences (no seq_idx or cu_seqlens)"

    name = "tilegym"
    Switches = TilegymSwitches
    TUNED = True
    TILE_PROTOCOL = None  # per stage, in describe()["tuning_sources"] (impls/tuning.py Resolution)

    def __init__(self, switches=None, **overrides):
        super().__init__(switches, **overrides)
        self._entries: dict = {}  # (stage, key) -> (config namespace, hinted kernel) installed into TileGym
        self._kernels: dict = {}
        self._sources: dict[str, dict] = {}

    # --- capability -------------------------------------------------------------------------------------
    @classmethod
    def available(cls) -> tuple[bool, str]:
        ok, reason = pinned_version("tilegym", loader.version(), loader.VERSION_REQUIRED)
        if not ok:
            return ok, reason
        try:
            loader.load()
        except Exception as exc:  # ImportError, or cuda.tile raising at import
            return False, f"TileGym's mamba2 module cannot be loaded: {exc}"
        if not torch.cuda.is_available():
            return False, "no CUDA device visible to torch (TileGym's kernels are cuTile, CUDA only)"
        return True, ""

    @classmethod
    def peer_files(cls) -> dict[str, Path]:
        """TileGym's mamba2 module and the autotune file it imports: what loader.load() executes."""
        return loader.kernel_files()

    def check_device(self, device) -> tuple[bool, str]:
        return cuda_only(device, "TileGym's cuTile kernels")

    def supports(self, problem: Problem) -> tuple[bool, str]:
        s = problem.shape
        if problem.dtype not in FLOAT_DTYPES:
            return False, f"dtype {problem.dtype}: TileGym's kernels take {FLOAT_DTYPES}"
        if problem.state_dtype not in (None,) + FLOAT_DTYPES:
            return False, f"state_dtype {problem.state_dtype}: TileGym stores states in {FLOAT_DTYPES}"
        if problem.has_seq_idx:
            return False, "TileGym's Mamba-2 forward has no seq_idx / cu_seqlens (packed sequences)"
        if not _power_of_two(s.chunk_size) or not 16 <= s.chunk_size <= 256:
            return False, f"chunk_size {s.chunk_size}: TileGym's tiles need a power of two (16..256)"
        if s.seqlen % s.chunk_size:
            return False, (f"seqlen {s.seqlen} is not a multiple of chunk_size {s.chunk_size}: TileGym raises "
                           "(`_validate_chunk_size`), it does not pad the last chunk")
        if s.nheads and not any(s.nheads % bh == 0 for bh in (4, 8, 16)):
            return False, f"nheads {s.nheads}: TileGym's chunk_cumsum tiles heads by 4, 8 or 16"
        if s.ngroups and s.nheads % s.ngroups:
            return False, f"ngroups {s.ngroups} does not divide nheads {s.nheads}"
        if s.headdim:
            block = min(64, s.headdim)
            if not _power_of_two(block) or s.headdim % block or block < 16:
                return False, f"headdim {s.headdim}: TileGym tiles it by min(64, headdim), a power of two >= 16"
        if s.dstate and s.dstate % 16:
            return False, f"dstate {s.dstate}: TileGym tiles it by 16, 32 or 64"
        pinned = [(sw, bh) for sw, bh in _variants(s.chunk_size)
                  if self.switches.swap in (None, sw) and self.switches.bht in (None, bh)]
        if not pinned:
            return False, (f"swap={self.switches.swap}, bht={self.switches.bht}: TileGym's fwd_pass_state search "
                           f"space at chunk_size {s.chunk_size} holds (SWAP, BHT) in {_variants(s.chunk_size)}")
        return True, ""

    def tf32_matmuls(self, stage, device) -> bool:
        # compute_out casts the intra-chunk scores and dt·x to tfloat32 before its MMA, whatever the input dtype;
        # held to tf32's tolerance in every stage with a matmul, as the GPU tests always have
        return True

    # --- tuning -----------------------------------------------------------------------------------------
    @staticmethod
    def mod():
        return loader.load()

    def _variant(self) -> dict:
        return {"SWAP": self.switches.swap, "BHT": self.switches.bht}

    def _run(self, stage, shape, dtype, call, key_args, state_dtype=None):
        """Runs TileGym's wrapper for `stage` with the config the `tuning` switch selects."""
        mod = self.mod()
        variant = self._variant() if stage == "fwd_pass_state" else {}
        sd = dtype_name(state_dtype) if state_dtype is not None else None
        key = tune.config_key(stage, shape, dtype, variant, sd)
        entry_key = (stage, key)  # stages share tuning keys (shape and dtype); their configs differ
        if entry_key not in self._entries:
            configs = tune.space(mod, stage, shape, variant)
            if not configs:
                raise ValueError(f"tilegym {stage}: TileGym's search space is empty for {shape.label()}")
            ran = {}

            def own_search() -> dict:  # TileGym's autotuner, through its own wrapper; the call's result is kept
                if self.switches.precompile_workers:
                    precompile(stage, shape, call, key_args, [dict(vars(c)) for c in configs],
                               self.switches.precompile_workers)
                ran["result"], chosen = tune.search(mod, stage, shape, variant, call, key_args)
                return chosen

            gpu = torch.cuda.get_device_name(key_args[0].device)
            resolution = tuning.resolve(tune.tunable(stage, key, gpu, self.switches.tuning, configs, own_search))
            self._entries[entry_key] = tune.install(mod, stage, shape, resolution.config, self._kernels)
            self._sources[stage] = resolution.as_dict()
            if "result" in ran:
                return ran["result"]
        return tune.run_with(mod, stage, self._entries[entry_key], call, key_args)

    # --- stages -----------------------------------------------------------------------------------------
    @staticmethod
    def _shape(x, B, chunk_size) -> Shape:
        b, t, h, p = x.shape
        return Shape(b, t, h, p, B.shape[2], B.shape[3], chunk_size)

    def chunk_cumsum(self, dt, A, chunk_size, dt_bias, dt_softplus, dt_limit):
        b, t, h = dt.shape
        shape = Shape(b, t, h, 0, 0, 0, chunk_size)
        return chunk_cumsum(self.mod(), self._run, shape, dtype_name(dt.dtype), dt, A, dt_bias, dt_softplus,
                            dt_limit)

    def fwd_pass_state(self, B, x, dt, dA_cumsum, initial_states, seq_idx, state_dtype):
        if seq_idx is not None:
            raise NotImplementedError("tilegym: no seq_idx (supports() refuses it)")
        shape = self._shape(x, B, dt.shape[-1])
        return fwd_pass_state(self.mod(), self._run, shape, dtype_name(x.dtype), B, x, dt, dA_cumsum,
                              initial_states, state_dtype)

    def compute_out(self, C, B, x, dt, dA_cumsum, states, D, z, seq_idx):
        if seq_idx is not None:
            raise NotImplementedError("tilegym: no seq_idx (supports() refuses it)")
        shape = self._shape(x, B, dt.shape[-1])
        return compute_out(self.mod(), self._run, shape, dtype_name(x.dtype), C, B, x, dt, dA_cumsum, states, D, z)

    def varlen_states(self, B, x, dt, dA_cumsum, states, cu_seqlens):
        raise NotImplementedError("tilegym: no cu_seqlens (supports() refuses it)")

    # --- the whole forward: prepare (adapter) -> peer (TileGym's three kernels) -> finish (adapter) ---------
    def prepare(self, x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                dt_softplus=False, dt_limit=(0.0, float("inf")), state_dtype=None) -> Prepared:
        """The adapter's pre-processing (adapter.STEPS "prepare.*"): processed dt, fp32 initial state, kernel D."""
        shape = self._shape(x, B, chunk_size)
        return Prepared(shape, dtype_name(x.dtype), x, B, C, A,
                        adapter.processed_dt(dt, dt_bias, dt_softplus, dt_limit, A),
                        adapter.kernel_initial_state(initial_states, shape.batch, shape.nheads, shape.headdim,
                                                     shape.dstate, x),
                        adapter.kernel_D(D, shape.nheads, x), D, z, state_dtype or x.dtype)

    def peer(self, p: Prepared):
        """TileGym's three kernels only, chained in their own layouts (base-2 decays, (b, h, c, p, n) states)."""
        mod = self.mod()
        _bth, decay_bht, dt_bht = peer_chunk_cumsum(mod, self._run, p.shape, p.dtype, p.A, p.dt32)
        hiddens, final = peer_fwd_pass_state(mod, self._run, p.shape, p.dtype, p.x, p.B, dt_bht, decay_bht,
                                             p.init32, p.state_dtype)
        y = peer_compute_out(mod, self._run, p.shape, p.dtype, p.x, p.B, p.C, p.d, dt_bht, decay_bht, hiddens)
        return y, final, hiddens, decay_bht, dt_bht

    def finish(self, p: Prepared, raw) -> ForwardResult:
        """The adapter's post-processing ("finish.D_z"), plus the intermediates in the contract's form."""
        y, final, hiddens, decay_bht, dt_bht = raw
        s = p.shape
        return ForwardResult(adapter.finish_y(y, p.x, p.D, p.z), final, None,
                             dt_bht.view(s.batch, s.nheads, s.nchunks, s.chunk_size),
                             adapter.to_natural(decay_bht, s.nchunks, s.chunk_size), hiddens.permute(0, 2, 1, 3, 4))

    def ssd_forward(self, x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens,
                    dt_softplus, dt_limit, state_dtype):
        if seq_idx is not None or cu_seqlens is not None:
            raise NotImplementedError("tilegym: no seq_idx / cu_seqlens (supports() refuses them)")
        p = self.prepare(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, dt_softplus, dt_limit,
                         state_dtype)
        return self.finish(p, self.peer(p))

    def forward_parts(self, x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens,
                      dt_softplus, dt_limit, state_dtype):
        p = self.prepare(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, dt_softplus, dt_limit,
                         state_dtype)
        raw = self.peer(p)
        return {
            "adapter_prepare": lambda: self.prepare(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states,
                                                    dt_softplus, dt_limit, state_dtype),
            "peer": lambda: self.peer(p),
            "adapter_finish": lambda: self.finish(p, raw),
        }

    # --- the backward (impls.ssd): TileGym's mamba2_chunk_backward, dt's processing differentiated here ----------
    BACKWARD = ("TileGym 1.5.1's mamba2_chunk_backward (cuTile): the forward keeps its inputs; the backward "
                "recomputes chunk_cumsum and the chunk states (fp32), then a reverse state pass and the gradients; "
                "dt's processing (bias, softplus, clamp) differentiated by torch autograd on our side")

    def forward_for_backward(self, args, needs):
        from impls.tilegym.backward import forward_for_backward

        return forward_for_backward(self, args, needs)

    # --- what ran -----------------------------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        out = super().describe()
        out.update({
            "peer": f"tilegym {loader.version()} (tilegym.ops.cutile.mamba2)",
            "adapter_steps": dict(adapter.STEPS),
            "tuning_sources": dict(self._sources),
            "tf32": "float32 inputs: compute_out's intra-chunk product runs in tf32",
        })
        return out
