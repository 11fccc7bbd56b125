"""Measuring helpers for notebooks 05 and 07: wall-clock time of calls, and the memory their tensors take.

Times are medians of *interleaved* rounds (`interleaved_seconds`): every call runs once per round,
so a disturbance (another program, the processor changing speed) falls on all of them alike
instead of on one length or one method; ratios between them (`ratios`) are computed, not read off.

`peak_tensor_bytes` counts what PyTorch allocates for the tensors an operation returns, while the
call runs, and reports the most that was alive at once: the memory a computation *needs*, as the
program sees it. It does not see the scratch space a fused kernel uses internally (such as the
small per-thread tiles of `torch.nn.functional.scaled_dot_product_attention`), nor the allocator's
caching, so it is an estimate of the allocator's peak, not a reading of the process's memory.
"""
from __future__ import annotations

import statistics
import time
import weakref
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class TensorMemory(TorchDispatchMode):
    """Inside `with TensorMemory() as mem:`, every storage a PyTorch operation allocates is counted
    while some tensor still uses it; `mem.peak` is the most bytes alive at once, `mem.largest` the
    largest single allocation. Tensors that existed before the block (inputs, weights) and views of
    them are not counted."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False  # else PyTorch wraps the mode for torch.compile, importing dynamo (seconds)

    def __init__(self):
        super().__init__()
        self.live = 0        # bytes of counted storages still in use
        self.peak = 0        # the most `live` has been
        self.largest = 0     # the largest single allocation
        self._users: dict[int, int] = {}   # storage address -> tensors using it
        self._sizes: dict[int, int] = {}   # storage address -> bytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0]
                  if isinstance(t, torch.Tensor)}
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor) or t.device.type == "meta":
                continue
            storage = t.untyped_storage()
            address, size = storage.data_ptr(), storage.nbytes()
            if size == 0 or (address in inputs and address not in self._users):
                continue  # empty, or a view of / in-place change to a tensor from outside the block
            if address not in self._users:  # a new allocation
                self._users[address], self._sizes[address] = 0, size
                self.live += size
                self.peak = max(self.peak, self.live)
                self.largest = max(self.largest, size)
            self._users[address] += 1
            weakref.finalize(t, self._release, address)
        return out

    def _release(self, address: int) -> None:
        self._users[address] -= 1
        if self._users[address] == 0:
            self.live -= self._sizes.pop(address)
            del self._users[address]


def peak_tensor_bytes(fn: Callable[..., Any], *args, **kwargs) -> int:
    """The most bytes of tensors that `fn(*args, **kwargs)` had alive at once (see TensorMemory)."""
    with torch.no_grad(), TensorMemory() as mem:
        result = fn(*args, **kwargs)
        del result
    return mem.peak


def seconds(fn: Callable[..., Any], *args, repeat: int = 5, **kwargs) -> float:
    """The median wall-clock time of `fn(*args, **kwargs)` over `repeat` calls (after one warm-up call)."""
    with torch.no_grad():
        fn(*args, **kwargs)
        times = []
        for _ in range(repeat):
            start = time.perf_counter()
            fn(*args, **kwargs)
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def interleaved_seconds(calls: dict[Any, Callable[[], Any]], repeat: int = 7) -> dict[Any, float]:
    """The median wall-clock seconds of each zero-argument call, over `repeat` rounds in which every
    call runs once, in turn (after one warm-up round)."""
    times: dict[Any, list[float]] = {key: [] for key in calls}
    with torch.no_grad():
        for call in calls.values():  # a warm-up round: first-call allocations, lazy initialisation
            call()
        for _ in range(repeat):
            for key, call in calls.items():
                start = time.perf_counter()
                call()
                times[key].append(time.perf_counter() - start)
    return {key: statistics.median(values) for key, values in times.items()}


def ratios(values: list[float]) -> list[float]:
    """Each value divided by the one before it: what one step (a doubling of T, say) multiplies it by."""
    return [b / a for a, b in zip(values, values[1:], strict=False)]

