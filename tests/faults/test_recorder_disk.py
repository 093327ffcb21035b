"""The flight recorder's file on real filesystems that fail: a small tmpfs filled up (at start, and mid-run then
freed), a tmpfs remounted read-only mid-run, a directory made read-only for a `record` whose capability to
override file permissions is dropped (`setpriv`), the file and its directory removed or replaced while recording.

For each: one line naming the file and the fix, never a traceback; the writer keeps the rows in memory and writes
them once it can (recording resumes by itself); `record` and the console keep running and say so; and whatever is
lost is said (a removed file's rows went with it: said, and the new file holds everything after).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sparkconsole.errors import UserError
from sparkconsole.recorder.reader import RecorderReader
from sparkconsole.recorder.store import RecorderStore
from tests.test_recorder import integrity, tick

ROOT = Path(__file__).resolve().parents[2]


def wait(pred, timeout: float, what: str, step: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(step)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


@pytest.fixture
def tmpfs(tmp_path):
    """mount(name, size) → a fresh tmpfs of that size; unmounted at teardown."""
    mounted: list[Path] = []

    def mount(name: str, size: str = "512k") -> Path:
        d = tmp_path / name
        d.mkdir()
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(d)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"mounting a tmpfs was refused here ({r.stderr.strip()[:120]}): the full-disk and "
                        "read-only-filesystem faults need one")
        mounted.append(d)
        return d
    yield mount
    for d in reversed(mounted):
        if subprocess.run(["umount", str(d)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(d)], capture_output=True)


def fill(d: Path) -> Path:
    """A file taking every free byte of d's filesystem."""
    filler = d / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for size in (1 << 16, 4096, 512, 1):
            try:
                while os.write(fd, b"\0" * size):
                    pass
            except OSError:
                pass
    finally:
        os.close(fd)
    return filler


def seqs(path: Path, node: str = "n") -> list[int]:
    r = RecorderReader(path)
    try:
        return [x["seq"] for x in r.ticks(node, 0, time.time() + 3600)]
    finally:
        r.close()


class Said(list):
    def __call__(self, text: str, severity: str) -> None:
        assert "\n" not in text and "Traceback" not in text, text
        self.append(text)

    def has(self, *words: str) -> str | None:
        return next((s for s in self if all(w in s for w in words)), None)


def feed(store: RecorderStore, start: int, n: int, t0: float) -> None:
    for i in range(start, start + n):
        store.put_tick("n", tick(t0 + i * 0.5, i))


def recording_in(d: Path, rows: int) -> tuple[RecorderStore, Said, Path, float]:
    """A store writing d/rec.sqlite with `rows` ticks committed; (store, what it said, path, t0)."""
    said = Said()
    path = d / "rec.sqlite"
    store = RecorderStore(path, on_status=said)
    t0 = time.time()
    feed(store, 0, rows, t0)
    store.flush()
    return store, said, path, t0


@pytest.mark.fault("recorder disk full at start, then freed")
def test_full_at_start_then_freed(tmpfs, ledger):
    d = tmpfs("fs")
    filler = fill(d)
    said = Said()
    path = d / "rec.sqlite"
    store = RecorderStore(path, on_status=said)
    first = wait(lambda: said.has("disk is full", str(path), "fix:"), 10, "the full-disk line")
    assert "record elsewhere" in first and store.error is not None
    t0 = time.time()
    feed(store, 0, 40, t0)
    store.flush()
    filler.unlink()
    wait(lambda: said.has("writing", "again"), 20, "the writer to resume by itself")
    feed(store, 40, 10, t0)
    store.flush()
    store.close()
    assert seqs(path) == list(range(50)) and store.rows_dropped == 0
    assert integrity(path) == "ok"
    ledger.lost(50 - len(seqs(path)), "ticks across a full disk")


