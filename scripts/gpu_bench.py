"""scripts/gpu-check's benchmarks: paged decode attention's achieved GB/s vs the device's peak (1k/4k/16k context,
batch 1/32; target >= 70% at 4k) and prefill attention vs torch SDPA (target <= 1.3x), then decode tokens/s through
the engine, kernels vs torch (scripts/engine_bench.py). Misses are reported, not failed. `--tiny` runs them tiny,
on CPU through the Triton interpreter, to check this code where there is no GPU. FLEET_PEAK_GBPS=... overrides the
peak bandwidth."""

import os
import sys
import time
from collections.abc import Callable

SMOKE = "--tiny" in sys.argv[1:]
if SMOKE:
    os.environ["FLEET_KERNELS"] = "interpret"  # before anything imports triton
import engine_bench
import torch
import torch.nn.functional as F

from fleetctl.kernels import ops  # noqa: F401  (switches the interpreter on in smoke mode)
from fleetctl.kernels.paged_attention import paged_decode_attention_triton, prefill_attention_triton
from fleetctl.kernels.store_kv import store_kv_ref

DEV = torch.device("cpu" if SMOKE else "cuda")
H, HKV, D, PAGE, DT = 32, 8, 128, 16, torch.bfloat16  # a Llama-3-8B layer
SCALE = D**-0.5
DECODE_CTX, DECODE_BATCH = ([64, 80], [1, 3]) if SMOKE else ([1024, 4096, 16384], [1, 32])
PREFILL = [(1, 40), (2, 33)] if SMOKE else [(1, 2048), (1, 8192), (8, 1024), (4, 4096)]  # (seqs, tokens each)


def bench_ms(fn: Callable[[], object]) -> float:
    if SMOKE:
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3
    from triton.testing import do_bench, do_bench_cudagraph

    try:  # CUDA graphs: kernel time without the Python launch overhead
        return do_bench_cudagraph(fn, rep=100)
    except Exception:
        return do_bench(fn, warmup=25, rep=100)


def peak_gbps() -> tuple[float, str]:
    if os.environ.get("FLEET_PEAK_GBPS"):
        return float(os.environ["FLEET_PEAK_GBPS"]), "FLEET_PEAK_GBPS"
    if SMOKE:
        return 100.0, "smoke"
    name = torch.cuda.get_device_name()
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByUUID("GPU-" + str(torch.cuda.get_device_properties(DEV).uuid))
        except Exception:
            handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
        clock = pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_MEM)  # MHz
        width = pynvml.nvmlDeviceGetMemoryBusWidth(handle)  # bits
        return 2 * clock * 1e6 * width / 8 / 1e9, f"NVML max memory clock {clock} MHz x {width}-bit, DDR"
    except Exception as err:  # data sheet values
        table = {"H200": 4800.0, "H100 NVL": 3900.0, "H100 PCIe": 2000.0, "H100": 3350.0, "A100": 2039.0}
        for key, value in table.items():
            if key in name:
                return value, f"data sheet for {key} (NVML: {err})"
        raise SystemExit(f"unknown peak bandwidth for {name}; set FLEET_PEAK_GBPS") from err


