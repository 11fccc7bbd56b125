"""Where training runs: the device, CPU threads, and several processes under `torchrun`
(DistributedDataParallel: NCCL on GPUs, gloo on CPUs)."""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Distributed:
    """This process's place among the training processes (one process: rank 0 of 1)."""
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    started_here: bool = False   # this call initialised the process group (and must end it)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world_size > 1


def init_distributed(device: torch.device | None = None) -> Distributed:
    """Join the process group `torchrun` describes in the environment (WORLD_SIZE, RANK, ...);
    a plain run is one process and needs nothing."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Distributed()
    import torch.distributed as dist

    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    started = False
    if not dist.is_initialized():
        backend = "nccl" if (device is None or device.type == "cuda") and torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend)
        started = True
    return Distributed(rank, world, local, started)


def pick_device(device: str | None = None, dist: Distributed = Distributed()) -> torch.device:
    """The device asked for, else CUDA when available, else the CPU. A CUDA device always carries its
    index ("cuda" -> "cuda:0"): `torch.cuda.set_device` refuses one without. A device this machine cannot
    give is a ValueError that says so (it was PyTorch's AssertionError, deep in a traceback)."""
    if device:
        try:
            chosen = torch.device(device)
        except RuntimeError:
            raise ValueError(f"--device {device}: not a device PyTorch knows; give cpu, cuda or cuda:N "
                             "(or leave it out: a GPU when there is one, else the CPU)") from None
        if chosen.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"--device {device}: this PyTorch sees no CUDA GPU (a CPU-only build, or no NVIDIA "
                             "driver); leave --device out to run on the CPU")
    elif torch.cuda.is_available():
        chosen = torch.device("cuda")
    else:
        return torch.device("cpu")
    if chosen.type == "cuda" and chosen.index is None:
        chosen = torch.device("cuda", dist.local_rank if dist.active else torch.cuda.current_device())
    return chosen


def describe_device(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    cores = os.cpu_count() or 1
    return f"CPU ({cores} {'core' if cores == 1 else 'cores'})"


def cpu_threads(requested: int | None) -> int:
    """Threads for CPU training: as requested, else all cores, or 1 when the machine is already busy
    (PyTorch's threads wait for each other; on an oversubscribed machine one thread is faster)."""
    if requested:
        return requested
    cores = os.cpu_count() or 1
    try:
        busy = os.getloadavg()[0] >= cores
    except OSError:  # pragma: no cover - not on every platform
        busy = False
    return 1 if busy else cores


def synchronize(device: torch.device) -> None:
    """Wait for the queued GPU work (so a clock read after it measures it)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass(frozen=True)
class Precision:
    """How the forward pass computes: bf16 or fp16 autocast, or full fp32. fp16's narrow range makes
    small gradients underflow to zero, so it trains with a gradient scaler (bf16 has fp32's range)."""
    name: str  # "bf16", "fp16" or "fp32"
    why: str   # one line for the run's log and config.json

    @property
    def dtype(self) -> torch.dtype | None:
        return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.name)

    def autocast(self, device: torch.device):
        """The autocast context for `device` (a no-op for fp32)."""
        return torch.autocast(device.type, dtype=self.dtype or torch.float32, enabled=self.dtype is not None)

    def grad_scaler(self, device: torch.device) -> torch.amp.GradScaler:
        """A gradient scaler, switched on for fp16 only (off, its calls pass straight through)."""
        return torch.amp.GradScaler(device.type, enabled=self.name == "fp16")


def choose_precision(device_type: str, low_precision: bool, capability: tuple[int, int] | None) -> Precision:
    """bf16 where the GPU computes it natively (compute capability 8.0 and later: A100, H100, RTX 30xx
    and later), fp16 with a gradient scaler on older GPUs (a T4, Colab's free GPU, is 7.5: bf16 is
    emulated there and slow), fp32 on the CPU or when the recipe asks for it."""
    if device_type != "cuda":
        return Precision("fp32", f"{device_type}: full precision")
    if not low_precision:
        return Precision("fp32", "the recipe asks for full precision (bf16=False)")
    major, minor = capability or (0, 0)
    if (major, minor) >= (8, 0):
        return Precision("bf16", f"bf16 autocast: compute capability {major}.{minor} computes bf16 natively")
    return Precision("fp16", f"fp16 autocast with a gradient scaler: compute capability {major}.{minor} has no "
                             "native bf16")


def precision_for(device: torch.device, low_precision: bool) -> Precision:
    """`choose_precision` for this device."""
    capability = torch.cuda.get_device_capability(device) if device.type == "cuda" else None
    return choose_precision(device.type, low_precision, capability)