@pytest.mark.fault("recorder disk full mid-run, then freed")
def test_full_mid_run_then_freed(tmpfs, ledger):
    d = tmpfs("fs", "1m")
    store, said, path, t0 = recording_in(d, 100)
    filler = fill(d)
    i = 100
    while not said.has("disk is full"):          # rows until the WAL needs a page the disk no longer has
        feed(store, i, 50, t0)
        i += 50
        store.flush()
        assert i < 200_000, "the disk never filled"
    held_at = i
    feed(store, i, 20, t0)
    i += 20
    filler.unlink()
    wait(lambda: said.has("writing", "again"), 20, "the writer to resume")
    feed(store, i, 20, t0)
    i += 20
    store.flush()
    store.close()
    got = seqs(path)
    assert got == list(range(i)), (len(got), i, held_at)
    assert integrity(path) == "ok" and store.rows_dropped == 0
    assert len([s for s in said if "disk is full" in s]) == 1, said      # said once, not per retry
    ledger.lost(i - len(got), "ticks across a disk full mid-run")


@pytest.fixture
def ext4(tmp_path):
    """An ext4 filesystem on a loop device, mounted errors=remount-ro: (its directory, its error trigger).
    Writing to the trigger is how the kernel reacts to a failing disk: the filesystem turns read-only under the
    open file (a tmpfs cannot: the kernel refuses to remount read-only while a file is open for writing)."""
    img, d = tmp_path / "ext4.img", tmp_path / "ext4"
    d.mkdir()
    with open(img, "wb") as fh:
        fh.truncate(16 << 20)
    made = subprocess.run(["mkfs.ext4", "-q", str(img)], capture_output=True, text=True)
    r = subprocess.run(["mount", "-o", "loop,errors=remount-ro", str(img), str(d)], capture_output=True, text=True) \
        if made.returncode == 0 else made
    if r.returncode != 0:
        pytest.skip(f"an ext4 loop mount was refused here ({r.stderr.strip()[:120]})")
    dev = Path(subprocess.run(["findmnt", "-no", "SOURCE", str(d)], capture_output=True, text=True).stdout.strip()).name
    trigger = Path(f"/sys/fs/ext4/{dev}/trigger_fs_error")
    try:
        if not trigger.exists():
            pytest.skip("this kernel has no ext4 trigger_fs_error: a filesystem cannot be turned read-only mid-write")
        yield d, trigger
    finally:
        if subprocess.run(["umount", str(d)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(d)], capture_output=True)


@pytest.mark.fault("recorder filesystem turned read-only mid-run (ext4 errors=remount-ro)")
def test_filesystem_read_only_mid_run(ext4, ledger):
    d, trigger = ext4
    store, said, path, t0 = recording_in(d, 50)
    trigger.write_text("sparkconsole test: the disk failed\n")
    feed(store, 50, 30, t0)
    store.flush()
    line = wait(lambda: said.has("read-only", str(path), "fix: remount"), 15, "the read-only line")
    assert store.error == line
    feed(store, 80, 10, t0)
    store.close()                         # the filesystem never comes back while this runs: what is held is lost
    assert store.rows_dropped == 40 and said.has("40 rows", "could not be written", str(path)), said
    assert len([s for s in said if "filesystem is read-only" in s]) == 1, said
    assert seqs(path) == list(range(50))  # what was committed before stays readable
    ledger.lost(store.rows_dropped, "ticks held when the filesystem turned read-only and stayed so (said)")


