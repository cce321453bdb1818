"""`fleetctl status`'s pool line: a pool that verified drafts says how many stood and what a verifying step gained;
one that did not says nothing of drafts."""

from fleetctl.console.cli.status import pool_line
from fleetctl.engine.api.status import PoolInfo

POOL = {"workers": 2, "busy": 0.5, "mfu": 0.01, "mbu": 0.2, "queue": 0, "prefix_hit_ratio": 0.25}


def test_a_speculating_pool_says_what_its_drafts_gave() -> None:
    line = pool_line("decode", PoolInfo(**POOL, spec_acceptance=0.78, spec_tokens_per_step=5.6))
    assert line == ("decode   workers 2  busy 50.0%  mfu 1.00%  mbu 20.00%  queue 0  prefix hits 25.0%  "
                    "drafts kept 78% (5.60 tokens a step)")
    assert "drafts" not in pool_line("prefill", PoolInfo(**POOL))
