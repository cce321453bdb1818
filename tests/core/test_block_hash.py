"""The hash chain that names full KV blocks, and its salt: positions, every salt field, and agreement
between processes (no per-process randomness)."""

import dataclasses
import os
import subprocess
import sys

import pytest

from fleetctl.engine.core.block_hash import KVSalt, Numerics, chain_hashes

BLOCK = 4
SALT = KVSalt("weights:config", "bfloat16", Numerics.DETERMINISTIC, "cpu", "torch", "0.1.0", 1, BLOCK)
ROOT = SALT.root()


def tokens(n: int, start: int = 100) -> list[int]:
    return list(range(start, start + n))


def test_a_later_block_with_the_same_tokens_has_another_hash() -> None:
    ids = [5] * (3 * BLOCK)
    assert len(set(chain_hashes(ROOT, ids, BLOCK))) == 3  # the chain encodes the position


@pytest.mark.parametrize("field", [f.name for f in dataclasses.fields(KVSalt)])
def test_every_salt_field_changes_every_hash(field: str) -> None:
    changed = {"numerics": Numerics.FAST, "kv_layout": 2, "block_size": 8}.get(field, "other")
    other = dataclasses.replace(SALT, **{field: changed}).root()
    ids = tokens(5 * BLOCK)
    assert not set(chain_hashes(ROOT, ids, BLOCK)) & set(chain_hashes(other, ids, BLOCK))


def test_hashes_agree_across_processes() -> None:
    """Workers and routers must agree: no per-process randomness (Python's hash() has some)."""
    code = (
        "from fleetctl.engine.core.block_hash import KVSalt, Numerics, chain_hashes\n"
        "salt = KVSalt('weights:config', 'bfloat16', Numerics.DETERMINISTIC, 'cpu', 'torch', '0.1.0', 1, 4)\n"
        "print(chain_hashes(salt.root(), list(range(100, 112)), 4)[-1].hex())"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == chain_hashes(ROOT, tokens(12), BLOCK)[-1].hex()
