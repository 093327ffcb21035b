"""Test bed plugin: the tiny chat model vLLM serves, made at test time (tokenizer + random Llama weights).

Built by tests/testbed/model_build.py inside the vLLM venv (which has torch/transformers/tokenizers) and
cached under the test bed cache; rebuilt when the build script or the venv changes.
"""

from __future__ import annotations

import hashlib
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.testbed.cache import Venv, cache_root, locked, marker_matches, run_logged, write_marker

BUILD_SCRIPT = Path(__file__).with_name("model_build.py")
SERVED_NAME = "tiny-llama"


@dataclass(frozen=True)
class TinyModel:
    path: Path
    name: str = SERVED_NAME  # the --served-model-name clients ask for
    build_seconds: float | None = None  # None when reused from the cache


def ensure_tiny_model(venv: Venv) -> TinyModel:
    path = cache_root() / "models" / SERVED_NAME
    want = {
        "build_script_sha256": hashlib.sha256(BUILD_SCRIPT.read_bytes()).hexdigest(),
        "venv": str(venv.path),
        "venv_marker": (venv.path / ".sparkconsole-testbed.json").read_text() if venv.path.exists() else "",
    }
    with locked("model-tiny"):
        if marker_matches(path, want) and (path / "config.json").exists():
            return TinyModel(path)
        shutil.rmtree(path, ignore_errors=True)
        start = time.monotonic()
        run_logged([str(venv.python), str(BUILD_SCRIPT), str(path)], cache_root() / "logs" / "model-build.log",
                   env={"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                        "HOME": str(Path.home())})
        seconds = round(time.monotonic() - start, 1)
        write_marker(path, want, build_seconds=seconds)
        return TinyModel(path, SERVED_NAME, seconds)


@pytest.fixture(scope="session")
def tiny_model(vllm_env: Venv) -> TinyModel:
    return ensure_tiny_model(vllm_env)
