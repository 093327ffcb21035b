"""--resume never mixes clocks: levels a simulated (demo) run measured in a results file are not taken as
measured for a real endpoint, nor for a simulated one at another speed. Real loopback servers, real SQLite."""

from __future__ import annotations

import pytest

from sparkconsole.bench.matrix import run_matrix
from sparkconsole.bench.measure import run_sweep
from sparkconsole.bench.results import ResultsStore
from sparkconsole.bench.sweep import SweepSpec
from tests.test_bench_helpers import Behaviour, FakeVllm


def _spec(url: str, **kw) -> SweepSpec:
    base = dict(url=url, pp=(40,), tg=(8,), concurrency=(1,), runs=1, warmup=False, latency_mode="none",
                topology="solo")    # a topology: the URL is not part of the identity, as after a relaunch
    base.update(kw)
    return SweepSpec(**base)


async def _sweep(tmp_path, sim_speed, *, resume):
    srv = await FakeVllm(Behaviour(token_delay=0.001, sim_speed=sim_speed)).start()
    try:
        with ResultsStore(tmp_path / "r.sqlite") as store:
            return await run_sweep(_spec(srv.url), store, resume=resume)
    finally:
        await srv.stop()


@pytest.mark.parametrize("second", [None, 20.0], ids=["real", "other-speed"])
async def test_sweep_resume_does_not_continue_a_run_on_another_clock(tmp_path, second):
    demo = await _sweep(tmp_path, 10.0, resume=False)
    again = await _sweep(tmp_path, second, resume=True)
    assert not again.resumed and again.run_id != demo.run_id and not again.skipped and len(again.levels) == 1
    same = await _sweep(tmp_path, second, resume=True)       # the same clock still resumes
    assert same.resumed and same.run_id == again.run_id and len(same.skipped) == 1 and not same.levels
    with ResultsStore(tmp_path / "r.sqlite") as store:
        runs = {r.run_id: r for r in store.runs()}
    assert runs[demo.run_id].simulated and runs[demo.run_id].speed == 10.0
    assert runs[again.run_id].simulated == (second is not None)


class _Launcher:
    def __init__(self, sim_speed):
        self.sim_speed, self.srv, self.launched = sim_speed, None, []

    async def launch(self, recipe, topology):
        self.launched.append(topology)
        self.srv = await FakeVllm(Behaviour(token_delay=0.001, sim_speed=self.sim_speed)).start()
        return self.srv.url

    async def stop(self):
        if self.srv is not None:
            await self.srv.stop()
            self.srv = None


async def test_matrix_resume_does_not_skip_topologies_a_demo_measured(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("name: tiny\n")
    template = _spec("http://unset.invalid")
    with ResultsStore(tmp_path / "m.sqlite") as store:
        demo = await run_matrix(str(recipe), ["solo"], _Launcher(10.0), template, store, simulated=True, speed=10.0)
        real_launcher = _Launcher(None)
        real = await run_matrix(str(recipe), ["solo"], real_launcher, template, store, resume=True)
        other = await run_matrix(str(recipe), ["solo"], _Launcher(20.0), template, store, resume=True,
                                 simulated=True, speed=20.0)
        same_launcher = _Launcher(10.0)
        same = await run_matrix(str(recipe), ["solo"], same_launcher, template, store, resume=True,
                                simulated=True, speed=10.0)
        runs = store.runs()
    assert demo.measured == ["solo"]
    assert real.measured == ["solo"] and not real.skipped and real_launcher.launched == ["solo"]
    assert other.measured == ["solo"] and not other.skipped
    assert same.skipped == ["solo"] and same_launcher.launched == []
    assert sorted((r.simulated, r.speed) for r in runs) == [(False, 1.0), (True, 10.0), (True, 20.0)]