@pytest.mark.fault("recorder file or its directory removed or replaced while recording")
@pytest.mark.parametrize("how", ["file removed", "file replaced", "directory removed", "directory became a file"])
def test_file_or_directory_moved_while_recording(tmp_path, how, ledger):
    d = tmp_path / "rec"
    path = d / "rec.sqlite"
    said = Said()
    store = RecorderStore(path, on_status=said)
    t0 = time.time()
    feed(store, 0, 20, t0)
    store.flush()
    if how == "file removed":
        path.unlink()
    elif how == "file replaced":
        other = RecorderStore(tmp_path / "other.sqlite")
        other.put_tick("n", tick(t0 - 100, 1000))
        other.close()
        os.replace(tmp_path / "other.sqlite", path)
    elif how == "directory removed":
        shutil.rmtree(d)
    else:
        shutil.rmtree(d)
        d.write_text("not a directory\n")
    feed(store, 20, 20, t0)
    store.flush()
    if how == "directory became a file":
        line = wait(lambda: said.has("cannot write", str(path), "fix:"), 15, "the cannot-write line")
        assert "is not a directory" in line, line
        d.unlink()
        wait(lambda: said.has("writing", "again"), 20, "the writer to resume")
    else:
        line = wait(lambda: said.has(str(path), "while recording"), 15, "the moved-file line")
        assert ("removed" if "removed" in how else "replaced") in line and "not this one" in line, line
    store.close()
    got = seqs(path)
    expect = ([1000] if how == "file replaced" else []) + list(range(20, 40))
    assert got == expect, got
    assert integrity(path) == "ok"
    ledger.lost(20, f"ticks in a recorder file removed or overwritten by hand ({how}; said)")


def _record(args: list[str], env: dict, *, drop_dac: bool) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "sparkconsole", "record", *args]
    if drop_dac:
        cmd = ["setpriv", "--inh-caps=-all", "--bounding-set=-dac_override,-dac_read_search,-fowner", "--", *cmd]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _ticks(path: Path) -> int:
    """Ticks in a file `record` is writing; the reader closed at once (an open one keeps the writer's WAL: busy)."""
    try:
        r = RecorderReader(path)
    except UserError:
        return 0                       # the writer has made the file (and its -wal), not yet its tables
    try:
        return sum(r.tick_counts().values())
    finally:
        r.close()


class Lines:
    """A process's output read in a thread, so a test can wait for a line."""

    def __init__(self, proc: subprocess.Popen) -> None:
        import threading
        self.proc, self.lines = proc, []
        self._t = threading.Thread(target=self._read, daemon=True)
        self._t.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def has(self, *words: str) -> str | None:
        return next((x for x in self.lines if all(w in x for w in words)), None)

    def stop(self) -> tuple[int, str]:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(60)
        self._t.join(10)
        return rc, "\n".join(self.lines)


@pytest.mark.fault("record: recorder directory read-only at start (no CAP_DAC_OVERRIDE), made writable mid-run")
def test_record_read_only_directory_at_start(tmp_path, ledger):
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is not installed: cannot drop CAP_DAC_OVERRIDE for the child")
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(0o555)
    env = {**os.environ, "SPARKCONSOLE_STATE_DIR": str(tmp_path / "state")}
    out = Lines(_record(["--file", str(d / "rec.sqlite"), "--duration", "120"], env, drop_dac=os.geteuid() == 0))
    try:
        line = wait(lambda: out.has("cannot write", str(d / "rec.sqlite")), 60, "the read-only line")
        assert "fix: let this user write" in line and "Traceback" not in "\n".join(out.lines), out.lines
        assert out.proc.poll() is None, "record stopped instead of running on without its file"
        d.chmod(0o755)
        wait(lambda: out.has("writing", "again"), 60, "record to resume by itself")
        wait(lambda: len(RecorderReader(d / "rec.sqlite").tick_counts()) == 1, 60, "ticks in the file")
    finally:
        d.chmod(0o755)
        rc, text = out.stop()
    ledger.output(text, "record, read-only directory")
    assert rc == 0 and "Traceback" not in text, text[-3000:]
    assert text.count("cannot write") == 1, text          # once, not per retry


