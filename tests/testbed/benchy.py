"""Test bed plugin: llama-benchy 0.4.0, the community benchmark our bench numbers are cross-checked against.

Run offline: model and tokenizer passed explicitly (its auto-detect asks a model hub), the coherence check
skipped (the random tiny model cannot answer "Paris"), and its book text pre-seeded in a private HOME's
cache under the md5 of its default book URL (llama_benchy/corpus.py), so it never downloads.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.testbed.cache import TestbedError, Venv, VenvSpec, cache_root, ensure_venv
from tests.testbed.model import TinyModel
from tests.testbed.model_build import corpus

BENCHY_VERSION = "0.4.0"
BENCHY_VENV = VenvSpec(
    name=f"llama-benchy-{BENCHY_VERSION}",
    requirements=(f"llama-benchy=={BENCHY_VERSION}",),
    pins=(("llama-benchy", BENCHY_VERSION),),
)
# llama_benchy/config.py: the --book-url default; its text is looked up as ~/.cache/llama-benchy/<md5(url)>.txt
DEFAULT_BOOK_URL = "https://www.gutenberg.org/files/1661/1661-0.txt"
LOCKSTEP = Path(__file__).with_name("lockstep.py")


def seed_book(home: Path, url: str = DEFAULT_BOOK_URL) -> Path:
    path = home / ".cache" / "llama-benchy" / f"{hashlib.md5(url.encode()).hexdigest()}.txt"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(corpus(lines=6000, seed=7)) + "\n", encoding="utf-8")
    return path


@dataclass(frozen=True)
class Benchy:
    venv: Venv
    home: Path  # private HOME holding the seeded book cache

    def argv(self, base_url: str, model: TinyModel, *, pp: Sequence[int] = (128,), tg: Sequence[int] = (16,),
             concurrency: Sequence[int] = (1,), runs: int = 1, api_key: str | None = None,
             extra: Sequence[str] = ()) -> list[str]:
        argv = [str(self.venv.bin("llama-benchy")), "--base-url", f"{base_url.rstrip('/')}/v1",
                "--model", model.name, "--tokenizer", str(model.path), "--skip-coherence",
                "--pp", *map(str, pp), "--tg", *map(str, tg), "--concurrency", *map(str, concurrency),
                "--runs", str(runs), "--latency-mode", "none", "--format", "json"]
        if api_key:
            argv += ["--api-key", api_key]
        return argv + list(extra)

    def env(self) -> dict[str, str]:
        """Offline, with the private HOME that holds the seeded book."""
        return {"PATH": f"{self.venv.path / 'bin'}:/usr/bin:/bin", "HOME": str(self.home),
                "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "NO_PROXY": "127.0.0.1,localhost"}

    def run(self, base_url: str, model: TinyModel, out_dir: Path, *, timeout: float = 600, **kw) -> dict:
        """Run one benchmark; returns llama-benchy's JSON (metadata + "benchmarks" list)."""
        result_path = out_dir / "benchy.json"
        log_path = out_dir / "benchy.log"
        argv = self.argv(base_url, model, **kw) + ["--save-result", str(result_path)]
        with open(log_path, "wb") as log:
            proc = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, env=self.env(), cwd=out_dir,
                                  timeout=timeout)
        if proc.returncode != 0 or not result_path.exists():
            tail = log_path.read_text(errors="replace").strip().splitlines()[-1:]
            raise TestbedError(f"llama-benchy failed (rc {proc.returncode}): {tail} (log: {log_path})")
        return json.loads(result_path.read_text())

    def lockstep(self, base_url: str, model: TinyModel, out: Path, *, pp: int, tg: int, concurrency: Sequence[int],
                 rounds: int, pause_ms: float = 10.0, cpus: set[int] | None = None, timeout: float = 600,
                 same_prompts: bool = False) -> dict:
        """Our client and llama-benchy's batch by batch on one server (tests/testbed/lockstep.py, run with
        llama-benchy's interpreter); `cpus` pins it. Returns its rounds (timing.compare_rounds reads them)."""
        argv = [str(self.venv.python), str(LOCKSTEP), base_url, model.name, str(model.path),
                "--book-url", DEFAULT_BOOK_URL, "--pp", str(pp), "--tg", str(tg),
                "--concurrency", *map(str, concurrency), "--rounds", str(rounds), "--pause-ms", str(pause_ms),
                "--out", str(out), *(["--same-prompts"] if same_prompts else [])]
        proc = subprocess.run(argv, env=self.env(), capture_output=True, text=True, timeout=timeout,
                              preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)
        if proc.returncode != 0 or not out.exists():
            raise TestbedError(f"lockstep run failed (rc {proc.returncode}): {proc.stderr.strip()[-500:]}")
        return json.loads(out.read_text())


@pytest.fixture(scope="session")
def benchy_env() -> Venv:
    return ensure_venv(BENCHY_VENV)


@pytest.fixture(scope="session")
def benchy(benchy_env: Venv) -> Benchy:
    home = cache_root() / "benchy-home"
    seed_book(home)
    return Benchy(benchy_env, home)
