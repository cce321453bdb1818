"""Errors that poison the device: after an illegal memory access, a device-side assert or a launch
failure, every later CUDA call in the process fails too (the CUDA context is sticky-broken), so only a
new process can use the device again. An error of one request is not one of these."""

import re

# a CUDA runtime error as torch raises it (RuntimeError, or its subclass torch.AcceleratorError since 2.8:
# "CUDA error: an illegal memory access was encountered") or Triton ("Triton Error [CUDA]: …"); running out
# of memory reads "CUDA out of memory" (torch.OutOfMemoryError): raised before anything ran, it poisons nothing
_CUDA_ERROR = re.compile(r"CUDA error|Triton Error \[CUDA\]")


def poisons_device(exc: BaseException) -> bool:
    """Whether `exc` left the process's CUDA context unusable."""
    return isinstance(exc, RuntimeError) and bool(_CUDA_ERROR.search(str(exc)))
