"""A replica's open requests, reported before they end: the oldest per operation, by rank."""

from __future__ import annotations

from serve.inflight import InFlight


def test_the_oldest_open_requests_are_reported_by_operation_and_rank() -> None:
    now = [100.0]
    flight = InFlight(clock=lambda: now[0])
    with flight.track("chat"):
        now[0] += 3.0
        with flight.track("chat"), flight.track("embeddings"):
            now[0] += 1.5
            with flight.track("chat"):  # 0 s old: too young to be news
                assert flight.oldest(top=4, min_age_s=1.0) == [
                    ("chat", 0, 4.5), ("chat", 1, 1.5), ("embeddings", 0, 1.5)]
                assert flight.oldest(top=1, min_age_s=1.0) == [("chat", 0, 4.5),
                                                               ("embeddings", 0, 1.5)]
        # Ended requests are gone at once.
        assert flight.oldest(min_age_s=0.0) == [("chat", 0, 4.5)]
    assert flight.oldest(min_age_s=0.0) == []


def test_a_request_that_fails_is_no_longer_open() -> None:
    flight = InFlight()
    try:
        with flight.track("chat"):
            raise RuntimeError("the model failed")
    except RuntimeError:
        pass
    assert flight.oldest(min_age_s=0.0) == []
