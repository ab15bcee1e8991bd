"""The training step under DistributedDataParallel (models/ddp.py): two gloo processes on the halves of a batch end
one AdamW step with the gradients and parameters of one process on the whole batch; a whole run on two ranks is the
single process's."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.multiprocessing as mp

from models.ddp import (
    ddp_train_step,
    free_port,
    process_group,
    process_group_backend,
    rank_device,
    rank_share,
    train_ddp,
    wrap,
)
from models.recall import RecallTask, recall_batch
from models.train import ModelSizes, OptimSettings, TrainConfig, build_model, make_optimizer, train, train_step

# no clipping: a clipped gradient hides a wrongly scaled one (as AdamW's first step nearly does)
TINY = TrainConfig(task=RecallTask(n_pairs=4, n_queries=3, n_keys=8, n_values=8),
                   model=ModelSizes(n_layer=2, d_model=16, d_state=8, headdim=8, chunk_size=16),
                   optim=OptimSettings(steps=1, batch=4, lr=1e-2, grad_clip=None))
WORLD = 2


def _batch():
    return recall_batch(TINY.task, TINY.optim.batch, torch.Generator().manual_seed(5))


def _state(model) -> dict:
    return {"params": {n: p.detach().clone() for n, p in model.named_parameters()},
            "grads": {n: p.grad.detach().clone() for n, p in model.named_parameters()}}


def _rank(rank: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    model = build_model(TINY, "reference", 0, "cpu")
    with process_group(rank, WORLD, port, "cpu"):
        replica = wrap(model, "cpu")
        optimizer = make_optimizer(model, TINY.optim)
        loss = ddp_train_step(replica, optimizer, rank_share(_batch(), rank, WORLD), TINY.optim.grad_clip)
        torch.save({**_state(model), "loss": loss}, f"{out}.{rank}")


def _one_process(batch):
    model = build_model(TINY, "reference", 0, "cpu")
    loss = train_step(model, make_optimizer(model, TINY.optim), batch, TINY.optim.grad_clip)
    return {**_state(model), "loss": loss}


def _max_diff(a: dict, b: dict) -> float:
    return max((a[n] - b[n]).abs().max().item() for n in a)


def test_two_gloo_ranks_on_halves_match_one_process_on_the_whole_batch(tmp_path):
    out = str(tmp_path / "rank")
    mp.spawn(_rank, args=(free_port(), out), nprocs=WORLD, join=True)
    ranks = [torch.load(f"{out}.{r}") for r in range(WORLD)]
    whole = _one_process(_batch())
    for got in ranks:
        assert _max_diff(got["grads"], whole["grads"]) < 1e-6
        assert _max_diff(got["params"], whole["params"]) < 1e-6
    # the mean of the ranks' losses is the whole batch's; each half's alone is not (the halves differ)
    assert sum(r["loss"] for r in ranks) / WORLD == pytest.approx(whole["loss"], rel=1e-6)
    assert abs(ranks[0]["loss"] - whole["loss"]) > 1e-4
    half = _one_process(rank_share(_batch(), 0, WORLD))  # a rank that stepped alone would not match
    assert _max_diff(half["grads"], whole["grads"]) > 1e-4


def test_the_process_group_backend_follows_the_device():
    assert process_group_backend(torch.device("cpu")) == "gloo"
    assert process_group_backend(torch.device("cuda", 1)) == "nccl"
    with pytest.raises(ValueError, match="device"):
        process_group_backend(torch.device("meta"))
    assert rank_device(1, WORLD, "cpu") == torch.device("cpu")
    if torch.cuda.device_count() < WORLD:
        with pytest.raises(ValueError, match="world_size"):
            rank_device(0, WORLD, "cuda")


def test_a_batch_that_does_not_split_evenly_is_refused():
    with pytest.raises(ValueError, match="world_size"):
        rank_share(recall_batch(TINY.task, 3, torch.Generator().manual_seed(0)), 0, WORLD)


@pytest.mark.slow
def test_a_run_on_two_gloo_ranks_is_the_single_process_run():
    config = dataclasses.replace(TINY, optim=dataclasses.replace(TINY.optim, steps=3, eval_batch=4))
    alone, ranked = train(config, "reference", 1, "cpu"), train_ddp(config, "reference", 1, WORLD, "cpu")
    assert max(abs(a - b) for a, b in zip(alone.losses, ranked.losses)) < 1e-5 and len(ranked.losses) == 3
    assert ranked.accuracy == pytest.approx(alone.accuracy)
    assert ranked.describe["data_parallel"] == {"world_size": 2, "process_group": "gloo"}
