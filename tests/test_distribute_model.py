"""Models copied between the real sshd test nodes' own Hugging Face caches (issue 18, "the model and the image on
every node"). Node A's cache holds the test bed's tiny model in huggingface_hub's layout (blobs, a snapshot of
links, refs/main); node B's cache is a directory of its own (a 1 MiB tmpfs for the full-disk case). Nothing
reaches a hub: the download step is tested by its argv and by the error of a node without the tool."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from sparkconsole.distribute import models
from sparkconsole.distribute.nodescript import STAGE_DIR, cache_dir_name
from sparkconsole.errors import UserError
from sparkconsole.nodes.connect import make_transport
from tests.testbed.model import hf_layout as seeded_hf_layout

pytestmark = pytest.mark.sshd
MODEL = "testbed/tiny-llama"
REV = "0123456789abcdef0123456789abcdef01234567"


def hf_layout(model_dir: Path, hub: Path) -> Path:
    return seeded_hf_layout(model_dir, hub, MODEL, REV)


def tree(root: Path) -> dict[str, object]:
    out = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        out[rel] = os.readlink(p) if p.is_symlink() else (p.read_bytes() if p.is_file() else "dir")
    return out


@pytest.fixture
def caches(tmp_path, tiny_model, monkeypatch):
    monkeypatch.setenv("SPARKCONSOLE_STATE_DIR", str(tmp_path / "state"))
    a, b = tmp_path / "hub-a", tmp_path / "hub-b"
    src = hf_layout(Path(tiny_model.path), a)
    b.mkdir()
    return a, b, src


async def transports(sshd, a: Path, b: Path, **extra_env):
    cfg = sshd.cluster_config()
    envs = [(("HF_HUB_CACHE", str(a)),), (("HF_HUB_CACHE", str(b)), *extra_env.items())]
    ts = [make_transport(replace(n, env=e), cfg.ssh) for n, e in zip(cfg.nodes, envs, strict=False)]
    return ts


async def close(ts):
    await asyncio.gather(*(t.close() for t in ts), return_exceptions=True)


async def test_pull_copies_a_real_model_into_the_other_nodes_own_cache(sshd_nodes, caches):
    a, b, src = caches
    ts = await transports(sshd_nodes, a, b)
    try:
        before = await models.list_models(ts)
        assert [m.model for m in before[0].models] == [MODEL] and before[0].models[0].complete
        assert before[1].models == () and before[1].hub == str(b)
        seen = []
        report = await models.pull(MODEL, ts, on_progress=lambda p, final: seen.append((p.done, p.total, final)))
        assert report.source == "node1" and not report.downloaded
        size = sum(f.stat().st_size for f in src.rglob("*") if f.is_file() and not f.is_symlink())
        assert report.copied == {"node2": size}
        assert tree(b / cache_dir_name(MODEL)) == tree(src)      # bytes, links and refs, identical
        assert not any((b / STAGE_DIR).iterdir())                   # nothing left staged
        assert seen[-1] == (size, size, True)
        after = await models.list_models(ts)
        assert after[1].models[0].complete and after[1].models[0].size == size
        again = await models.pull(MODEL, ts)                        # everything there: nothing moves
        assert again.copied == {} and sorted(again.already) == ["node1", "node2"]
        freed = await models.remove(MODEL, ts[1:])
        assert freed == {"node2": size} and not (b / cache_dir_name(MODEL)).exists()
    finally:
        await close(ts)


async def test_an_interrupted_copy_is_never_taken_for_complete_and_resumes(sshd_nodes, caches):
    a, b, src = caches
    ts = await transports(sshd_nodes, a, b)
    total = sum(f.stat().st_size for f in src.rglob("*") if f.is_file() and not f.is_symlink())
    try:
        moved = []

        def stop_midway(p, final):
            moved.append(p.done)
            if p.done >= total // 2:
                raise KeyboardInterrupt        # the operator's ^C, mid-file (64 KiB chunks)
        with pytest.raises(KeyboardInterrupt):
            await models.pull(MODEL, ts, on_progress=stop_midway, chunk=65536)
        final = b / cache_dir_name(MODEL)
        assert not final.exists()                                    # the runner's check finds nothing
        staged = sum(f.stat().st_size for f in (b / STAGE_DIR).rglob("*") if f.is_file())
        assert 0 < staged < total
        listed = await models.list_models(ts)
        assert listed[1].models == () and listed[1].partial[0].model == MODEL
        report = await models.pull(MODEL, ts, chunk=65536)
        assert report.copied["node2"] == total - staged               # resumed: only the missing bytes moved
        assert tree(final) == tree(src)
    finally:
        await close(ts)


@pytest.fixture
def small_disk(tmp_path):
    mnt = tmp_path / "hub-b-small"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


async def test_a_full_disk_is_one_line_and_leaves_nothing_complete(sshd_nodes, caches, small_disk):
    a, _, src = caches
    ts = await transports(sshd_nodes, a, small_disk)
    try:
        # refused up front: the model is larger than the free space
        with pytest.raises(UserError, match=r"node2: testbed/tiny-llama needs .* more, .* free in") as ei:
            await models.pull(MODEL, ts)
        assert "\n" not in str(ei.value)
        assert not (small_disk / cache_dir_name(MODEL)).exists()
    finally:
        await close(ts)


async def test_the_disk_filling_up_during_the_copy_is_one_line(sshd_nodes, caches, tmp_path):
    a, _, src = caches
    mnt = tmp_path / "hub-b-fills"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mnt)]).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    ts = await transports(sshd_nodes, a, mnt)
    try:
        def fill(p, final):             # something else fills the disk once the copy has started
            filler = mnt / "filler"
            if not filler.exists():
                subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=64k"], capture_output=True)
        with pytest.raises(UserError, match=r"node2: disk full while copying testbed/tiny-llama") as ei:
            await models.pull(MODEL, ts, on_progress=fill, chunk=65536)
        assert "\n" not in str(ei.value) and "run the same command again" in str(ei.value)
        assert not (mnt / cache_dir_name(MODEL)).exists()
        (mnt / "filler").unlink()
        await models.pull(MODEL, ts)                                  # space back: it resumes and completes
        assert tree(mnt / cache_dir_name(MODEL)) == tree(src)
    finally:
        await close(ts)
        subprocess.run(["umount", "-l", str(mnt)], check=False)


async def test_a_vanished_node_is_one_line_and_leaves_nothing_complete(sshd_live, caches):
    a, b, src = caches
    ts = await transports(sshd_live, a, b)
    try:
        def vanish(p, final):
            if sshd_live[1].proc and sshd_live[1].proc.poll() is None:
                sshd_live[1].kill()
        with pytest.raises(UserError, match=r"node2") as ei:
            await models.pull(MODEL, ts, on_progress=vanish, chunk=65536)
        assert "\n" not in str(ei.value) and "run the same command again" in str(ei.value)
        assert not (b / cache_dir_name(MODEL)).exists()
    finally:
        await close(ts)


def test_download_argv():
    assert models.download_argv("hf", MODEL) == ["hf", "download", MODEL]
    assert models.download_argv("huggingface-cli", MODEL, "main") == ["huggingface-cli", "download", MODEL,
                                                                      "--revision", "main"]
    with pytest.raises(UserError, match="bad model id"):
        models.download_argv("hf", "x; rm -rf /")


async def test_no_node_has_it_and_the_download_tool_is_missing(sshd_nodes, tmp_path, monkeypatch):
    monkeypatch.setenv("SPARKCONSOLE_STATE_DIR", str(tmp_path / "state"))
    a, b = tmp_path / "a", tmp_path / "b"
    empty_bin = tmp_path / "bin"
    empty_bin.mkdir()
    for tool, real in (("sh", shutil.which("sh")), ("env", shutil.which("env")),
                       ("python3", os.path.realpath(sys.executable))):
        (empty_bin / tool).symlink_to(real)
    ts = await transports(sshd_nodes, a, b)
    ts[0] = make_transport(replace(ts[0].node, env=(("HF_HUB_CACHE", str(a)), ("PATH", str(empty_bin)))),
                           sshd_nodes.cluster_config().ssh)
    try:
        with pytest.raises(UserError, match=r"node1: neither `hf` nor `huggingface-cli`") as ei:
            await models.download(ts[0], MODEL)
        assert "\n" not in str(ei.value)
        with pytest.raises(UserError, match="no node has a complete copy"):
            await models.pull(MODEL, ts, download_missing=False)
    finally:
        await close(ts)
