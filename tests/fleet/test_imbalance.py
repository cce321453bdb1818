"""A pool's outlier (engine/fleet/imbalance.py): the worker whose busy share is far from its peers' median, else
one holding many more sessions; none while the workers agree or a pool has one worker."""

from support.console_fixture import worker

from fleetctl.engine.fleet.imbalance import outlier


def test_the_worker_far_from_its_peers_busy_share_is_named() -> None:
    pool = [worker("decode-0", "decode", "cpu:2", busy=0.95), worker("decode-1", "decode", "cpu:3", busy=0.9),
            worker("decode-2", "decode", "cpu:4", busy=0.2)]
    assert outlier(pool) == "decode-2 busy 20% against 92% for its peers"


def test_one_holding_many_more_sessions_is_named_when_busy_agrees() -> None:
    pool = [worker("decode-0", "decode", "cpu:2", busy=0.9, sessions=14),
            worker("decode-1", "decode", "cpu:3", busy=0.92, sessions=5),
            worker("decode-2", "decode", "cpu:4", busy=0.88, sessions=4)]
    assert outlier(pool) == "decode-0 holds 14 sessions against 4.5 for its peers"


def test_agreeing_workers_and_lone_workers_have_no_outlier() -> None:
    assert outlier([worker("decode-0", "decode", "cpu:2", busy=0.9, sessions=6),
                    worker("decode-1", "decode", "cpu:3", busy=0.7, sessions=3)]) is None
    assert outlier([worker("decode-0", "decode", "cpu:2", busy=0.9)]) is None
    # two apart: the busier is named
    apart = [worker("prefill-0", "prefill", "cpu:0", busy=0.1), worker("prefill-1", "prefill", "cpu:1", busy=0.8)]
    assert outlier(apart) == "prefill-1 busy 80% against 10% for its peers"
