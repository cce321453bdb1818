"""A decoder's weights as plain tensors: each layer's norms and matrices (dense, packed or weight-only quantized), the
embedding, the final norm and the head; and the bytes a decode step reads of them."""

from dataclasses import dataclass, replace

import torch

from fleetctl.kernels.packed_linear import DenseWeight, pack
from fleetctl.kernels.quantized_linear import QuantizedWeight

Matrix = DenseWeight | QuantizedWeight  # a layer's weight matrix: dense (plain or packed), or weight-only quantized


@dataclass
class LayerWeights:
    input_norm: torch.Tensor  # [D]
    qkv: Matrix  # [(H + 2*Hkv) * d, D]
    qkv_bias: torch.Tensor | None  # [(H + 2*Hkv) * d]
    o_proj: Matrix  # [D, H * d]
    post_norm: torch.Tensor  # [D]
    gate_up: Matrix  # [2 * I, D]
    down: Matrix  # [D, I]
    q_norm: torch.Tensor | None = None  # [d]: over each query head (Qwen3, Gemma 3)
    k_norm: torch.Tensor | None = None  # [d]
    attn_out_norm: torch.Tensor | None = None  # [D]: on the attention's output (Gemma's sandwich norms)
    mlp_out_norm: torch.Tensor | None = None  # [D]: on the MLP's output


@dataclass
class ModelWeights:
    embed: torch.Tensor  # [V, D]
    layers: list[LayerWeights]
    final_norm: torch.Tensor  # [D]
    lm_head: Matrix  # [V, D]; the embedding itself when tied (or a GGUF's Q8_0 blocks of it: engine/model/quantize)

    def packed(self) -> "ModelWeights":
        """The dense weight matrices laid out for the CPU's products (kernels/packed_linear; unchanged on a GPU or
        quantized); the embedding and norms as they are. A tied head gets a packed copy beside the embedding."""
        layers = [replace(layer, qkv=_pack(layer.qkv), o_proj=_pack(layer.o_proj), gate_up=_pack(layer.gate_up),
                          down=_pack(layer.down)) for layer in self.layers]
        return replace(self, layers=layers, lm_head=_pack(self.lm_head))

    @property
    def layer_matrix_bytes(self) -> int:
        """Bytes of the decoder layers' matrices as stored (quantized: codes and scales): what a step reads."""
        return sum(matrix_bytes(getattr(layer, name)) for layer in self.layers
                   for name in ("qkv", "o_proj", "gate_up", "down"))

    @property
    def head_bytes(self) -> int:
        """Bytes of the lm_head as stored: what a step reads of it."""
        return matrix_bytes(self.lm_head)


def matrix_bytes(matrix: Matrix) -> int:
    """Bytes a decode step reads of one matrix (quantized: its codes and scales)."""
    if isinstance(matrix, QuantizedWeight):
        return matrix.nbytes
    return matrix.numel() * matrix.element_size()


def _pack(matrix: Matrix) -> Matrix:
    return matrix if isinstance(matrix, QuantizedWeight) else pack(matrix)
