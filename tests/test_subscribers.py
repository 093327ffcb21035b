"""subscribers.Subscribers: what every `subscribe(cb) -> unsubscribe` below the TUI promises."""

from __future__ import annotations

import logging

from sparkconsole.subscribers import Subscribers


def test_order_unsubscribe_and_a_failing_callback(caplog):
    subs: Subscribers[int] = Subscribers("test")
    got: list[tuple[str, int]] = []
    subs.add(lambda v: got.append(("a", v)))
    subs.add(lambda v: 1 / 0)
    off = subs.add(lambda v: got.append(("c", v)))
    with caplog.at_level(logging.ERROR, logger="sparkconsole.subscribers"):
        subs.notify(1)
    assert got == [("a", 1), ("c", 1)]                     # the one that raised did not stop the rest
    assert "test subscriber failed" in caplog.text and "ZeroDivisionError" in caplog.text
    off()
    off()                                                   # twice is harmless
    subs.notify(2)
    assert got[-1] == ("a", 2) and len(subs) == 2


def test_a_callback_may_unsubscribe_itself_during_notify():
    subs: Subscribers[str] = Subscribers("test")
    seen: list[str] = []
    offs = []

    def once(v: str) -> None:
        seen.append("once:" + v)
        offs[0]()

    offs.append(subs.add(once))
    subs.add(lambda v: seen.append("always:" + v))
    subs.notify("x")
    subs.notify("y")
    assert seen == ["once:x", "always:x", "always:y"]
