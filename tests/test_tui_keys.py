"""What a key press waits for: the key bar is redrawn only when the keys it shows change, and the heap keeper
moves long-lived objects out of the collector's view, with a full pass only while nobody presses a key."""

from __future__ import annotations

import gc

from sparkconsole.tui.heap import HeapKeeper
from sparkconsole.tui.screens.help import HelpScreen
from sparkconsole.tui.widgets.key_bar import KeyBar
from tests.helpers import wait_for
from tests.test_tui_app import SIZE, make_app, recording, state_dir  # noqa: F401  (fixtures)


def key_bar(app) -> KeyBar:
    return app.dashboard.query_one(KeyBar)


def descriptions(app) -> list[str]:
    return [k.description for k in key_bar(app).keys]


async def test_help_over_the_dashboard_keeps_the_key_bar_and_a_new_focus_redraws_it(recording):
    app, _, _ = make_app(recording, n=4)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: "Logs" in descriptions(app), what="the node keys")
        before, changes = descriptions(app), key_bar(app).changes
        assert "Quit" in before and key_bar(app).palette is not None
        for _ in range(2):
            await pilot.press("question_mark")
            await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), what="help")
            await pilot.press("escape")
            await wait_for(pilot, lambda: not isinstance(app.screen, HelpScreen), what="help closed")
        await pilot.pause(0.2)
        assert descriptions(app) == before and key_bar(app).changes == changes    # not redrawn: same keys
        # the filter box has other keys than a node panel: the bar follows the focus
        await pilot.press("slash")
        await wait_for(pilot, lambda: "Logs" not in descriptions(app), what="the key bar without the node's keys")
        await pilot.press("escape")
        await pilot.press("q")


async def test_a_click_on_a_key_presses_it(recording):
    app, _, _ = make_app(recording, n=2)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: "Help" in descriptions(app), what="the keys")
        bar = key_bar(app)
        start = next(s for s, _, k in bar._spans if k.description == "Help")
        await pilot.click(KeyBar, offset=(start + 1, 0))
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), what="help from a click")
        await pilot.press("escape")
        await pilot.press("q")


class Cycle:
    def __init__(self) -> None:
        self.me = self


def test_heap_keeper_collects_only_when_due_and_idle_or_overdue():
    keeper = HeapKeeper(settle_s=0.0, idle_s=3600, max_defer_s=3600, collect_s=3600)
    keeper.start()
    try:
        gc.collect()
        Cycle()                                   # garbage only the cycle collector can free
        keeper.touched()
        keeper.tick()                             # a key was just pressed: nothing runs
        assert keeper.settles == 0 and keeper.collected == 0
        keeper.max_defer_s = 0.0
        keeper.tick()                             # overdue: collected anyway, the survivors frozen
        assert keeper.settles == 1 and keeper.collected >= 1 and gc.get_freeze_count() > 0
        Cycle()
        keeper.idle_s, keeper.max_defer_s, keeper.collect_s = 0.0, 3600, 0.0
        keeper.tick()                             # idle and the full pass due: unfrozen, collected, frozen again
        assert keeper.settles == 2 and keeper.collected >= 2 and gc.get_freeze_count() > 0
    finally:
        keeper.release()
    assert gc.get_freeze_count() == 0


def test_heap_keeper_start_raises_the_young_threshold_stops_old_passes_and_release_restores_it():
    before = gc.get_threshold()
    keeper = HeapKeeper()
    keeper.start()
    try:
        now = gc.get_threshold()
        assert now[0] > before[0] and now[1] == before[1] and now[2] >= 1 << 20
        assert gc.get_freeze_count() > 0
    finally:
        keeper.release()
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0


async def test_no_cycle_collection_until_the_first_frame_then_the_keeper_runs_it(recording):
    from sparkconsole.tui import heap
    heap.hold()                                  # what `sparkconsole console` does before importing the app
    try:
        assert not gc.isenabled()
        app, _, mon = make_app(recording, n=2)
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(pilot, lambda: app.first_frame_at is not None and any(nm.last for nm in mon.nodes.values()),
                           what="the first frame and a reading")
            await wait_for(pilot, gc.isenabled, what="the collector back once the monitors run")
            assert gc.get_threshold()[2] >= 1 << 20 and gc.get_freeze_count() > 0      # HeapKeeper's, not Python's
            await pilot.press("q")
    finally:
        heap.unhold()
    assert gc.isenabled()
