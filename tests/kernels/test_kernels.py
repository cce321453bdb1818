"""Triton kernels against their torch references, plus greedy generation through the kernels.

On a CPU the kernels run through Triton's interpreter (switched on below, at collection, before any
kernel is jitted; process-wide, which is harmless for the other tests: on CPU tensors they use the
torch references). On a machine with CUDA they are compiled and run on the GPU (scripts/gpu-check).

Tolerances (torch.testing.assert_close): float32 atol=rtol=1e-5 everywhere; bfloat16 is 8 bits of
mantissa, so rtol=1.6e-2 (one bf16 ulp is at most 2^-7 relative) with atol=1e-5 for the elementwise
kernels and atol=1e-2 for attention (outputs are averages of O(1) values; bf16 P@V rounding).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fleetctl.kernels.glu import glu_ref, glu_triton
from fleetctl.kernels.paged_attention import (
    paged_decode_attention_ref,
    paged_decode_attention_triton,
    prefill_attention_ref,
    prefill_attention_triton,
)
from fleetctl.kernels.rms_norm import rms_norm_ref, rms_norm_triton
from fleetctl.kernels.rotary import rotary_ref, rotary_triton
from fleetctl.kernels.store_kv import store_kv_ref, store_kv_triton
from fleetctl.tests.support.kernel_cases import DEVICE, DTYPES, PAGE, close, paged_pool, randn


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("tokens", "dim"), [(1, 64), (7, 576), (3, 1000)])
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm(dtype: torch.dtype, tokens: int, dim: int, with_residual: bool) -> None:
    x, weight = randn(tokens, dim, dtype=dtype), randn(dim, dtype=dtype, seed=1)
    residual = randn(tokens, dim, dtype=dtype, seed=2) if with_residual else None
    normed, summed = rms_norm_triton(x, weight, 1e-5, residual)
    ref_normed, ref_summed = rms_norm_ref(x, weight, 1e-5, residual)
    close(normed, ref_normed)
    close(summed, ref_summed)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("tokens", "inner"), [(1, 64), (5, 1536), (3, 100)])
@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
def test_glu(dtype: torch.dtype, tokens: int, inner: int, activation: str) -> None:
    gate_up = randn(tokens, 2 * inner, dtype=dtype) * 3  # reach the activations' curved parts
    close(glu_triton(gate_up, activation), glu_ref(gate_up, activation))


def test_glu_refuses_an_unknown_activation() -> None:
    with pytest.raises(ValueError, match="unknown gate activation 'relu'"):
        glu_triton(randn(1, 8), "relu")
    with pytest.raises(ValueError, match="unknown gate activation 'relu'"):
        glu_ref(randn(1, 8), "relu")


def fused_qkv(tokens: int, heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """q [T, H, d], k, v [T, Hkv, d] as strided views of one projection, as the model makes them."""
    qkv = randn(tokens, (heads + 2 * kv_heads) * head_dim, dtype=dtype, seed=3)
    q, k, v = qkv.split((heads * head_dim, kv_heads * head_dim, kv_heads * head_dim), dim=-1)
    return q.view(tokens, heads, head_dim), k.view(tokens, kv_heads, head_dim), v.view(tokens, kv_heads, head_dim)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("tokens", "heads", "kv_heads", "head_dim"), [(1, 9, 3, 64), (5, 4, 2, 16), (3, 32, 8, 128)])
def test_rotary(dtype: torch.dtype, tokens: int, heads: int, kv_heads: int, head_dim: int) -> None:
    q, k, _ = fused_qkv(tokens, heads, kv_heads, head_dim, dtype)
    angles = randn(tokens, head_dim // 2, seed=4) * 10
    cos, sin = angles.cos(), angles.sin()
    # the kernel computes in fp32; the CPU reference in the model's dtype (as transformers does), so
    # compare against the reference run in fp32 and rounded once
    ref_q, ref_k = (t.to(dtype) for t in rotary_ref(q.float(), k.float(), cos, sin))
    out_q, out_k = rotary_triton(q, k, cos, sin)
    close(out_q, ref_q)
    close(out_k, ref_k)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("tokens", "kv_heads", "head_dim"), [(1, 3, 64), (37, 2, 16), (5, 8, 128)])
def test_store_kv(dtype: torch.dtype, tokens: int, kv_heads: int, head_dim: int) -> None:
    _, k, v = fused_qkv(tokens, 2, kv_heads, head_dim, dtype)
    kv_layer = randn(2, 8, PAGE, kv_heads, head_dim, dtype=dtype, seed=5)
    expected = kv_layer.clone()
    slots = torch.randperm(8 * PAGE, generator=torch.Generator().manual_seed(6))[:tokens].to(DEVICE)
    store_kv_ref(k, v, expected, slots)
    store_kv_triton(k, v, kv_layer, slots)
    torch.testing.assert_close(kv_layer, expected, atol=0, rtol=0)


# (heads, kv_heads, head_dim): smollm2-135m, an 8:1 group at head_dim 128, the tiny test model, plain MHA
HEAD_SHAPES = [(9, 3, 64), (8, 1, 128), (4, 2, 16), (4, 4, 32)]
DECODE_LENGTHS = {
    (9, 3, 64): [1, 15, 16, 17, 257],
    (8, 1, 128): [257, 16],
    (4, 2, 16): [15, 17, 1],
    (4, 4, 32): [33],
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", HEAD_SHAPES, ids=str)
@pytest.mark.parametrize("partition", [None, 64], ids=["one-split", "split-k"])
def test_decode_attention(dtype: torch.dtype, shape: tuple[int, int, int], partition: int | None) -> None:
    heads, kv_heads, head_dim = shape
    lengths = DECODE_LENGTHS[shape]
    kv_layer, tables, lens = paged_pool(lengths, kv_heads, head_dim, dtype)
    q = randn(len(lengths), heads, head_dim, dtype=dtype, seed=8)
    scale = head_dim**-0.5
    out = paged_decode_attention_triton(q, kv_layer, tables, lens, scale, partition=partition)
    close(out, paged_decode_attention_ref(q, kv_layer.nan_to_num(), tables, lens, scale), attention=True)


# (cached prefix, new tokens) per sequence of one packed batch
PREFILL_BATCHES = {
    "no-prefix": [(0, 1), (0, 15), (0, 16), (0, 17)],
    "prefix": [(16, 1), (15, 17), (200, 57), (3, 40)],
    "long": [(0, 257)],
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", HEAD_SHAPES[:3], ids=str)
@pytest.mark.parametrize("batch", list(PREFILL_BATCHES))
def test_prefill_attention(dtype: torch.dtype, shape: tuple[int, int, int], batch: str) -> None:
    heads, kv_heads, head_dim = shape
    seqs = PREFILL_BATCHES[batch]
    kv_layer, tables, lens = paged_pool([p + n for p, n in seqs], kv_heads, head_dim, dtype)
    cu = torch.tensor([0] + [n for _, n in seqs], dtype=torch.int32).cumsum(0, dtype=torch.int32).to(DEVICE)
    q = randn(int(cu[-1]), heads, head_dim, dtype=dtype, seed=9)
    scale = head_dim**-0.5
    expected = prefill_attention_ref(q, kv_layer.nan_to_num(), tables, cu, lens, scale)
    close(prefill_attention_triton(q, kv_layer, tables, cu, lens, scale), expected, attention=True)
    if shape == HEAD_SHAPES[0] and batch == "prefix":  # small tiles: many per sequence, unaligned diagonals
        close(prefill_attention_triton(q, kv_layer, tables, cu, lens, scale, block_m=16, block_n=32), expected, True)


GENERATE = """
import json, sys
from pathlib import Path
from fleetctl.engine.core.engine_settings import EngineConfig, EngineSettings
from fleetctl.engine.core.llm_engine import LLMEngine
from fleetctl.engine.core.sequence import SamplingParams
from fleetctl.kernels import ops

