"""Process groups and model wrapping: one place that knows about torchrun, DDP, FSDP and compile.

`torchrun --nproc_per_node N -m bertkit pretrain ...` sets RANK / WORLD_SIZE / LOCAL_RANK;
`init()` reads them (gloo on CPU, NCCL on GPU). Without them everything is a no-op world of 1.
`parallelize(model, ...)` applies torch.compile and DDP or FSDP without touching model.py.
"""
from __future__ import annotations

import os
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn


@dataclass
class World:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def init(device: str | None = None) -> World:
    """Join the torchrun process group if there is one; pick this process's device."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = torch.cuda.is_available() if device is None else device.startswith("cuda")
    dev = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(dev)
    if world_size > 1 and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if use_cuda else "gloo")
    return World(rank, world_size, local_rank, dev)


def teardown() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def all_reduce_sum(t: torch.Tensor, world: World) -> torch.Tensor:
    """Sum a tensor over all ranks (in place; returned for chaining)."""
    if world.distributed:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def mean_over_ranks(x: float, world: World) -> float:
    """A number's mean over all ranks (the same answer on every rank)."""
    return all_reduce_sum(torch.tensor([x], dtype=torch.float64, device=world.device), world).item() / world.world_size


def all_ranks_agree(flag: bool, world: World) -> bool:
    """True if `flag` is true on any rank (e.g. 'a stop signal arrived'), the same answer on all."""
    if not world.distributed:
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=world.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item() > 0)


def barrier(world: World) -> None:
    if world.distributed:
        dist.barrier()


def parallelize(model: nn.Module, world: World, strategy: str = "ddp", compile: bool = False) -> nn.Module:
    """The module the training step calls: the model, compiled and/or wrapped for DDP / FSDP.

    Parameters stay the model's own (DDP) or become sharded DTensors (FSDP); see
    `full_state_dict` for saving either way."""
    wrapped: nn.Module = model
    if world.distributed and strategy == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for block in model.bert.blocks:
            fully_shard(block)
        fully_shard(model)
    elif world.distributed:
        from torch.nn.parallel import DistributedDataParallel

        ids = [world.device.index] if world.device.type == "cuda" else None
        wrapped = DistributedDataParallel(model, device_ids=ids)
    if compile:
        wrapped = torch.compile(wrapped, dynamic=True)
    return wrapped


def no_sync(wrapped: nn.Module, skip: bool):
    """Skip DDP's gradient all-reduce for the micro-batches before the last one of an update."""
    inner = getattr(wrapped, "_orig_mod", wrapped)
    if skip and hasattr(inner, "no_sync"):
        return inner.no_sync()
    if skip and hasattr(inner, "set_requires_gradient_sync"):          # FSDP2
        inner.set_requires_gradient_sync(False)
        return _resync(inner)
    return nullcontext()


@contextmanager
def _resync(module):
    try:
        yield
    finally:
        module.set_requires_gradient_sync(True)


def full_state_dicts(model: nn.Module, optimizer: torch.optim.Optimizer, strategy: str, world: World):
    """(model state dict, optimizer state dict) as plain CPU tensors, whatever the wrapping."""
    if world.distributed and strategy == "fsdp":
        from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                             get_optimizer_state_dict)

        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_model_state_dict(model, options=opts), get_optimizer_state_dict(model, optimizer, options=opts)
    return model.state_dict(), optimizer.state_dict()


def load_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer, optim_sd: dict) -> None:
    """Load a full (unsharded) optimizer state into the optimizer of an FSDP-sharded model."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(model, optimizer, optim_sd, options=StateDictOptions(full_state_dict=True))
