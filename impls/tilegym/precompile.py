"""Compiles a TileGym stage's whole search space in parallel worker processes before its exhaustive search.

TileGym's search (cuda.tile.tune.exhaustive_search inside its wrapper) compiles its configs one after the other:
cuTile compiles under a process-wide lock (`cuda/tile/_compile.py`, `global_compiler_lock`), a few seconds each
on the H200 machine's CPU, so a 64-config stage spends most of a 10-minute run compiling. Compiled cubins
go to cuTile's disk cache (CUDA_TILE_CACHE_DIR, else its default directory), keyed by compiler version, target
and the kernel's bytecode — the same key in every process that compiles the same kernel for the same tensors.

So `precompile` first runs the wrapper once per config in `workers` spawned processes, each with its share of
the configs installed in turn (`tune.install` / `tune.run_with`, never a search). The workers get the wrapper's
own tensors through CUDA IPC (torch.multiprocessing keeps their shapes, strides and dtypes, which the kernels'
signatures depend on). The search that follows then finds every cubin in the disk cache and spends its time on
timing. Nothing is chosen here: the workers' outputs are discarded, and the search times every config itself.
"""

from __future__ import annotations

import dataclasses
import queue as queue_mod
import time
from typing import Any


@dataclasses.dataclass
class WrapperCall:
    """A call of one TileGym wrapper, `mod.<name>(**kwargs)`. Sent to another process it travels by name (the
    module is not pickled) and runs there on that process's own `loader.load()` unless given one."""

    mod: Any
    name: str
    kwargs: dict[str, Any]

    def __call__(self, mod=None):
        return getattr(mod or self.mod, self.name)(**self.kwargs)

    def __getstate__(self):
        return {"mod": None, "name": self.name, "kwargs": self.kwargs}


def shares(configs: list[dict], workers: int) -> list[list[dict]]:
    """Round-robin split of the configs over at most `workers` non-empty shares."""
    if workers < 1:
        raise ValueError(f"precompile workers={workers}: must be >= 1")
    out = [configs[i::workers] for i in range(min(workers, len(configs)))]
    return [s for s in out if s]


def compile_share(stage: str, shape, call: WrapperCall, key_args: tuple, configs: list[dict]) -> dict:
    """Runs the wrapper once with each config installed (compiling it); returns counts and the failures."""
    import torch

    from impls.tilegym import loader, tune

    mod = loader.load()
    kernels: dict = {}
    done, failures = 0, []
    for cfg in configs:
        try:
            entry = tune.install(mod, stage, shape, cfg, kernels)
            tune.run_with(mod, stage, entry, lambda: call(mod), key_args)
            done += 1
        except Exception as exc:  # the search records the same failure for this config; keep compiling the rest
            failures.append({"config": cfg, "error": f"{type(exc).__name__}: {str(exc)[:200]}"})
    if torch.cuda.is_initialized():  # the launches are asynchronous: finish them before reporting
        torch.cuda.synchronize()
    return {"compiled": done, "failures": failures}


def _worker(stage, shape, call, key_args, configs, queue):
    try:
        queue.put(compile_share(stage, shape, call, key_args, configs))
    except BaseException as exc:  # report, never hang the parent
        queue.put({"compiled": 0, "failures": [{"config": None, "error": f"{type(exc).__name__}: {exc}"}]})


def precompile(stage: str, shape, call: WrapperCall, key_args: tuple, configs: list[dict], workers: int) -> dict:
    """Compiles every config of `configs` in `workers` spawned processes; returns a summary for the log/record."""
    import torch.multiprocessing as mp

    start = time.perf_counter()
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(stage, shape, call, key_args, share, queue))
             for share in shares(configs, workers)]
    for p in procs:
        p.start()
    for p in procs:  # the items are small (counts, failures cut to 200 characters): a put never blocks a join
        p.join()
    results = []
    while True:
        try:
            results.append(queue.get(timeout=1))
        except queue_mod.Empty:
            break
    if len(results) < len(procs):  # a worker died before reporting (its configs compile again in the search)
        codes = [p.exitcode for p in procs]
        results.append({"compiled": 0, "failures": [
            {"config": None, "error": f"{len(procs) - len(results)} worker(s) did not report; exit codes {codes}"}]})
    summary = {"stage": stage, "workers": len(procs), "configs": len(configs),
               "compiled": sum(r["compiled"] for r in results),
               "failures": [f for r in results for f in r["failures"]],
               "seconds": round(time.perf_counter() - start, 1)}
    print(f"[tilegym precompile] {stage}: {summary['compiled']}/{len(configs)} configs compiled by "
          f"{len(procs)} workers in {summary['seconds']} s, {len(summary['failures'])} failed", flush=True)
    return summary
