"""Data parallelism under torchrun: process-group set-up from its environment variables and the few
collectives the trainer needs. With one process every helper is a no-op, so the single-process
path has no torch.distributed dependency at all.

torchrun sets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT; we use NCCL on CUDA and
gloo on CPU. Only rank 0 writes anything (checkpoints, logs, TensorBoard).
"""

from __future__ import annotations

import contextlib
import inspect
import os
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Iterator

import numpy as np
import torch
import torch.distributed as dist

from aiayn.errors import UserError


@dataclass(frozen=True)
class DistEnv:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    owns_group: bool = False  # this process group was started by `setup` (and ends in teardown)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def env_world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def pick_device(device: str | None = None, index: int = 0) -> torch.device:
    """`device` ("cpu", "cuda" or None: CUDA when available, else the CPU) as a torch device, CUDA
    device `index`; asking for CUDA where this torch has none is one UserError."""
    kind = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if kind == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda: no CUDA device is available to this torch")
    return torch.device("cuda", index) if kind == "cuda" else torch.device(kind)


def setup(device: str | None = None) -> DistEnv:
    """Start the process group if torchrun launched us (WORLD_SIZE > 1); pick this rank's device.
    `device` None means CUDA when available, else CPU."""
    world = env_world_size()
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    dev = pick_device(device, local)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    owns = False
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if dev.type == "cuda" else "gloo", rank=rank,
                                world_size=world, device_id=dev if dev.type == "cuda" else None)
        owns = True
    return DistEnv(rank, world, local, dev, owns)


def rank_seed(seed: int, rank: int) -> int:
    """Dropout seed of a rank: independent streams per rank, derived from the run's seed."""
    return int(np.random.SeedSequence([seed, rank, 17]).generate_state(1, np.uint64)[0] >> 1)


def wrap_ddp(model: torch.nn.Module, env: DistEnv) -> torch.nn.parallel.DistributedDataParallel:
    """DDP around `model` (identical weights on every rank after this: rank 0's are broadcast).
    No buffer needs syncing before each forward: the model's only buffer is the sinusoid table, a
    cache each rank grows on demand."""
    ddp = torch.nn.parallel.DistributedDataParallel
    params = inspect.signature(ddp.__init__).parameters
    no_sync = {"forward_sync_buffers": False} if "forward_sync_buffers" in params else {"broadcast_buffers": False}
    return ddp(model, device_ids=[env.device.index] if env.device.type == "cuda" else None, **no_sync)


def teardown() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def all_reduce(t: torch.Tensor, env: DistEnv, op: str = "sum") -> torch.Tensor:
    """In-place all-reduce of a small tensor ("sum", "min" or "max"); identity with one process."""
    if env.distributed:
        ops = {"sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}
        dist.all_reduce(t, op=ops[op])
    return t


def gather_to_main(obj: Any, env: DistEnv) -> list[Any] | None:
    """Every rank's `obj` as a list on rank 0 (None elsewhere); [obj] with one process."""
    if not env.distributed:
        return [obj]
    out: list[Any] | None = [None] * env.world_size if env.is_main else None
    dist.gather_object(obj, out, dst=0)
    return out


def scatter_from_main(objs: list[Any] | None, env: DistEnv) -> Any:
    """Rank 0 holds one object per rank; each rank receives its own. objs[0] with one process."""
    if not env.distributed:
        return objs[0] if objs else None
    out: list[Any] = [None]
    dist.scatter_object_list(out, objs if env.is_main else None, src=0)
    return out[0]


def broadcast_object(obj: Any, env: DistEnv) -> Any:
    """Rank 0's `obj` on every rank."""
    if not env.distributed:
        return obj
    box = [obj if env.is_main else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def barrier(env: DistEnv) -> None:
    if env.distributed:
        dist.barrier()


@contextlib.contextmanager
def held_by_main(acquire: Callable[[], ContextManager], env: DistEnv) -> Iterator[None]:
    """Rank 0 enters `acquire()` (e.g. the lock on a run directory) for the block; the other ranks
    learn whether it could. When it could not, every rank raises rank 0's UserError, instead of
    the others waiting for a rank that has left."""
    with contextlib.ExitStack() as stack:
        error = None
        if env.is_main:
            try:
                stack.enter_context(acquire())
            except UserError as e:
                error = str(e)
        error = broadcast_object(error, env)
        if error is not None:
            raise UserError(error)
        yield
