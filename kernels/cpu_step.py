"""A whole decode step on a CPU in one C call (`cpu_step.c`): every layer's norms, products, rotary, KV store and
attention, then the final norm. The per-op path (`ops` from the decoder's Python) calls the same C kernels about 20
times a layer, and at batch 1 its Python costs as much as the layer's products; here the Python is one call a step.

`DecodeStep` holds the model's weights as the kernel reads them, laid out once (ctypes structures that point into
the weights' tensors, which it keeps alive); `run` takes what changes from step to step.
"""

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

import torch

from fleetctl.kernels import cpu_build, cpu_gemv, cpu_rows, kv_quant


class _Matrix(ctypes.Structure):
    _fields_ = [("format", ctypes.c_int), ("weight", ctypes.c_void_p), ("aux", ctypes.c_void_p),
                ("out_features", ctypes.c_int), ("in_features", ctypes.c_int), ("group_size", ctypes.c_int),
                ("doubled_inputs", ctypes.c_int)]


class _Layer(ctypes.Structure):
    _fields_ = [*((name, ctypes.c_void_p) for name in ("input_norm", "post_norm", "qkv_bias", "q_norm", "k_norm",
                                                       "attn_out_norm", "mlp_out_norm")),
                *((name, _Matrix) for name in ("qkv", "o_proj", "gate_up", "down")),
                ("window", ctypes.c_int), ("local_rope", ctypes.c_int)]


class _Model(ctypes.Structure):
    _fields_ = [*((name, ctypes.c_int) for name in ("layers", "hidden", "heads", "kv_heads", "head_dim", "rotary_dim",
                                                    "intermediate", "gelu", "bf16")),
                ("eps", ctypes.c_float), ("scale", ctypes.c_float), ("final_norm", ctypes.c_void_p)]


class _Step(ctypes.Structure):
    _fields_ = [("tokens", ctypes.c_int), ("hidden", ctypes.c_void_p), ("positions", ctypes.c_void_p),
                *((name, ctypes.c_void_p) for name in ("cos", "sin", "local_cos", "local_sin", "slots", "window_slots",
                                                       "tables", "window_tables")),
                *((name, ctypes.c_int) for name in ("max_blocks", "window_max_blocks", "block_size")),
                ("context_lens", ctypes.c_void_p), ("kv", ctypes.c_void_p), ("kv_blocks", ctypes.c_void_p),
                ("kv_int8", ctypes.c_int), ("threads", ctypes.c_int)]


@dataclass(frozen=True)
class LayerPlan:
    """One decoder layer as the step reads it; a None norm or bias is one the family does not have."""

    input_norm: torch.Tensor  # [D]
    post_norm: torch.Tensor  # [D]
    qkv: cpu_gemv.Operands
    o_proj: cpu_gemv.Operands
    gate_up: cpu_gemv.Operands
    down: cpu_gemv.Operands
    qkv_bias: torch.Tensor | None = None
    q_norm: torch.Tensor | None = None  # [d]
    k_norm: torch.Tensor | None = None
    attn_out_norm: torch.Tensor | None = None  # [D]
    mlp_out_norm: torch.Tensor | None = None
    window: int | None = None  # sliding window in tokens: the layer reads the step's window slots and tables
    local_rope: bool = False  # it rotates by the windowed layers' own tables


@dataclass(frozen=True)
class ModelShape:
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    rotary_dim: int
    intermediate: int
    gelu: bool  # GeGLU (tanh form); SwiGLU otherwise
    eps: float
    scale: float  # attention's softmax scale
    final_norm: torch.Tensor  # [D]


@cache
def _library() -> ctypes.CDLL | None:
    library = cpu_build.library()
    if library is not None:
        library.decode_step.argtypes = [ctypes.POINTER(_Model), ctypes.POINTER(_Layer), ctypes.POINTER(_Step)]
        library.decode_step.restype = ctypes.c_int
    return library


def available() -> bool:
    """Whether the kernel is built here and nothing watches the dispatcher (a FLOP counter or a tracer sees the
    per-op path's ops instead)."""
    return _library() is not None and not torch._C._len_torch_dispatch_stack()


def fits(shape: ModelShape) -> bool:
    """Whether the kernels' fixed scratch holds this model's rows (RMSNorm's and attention's)."""
    return (shape.hidden <= cpu_rows.MAX_WIDTH and shape.head_dim <= cpu_rows.MAX_HEAD_DIM and not shape.head_dim % 8
            and not shape.rotary_dim % 2)


def _pointer(tensor: torch.Tensor | None) -> int | None:
    return None if tensor is None else tensor.data_ptr()


