"""A decode step's small ops on a CPU in one C call each (`cpu_rows.c`, built by `cpu_build`): RMSNorm, where torch's
composite runs ~8 small ops (upcast, square, mean, rsqrt, two products, a cast) of ~5 µs each; rotary (~6 ops); the
KV store (two index copies); the gated MLP's activation (3 ops); decode attention straight off the paged pool, where
the reference gathers the blocks, builds a mask and runs SDPA (~60 µs a layer). The KV store and decode attention
take an int8 pool too (`--kv-dtype int8`: rows of codes and a scale, kernels/kv_quant), quantizing as the store
writes and reading the codes as attention runs, where the reference dequantizes the gathered blocks first.

Each takes CPU tensors in float32 or bfloat16 while no torch dispatch mode watches (a FLOP counter or a tracer sees
torch's own ops instead)."""

import ctypes
from functools import cache

import torch

from fleetctl.kernels import cpu_build, kv_quant

MAX_WIDTH = 16384  # RMSNorm's float32 scratch row
MAX_HEAD_DIM = 512  # decode attention's float32 query and accumulator
MAX_GLU_ROWS = 64  # the GLU's rows past which torch's vectorized ops are faster (a prefill's)


@cache
def _library() -> ctypes.CDLL | None:
    library = cpu_build.library()
    if library is not None:
        library.rms_norm.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_float,
                                     ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int]
        library.rms_norm.restype = ctypes.c_int
        library.decode_attention.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_void_p,
                                             ctypes.c_int,
                                             ctypes.c_void_p, *[ctypes.c_int] * 6, ctypes.c_float, ctypes.c_int,
                                             ctypes.c_void_p, *[ctypes.c_int] * 3]
        library.decode_attention.restype = None
        library.store_kv.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                                     ctypes.c_void_p, *[ctypes.c_int] * 6]
        library.store_kv.restype = None
        library.rotary.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_void_p,
                                   ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int]
        library.rotary.restype = None
        library.glu.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p,
                                ctypes.c_int, ctypes.c_int]
        library.glu.restype = None
    return library


def _kernel() -> ctypes.CDLL:
    library = _library()
    if library is None:
        raise cpu_build.KernelBuildError("the CPU row kernels are not built on this machine: check takes() first")
    return library


def _computable(*tensors: torch.Tensor) -> bool:
    """CPU tensors of one dtype, float32 or bfloat16, and nothing watching the dispatcher."""
    first = tensors[0]
    return (first.device.type == "cpu" and first.dtype in (torch.float32, torch.bfloat16)
            and all(t.device.type == "cpu" and t.dtype == first.dtype for t in tensors[1:])
            and not torch._C._len_torch_dispatch_stack() and _library() is not None)


def takes(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None) -> bool:
    """Whether `rms_norm` computes these: rows [T, D], D within MAX_WIDTH."""
    return (x.dim() == 2 and x.shape[1] <= MAX_WIDTH
            and _computable(x, weight, *(() if residual is None else (residual,))))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """x, residual: [T, D]; weight: [D] -> (normed [T, D], new residual x + residual [T, D]; x itself without one),
    as `rms_norm_ref`; `takes(x, weight, residual)` true."""
    library = _kernel()
    x, weight = x.contiguous(), weight.contiguous()
    out = torch.empty_like(x)
    stream = torch.empty_like(x) if residual is not None else x
    residual = residual.contiguous() if residual is not None else None
    library.rms_norm(x.data_ptr(), None if residual is None else residual.data_ptr(), weight.data_ptr(), eps,
                     out.data_ptr(), None if residual is None else stream.data_ptr(), x.shape[0], x.shape[1],
                     int(x.dtype == torch.bfloat16))
    return out, stream


def _reads_pool(x: torch.Tensor, kv_layer: torch.Tensor) -> bool:
    """Whether kv_layer [2, blocks, bs, Hkv, W] is a pool the kernels read beside x [..., d] (a CPU tensor of
    `_computable`): contiguous, in x's dtype with W = d, or int8 with W = kv_quant.stored_width(d)."""
    int8 = kv_layer.dtype == torch.int8
    return (kv_layer.device.type == "cpu" and kv_layer.dim() == 5 and kv_layer.dtype in (x.dtype, torch.int8)
            and kv_layer.shape[-1] == (kv_quant.stored_width(x.shape[-1]) if int8 else x.shape[-1])
            and kv_layer.is_contiguous())


def takes_attention_tables(block_tables: torch.Tensor) -> bool:
    """Whether a decode step over these block tables will run its attention in the C kernel (so nothing needs
    gathering for torch's), as far as the tables tell: `takes_attention` decides per layer."""
    return block_tables.device.type == "cpu" and not torch._C._len_torch_dispatch_stack() and _library() is not None


