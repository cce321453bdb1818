"""The checks every prompt passes before it is queued anywhere (engine or fleet controller)."""

from fleetctl.errors import UserError


class PromptError(UserError):
    """A prompt the engine cannot take: empty, longer than the context, or bad token ids."""


def check_prompt(ids: list[int], vocab_size: int, max_model_len: int) -> None:
    if not ids:
        raise PromptError("the prompt is empty")
    if any(not 0 <= t < vocab_size for t in ids):
        raise PromptError(f"prompt token ids must be in [0, {vocab_size})")
    if len(ids) >= max_model_len:
        raise PromptError(f"the prompt is {len(ids)} tokens; this model's context is {max_model_len} tokens")
