"""The training step (models/train.py `train_step`) under torch.distributed's DistributedDataParallel: each process
holds a replica, runs its share of the batch, and DDP averages the gradients before the optimizer's step.

The process group's backend follows the device: NCCL for CUDA devices, gloo for the CPU (`process_group_backend`).
With every rank's loss a mean over the same number of targets (models/recall.py), the averaged gradient is the
whole batch's, so one step on N ranks equals one step of one process on the whole batch.
"""

from __future__ import annotations

import socket
from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from models.recall import RecallBatch
from models.train import train_step


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
                   grad_clip: float | None) -> float:
    """One step of this rank on its share `batch` (forward through the replica, whose backward all-reduces the
    gradients to their mean over the ranks, then clipping and the optimizer's step); -> this rank's loss."""
    return train_step(replica, optimizer, batch, grad_clip)
