"""A request's tokens over its life, bounded: counted in buckets from its first token, the buckets doubling in
width (neighbours merged) once a token falls past the last of MAX_BUCKETS, so every token stays counted and the
series spans the whole request at the finest width that fits."""

import pytest

from fleetctl.engine.fleet.token_buckets import FIRST_BUCKET_S, MAX_BUCKETS, TokenBuckets


def test_tokens_count_in_their_buckets_from_the_first_token() -> None:
    buckets = TokenBuckets()
    for offset in (0.0, 0.004, 0.015, 0.035):
        buckets.add(offset)
    assert (buckets.bucket_s, buckets.counts) == (FIRST_BUCKET_S, [2, 1, 0, 1])


def test_a_token_past_the_last_bucket_doubles_their_width_merging_neighbours() -> None:
    buckets = TokenBuckets()
    for i in range(MAX_BUCKETS):
        buckets.add((i + 0.5) * FIRST_BUCKET_S)  # one in each bucket
    buckets.add(MAX_BUCKETS * FIRST_BUCKET_S + 0.001)  # just past the last
    assert buckets.bucket_s == pytest.approx(2 * FIRST_BUCKET_S)
    assert buckets.counts == [2] * (MAX_BUCKETS // 2) + [1]


def test_a_long_request_keeps_every_token_in_at_most_max_buckets_spanning_its_life() -> None:
    buckets = TokenBuckets()
    offsets = [i * 0.037 for i in range(5000)]  # about 185 s at 27 tokens/s
    for offset in offsets:
        buckets.add(offset)
    assert sum(buckets.counts) == len(offsets)
    assert MAX_BUCKETS // 2 < len(buckets.counts) <= MAX_BUCKETS
    assert (len(buckets.counts) - 1) * buckets.bucket_s <= offsets[-1] < len(buckets.counts) * buckets.bucket_s
