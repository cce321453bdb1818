"""A prefill's end, as the controller reads it (no processes: support/inbox_fleet.py): a prefill worker's first
token of a request comes with the KV it published, and from that one event the token reaches the client and
the handoff begins — whatever other message comes before or after it."""

import itertools
from pathlib import Path

import pytest
from support.inbox_fleet import InboxFleet, step, streamed

from fleetctl.engine.fleet.request import RequestStage
from fleetctl.engine.worker import protocol as m

FIRST = 42  # the first token prefill-0 makes


def around(fleet: InboxFleet) -> dict[str, tuple[str, object]]:
    """The prefill's end of request "a", and the messages that may come around it from either worker."""
    return {
        "prefill end": ("prefill-0", step("prefill-0", [m.TokenEvent("a", FIRST, False, None,
                                                                      handoff=fleet.handoff("a"))], free_blocks=63)),
        "prefill capacity": ("prefill-0", m.Capacity("prefill-0", 63)),
        "prefill heartbeat": ("prefill-0", m.Heartbeat("prefill-0")),
        "decode step": ("decode-0", step("decode-0", [], free_blocks=64, prefill=False)),
    }


@pytest.mark.parametrize("order", list(itertools.permutations(["prefill end", "prefill capacity",
                                                                "prefill heartbeat", "decode step"])))
def test_a_prefill_end_streams_its_token_and_hands_its_kv_over_whatever_comes_around_it(
        tiny_model_dir: Path, tmp_path: Path, order: tuple[str, ...]) -> None:
    fleet = InboxFleet(tiny_model_dir, tmp_path)
    req = fleet.submit("a", [5, 6, 7])
    assert req.prefill_worker == "prefill-0" and fleet.sent("prefill-0", m.RunRequest, "a")
    messages = around(fleet)
    for name in order:
        fleet.deliver(*messages[name])
    assert [e.token_id for e in streamed(req)] == [FIRST] and req.times.first_token is not None
    [adopt] = fleet.sent("decode-0", m.Adopt, "a")
    assert adopt.handle.location == str(tmp_path / "a.kv") and adopt.output_token_ids == [FIRST]
    assert (tmp_path / "a.kv").exists()  # not taken for a stale copy's
    assert not fleet.sent("prefill-0", m.ReleaseKV, "a") and not fleet.sent("prefill-0", m.Abort, "a")
    assert req.stage is RequestStage.HANDOFF and req.decode_worker == "decode-0"
    assert req.times.handoff_seconds == 0.25 and req.times.handoff_start is not None
    assert not fleet.fleet.views["prefill-0"].prefilling  # no longer work ahead of its next prompt
    fleet.deliver("decode-0", m.Adopted("a", 2, 0.5, 63))
    assert req.stage is RequestStage.DECODE and req.times.handoff_seconds == 0.75
    assert fleet.sent("prefill-0", m.ReleaseKV, "a")  # its prefill copy freed once adopted


def test_a_prefill_end_whose_publishing_failed_streams_its_token_and_is_recomputed_by_a_decode_worker(
        tiny_model_dir: Path, tmp_path: Path) -> None:
    """The worker sends the token without a handoff, then drops the request (RequestFailed): the decode worker
    prefills the prompt and the first token itself, and no token is repeated."""
    fleet = InboxFleet(tiny_model_dir, tmp_path)
    req = fleet.submit("a", [5, 6, 7])
    fleet.deliver("prefill-0", step("prefill-0", [m.TokenEvent("a", FIRST, False, None)], free_blocks=63))
    assert [e.token_id for e in streamed(req)] == [FIRST] and not fleet.sent("decode-0", m.Adopt, "a")
    fleet.deliver("prefill-0", m.RequestFailed("a", "InjectedFault: fault injected at publish", retry=True))
    [run] = fleet.sent("decode-0", m.RunRequest, "a")
    assert run.output_token_ids == [FIRST] and req.decode_worker == "decode-0" and req.recomputes == 1


def test_a_prefill_end_for_a_request_that_went_on_elsewhere_frees_what_it_published(tiny_model_dir: Path,
                                                                                     tmp_path: Path) -> None:
    fleet = InboxFleet(tiny_model_dir, tmp_path)
    req = fleet.submit("a", [5, 6, 7])
    fleet.fleet.cancel(req)
    fleet.deliver("prefill-0", step("prefill-0", [m.TokenEvent("a", FIRST, False, None, handoff=fleet.handoff("a"))],
                                    free_blocks=63))
    assert not (tmp_path / "a.kv").exists() and len(fleet.sent("prefill-0", m.Abort, "a")) == 2  # cancel, token
    assert not fleet.sent("decode-0", m.Adopt, "a")
