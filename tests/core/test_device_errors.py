"""Which errors poison the device (a sticky CUDA error: the worker must restart) and which are one request's."""

import pytest
import torch

from fleetctl.engine.core.device_errors import poisons_device


@pytest.mark.parametrize("exc", [
    RuntimeError("CUDA error: an illegal memory access was encountered\\nCUDA kernel errors might be ..."),
    torch.AcceleratorError("CUDA error: device-side assert triggered"),
    RuntimeError("Triton Error [CUDA]: an illegal memory access was encountered"),
])
def test_a_sticky_cuda_error_poisons_the_device(exc: BaseException) -> None:
    assert poisons_device(exc)


@pytest.mark.parametrize("exc", [
    torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
    RuntimeError("shape mismatch"),
    ValueError("CUDA error: not a runtime error's"),
])
def test_an_ordinary_error_does_not(exc: BaseException) -> None:
    assert not poisons_device(exc)
