"""A request as its caller follows it (`Fleet.generate`'s handles), on a fleet of fake workers: its events end
with exactly one final one, its token counts and finish reason are the request's, and `cancel` stops it where it
runs (a no-op once it ended)."""

import asyncio
from pathlib import Path

from support.fake_workers import FakeLauncher, expected_tokens, run_fleet

from fleetctl.engine.core.sequence import SamplingParams
from fleetctl.engine.fleet.controller import Fleet

PROMPT = [5, 6, 7]


def test_handles_follow_their_samples_to_the_end(tiny_model_dir: Path, tmp_path: Path) -> None:
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)

    async def scenario(fleet: Fleet, _: FakeLauncher) -> None:
        first, second = fleet.generate(PROMPT, params, ["call-0", "call-1"])
        assert (first.id, second.id, first.prompt_tokens, first.done) == ("call-0", "call-1", 3, False)
        events = [event async for event in first.events()]
        assert [e.final for e in events].count(True) == 1 and events[-1].finish_reason == "length"
        assert [e.token_id for e in events if e.token_id is not None] == expected_tokens(PROMPT, 6)
        assert (first.output_tokens, first.finish_reason, first.done) == (6, "length", True)
        first.cancel()  # ended: nothing changes
        assert first.finish_reason == "length"
        rest = [event async for event in second.events()]  # the other sample, drawn beside it
        assert rest[-1].finish_reason == "length" and second.output_tokens == 6

    run_fleet(tiny_model_dir, FakeLauncher(tmp_path), scenario)


def test_cancel_stops_a_running_sample(tiny_model_dir: Path, tmp_path: Path) -> None:
    endless = SamplingParams(max_tokens=10_000, temperature=0.0, ignore_eos=True)

    async def scenario(fleet: Fleet, _: FakeLauncher) -> None:
        [handle] = fleet.generate(PROMPT, endless, [""])
        assert handle.id.startswith("req-")
        while handle.output_tokens < 3:
            await asyncio.sleep(0.005)
        handle.cancel()
        assert handle.done and handle.finish_reason == "abort"
        events = [event async for event in handle.events()]
        assert events[-1].finish_reason == "abort" and not fleet.state.requests

    run_fleet(tiny_model_dir, FakeLauncher(tmp_path), scenario)
