"""The collector's duties between two consoles with no collector (collector/duties.py), over replayed nodes and the
real writer lock: the first records, guards and notifies; the second says so and holds nothing; when the first
quits, the second takes them over. (A real `record` SIGKILLed and started again under a console:
tests/test_collector.py.)"""

from __future__ import annotations

from pathlib import Path

from sparkconsole.collector.attach import AttachedMonitor
from sparkconsole.collector.core import Collector
from sparkconsole.collector.roles import console_role
from sparkconsole.config import ClusterConfig, NodeConfig, ProtectSettings
from sparkconsole.nodes.replay import replay_factory
from tests.helpers import until

ROOT = Path(__file__).resolve().parent.parent


def console(cluster: ClusterConfig, said: list[str]) -> Collector:
    replay = replay_factory(str(ROOT / "tests/fixtures/agent-h100-load.jsonl"), interval=0.1)
    mon = AttachedMonitor(cluster, transport_factory=replay, retry_s=0.2)
    return Collector(cluster, console_role(record=True), mon, say=lambda text, sev: said.append(text))


async def test_two_consoles_without_a_collector_share_nothing_and_the_second_takes_over(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARKCONSOLE_STATE_DIR", str(tmp_path / "state"))
    cluster = ClusterConfig(nodes=(NodeConfig(name="spark1", address="127.0.0.1"),), endpoints=(),
                            source=str(tmp_path / "c.yaml"), protect=ProtectSettings(30))
    said1: list[str] = []
    said2: list[str] = []
    first, second = console(cluster, said1), console(cluster, said2)
    try:
        await first.start()
        assert first.duties.held and first.recorder is not None and first.guardian.threshold_s == 30
        assert first.duties.line() == "recording, guard and notifications: this console (no collector)"
        await second.start()
        assert not second.duties.held and second.recorder is None and second.notifier is None
        assert second.guardian.threshold_s == 0
        assert second.duties.line().startswith("recording, guard and notifications: sparkconsole console (pid ")
        # both watch and judge the same ticks; only the first records them
        await until(lambda: len(second.monitor.nodes["spark1"].history) >= 5, 20, "the second console's ticks")
        assert not second.duties.held
        path = first.recorder.store.path
        await first.stop()
        await until(lambda: second.duties.held, 30, "the second console taking over (it tries every RETRY_S)")
        assert second.recorder.store.path == path and second.guardian.threshold_s == 30
        assert second.notifier is not None
        assert any(text.startswith("took over recording, guard and notifications from sparkconsole console")
                   for text in said2), said2
    finally:
        await first.stop()
        await second.stop()
