"""The training step (models/train.py `train_step`) under torch.distributed's DistributedDataParallel: each process
holds a replica, runs its share of the batch, and DDP averages the gradients before the optimizer's step.

The process group's backend follows the device: NCCL for CUDA devices, gloo for the CPU (`process_group_backend`).
With every rank's loss a mean over the same number of targets (models/recall.py), the averaged gradient is the
whole batch's, so one step on N ranks equals one step of one process on the whole batch. `train_ddp` runs a whole
training run (models/train.py `train`) that way, one process per rank (one GPU each on CUDA).
"""

from __future__ import annotations

import socket
import tempfile
import time
from contextlib import contextmanager

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

from models.recall import RecallBatch, recall_batch
from models.train import (
    EVAL_SEED,
    Curve,
    TrainConfig,
    build_model,
    data_generator,
    make_optimizer,
    recall_accuracy,
    train_step,
)


def process_group_backend(device: torch.device) -> str:
    """"nccl" for a CUDA device, "gloo" for the CPU; another device type raises, naming it."""
    device = torch.device(device)
    if device.type == "cuda":
        return "nccl"
    if device.type == "cpu":
        return "gloo"
    raise ValueError(f"device: expected a cuda or cpu device for a process group, got {device}")


def free_port() -> int:
    """A TCP port free on this host now (for the process group's rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def process_group(rank: int, world_size: int, port: int, device):
    """The default process group of this rank over a TCP rendezvous on localhost:`port`, its backend chosen by
    `device`; destroyed on exit. A CUDA device is made this process's current device first (NCCL needs it)."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(process_group_backend(device), init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()


def wrap(model: torch.nn.Module, device) -> DistributedDataParallel:
    """The model (already on `device`) as a DDP replica: on CUDA bound to its device, on the CPU without ids."""
    device = torch.device(device)
    ids = [device] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids)


def rank_share(batch: RecallBatch, rank: int, world_size: int) -> RecallBatch:
    """This rank's contiguous share of the batch; a batch that does not divide evenly raises (the ranks' means would
    weigh sequences unequally)."""
    n = batch.input_ids.shape[0]
    if n % world_size:
        raise ValueError(f"batch: expected a multiple of world_size = {world_size} sequences, got {n}")
    size = n // world_size
    return batch.rows(rank * size, (rank + 1) * size)


def ddp_train_step(replica: DistributedDataParallel, optimizer: torch.optim.Optimizer, batch: RecallBatch,
                   grad_clip: float | None, precision=None) -> float:
    """One step of this rank on its share `batch` (forward through the replica, whose backward all-reduces the
    gradients to their mean over the ranks, then clipping and the optimizer's step; the forward in `precision`'s
    context, `TrainConfig.precision`); -> this rank's loss."""
    return train_step(replica, optimizer, batch, grad_clip, precision)


def rank_device(rank: int, world_size: int, device_type: str) -> torch.device:
    """Rank `rank`'s device: cuda:<rank> (one GPU per rank; fewer GPUs than ranks raise, naming world_size), or the
    CPU."""
    if device_type == "cpu":
        return torch.device("cpu")
    if device_type != "cuda":
        raise ValueError(f"device: expected cuda or cpu for a data-parallel run, got {device_type!r}")
    count = torch.cuda.device_count()
    if world_size > count:
        raise ValueError(f"world_size: {world_size} ranks need as many GPUs, this machine has {count}")
    return torch.device("cuda", rank)


def train_rank(rank: int, world_size: int, port: int, config: TrainConfig, backend: str, seed: int,
               device_type: str, out: str) -> None:
    """One rank of `models.train.train`'s run under DDP: the same initial parameters and batches, each step's batch
    split across the ranks; rank 0 saves the Curve (each step's loss averaged over the ranks: the whole batch's)
    to `out`."""
    device = rank_device(rank, world_size, device_type)
    model = build_model(config, backend, seed, device)
    optimizer = make_optimizer(model, config.optim)
    gen = data_generator(seed)
    losses = []
    with process_group(rank, world_size, port, device):
        replica = wrap(model, device)
        start = time.perf_counter()
        for _ in range(config.optim.steps):
            share = rank_share(recall_batch(config.task, config.optim.batch, gen), rank, world_size).to(device)
            loss = torch.tensor(ddp_train_step(replica, optimizer, share, config.optim.grad_clip,
                                                config.precision(device)), device=device)
            dist.all_reduce(loss)
            losses.append(loss.item() / world_size)
        seconds = time.perf_counter() - start
    if rank == 0:
        held_out = recall_batch(config.task, config.optim.eval_batch, torch.Generator().manual_seed(EVAL_SEED))
        accuracy = recall_accuracy(model, held_out.to(device), config.precision(device))
        describe = {**model.describe(), "data_parallel": {"world_size": world_size,
                                                          "process_group": process_group_backend(device)}}
        torch.save(Curve(backend, seed, tuple(losses), accuracy, describe, seconds), out)


def train_ddp(config: TrainConfig, backend: str, seed: int, world_size: int, device_type: str) -> Curve:
    """`models.train.train`'s run on `world_size` processes (torch.multiprocessing spawn, DDP over NCCL on GPUs or
    gloo on the CPU); -> rank 0's Curve."""
    with tempfile.TemporaryDirectory() as folder:
        out = f"{folder}/curve.pt"
        mp.spawn(train_rank, args=(world_size, free_port(), config, backend, seed, device_type, out),
                 nprocs=world_size, join=True)
        return torch.load(out, weights_only=False)
