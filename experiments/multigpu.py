"""`python -m experiments.multigpu --gpus N -- <bench overrides>`: one job per GPU on a multi-GPU node, without
joblib. Starts N `experiments.bench` processes, process i seeing only GPU i (CUDA_VISIBLE_DEVICES) and running,
with Hydra's basic launcher, the jobs whose number modulo N is i (launch.shard=i, launch.num_shards=N). All
shards share one sweep id (SSD_SWEEP_ID), so their rows form one sweep; merge them with experiments.merge."""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import subprocess
import sys


def owns_job(job_num: int, shard: int, num_shards: int) -> bool:
    """Whether process `shard` of `num_shards` runs job `job_num` (round robin)."""
    if num_shards < 1 or not 0 <= shard < num_shards:
        raise ValueError(f"shard: expected 0 <= shard < num_shards, got {shard}/{num_shards}")
    return job_num % num_shards == shard


def gpu_for_job(job_num: int, gpus: list[int]) -> int:
    """The physical GPU that runs job `job_num` when jobs are dealt round robin over `gpus`."""
    if not gpus:
        raise ValueError("gpus: expected at least one GPU")
    return gpus[job_num % len(gpus)]


def shard_commands(gpus: list[int], overrides: list[str], sweep_id: str) -> list[tuple[dict, list[str]]]:
    """(environment, argv) of each shard process."""
    out = []
    for shard, gpu in enumerate(gpus):
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(gpu), "SSD_SWEEP_ID": sweep_id}
        argv = [sys.executable, "-m", "experiments.bench", *overrides, f"launch.num_shards={len(gpus)}",
                f"launch.shard={shard}"]
        out.append((env, argv))
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--gpus", default=None, help="count (N) or comma list of GPU indices; default: all")
    parser.add_argument("overrides", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.gpus is None:
        import torch

        gpus = list(range(torch.cuda.device_count()))
    elif "," in args.gpus:
        gpus = [int(g) for g in args.gpus.split(",")]
    else:
        gpus = list(range(int(args.gpus)))
    overrides = [o for o in args.overrides if o != "--"]
    sweep_id = "multigpu-" + _dt.datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
    procs = [subprocess.Popen(cmd, env=env) for env, cmd in shard_commands(gpus, overrides, sweep_id)]
    codes = [p.wait() for p in procs]
    print(f"[multigpu] sweep {sweep_id}: shard exit codes {codes}")
    return max(codes, default=0)


if __name__ == "__main__":
    sys.exit(main())