@pytest.mark.fault("record: recorder directory made read-only mid-run (no CAP_DAC_OVERRIDE)")
def test_record_directory_made_read_only_mid_run_leaves_no_wal_or_shm(tmp_path, ledger):
    """Issue 40: `chmod a-w` on the directory while `record` writes: the file itself stays writable, so recording
    goes on, but removing -wal and -shm at exit is a change to the directory, and they were left behind. Now the
    owner's write bit is lifted for that moment: the file is left whole and alone, the directory's mode as it was."""
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is not installed: cannot drop CAP_DAC_OVERRIDE for the child")
    d = tmp_path / "rw"
    d.mkdir()
    path = d / "rec.sqlite"
    env = {**os.environ, "SPARKCONSOLE_STATE_DIR": str(tmp_path / "state")}
    out = Lines(_record(["--file", str(path), "--duration", "120"], env, drop_dac=os.geteuid() == 0))

    try:
        wait(lambda: Path(f"{path}-wal").exists() and _ticks(path) > 0, 60, "ticks in the file")
        d.chmod(0o555)
        ticks_before = _ticks(path)
        wait(lambda: _ticks(path) > ticks_before, 30, "ticks written after the directory went read-only")
    finally:
        rc, text = out.stop()
        mode = d.stat().st_mode & 0o777
        d.chmod(0o755)
    ledger.output(text, "record, directory made read-only mid-run")
    assert rc == 0 and "Traceback" not in text, text[-3000:]
    assert sorted(p.name for p in d.iterdir()) == ["rec.sqlite"], (list(d.iterdir()), text[-3000:])
    assert mode == 0o555 and integrity(path) == "ok"


@pytest.mark.fault("recorder's first run on a disk with 12 KiB free")
def test_first_run_on_a_nearly_full_disk_leaves_every_file_private(tmpfs, ledger):
    """Issue 40: with 12 KiB free the file was made 0644 and changed to 0600 after SQLite had made its -shm from
    it, at 0644. Now the file is 0600 before SQLite opens it, so -wal and -shm are too."""
    d = tmpfs("fs", "256k")
    filler = d / "filler"
    st = os.statvfs(d)
    filler.write_bytes(b"\0" * (st.f_bavail * st.f_frsize - 12 * 1024))
    said = Said()
    store = RecorderStore(d / "rec.sqlite", on_status=said)
    feed(store, 0, 20, time.time())
    store.flush()
    made = {p.name: p.stat().st_mode & 0o777 for p in d.iterdir() if p.name.startswith("rec.sqlite")}
    store.close()
    assert "rec.sqlite-shm" in made and set(made.values()) == {0o600}, {k: oct(v) for k, v in made.items()}
    ledger.lost(20 - store.rows_written, "ticks held on a disk with 12 KiB free, lost at exit (said)")


@pytest.mark.fault("record: recorder disk full at start (was a traceback), freed mid-run")
def test_record_full_disk_at_start(tmpfs, tmp_path, ledger):
    d = tmpfs("fs", "256k")
    filler = fill(d)
    env = {**os.environ, "SPARKCONSOLE_STATE_DIR": str(tmp_path / "state")}
    out = Lines(_record(["--file", str(d / "rec.sqlite"), "--duration", "120"], env, drop_dac=False))
    try:
        line = wait(lambda: out.has("disk is full", str(d / "rec.sqlite")), 60, "the full-disk line")
        assert "fix:" in line
        assert out.proc.poll() is None, "record stopped instead of running on without its file"
        filler.unlink()
        wait(lambda: out.has("writing", "again"), 60, "record to resume by itself")
        # what it held may be events only: the first tick can come after the file (a loaded machine's agent)
        wait(lambda: _ticks(d / "rec.sqlite") > 0, 60, "ticks in the file")
    finally:
        rc, text = out.stop()
    ledger.output(text, "record, full disk")
    assert rc == 0 and "Traceback" not in text, text[-3000:]
    assert RecorderReader(d / "rec.sqlite").tick_counts(), f"nothing recorded after the disk was freed: {text[-3000:]}"