model_dir, device, prompts = Path(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
engine = LLMEngine(EngineConfig(model_dir, device=device, settings=EngineSettings(dtype="float32", num_kv_blocks=64)))
params = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True, logprobs=2)
ids = [engine.add_request(p, params).request_id for p in prompts]
steps = {i: [] for i in ids}  # per request, per token: [token, its logprob, the runner-up's logprob]
while engine.has_unfinished():
    for out in engine.step():
        steps[out.request_id].append([out.token_id, out.logprobs.logprob, out.logprobs.top[1][1]])
print(json.dumps({"mode": ops.MODE, "triton": "triton" in sys.modules, "steps": [steps[i] for i in ids]}))
"""
PROMPTS = [
    "The quick brown fox",
    "Once upon a time there was a small model that served many requests on one node. Numbers 0 1 2",
    "def",
]
NEAR_TIE = 1e-3  # a reference step whose best two logprobs are closer than this may go either way in fp32
LOGPROB_ATOL = 1e-4


def start_generation(model_dir: Path, device: str, mode: str) -> subprocess.Popen[str]:
    """FLEET_KERNELS (and TRITON_INTERPRET) are read when the kernels are imported: a fresh process."""
    env = {k: v for k, v in os.environ.items() if k not in ("FLEET_KERNELS", "TRITON_INTERPRET")}
    env["FLEET_KERNELS"] = mode
    args = [sys.executable, "-c", GENERATE, str(model_dir), device, json.dumps(PROMPTS)]
    return subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish_generation(proc: subprocess.Popen[str]) -> dict:
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr[-4000:]
    return json.loads(stdout.strip().splitlines()[-1])


def greedy_agreement(ours: list[list[float]], ref: list[list[float]]) -> int:
    """How many greedy steps of one request agree (same token, logprob within LOGPROB_ATOL) before the first
    near-tie of the reference, after which the two may rightly part; fails at a step that disagrees before."""
    for step, ((token, logprob, _), (ref_token, ref_logprob, runner_up)) in enumerate(zip(ours, ref, strict=True)):
        if ref_logprob - runner_up < NEAR_TIE:
            return step
        assert (token, logprob) == (ref_token, pytest.approx(ref_logprob, abs=LOGPROB_ATOL)), f"step {step}"
    return len(ref)


@pytest.mark.slow  # over ~10 s: `make test` runs it, `make test-fast` does not
@pytest.mark.parametrize(
    ("device", "mode"),
    [
        ("cpu", "interpret"),
        pytest.param("cuda:0", "auto", marks=pytest.mark.skipif(DEVICE != "cuda", reason="needs CUDA")),
    ],
)
def test_generation_through_kernels_matches_torch(tiny_model_dir: Path, device: str, mode: str) -> None:
    """The tiny model's random logits are near-flat: fp32 Triton and torch may pick differently at a near-tie,
    so the tokens are compared up to each request's first one, and most steps must come before it."""
    kernels = start_generation(tiny_model_dir, device, mode)
    reference = start_generation(tiny_model_dir, device, "torch")
    ours, ref = finish_generation(kernels), finish_generation(reference)
    assert ours["mode"] == mode and ours["triton"], "the Triton kernels did not run"
    assert ref["mode"] == "torch" and not ref["triton"]
    assert [len(steps) for steps in ours["steps"]] == [10] * len(PROMPTS)
    agreed = [greedy_agreement(a, b) for a, b in zip(ours["steps"], ref["steps"], strict=True)]
    assert sum(agreed) >= 0.8 * 10 * len(PROMPTS), agreed


def test_kernel_selection_without_triton() -> None:
    """Importing the ops never imports triton; without triton, auto falls back to the references
    and interpret refuses to start."""
    script = (
        "import sys\n"
        "if sys.argv[1] == 'hide': sys.modules['triton'] = None\n"
        "import torch\n"
        "from fleetctl.kernels import ops\n"
        "normed, _ = ops.rms_norm(torch.ones(2, 4), torch.ones(4), 1e-5)\n"
        "print(ops.MODE, 'triton' in sys.modules and sys.modules['triton'] is not None, round(normed.sum().item()))\n"
    )
    runs = {
        (mode, hide): subprocess.Popen(
            [sys.executable, "-c", script, hide],
            env={k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"FLEET_KERNELS": mode},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for mode, hide in [("auto", "show"), ("auto", "hide"), ("interpret", "hide")]
    }
    results = {key: proc.communicate(timeout=120) for key, proc in runs.items()}
    assert results["auto", "show"][0].split() == ["auto", "False", "8"]
    assert results["auto", "hide"][0].split() == ["auto", "False", "8"]
    assert runs["interpret", "hide"].returncode != 0
    assert "FLEET_KERNELS=interpret needs the `triton` package" in results["interpret", "hide"][1]
