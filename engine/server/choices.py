"""One OpenAI call's choices: each prompt's `n` samples (choice index = prompt × n + sample, prompt-major),
admitted together, their streams interleaved as tokens arrive, each collected with its text and logprobs. A
choice follows its request through the fleet's handle (`Generation`)."""

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from fastapi import Request

from fleetctl.engine.fleet.generation import Generation
from fleetctl.engine.fleet.request import StreamEvent
from fleetctl.engine.server.errors import GenerationFailed
from fleetctl.engine.server.openai_logprobs import SampledToken

DISCONNECT_POLL_S = 0.25  # how often a non-streaming request checks that its client is still there


@dataclass(eq=False)
class Choice:
    index: int
    prompt: int  # which of the call's prompts it samples (its samples count the prompt's tokens once)
    generation: Generation
    echo: str = ""  # the prompt's text, shown before the answer (completions' `echo`)
    text_offset: int = 0  # where the next token's text starts in the choice's text (completions' logprobs)
    text: str = ""
    tokens: list[SampledToken] = field(default_factory=list)  # with logprobs asked for: each token's

    @property
    def finish_reason(self) -> str:
        return self.generation.finish_reason or "stop"

    def take(self, event: StreamEvent) -> list[SampledToken]:
        """Add one event's text and token; returns the token's logprobs entry (none when not asked for)."""
        self.text += event.text
        if event.logprobs is None or event.token_id is None:
            return []
        self.tokens.append((event.token_id, event.logprobs))
        return self.tokens[-1:]


class Choices:
    def __init__(self, choices: list[Choice], response_id: str) -> None:
        self.choices = choices
        self.response_id = response_id

    def usage(self) -> dict:
        """Prompt tokens once per prompt (its samples share it), completion tokens of every choice."""
        prompts = {c.prompt: c.generation.prompt_tokens for c in self.choices}
        completion = sum(c.generation.output_tokens for c in self.choices)
        prompt = sum(prompts.values())
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def cancel(self) -> None:
        """Stop whatever still runs (a no-op for choices that finished)."""
        for choice in self.choices:
            choice.generation.cancel()

    async def events(self) -> AsyncIterator[tuple[Choice, StreamEvent]]:
        """Every choice's events as they come, until each has ended."""
        merged: asyncio.Queue[tuple[Choice, StreamEvent]] = asyncio.Queue()

        async def forward(choice: Choice) -> None:
            async for event in choice.generation.events():
                merged.put_nowait((choice, event))

        tasks = [asyncio.create_task(forward(c)) for c in self.choices]
        try:
            open_choices = len(self.choices)
            while open_choices:
                choice, event = await merged.get()
                open_choices -= event.final
                yield choice, event
        finally:
            for task in tasks:
                task.cancel()

    async def collect(self, request: Request) -> None:
        """Every choice's whole answer; the work stops when the client goes away first, or when a choice fails."""
        watcher = asyncio.create_task(self._cancel_when_gone(request))
        try:
            async with contextlib.aclosing(self.events()) as events:
                async for choice, event in events:
                    if event.error:
                        raise GenerationFailed(event.error)
                    choice.take(event)
        finally:
            watcher.cancel()
            self.cancel()

    async def _cancel_when_gone(self, request: Request) -> None:
        while not all(c.generation.done for c in self.choices):
            if await request.is_disconnected():
                self.cancel()
                return
            await asyncio.sleep(DISCONNECT_POLL_S)
