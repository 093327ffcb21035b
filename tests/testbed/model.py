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
HF_ID = "sparkconsole-testbed/tiny-llama"      # what the tiny-testbed recipe serves, from the node's HF cache
HF_REVISION = "0" * 39 + "1"


@dataclass(frozen=True)
class TinyModel:
    path: Path
    name: str = SERVED_NAME  # the --served-model-name clients ask for
    build_seconds: float | None = None  # None when reused from the cache
    hf_id: str = HF_ID

    def seed_hf_cache(self, hf_home: Path) -> Path:
        """The model in a node's Hugging Face cache (`HF_HOME/hub`), as `hf download` leaves it: what an operator
        has on the node they downloaded it to."""
        return hf_layout(self.path, hf_home / "hub", self.hf_id, HF_REVISION)


def hf_layout(model_dir: Path, hub: Path, repo_id: str, rev: str) -> Path:
    """The model's files as huggingface_hub stores them: blobs by hash, a snapshot of relative links (so the
    cache still holds the model when mounted into a container), refs/main. Returns the repo's directory."""
    root = hub / ("models--" + repo_id.replace("/", "--"))
    (root / "blobs").mkdir(parents=True, exist_ok=True)
    (root / "refs").mkdir(exist_ok=True)
    (root / "refs" / "main").write_text(rev)
    snap = root / "snapshots" / rev
    snap.mkdir(parents=True, exist_ok=True)
    for f in sorted(model_dir.iterdir()):
        if f.is_file() and not f.name.startswith("."):
            digest = hashlib.sha256(f.read_bytes()).hexdigest()
            shutil.copyfile(f, root / "blobs" / digest)
            link = snap / f.name
            if not link.is_symlink():
                link.symlink_to(f"../../blobs/{digest}")
    return root


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