def takes_attention(q: torch.Tensor, kv_layer: torch.Tensor) -> bool:
    """Whether `decode_attention` computes q [B, H, d] over kv_layer [2, blocks, bs, Hkv, d] (contiguous, in q's
    dtype; or an int8 pool of rows d + kv_quant.SCALE_BYTES)."""
    head_dim = q.shape[-1]
    return head_dim <= MAX_HEAD_DIM and head_dim % 8 == 0 and _computable(q) and _reads_pool(q, kv_layer)


def decode_attention(q: torch.Tensor, kv_layer: torch.Tensor, block_tables: torch.Tensor,
                     context_lens: torch.Tensor, scale: float, window: int | None) -> torch.Tensor:
    """As `paged_decode_attention_ref`: q [B, H, d]; block_tables [B, max_blocks] int32; context_lens [B] int32
    (keys per sequence, the current token's included) -> [B, H, d]. `takes_attention(q, kv_layer)` true."""
    library = _kernel()
    q = q.contiguous()
    tables = block_tables.to(torch.int32).contiguous()
    lens = context_lens.to(torch.int32).contiguous()
    batch, heads, head_dim = q.shape
    _, blocks, block_size, kv_heads, _ = kv_layer.shape
    out = torch.empty_like(q)
    library.decode_attention(q.data_ptr(), heads * head_dim, kv_layer.data_ptr(), tables.data_ptr(), tables.shape[1],
                             lens.data_ptr(), batch, heads, kv_heads, head_dim, blocks, block_size, scale, window or 0,
                             out.data_ptr(), int(q.dtype == torch.bfloat16), int(kv_layer.dtype == torch.int8),
                             torch.get_num_threads())
    return out


def takes_store(k: torch.Tensor, kv_layer: torch.Tensor) -> bool:
    """Whether `store_kv` writes k [T, Hkv, d] (and v alike) into kv_layer: a pool `decode_attention` reads."""
    return _computable(k) and _reads_pool(k, kv_layer)


def store_kv(k: torch.Tensor, v: torch.Tensor, kv_layer: torch.Tensor, slots: torch.Tensor) -> None:
    """As `store_kv_ref`: k, v [T, Hkv, d] into kv_layer [2, blocks, bs, Hkv, d] at slots [T] int64, in place (an
    int8 pool: each row quantized, the same bytes as the reference's). `takes_store(k, kv_layer)` true."""
    library = _kernel()
    k, v, slots = k.contiguous(), v.contiguous(), slots.to(torch.int64).contiguous()
    _, blocks, block_size, kv_heads, _ = kv_layer.shape
    head_dim = k.shape[-1]
    library.store_kv(k.data_ptr(), v.data_ptr(), kv_heads * head_dim, kv_layer.data_ptr(), slots.data_ptr(),
                     k.shape[0], kv_heads, head_dim, blocks * block_size, int(k.dtype == torch.bfloat16),
                     int(kv_layer.dtype == torch.int8))


def takes_rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor) -> bool:
    """Whether `rotary` rotates q [T, H, d] and k [T, Hkv, d] (each head's values contiguous) in place."""
    return (q.stride(-1) == 1 and k.stride(-1) == 1 and q.stride(1) == q.shape[-1] and k.stride(1) == k.shape[-1]
            and _computable(q, k, cos))


def rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """As `rotary_ref` (cos, sin [T, d/2]), but in place on q and k, which it returns; one call when k's heads
    follow q's in memory (both views of one qkv row). `takes_rotary(q, k, cos)` true."""
    library = _kernel()
    cos, sin = cos.contiguous(), sin.contiguous()
    tokens, heads, head_dim = q.shape
    bf16 = int(q.dtype == torch.bfloat16)
    adjacent = k.stride(0) == q.stride(0) and k.data_ptr() == q.data_ptr() + heads * head_dim * q.element_size()
    parts = [(q, heads + k.shape[1])] if adjacent else [(q, heads), (k, k.shape[1])]
    for tensor, count in parts:
        library.rotary(tensor.data_ptr(), tensor.stride(0), count, head_dim, cos.data_ptr(), sin.data_ptr(), None,
                       tokens, head_dim, bf16)
    return q, k


def takes_glu(gate_up: torch.Tensor) -> bool:
    """Whether `glu` computes gate_up [T, 2I]: decode's rows (past MAX_GLU_ROWS torch's ops are faster)."""
    return gate_up.dim() == 2 and gate_up.shape[0] <= MAX_GLU_ROWS and _computable(gate_up)


def glu(gate_up: torch.Tensor, activation: str) -> torch.Tensor:
    """As `glu_ref`: gate_up [T, 2I] -> act(gate) * up [T, I], activation silu or gelu_tanh (the activation's float32
    rounding aside). `takes_glu(gate_up)` true."""
    library = _kernel()
    gate_up = gate_up.contiguous()
    tokens, inner = gate_up.shape[0], gate_up.shape[1] // 2
    out = gate_up.new_empty(tokens, inner)
    library.glu(gate_up.data_ptr(), tokens, inner, int(activation == "gelu_tanh"), out.data_ptr(),
                int(gate_up.dtype == torch.bfloat16), torch.get_num_threads())
    return out