def paged_pool(seqs: int, length: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Shuffled pages holding `seqs` sequences of `length` tokens: (kv_layer, tables, lens, kv [2, B, L, Hkv, D])."""
    per_seq = -(-length // PAGE)
    pages = seqs * per_seq + 1
    kv_layer = torch.zeros(2, pages, PAGE, HKV, D, dtype=DT, device=DEV)
    tables = (torch.randperm(pages - 1, device=DEV)[: seqs * per_seq] + 1).view(seqs, per_seq).int()
    kv = torch.randn(2, seqs, length, HKV, D, dtype=DT, device=DEV)
    slots = (tables.long()[:, :, None] * PAGE + torch.arange(PAGE, device=DEV)).flatten(1)[:, :length].flatten()
    store_kv_ref(kv[0].flatten(0, 1), kv[1].flatten(0, 1), kv_layer, slots)
    lens = torch.full((seqs,), length, dtype=torch.int32, device=DEV)
    return kv_layer, tables, lens, kv


torch.manual_seed(0)
peak, source = peak_gbps()
print(f"peak HBM bandwidth: {peak:.0f} GB/s ({source})")
if not SMOKE:
    x = torch.empty(1 << 30, dtype=torch.uint8, device=DEV)
    y = torch.empty_like(x)
    copy = 2 * x.numel() / (bench_ms(lambda: y.copy_(x)) * 1e-3) / 1e9
    print(f"device copy (1 GiB): {copy:.0f} GB/s = {copy / peak:.0%} of peak (a practical ceiling)")
    del x, y

print(f"\ndecode attention, H={H} Hkv={HKV} d={D} {DT}, page {PAGE}, one layer")
print(f"{'context':>8} {'batch':>6} {'time us':>9} {'GB/s':>8} {'% peak':>7}  target")
misses = []
for ctx in DECODE_CTX:
    for batch in DECODE_BATCH:
        kv_layer, tables, lens, _ = paged_pool(batch, ctx)
        q = torch.randn(batch, H, D, dtype=DT, device=DEV)
        ms = bench_ms(lambda: paged_decode_attention_triton(q, kv_layer, tables, lens, SCALE))  # noqa: B023
        moved = 2 * batch * ctx * HKV * D * kv_layer.element_size() + 2 * q.numel() * q.element_size()
        gbps = moved / (ms * 1e-3) / 1e9
        target = ""
        if ctx == 4096:
            target = "ok" if gbps >= 0.7 * peak else "MISS (>= 70%)"
            if gbps < 0.7 * peak:
                misses.append(f"decode ctx {ctx} batch {batch}: {gbps / peak:.0%} of peak")
        print(f"{ctx:>8} {batch:>6} {ms * 1e3:>9.1f} {gbps:>8.0f} {gbps / peak:>7.0%}  {target}")
        del kv_layer, tables, lens

ctx, batch = DECODE_CTX[1], DECODE_BATCH[-1]
kv_layer, tables, lens, _ = paged_pool(batch, ctx)
q = torch.randn(batch, H, D, dtype=DT, device=DEV)
cells = []
for partition in [None, 256, 512, 1024, ctx]:
    ms = bench_ms(lambda: paged_decode_attention_triton(q, kv_layer, tables, lens, SCALE, partition=partition))  # noqa: B023
    cells.append(f"{partition or 'auto'}: {ms * 1e3:.1f} us")
print(f"split-K partition at context {ctx}, batch {batch}: " + ", ".join(cells))
del kv_layer, tables, lens

print(f"\nprefill attention (causal, no cached prefix), H={H} Hkv={HKV} d={D} {DT}, vs SDPA on contiguous K/V")
print(f"{'seqs x len':>11} {'ours ms':>9} {'SDPA ms':>9} {'ratio':>6} {'TFLOP/s':>8} {'max err':>8}  target")
for seqs, length in PREFILL:
    kv_layer, tables, lens, kv = paged_pool(seqs, length)
    q = torch.randn(seqs * length, H, D, dtype=DT, device=DEV)
    cu = torch.arange(seqs + 1, device=DEV, dtype=torch.int32) * length
    ours = bench_ms(lambda: prefill_attention_triton(q, kv_layer, tables, cu, lens, SCALE))  # noqa: B023
    qs = q.view(seqs, length, H, D).transpose(1, 2).contiguous()
    ks, vs = (t.transpose(1, 2).repeat_interleave(H // HKV, dim=1).contiguous() for t in kv)  # [B, H, L, D]
    sdpa = bench_ms(lambda qs=qs, ks=ks, vs=vs: F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=SCALE))
    expected = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=SCALE).transpose(1, 2)
    got = prefill_attention_triton(q, kv_layer, tables, cu, lens, SCALE).view(seqs, length, H, D)
    err = (got.float() - expected.float()).abs().max().item()
    tflops = 4 * seqs * H * D * length * length / 2 / (ours * 1e-3) / 1e12
    ok = ours <= 1.3 * sdpa
    if not ok:
        misses.append(f"prefill {seqs}x{length}: {ours / sdpa:.2f}x SDPA")
    label = f"{seqs}x{length}"
    verdict = "ok" if ok else "MISS (<= 1.3x)"
    print(f"{label:>11} {ours:>9.3f} {sdpa:>9.3f} {ours / sdpa:>6.2f} {tflops:>8.0f} {err:>8.4f}  {verdict}")
    if err > 0.05:
        misses.append(f"prefill {label}: max error {err:.3f} vs SDPA")
    del kv_layer, tables, lens, kv, qs, ks, vs

seqs, length = PREFILL[1]
kv_layer, tables, lens, _ = paged_pool(seqs, length)
q = torch.randn(seqs * length, H, D, dtype=DT, device=DEV)
cu = torch.arange(seqs + 1, device=DEV, dtype=torch.int32) * length
cells = []
for block_m, block_n in [(None, None), (128, 32), (128, 64), (64, 64), (64, 32)]:
    ms = bench_ms(lambda: prefill_attention_triton(q, kv_layer, tables, cu, lens, SCALE, block_m, block_n))  # noqa: B023
    cells.append(f"{block_m or 'auto'}x{block_n or 'auto'}: {ms:.3f} ms")
print(f"prefill tiles (BLOCK_M x BLOCK_N) at {seqs}x{length}: " + ", ".join(cells))

print()
engine_bench.report(tiny=SMOKE)

print("\nperformance targets: " + ("all met" if not misses else "; ".join(misses)))