@pytest.mark.fault("console: recorder disk full, said on screen, recording resumes")
async def test_console_says_the_recorder_is_full_and_resumes(tmpfs, tmp_path, monkeypatch, ledger):
    from sparkconsole.config import ClusterConfig, NodeConfig
    from sparkconsole.nodes.monitor import ClusterMonitor
    from sparkconsole.nodes.replay import replay_factory
    from sparkconsole.tui.app import SparkConsoleApp
    from tests.helpers import wait_for
    from tests.test_tui_app import SIZE, widget_text

    d = tmpfs("state", "256k")
    monkeypatch.setenv("SPARKCONSOLE_STATE_DIR", str(d))
    (d / "recorder").mkdir()
    filler = fill(d)
    cluster = ClusterConfig(nodes=(NodeConfig("spark1", "127.0.0.1"),), endpoints=(), source=str(tmp_path / "c.yaml"))
    mon = ClusterMonitor(cluster, transport_factory=replay_factory(
        {"spark1": str(ROOT / "tests/fixtures/agent-h100-load.jsonl")}, interval=0.1))
    app = SparkConsoleApp(cluster, monitor=mon, record=True)
    async with app.run_test(size=SIZE) as pilot:
        events = app.dashboard.events
        await wait_for(pilot, lambda: "disk is full" in widget_text(events), timeout=30, what="the full-disk line")
        assert app.recorder is not None
        await wait_for(pilot, lambda: app.monitor.nodes["spark1"].last is not None, timeout=30,
                       what="the console running on without its recorder")
        filler.unlink()
        await wait_for(pilot, lambda: "again" in widget_text(events), timeout=30, what="recording resumed, said")
        text = widget_text(events)
        await app.action_quit()
    ledger.output(text, "console events pane")
    assert text.count("disk is full") == 1, text
    path = next((d / "recorder").glob("*.sqlite"))
    assert RecorderReader(path).tick_counts().get("spark1", 0) > 0


@pytest.mark.fault("recorder file truncated while recording")
def test_file_truncated_while_recording(tmp_path, ledger, monkeypatch):
    from sparkconsole.recorder import store as store_mod
    # A retention pass after every batch, the last one included: the WAL is then in the file, and the file's size
    # noted, when the cut comes. (Every 60 s, the pass that followed the first batch was the only one when the
    # 6,000 rows took more than one batch to arrive, as on a loaded machine: the WAL never emptied.)
    monkeypatch.setattr(store_mod, "RETENTION_EVERY_S", 0.0)
    store, said, path, t0 = recording_in(tmp_path, 6000)
    wait(lambda: not Path(f"{path}-wal").exists() or Path(f"{path}-wal").stat().st_size == 0, 90,
         "a retention pass to checkpoint the WAL into the file")
    os.truncate(path, path.stat().st_size // 2)
    feed(store, 6000, 10, t0)
    store.flush()
    store.close()
    line = said.has(str(path), "cut short", "readable rows", "unreadable")
    assert line and len(said) == 1, said
    got = seqs(path)
    assert got[-10:] == list(range(6000, 6010)) and got[0] == 0      # the new ticks, after the readable old ones
    r = RecorderReader(path)
    try:
        assert r.gap_texts(), "the file does not say what the cut took"
    finally:
        r.close()
    ledger.lost(6010 - len(got), "ticks in the truncated half of a recorder file (said)")


@pytest.mark.fault("recorder disk full past the memory cap of held rows, then freed")
def test_full_past_the_memory_cap_drops_the_oldest_and_says_so(tmpfs, monkeypatch, ledger):
    from sparkconsole.recorder import store as store_mod
    monkeypatch.setattr(store_mod, "MAX_PENDING", 30)
    d = tmpfs("fs")
    filler = fill(d)
    said = Said()
    path = d / "rec.sqlite"
    store = RecorderStore(path, on_status=said)
    wait(lambda: said.has("disk is full"), 10, "the full-disk line")
    feed(store, 0, 50, time.time())
    store.flush()
    wait(lambda: said.has("memory cap", str(path)), 10, "the memory-cap line")
    filler.unlink()
    line = wait(lambda: said.has("writing", "again"), 20, "the writer to resume")
    store.close()
    assert "the 30 rows held" in line and "20 older rows were dropped (recorded " in line, line
    assert seqs(path) == list(range(20, 50)) and store.rows_dropped == 20
    ledger.lost(store.rows_dropped, "ticks held past the memory cap while the disk was full (said, with their times)")
