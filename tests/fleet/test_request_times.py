"""A request's timing breakdown: a wait for a worker counts as queue time (arrival → its first prefill step
begins), not as prefill; TTFT is their sum, then the handoff and the first decode step."""

import pytest

from fleetctl.engine.core.sequence import SamplingParams
from fleetctl.engine.fleet.request import RequestTimes, TrackedRequest


def test_a_long_wait_is_queue_time_not_prefill_time() -> None:
    times = RequestTimes(arrival=1000.0, prefill_start=1090.0, first_token=1092.0, handoff_start=1092.0,
                         handoff_end=1092.5, second_token=1092.7, finished=1095.0)
    req = TrackedRequest("r", [1, 2, 3], SamplingParams(), seed=1, stream=None, times=times)  # type: ignore[arg-type]
    record = req.record()
    assert record["queue_s"] == pytest.approx(90.0) and record["prefill_s"] == pytest.approx(2.0)
    assert record["ttft_s"] == pytest.approx(92.0)
    assert record["handoff_wall_s"] == pytest.approx(0.5) and record["first_decode_s"] == pytest.approx(0.2)
    assert record["e2e_s"] == pytest.approx(95.0)
