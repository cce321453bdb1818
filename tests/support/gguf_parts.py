"""Checks an engine's quantized layer matrices against the GGUF it was loaded from, part by part of each fused
matrix: a part the GGUF ships in a block type the layout holds is the converted weights bit for bit (float32),
any other part is those weights rounded as the layout rounds them."""

from collections.abc import Callable, Container
from pathlib import Path

import gguf
import torch

from fleetctl.engine.core.llm_engine import LLMEngine
from fleetctl.engine.model.loader import load_weights
from fleetctl.engine.model.model_store import SOURCE_GGUF
from fleetctl.engine.model.quantize import MATRICES

# the engine's fused matrices and their GGUF parts, in the order they are stacked
PARTS = {"qkv": ("attn_q", "attn_k", "attn_v"), "o_proj": ("attn_output",), "gate_up": ("ffn_gate", "ffn_up"),
         "down": ("ffn_down",)}


def check_parts(engine: LLMEngine, model_dir: Path, shipped_types: Container[gguf.GGMLQuantizationType],
                rounded: Callable[[torch.Tensor], torch.Tensor]) -> tuple[int, int]:
    """Asserts every part as above; returns how many parts were shipped and how many rounded. `rounded` takes a
    part's converted rows [n, K] and returns them as the layout rounds them (dequantized)."""
    tensors = {t.name: t for t in gguf.GGUFReader(model_dir / SOURCE_GGUF).tensors}
    converted = load_weights(model_dir, engine.model_config, torch.float32, torch.device("cpu"))
    shipped = rounds = 0
    for i, (layer, reference) in enumerate(zip(engine.model.weights.layers, converted.layers, strict=True)):
        for name in MATRICES:
            ours, theirs, start = getattr(layer, name).dequantize(), getattr(reference, name), 0
            for part in PARTS[name]:
                tensor = tensors[f"blk.{i}.{part}.weight"]
                rows = slice(start, start + int(tensor.shape[1]))
                if tensor.tensor_type in shipped_types:
                    assert torch.equal(ours[rows], theirs[rows]), tensor.name
                    shipped += 1
                else:
                    assert torch.equal(ours[rows], rounded(theirs[rows])), tensor.name
                    rounds += 1
                start = rows.stop
    return shipped, rounds
