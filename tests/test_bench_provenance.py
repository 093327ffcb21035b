"""Results name exactly what was launched: the recipe file's hash also for recipes given by name."""

from __future__ import annotations

import hashlib

from sparkconsole.bench.matrix import recipe_hash, run_matrix
from sparkconsole.bench.results import ResultsStore
from sparkconsole.bench.sweep import SweepSpec
from sparkconsole.recipes import bundled_dir
from tests.test_bench_helpers import Behaviour, FakeVllm


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def test_recipe_hash_resolves_names_like_the_launcher(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    bundled = bundled_dir() / "gpt-oss-120b.yaml"
    assert recipe_hash("gpt-oss-120b") == _sha(bundled)
    # ./recipes/ wins over the bundle when resolving names, so its file is the one hashed.
    (tmp_path / "recipes").mkdir()
    local = tmp_path / "recipes" / "gpt-oss-120b.yaml"
    local.write_text(bundled.read_text() + "# tuned here\n")
    assert recipe_hash("gpt-oss-120b") == _sha(local) != _sha(bundled)
    assert recipe_hash("no-such-recipe") is None and recipe_hash(str(tmp_path / "missing.yaml")) is None


async def test_matrix_records_the_hash_of_a_bundled_recipe(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))

    class Launcher:
        srv = None

        async def launch(self, recipe, topology):
            self.srv = await FakeVllm(Behaviour(token_delay=0.001)).start()
            return self.srv.url

        async def stop(self):
            if self.srv:
                await self.srv.stop()

    template = SweepSpec(url="http://unset.invalid", pp=(40,), tg=(8,), concurrency=(1,), runs=1, warmup=False,
                         latency_mode="none")
    with ResultsStore(tmp_path / "m.sqlite") as store:
        out = await run_matrix("gpt-oss-120b", ["solo"], Launcher(), template, store)
        (run,) = store.runs()
    assert out.measured == ["solo"]
    assert run.recipe == "gpt-oss-120b" and run.recipe_hash == _sha(bundled_dir() / "gpt-oss-120b.yaml")
