"""What the kernel tests share: the device (Triton's interpreter on a CPU, switched on at import, before
anything jits a kernel), tolerances, seeded tensors and a paged KV pool whose unused slots are NaN."""

import pytest
import torch

from fleetctl.kernels import triton_support

if not triton_support.triton_available():
    pytest.skip("triton is not installed", allow_module_level=True)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":
    triton_support.use_interpreter()  # before anything imports triton

DTYPES = [torch.float32, torch.bfloat16]
PAGE = 16


def close(actual: torch.Tensor, expected: torch.Tensor, attention: bool = False) -> None:
    if expected.dtype == torch.float32:
        tol = {"atol": 1e-5, "rtol": 1e-5}
    else:
        tol = {"atol": 1e-2 if attention else 1e-5, "rtol": 1.6e-2}
    torch.testing.assert_close(actual, expected, **tol)


def randn(*shape: int, dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen).to(dtype=dtype, device=DEVICE)


def paged_pool(
    lengths: list[int], kv_heads: int, head_dim: int, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A KV pool holding sequences of the given lengths on shuffled pages, and its block tables.

    Returns kv_layer [2, pages, PAGE, Hkv, d], block_tables [B, max_pages + 2] int32 (zero padded)
    and context_lens [B] int32. Page 0 (what padding points at), unused pages and the slots past
    each sequence's end hold NaN, so a kernel that reads them fails (the references get the pool
    through `torch.nan_to_num`: the decode one reads those slots and masks them afterwards)."""
    needed = [-(-n // PAGE) for n in lengths]
    num_pages = sum(needed) + 3
    kv_layer = torch.full((2, num_pages, PAGE, kv_heads, head_dim), float("nan"), dtype=dtype, device=DEVICE)
    order = (torch.randperm(num_pages - 1, generator=torch.Generator().manual_seed(7)) + 1).tolist()
    tables = torch.zeros(len(lengths), max(needed) + 2, dtype=torch.int32)
    for i, (length, count) in enumerate(zip(lengths, needed, strict=True)):
        pages = [order.pop() for _ in range(count)]
        tables[i, :count] = torch.tensor(pages, dtype=torch.int32)
        values = randn(2, length, kv_heads, head_dim, dtype=dtype, seed=10 + i)
        flat = kv_layer[:, pages].flatten(1, 2)
        flat[:, :length] = values
        kv_layer[:, pages] = flat.view(2, count, PAGE, kv_heads, head_dim)
    return kv_layer, tables.to(DEVICE), torch.tensor(lengths, dtype=torch.int32, device=DEVICE)
