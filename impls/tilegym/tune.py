"""TileGym's autotuning, run once per shape and remembered through impls/tuning.py (backend "tilegym").

TileGym 1.5.1 picks each stage's config by an exhaustive search (cuda.tile.tune.exhaustive_search) the first
time it meets a shape, and keeps it in a module-level dict keyed by `_tuning_key(<the call's tensors>, ...,
is_autotune_disabled())` — minutes per shape. Here the config comes from `impls.tuning.resolve` (`tunable`):
- "search" (and "resume" without a usable record): TileGym's own search runs (its dict entry for the key is
  dropped first), what it chose is stored through impls/tuning.py with the versions it ran on;
- "record" / "fallback" / "auto": the chosen config is placed in TileGym's dict under the exact key its wrapper
  will compute, with `is_autotune_disabled` forced to True for the call — so if the key ever differed, TileGym
  would take its first config at once (never a silent minutes-long search) and `run_stage` raises because its
  own config was not the one used.
The fallback config is TileGym's own choice with autotuning disabled: the first of its search space (filtered
to the SWAP/BHT variant when the switches pin one).
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

from impls import tuning

BACKEND = "tilegym"


def _space(mod, stage, shape):
    if stage == "chunk_cumsum":
        return list(mod._chunk_cumsum_autotune_configs(num_heads=shape.nheads))
    if stage == "fwd_pass_state":
        return list(mod._fwd_pass_state_autotune_configs(shape.dstate, shape.headdim, shape.chunk_size))
    if shape.chunk_size == 64:  # TileGym's compute_out uses its operand-swapped kernel at chunk 64 only
        return list(mod._compute_out_swap_configs(head_size=shape.headdim, state_size=shape.dstate))
    return list(mod._compute_out_configs(head_size=shape.headdim, state_size=shape.dstate))


def _kernel(mod, stage, shape):
    if stage == "chunk_cumsum":
        return mod.chunk_cumsum_kernel
    if stage == "fwd_pass_state":
        return mod.fwd_pass_state_kernel
    return mod.compute_out_swap_kernel if shape.chunk_size == 64 else mod.compute_out_kernel


def _hints(stage, cfg):
    """The launch hints each TileGym wrapper derives from its config (its `hints_fn`)."""
    if stage == "fwd_pass_state":
        return {"num_ctas": cfg.num_ctas, "occupancy": cfg.occupancy}
    return {"occupancy": cfg.occupancy}


def _cache(mod, stage):
    return getattr(mod, f"_{stage}_tune_cache")


def matches(cfg: dict, variant: dict) -> bool:
    return all(cfg.get(k) == v for k, v in variant.items() if v is not None)


def space(mod, stage, shape, variant):
    """TileGym's search space for the stage, restricted to the pinned SWAP/BHT variant (fwd_pass_state only)."""
    configs = _space(mod, stage, shape)
    if stage == "fwd_pass_state":
        configs = [c for c in configs if matches(vars(c), variant)]
    return configs


@contextlib.contextmanager
def _autotune_forced(mod, disabled: bool):
    saved = mod.is_autotune_disabled
    mod.is_autotune_disabled = lambda: disabled
    try:
        yield
    finally:
        mod.is_autotune_disabled = saved


@contextlib.contextmanager
def _restricted_space(mod, stage, variant):
    """During a search with a pinned SWAP/BHT variant, TileGym's fwd_pass_state generator yields only it."""
    if stage != "fwd_pass_state" or all(v is None for v in variant.values()):
        yield
        return
    saved = mod._fwd_pass_state_autotune_configs

    def restricted(*args, **kwargs):
        return (c for c in saved(*args, **kwargs) if matches(vars(c), variant))

    mod._fwd_pass_state_autotune_configs = restricted
    try:
        yield
    finally:
        mod._fwd_pass_state_autotune_configs = saved


STACK = ("cuda-tile", "tileiras", "tilegym", "driver")  # what a TileGym record is bound to


def tunable(stage, key, gpu, mode, configs, own_search) -> tuning.Tunable:
    """The stage's choice as impls/tuning.py takes it: TileGym's own search (`own_search`), its space as the
    stored search space, its first config as the fallback."""
    return tuning.Tunable(backend=BACKEND, stage=stage, key=key, gpu=gpu, mode=mode, fallback=dict(vars(configs[0])),
                          space=[dict(vars(c)) for c in configs], own_search=own_search, stack=STACK)


def search(mod, stage, shape, variant, call, key_args):
    """Runs TileGym's exhaustive search through its own wrapper; returns (result, chosen config dict)."""
    cache = _cache(mod, stage)
    with _autotune_forced(mod, False), _restricted_space(mod, stage, variant):
        key = mod._tuning_key(*key_args, False)
        cache.pop(key, None)
        result = call()
    return result, dict(vars(cache[key][0]))


def install(mod, stage, shape, cfg: dict, kernels: dict):
    """Makes TileGym's wrapper use `cfg` (for the key computed from `key_args` later); kernels memoises the
    hinted kernel per config so that a config compiles once."""
    kernel = _kernel(mod, stage, shape)
    ident = (stage, id(kernel), tuple(sorted(cfg.items())))
    if ident not in kernels:
        ns = SimpleNamespace(**cfg)
        kernels[ident] = (ns, kernel.replace_hints(**_hints(stage, ns)))
    return kernels[ident]


def run_with(mod, stage, entry, call, key_args):
    """Calls TileGym's wrapper with `entry` = (config, hinted kernel) installed under its key."""
    cache = _cache(mod, stage)
    with _autotune_forced(mod, True):
        key = mod._tuning_key(*key_args, True)
        cache[key] = entry
        result = call()
    if cache.get(key) is not entry:
        raise RuntimeError(f"tilegym {stage}: TileGym's wrapper did not run the config chosen here (cache key drift)")
    return result


def config_key(stage, shape, dtype, variant, state_dtype=None) -> str:
    """The impls/tuning.py key: shape label, x's dtype, and what changes the kernel (state dtype, variant)."""
    extra = {}
    if stage == "fwd_pass_state":
        extra = {k: v for k, v in variant.items() if v is not None}
        extra["state_dtype"] = state_dtype
    return tuning.tuning_key(shape.label(), dtype, **extra)


# How each switch enters the record key (impls/tuning.py KEY_ROLES; tests/harness/test_tuning.py checks it against
# config_key): the SWAP and BHT variants key fwd_pass_state's records.
KEY_ROLES = {"swap": tuning.KEY, "bht": tuning.KEY, "precompile_workers": tuning.NEITHER, "tuning": tuning.NEITHER}
