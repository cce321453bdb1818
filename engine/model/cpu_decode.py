"""The decoder's decode step on a CPU as one C call (kernels/cpu_step): the model's layers laid out for it once, at
load, and the step's inputs handed over each step. It computes what `DecoderModel.forward` computes through the same
kernels op by op (the same roundings, the same values), without the ~20 Python calls a layer.

It takes a step when every product of the step would run in the streaming kernel at its row count (each weight's
`row_limit`: float32 and oneDNN-packed bf16 to 8 rows, the others to `cpu_gemv.max_rows()`), in the fast mode
(the deterministic mode keeps its fixed tiles op by op), outside torch.compile and any dispatch mode, and not where
the Triton kernels are asked for.
"""

from dataclasses import dataclass

import torch

from fleetctl.engine.model.attention_batch import AttentionBatch
from fleetctl.engine.model.model_config import ModelConfig
from fleetctl.engine.model.weights import ModelWeights
from fleetctl.kernels import cpu_gemv, cpu_step, ops
from fleetctl.kernels.packed_linear import DenseWeight
from fleetctl.kernels.packed_linear import cpu_operands as dense_operands
from fleetctl.kernels.quantized_linear import QuantizedWeight
from fleetctl.kernels.quantized_linear import cpu_operands as quantized_operands

MATRICES = ("qkv", "o_proj", "gate_up", "down")


def _operands(matrix: DenseWeight | QuantizedWeight) -> cpu_gemv.Operands | None:
    return quantized_operands(matrix) if isinstance(matrix, QuantizedWeight) else dense_operands(matrix)


@dataclass
class CpuDecode:
    step: cpu_step.DecodeStep
    max_rows: int  # the most sequences a step takes

    @classmethod
    def of(cls, config: ModelConfig, weights: ModelWeights, scale: float, layer_windows: tuple[int | None, ...],
           local_rope: list[bool]) -> "CpuDecode | None":
        """The step of these weights, or None where the kernel cannot take them."""
        dtype = weights.embed.dtype
        if weights.embed.device.type != "cpu" or dtype not in (torch.float32, torch.bfloat16) or \
                not cpu_step.available():
            return None
        shape = cpu_step.ModelShape(config.hidden_size, config.num_heads, config.num_kv_heads, config.head_dim,
                                    config.rotary_dim, config.intermediate_size,
                                    config.traits.activation == "gelu_tanh", config.rms_norm_eps, scale,
                                    weights.final_norm)
        matrices = [getattr(layer, name) for layer in weights.layers for name in MATRICES]
        operands = [_operands(matrix) for matrix in matrices]
        if not cpu_step.fits(shape) or any(o is None or o.weight.shape[1] % cpu_gemv.K_MULTIPLE or
                                           (o.aux is not None and o.aux.dtype != dtype) for o in operands):
            return None
        plans = []
        for index, layer in enumerate(weights.layers):
            qkv, o_proj, gate_up, down = operands[4 * index:4 * index + 4]
            plans.append(cpu_step.LayerPlan(
                layer.input_norm, layer.post_norm, qkv, o_proj, gate_up, down, layer.qkv_bias, layer.q_norm,
                layer.k_norm, layer.attn_out_norm, layer.mlp_out_norm, layer_windows[index], local_rope[index]))
        return cls(cpu_step.DecodeStep(shape, plans, dtype), min(cpu_gemv.max_rows(), *(o.row_limit for o in operands)))

    def takes(self, tokens: int, batch: AttentionBatch) -> bool:
        """Whether this step (`tokens` new tokens) runs here: decode, one token a sequence, within max_rows, and
        not with the Triton kernels asked for everywhere (FLEET_KERNELS=interpret)."""
        return (not batch.is_prefill and ops.backend(batch.slots.device) == "torch" and 0 < tokens <= self.max_rows
                and tokens == batch.context_lens.shape[0]
                and not torch._C._len_torch_dispatch_stack() and not torch.compiler.is_compiling())

    def forward(self, hidden: torch.Tensor, positions: torch.Tensor, batch: AttentionBatch,
                kv_cache: list[torch.Tensor], rope: tuple[torch.Tensor, torch.Tensor],
                local_rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """hidden [T, D] (the embeddings: overwritten) -> the final normed hidden states [T, D]. A windowed layer
        reads its own pool's slots and tables where the batch has them (as `AttentionBatch.for_layer`)."""
        window_slots, window_tables = batch.for_layer(True)
        return self.step.run(hidden, positions, rope, local_rope, batch.slots, batch.block_tables,
                             batch.context_lens, kv_cache, window_slots, window_tables)