def _matrix(operands: cpu_gemv.Operands) -> _Matrix:
    in_features = operands.weight.shape[1] * (2 if operands.format is cpu_gemv.WeightFormat.Q4 else 1)
    if operands.doubled_inputs:
        in_features //= 2
    return _Matrix(int(operands.format), operands.weight.data_ptr(), _pointer(operands.aux), operands.out_features,
                   in_features, operands.group_size, int(operands.doubled_inputs))


class DecodeStep:
    """A model's decode step as one call. Every tensor it is given must be a contiguous CPU tensor of one dtype
    (float32 or bfloat16; the KV pools that, or int8: kernels/kv_quant's rows) and stay alive as long as it: it keeps
    its own references."""

    def __init__(self, shape: ModelShape, layers: Sequence[LayerPlan], dtype: torch.dtype) -> None:
        library = _library()
        if library is None:
            raise cpu_build.KernelBuildError("the CPU kernels are not built on this machine: check available() first")
        self._call = library.decode_step
        self.shape, self.layers, self.dtype = shape, tuple(layers), dtype
        self._model = _Model(len(layers), shape.hidden, shape.heads, shape.kv_heads, shape.head_dim, shape.rotary_dim,
                             shape.intermediate, int(shape.gelu), int(dtype == torch.bfloat16), shape.eps,
                             shape.scale, shape.final_norm.data_ptr())
        self._layers = (_Layer * len(layers))(*(_Layer(
            _pointer(p.input_norm), _pointer(p.post_norm), _pointer(p.qkv_bias), _pointer(p.q_norm),
            _pointer(p.k_norm), _pointer(p.attn_out_norm), _pointer(p.mlp_out_norm), _matrix(p.qkv),
            _matrix(p.o_proj), _matrix(p.gate_up), _matrix(p.down), p.window or 0, int(p.local_rope))
            for p in layers))

    def run(self, hidden: torch.Tensor, positions: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
            local_rope: tuple[torch.Tensor, torch.Tensor], slots: torch.Tensor, block_tables: torch.Tensor,
            context_lens: torch.Tensor, kv: Sequence[torch.Tensor], window_slots: torch.Tensor | None = None,
            window_tables: torch.Tensor | None = None) -> torch.Tensor:
        """hidden [T, D] (the tokens' embeddings; overwritten) -> the final normed hidden states [T, D] (hidden
        itself). positions, slots [T] int64; rope, local_rope: (cos, sin) tables [P, rotary_dim / 2];
        block_tables [T, max_blocks] and context_lens [T] int32; kv: each layer's [2, blocks, bs, Hkv, d] in the
        model's dtype, or int8 [.., d + kv_quant.SCALE_BYTES] (each layer alike: one pool's); window_slots,
        window_tables: the windowed layers' own pool's, where it has one."""
        kv_int8 = kv[0].dtype == torch.int8
        width = kv_quant.stored_width(self.shape.head_dim) if kv_int8 else self.shape.head_dim
        if kv[0].dtype not in (self.dtype, torch.int8) or kv[0].shape[-1] != width or not kv[0].is_contiguous():
            raise ValueError(f"the decode step reads contiguous {self.dtype} or int8 KV pools of rows of "
                             f"{self.shape.head_dim} (int8: {width}), not {kv[0].dtype} {tuple(kv[0].shape)}")
        tables, lens = _int32(block_tables), _int32(context_lens)
        windowed = None if window_tables is None else _int32(window_tables)
        positions, slots = positions.contiguous(), slots.contiguous()
        pointers = (ctypes.c_void_p * len(kv))(*(layer.data_ptr() for layer in kv))
        blocks = (ctypes.c_int * len(kv))(*(layer.shape[1] for layer in kv))
        step = _Step(hidden.shape[0], hidden.data_ptr(), positions.data_ptr(), rope[0].data_ptr(), rope[1].data_ptr(),
                     local_rope[0].data_ptr(), local_rope[1].data_ptr(), slots.data_ptr(), _pointer(window_slots),
                     tables.data_ptr(), _pointer(windowed), tables.shape[1],
                     0 if windowed is None else windowed.shape[1], kv[0].shape[2], lens.data_ptr(),
                     ctypes.addressof(pointers), ctypes.addressof(blocks), int(kv_int8), torch.get_num_threads())
        if self._call(ctypes.byref(self._model), self._layers, ctypes.byref(step)):
            raise MemoryError("the decode step could not allocate its scratch buffers")
        return hidden


def _int32(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to(torch.int32).contiguous()
