"""Transport over real OpenSSH servers on loopback (tests/testbed/sshd.py) and on this machine."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

from sparkconsole.config import NodeConfig, SshPolicy
from sparkconsole.errors import UserError
from sparkconsole.nodes.connect import make_transport
from sparkconsole.nodes.ssh import SshTransport
from sparkconsole.nodes.transport import LocalTransport, TransportError, to_command

pytestmark = pytest.mark.sshd


def fingerprint(pub: Path) -> str:
    return subprocess.run(["ssh-keygen", "-lf", str(pub), "-E", "sha256"], capture_output=True, text=True,
                          check=True).stdout.split()[1]


def node_transport(cluster, i=0, **policy) -> SshTransport:
    cfg = cluster.cluster_config(**policy)
    t = make_transport(cfg.nodes[i], cfg.ssh)
    assert isinstance(t, SshTransport)
    return t


def procs_with(marker: str) -> list[int]:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        if marker in " ".join(p.info["cmdline"] or []):
            out.append(p.pid)
    return out


async def wait_gone(marker: str, timeout: float = 5.0) -> list[int]:
    for _ in range(int(timeout / 0.05)):
        left = procs_with(marker)
        if not left:
            return []
        await asyncio.sleep(0.05)
    return procs_with(marker)


async def test_run_quotes_every_argument(sshd_nodes):
    t = node_transport(sshd_nodes)
    try:
        args = ["a b", "$HOME", "it's", "; touch /tmp/x", "`id`", "*", "", "new\nline"]
        r = await t.run(["printf", "[%s]\\n", *args])
        assert r.rc == 0 and r.stdout == "".join(f"[{a}]\n" for a in args)
        r = await t.run("cat; echo err >&2; exit 3", input=b"payload\n")
        assert (r.rc, r.stdout, r.stderr) == (3, "payload\n", "err\n")
        assert t.connected
    finally:
        await t.close()
    assert not t.connected


async def test_run_timeout_is_a_transport_error_and_leaves_no_process(sshd_nodes):
    t = node_transport(sshd_nodes)
    marker = f"sleep-{uuid.uuid4().hex[:8]}"
    try:
        with pytest.raises(TransportError, match="timed out"):
            await t.run(["bash", "-c", f"exec -a {marker} sleep 30"], timeout=0.5)
    finally:
        await t.close()
    assert await wait_gone(marker) == []


async def test_stream_lines_and_close_ends_the_remote_command(sshd_nodes):
    t = node_transport(sshd_nodes, i=1)
    marker = f"stream-{uuid.uuid4().hex[:8]}"
    try:
        s = t.stream(["python3", "-u", "-c", "import sys,time\nfor i in range(10**6):\n print(i); time.sleep(0.02)",
                      marker])
        got = []
        async for line in s:
            got.append(line)
            if len(got) == 5:
                break
        assert got == ["0", "1", "2", "3", "4"]
        assert procs_with(marker)
        await s.close()
        assert await wait_gone(marker) == []
    finally:
        await t.close()


async def test_stream_drops_overlong_lines_and_counts_them(sshd_nodes):
    t = node_transport(sshd_nodes)
    try:
        s = t.stream(["python3", "-c", "print('a'); print('x' * (2 << 20)); print('b')"])
        lines = [line async for line in s]
        assert lines == ["a", "b"] and s.overlong == 1
        await s.close()
        assert s.returncode == 0
    finally:
        await t.close()


async def test_host_key_mismatch_is_refused_with_the_offered_fingerprint(sshd_nodes, tmp_path):
    n1, n2 = sshd_nodes[0], sshd_nodes[1]
    # known_hosts vouches for node2's key at node1's address: node1 then offers a different key.
    algo, blob = n2.host_key.with_suffix(".pub").read_text().split()[:2]
    kh = tmp_path / "known_hosts"
    kh.write_text(f"[{n1.address}]:{n1.port} {algo} {blob}\n")
    t = node_transport(sshd_nodes, known_hosts=str(kh), trust_on_first_use=True)
    t.confirm_new_host = lambda host, fp: pytest.fail("a mismatch must never be offered for trust")
    with pytest.raises(UserError) as ei:
        await t.connect()
    msg = str(ei.value)
    assert "\n" not in msg and "mismatch" in msg and f"{n1.address}:{n1.port}" in msg
    assert fingerprint(n1.host_key.with_suffix(".pub")) in msg
    assert kh.read_text() == f"[{n1.address}]:{n1.port} {algo} {blob}\n"
    assert not t.connected


async def test_unknown_host_refused_without_trust_on_first_use(sshd_nodes, tmp_path):
    kh = tmp_path / "known_hosts"
    t = node_transport(sshd_nodes, known_hosts=str(kh))
    with pytest.raises(UserError, match="unknown host key") as ei:
        await t.connect()
    assert fingerprint(sshd_nodes[0].host_key.with_suffix(".pub")) in str(ei.value)
    assert not kh.exists()


async def test_trust_on_first_use_writes_known_hosts_only_after_confirmation(sshd_nodes, tmp_path):
    n1 = sshd_nodes[0]
    kh = tmp_path / "known_hosts"
    asked = []
    t = node_transport(sshd_nodes, known_hosts=str(kh), trust_on_first_use=True)

    t.confirm_new_host = lambda host, fp: asked.append((host, fp)) or False
    with pytest.raises(UserError, match="unknown host key"):
        await t.connect()
    assert asked == [(f"{n1.address}:{n1.port}", fingerprint(n1.host_key.with_suffix(".pub")))]
    assert not kh.exists()

    async def yes(host, fp):       # the TUI asks in a modal: an awaitable answer
        asked.append((host, fp))
        return True
    t.confirm_new_host = yes
    await t.connect()
    assert len(asked) == 2 and (await t.run(["true"])).rc == 0
    await t.close()
    line = kh.read_text()
    assert line.startswith(f"[{n1.address}]:{n1.port} ssh-ed25519 ")
    assert line.split()[2] == n1.host_key.with_suffix(".pub").read_text().split()[1]

    await t.connect()               # now known: no second question
    assert len(asked) == 2
    await t.close()


async def test_wrong_user_key_is_a_user_error_naming_the_host(sshd_nodes, tmp_path):
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    cfg = sshd_nodes.cluster_config()
    node = cfg.nodes[0]
    node = replace(node, ssh=replace(node.ssh, identity=str(other)))
    t = SshTransport(node, cfg.ssh)
    with pytest.raises(UserError) as ei:
        await t.connect()
    assert f"{node.address}:{node.ssh.port}" in str(ei.value) and "refused" in str(ei.value)


async def test_unreachable_node_is_a_transport_error():
    with __import__("socket").socket() as s:
        s.bind(("127.0.0.4", 0))
        port = s.getsockname()[1]            # bound, never listening: connection refused
        node = NodeConfig(name="gone", address="127.0.0.4", ssh=replace(NodeConfig("x", "y").ssh, port=port))
        t = make_transport(node, SshPolicy(connect_timeout_s=2))
        with pytest.raises(TransportError) as ei:
            await t.connect()
    assert "gone" in str(ei.value) and "unreachable" in str(ei.value) and "\n" not in str(ei.value)


async def test_local_transport_adds_node_env_and_runs_argv_without_a_shell():
    node = NodeConfig(name="here", address="127.0.0.1", local=True, env=(("SPARK_TEST_VAR", "x y"),))
    t = make_transport(node, SshPolicy())
    assert isinstance(t, LocalTransport) and t.python == sys.executable
    r = await t.run(["sh", "-c", 'printf "%s|%s" "$SPARK_TEST_VAR" "$1"', "sh", "$HOME;"])
    assert r.stdout == "x y|$HOME;"
    r = await t.run("echo $SPARK_TEST_VAR; exit 4")
    assert (r.rc, r.stdout) == (4, "x y\n")
    marker = f"local-{uuid.uuid4().hex[:8]}"
    s = t.stream(["bash", "-c", f"exec -a {marker} sleep 30"])
    reader = asyncio.ensure_future(s.__anext__())
    await asyncio.sleep(0.3)
    assert procs_with(marker)
    await s.close()
    reader.cancel()
    assert await wait_gone(marker) == []


async def test_a_close_whose_caller_is_cancelled_still_ends_the_command():
    # A monitor stopped twice cancels its own teardown: the closing must go on (stdin end-of-file, TERM, then
    # KILL) rather than leave a command that ignores both running with nobody left to end it.
    t = LocalTransport(NodeConfig(name="here", address="127.0.0.1", local=True))
    marker = f"stubborn-{uuid.uuid4().hex[:8]}"
    s = t.stream([sys.executable, "-c", "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                  "print('up', flush=True); time.sleep(120)", marker])
    assert await s.__anext__() == "up"
    closing = asyncio.ensure_future(s.close())
    await asyncio.sleep(0.5)                    # inside the closer's wait for the command to end
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing
    assert procs_with(marker)                   # it ignores end-of-file and TERM: only the KILL, ~4 s on, ends it
    assert await wait_gone(marker, timeout=30) == []
    await asyncio.wait_for(s.close(), 10)       # a later close waits on the same closing, already done
    assert s.returncode == -9


def test_to_command_quotes_lists_and_keeps_snippets():
    assert to_command(["echo", "a b", "$X"]) == "echo 'a b' '$X'"
    assert to_command("echo $X | wc -c") == "echo $X | wc -c"


@pytest.mark.parametrize("split_at", [1, 3, 7, 64])
async def test_line_stream_splits_lines_across_any_chunking(split_at):
    from sparkconsole.nodes.transport import LineStream
    data = b"one\n\ntwo\xff\n" + b"x" * 40 + b"\nthree\n" + b"y" * 25 + b"\nfour"
    chunks = [data[i:i + split_at] for i in range(0, len(data), split_at)] + [b""]

    async def read():
        return chunks.pop(0) if chunks else b""

    async def close():
        pass
    s = LineStream(read, close, lambda: 0, max_line=20)
    assert [line async for line in s] == ["one", "", "two\ufffd", "three", "four"]
    assert s.overlong == 2


async def test_line_stream_drops_a_line_that_never_ends_but_keeps_one_merely_long():
    """A line past max_line is skipped and the next line still arrives; one still unended past endless_line raises,
    so a node printing without a newline cannot keep the console reading (and decrypting) forever."""
    from sparkconsole.nodes.transport import LineStream, TransportError

    def stream(data: bytes) -> LineStream:
        chunks = [data[i:i + 7] for i in range(0, len(data), 7)] + [b""]

        async def read():
            return chunks.pop(0) if chunks else b""

        async def close():
            pass
        return LineStream(read, close, lambda: 0, max_line=20, endless_line=100)
    long = stream(b"a\n" + b"x" * 99 + b"\nb\n")
    assert [line async for line in long] == ["a", "b"] and long.overlong == 1
    endless = stream(b"a\n" + b"x" * 200)
    got = []
    with pytest.raises(TransportError, match="unended after 10[0-9] bytes"):
        async for line in endless:
            got.append(line)
    assert got == ["a"]
