"""Published peaks of known GPUs (no torch: the planner reads them for what-if fleets, the workers
for their MFU/MBU denominators)."""

import re
from dataclasses import dataclass

TERA = 1e12


@dataclass(frozen=True)
class GpuSpec:
    name: str  # how an operator writes it (`--devices 8xH100`)
    pattern: str  # searched (case-insensitive) in the name torch/NVML report
    tensor_flops: float  # dense bf16/fp16 tensor-core FLOP/s (sparsity doubles it; not counted)
    fp32_flops: float  # non-tensor fp32 FLOP/s (torch's default fp32 matmul does not use TF32)
    bytes_per_s: float  # memory bandwidth


# Sources: NVIDIA's product datasheets (H100, H200, A100, L4, L40, L40S, A10, A40) and the Ada
# (RTX 4090) and GA102 (RTX 3090) architecture whitepapers; datasheets quote bf16 with sparsity,
# halved here. First match wins, so the more specific names come first.
GPU_SPECS = (
    GpuSpec("H100 NVL", r"H100 NVL", 835.5 * TERA, 60 * TERA, 3.9 * TERA),
    GpuSpec("H100 PCIe", r"H100.*PCIe", 756.5 * TERA, 51 * TERA, 2.0 * TERA),
    GpuSpec("H100", r"H100", 989.5 * TERA, 67 * TERA, 3.35 * TERA),  # SXM5, e.g. "NVIDIA H100 80GB HBM3"
    GpuSpec("H200 NVL", r"H200 NVL", 835.5 * TERA, 60 * TERA, 4.8 * TERA),
    GpuSpec("H200", r"H200", 989.5 * TERA, 67 * TERA, 4.8 * TERA),
    GpuSpec("A100 80GB PCIe", r"A100.*80GB.*PCIe", 312 * TERA, 19.5 * TERA, 1.935 * TERA),
    GpuSpec("A100 80GB", r"A100.*80GB", 312 * TERA, 19.5 * TERA, 2.039 * TERA),
    GpuSpec("A100", r"A100", 312 * TERA, 19.5 * TERA, 1.555 * TERA),  # 40 GB, SXM4 and PCIe
    GpuSpec("L40S", r"L40S", 362.05 * TERA, 91.6 * TERA, 0.864 * TERA),
    GpuSpec("L40", r"\bL40\b", 181.05 * TERA, 90.5 * TERA, 0.864 * TERA),
    GpuSpec("L4", r"\bL4\b", 121 * TERA, 30.3 * TERA, 0.3 * TERA),
    GpuSpec("A10", r"\bA10\b", 125 * TERA, 31.2 * TERA, 0.6 * TERA),  # not A10G, not A100
    GpuSpec("A40", r"\bA40\b", 149.7 * TERA, 37.4 * TERA, 0.696 * TERA),
    GpuSpec("RTX 4090", r"RTX 4090", 165.2 * TERA, 82.6 * TERA, 1.008 * TERA),  # bf16 with fp32 accumulate
    GpuSpec("RTX 3090", r"RTX 3090(?! Ti)", 71 * TERA, 35.6 * TERA, 0.936 * TERA),  # bf16 with fp32 accumulate
)


def find_gpu_spec(name: str) -> GpuSpec | None:
    """The table's entry for a GPU name (as torch reports it, or as an operator writes it), if any."""
    return next((spec for spec in GPU_SPECS if re.search(spec.pattern, name, re.IGNORECASE)), None)
