"""Fast checks of the test bed's own logic (no engine, no vLLM): cache markers, pins, container argv."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.testbed import cache
from tests.testbed.benchy import DEFAULT_BOOK_URL, seed_book
from tests.testbed.docker import TestbedImage, host_mounts, make_base_rootfs_tar


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def fake_venv(name: str) -> None:
    """A venv-shaped dir whose python is the base interpreter (its pip is what gets checked)."""
    path = cache.cache_root() / "venvs" / name
    (path / "bin").mkdir(parents=True)
    (path / "bin" / "python").symlink_to(cache.base_python())


def base_pip_version() -> str:
    return subprocess.run([str(cache.base_python()), "-c", "import pip; print(pip.__version__)"],
                          capture_output=True, text=True, env=cache.clean_env(), check=True).stdout.strip()


def test_cache_root_follows_env(cache_dir) -> None:
    assert cache.cache_root() == cache_dir and cache_dir.is_dir()


def test_matching_marker_reuses_venv(cache_dir) -> None:
    spec = cache.VenvSpec("fake", ("pip",), pins=(("pip", base_pip_version()),))
    fake_venv("fake")
    cache.write_marker(cache_dir / "venvs" / "fake", spec.as_marker())
    venv = cache.ensure_venv(spec)
    assert venv.install_seconds is None and venv.versions == {"pip": base_pip_version()}


def test_forbidden_release_is_refused(cache_dir) -> None:
    spec = cache.VenvSpec("fake", ("pip",), forbidden=(("pip", base_pip_version()),))
    fake_venv("fake")
    cache.write_marker(cache_dir / "venvs" / "fake", spec.as_marker())
    with pytest.raises(cache.TestbedError, match="must never be used"):
        cache.ensure_venv(spec)


def test_wrong_pin_is_refused(cache_dir) -> None:
    spec = cache.VenvSpec("fake", ("pip",), pins=(("pip", "0.0.1"),))
    fake_venv("fake")
    cache.write_marker(cache_dir / "venvs" / "fake", spec.as_marker())
    with pytest.raises(cache.TestbedError, match="expected 0.0.1"):
        cache.ensure_venv(spec)


def test_a_cached_venv_gets_its_startup_line_and_loses_it_without_a_rebuild(cache_dir) -> None:
    """The servers' GC setting (cache.SERVER_GC) reaches a venv the cache already holds, and its interpreter runs
    it as it starts; a spec without a startup line takes it away again; the clients keep Python's defaults."""
    from tests.testbed.benchy import BENCHY_VENV
    from tests.testbed.routers import LITELLM_VENV
    from tests.testbed.vllm import VLLM_VENV

    path = cache_dir / "venvs" / "real"
    subprocess.run([str(cache.base_python()), "-m", "venv", "--without-pip", str(path)], check=True,
                   env=cache.clean_env())
    spec = cache.VenvSpec("real", ("pip",), startup=cache.SERVER_GC)
    cache.write_marker(path, spec.as_marker())     # cached: ensure_venv must not build it again
    threshold = [str(path / "bin" / "python"), "-c", "import gc; print(gc.get_threshold())"]

    def read() -> str:
        return subprocess.run(threshold, capture_output=True, text=True, env=cache.clean_env(),
                              check=True).stdout.strip()

    default = read()
    venv = cache.ensure_venv(spec)
    assert venv.install_seconds is None and read() == "(700, 10, 1000)" != default
    cache.ensure_venv(spec)                         # again: the same one line
    assert (cache.site_packages(path) / cache.STARTUP_PTH).read_text() == cache.SERVER_GC + "\n"
    cache.ensure_venv(cache.VenvSpec("real", ("pip",)))
    assert read() == default
    assert VLLM_VENV.startup == LITELLM_VENV.startup == cache.SERVER_GC and BENCHY_VENV.startup == ""


def test_marker_mismatch_is_detected(cache_dir) -> None:
    path = cache_dir / "thing"
    path.mkdir(parents=True)
    cache.write_marker(path, {"a": 1})
    assert cache.marker_matches(path, {"a": 1})
    assert not cache.marker_matches(path, {"a": 2})
    assert not cache.marker_matches(cache_dir / "missing", {"a": 1})


def test_run_argv_mounts_everything_readonly() -> None:
    image = TestbedImage("img:1", host_mounts(), (("HOME", "/root"),))
    argv = image.run_argv("c1", ["python3", "-V"], memory="6g", extra_env={"X": "y z"})
    assert argv[:2] == ["run", "--detach"]
    assert "--init" in argv and argv[argv.index("--network") + 1] == "host"
    assert argv[argv.index("--memory") + 1] == "6g" and argv[argv.index("--shm-size") + 1] == "1g"
    mounts = [argv[i + 1] for i, a in enumerate(argv) if a == "--mount"]
    assert mounts and all(m.endswith(",readonly") for m in mounts)
    assert any(f"source={os.path.realpath(sys.base_prefix)}," in m for m in mounts)
    assert "X=y z" in argv and argv[-3:] == ["img:1", "python3", "-V"]


def test_host_mounts_skip_paths_already_covered() -> None:
    mounts = dict(host_mounts(__import__("pathlib").Path("/usr/lib")))
    assert "/usr" in mounts and "/usr/lib" not in mounts


def test_rootfs_has_real_sbin_and_lib_links(tmp_path) -> None:
    import tarfile

    with tarfile.open(make_base_rootfs_tar(tmp_path / "r.tar")) as tar:
        members = {m.name.lstrip("./"): m for m in tar.getmembers()}
    assert members["sbin"].isdir()  # docker-init is mounted into it
    assert members["bin"].issym() and members["bin"].linkname == "usr/bin"


def test_book_is_seeded_under_md5_of_url(tmp_path) -> None:
    import hashlib

    path = seed_book(tmp_path)
    assert path.name == hashlib.md5(DEFAULT_BOOK_URL.encode()).hexdigest() + ".txt"
    assert len(path.read_text().split()) > 20000
