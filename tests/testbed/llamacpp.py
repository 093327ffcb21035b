"""Test bed plugin: llama.cpp's `llama-server`, and the tiny model as a GGUF file for it.

The venv holds the `gguf` package (and numpy, safetensors) that writes the GGUF, and llama-server built from the
llama.cpp sources of PyPI's llama-cpp-python (tests/testbed/llamacpp_build.py); it is built in the background with
the others (tests/testbed/vllm.py's pytest_collection_finish) and cached. The GGUF is made from the test bed's tiny
model (tests/testbed/model.py) by tests/testbed/gguf_build.py, cached beside it.
"""

from __future__ import annotations

import hashlib
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.testbed.cache import (
    Venv,
    VenvSpec,
    cache_root,
    ensure_venv,
    locked,
    marker_matches,
    run_logged,
    write_marker,
)
from tests.testbed.model import TinyModel

GGUF_VERSION = "0.19.0"
BUILD = Path(__file__).with_name("llamacpp_build.py")
GGUF_SCRIPT = Path(__file__).with_name("gguf_build.py")
LLAMACPP_VENV = VenvSpec(
    name="llama-cpp-0.3.36",
    requirements=(f"gguf=={GGUF_VERSION}", "safetensors==0.8.0", "numpy>=1.26,<3"),
    pins=(("gguf", GGUF_VERSION),),
    build=BUILD,
)


@dataclass(frozen=True)
class TinyGguf:
    path: Path                          # the .gguf file
    build_seconds: float | None = None  # None when reused from the cache


def ensure_tiny_gguf(venv: Venv, model: TinyModel) -> TinyGguf:
    out_dir = cache_root() / "models" / "tiny-llama-gguf"
    path = out_dir / "tiny-llama.gguf"
    want = {"script_sha256": hashlib.sha256(GGUF_SCRIPT.read_bytes()).hexdigest(),
            "model_marker": (model.path / ".sparkconsole-testbed.json").read_text()
            if (model.path / ".sparkconsole-testbed.json").exists() else "",
            "venv_marker": (venv.path / ".sparkconsole-testbed.json").read_text()}
    with locked("model-tiny-gguf"):
        if marker_matches(out_dir, want) and path.exists():
            return TinyGguf(path)
        shutil.rmtree(out_dir, ignore_errors=True)
        out_dir.mkdir(parents=True)
        start = time.monotonic()
        run_logged([str(venv.python), str(GGUF_SCRIPT), str(model.path), str(path)],
                   cache_root() / "logs" / "gguf-build.log", env={"PATH": "/usr/bin:/bin", "HOME": str(Path.home())})
        seconds = round(time.monotonic() - start, 1)
        write_marker(out_dir, want, build_seconds=seconds)
        return TinyGguf(path, seconds)


@pytest.fixture(scope="session")
def llamacpp_env() -> Venv:
    return ensure_venv(LLAMACPP_VENV)


@pytest.fixture(scope="session")
def tiny_gguf(llamacpp_env: Venv, tiny_model: TinyModel) -> TinyGguf:
    return ensure_tiny_gguf(llamacpp_env, tiny_model)
