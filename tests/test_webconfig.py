"""The web config file (node_exporter's `--web.config.file` format) for `exporter` and `serve`: what loads, and each
mistake as one line naming the file, the line, the field and the fix — in the library and from the real command."""

from __future__ import annotations

import asyncio
import base64
import os
import ssl
import subprocess
import sys
import time

import pytest

from sparkconsole.errors import UserError
from sparkconsole.exporter.access import MAX_WAITING, SLOTS, Access, BasicUsers, Busy, parse_basic
from sparkconsole.exporter.listener import make_listener
from sparkconsole.exporter.webconfig import read_web_config
from tests.helpers import error_lines
from tests.tlsca import TestCA, bcrypt_hash


@pytest.fixture(scope="module")
def ca(tmp_path_factory):
    d = tmp_path_factory.mktemp("ca")
    ca = TestCA(d)
    ca.server = ca.issue("server")
    return ca


# a real bcrypt hash (cost 04): the costs above are put into it
CHECKED_HASH = "$2b$04$" + "N9qo8uLOickgx2ZMRZoMye" + "IjZAgcfl7p92ldGxad68LJZdL17lhWy"


def write(tmp_path, text: str, name: str = "web.yml"):
    p = tmp_path / name
    p.write_text(text)
    return p


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_full_config_loads(ca, tmp_path):
    """Relative paths from the config's own directory (as the toolkit reads them), TLS 1.3 only, mTLS, users,
    headers; the listener's URLs say https."""
    client_ca = ca.dir / "ca.crt"
    cfg = write(ca.dir, f"""\
tls_server_config:
  cert_file: server.crt
  key_file: {ca.server.key}
  min_version: TLS13
  client_auth_type: RequireAndVerifyClientCert
  client_ca_file: {client_ca.name}
http_server_config:
  http2: false
  headers:
    X-Frame-Options: deny
    Strict-Transport-Security: max-age=31536000
basic_auth_users:
  alice: {bcrypt_hash("alice-password")}
  bob: "$2y$10$hLqFl9jSjoAAy95Z/zw8Ye8wkdMBM8c5Bn1ptYqP/AXyV0.oy0S8m"
""", "full.yml")
    wc = read_web_config(cfg)
    assert wc.ssl_context is not None and wc.client_certs
    assert wc.ssl_context.minimum_version == ssl.TLSVersion.TLSv1_3
    assert wc.ssl_context.verify_mode == ssl.CERT_REQUIRED
    assert set(wc.users) == {"alice", "bob"}
    assert wc.headers == {"X-Frame-Options": "deny", "Strict-Transport-Security": "max-age=31536000"}
    listener = make_listener("127.0.0.1:9835", web_config_file=str(cfg))
    assert listener.tls and listener.url("/metrics") == "https://127.0.0.1:9835/metrics"
    assert listener.access.required and listener.access.token is None
    assert listener.describe() == "basic auth required; client certificate required"
    # Off loopback, required client certificates ask who comes in, as a token or users do; TLS alone does not.
    make_listener("0.0.0.0:9835", web_config_file=str(cfg)).refuse_open_network("unused")
    tls_only = write(ca.dir, "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n", "tls-only.yml")
    with pytest.raises(UserError, match="^--exporter: 0.0.0.0 is reachable .* no token was given"):
        make_listener("0.0.0.0:9835", web_config_file=str(tls_only), field="--exporter").refuse_open_network("give one")
    # An empty file configures nothing, as in the toolkit.
    empty = make_listener("127.0.0.1:9835", web_config_file=str(write(tmp_path, "")))
    assert not empty.tls and empty.url() == "http://127.0.0.1:9835" and not empty.access.required


BAD = [
    # (file text, what the line must name, a word of its fix)
    ("tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  cert_fiel: x\n",
     "tls_server_config.cert_fiel", "did you mean cert_file?"),
    ("tls_config:\n  cert_file: server.crt\n", "tls_config", "use one of tls_server_config"),
    ("tls_server_config:\n  cert_file: server.crt\n", "tls_server_config", "key_file"),
    ("tls_server_config:\n  cert_file: nowhere.crt\n  key_file: server.key\n",
     "tls_server_config.cert_file", "readable PEM file"),
    ("tls_server_config:\n  cert_file: server.crt\n  key_file: ca.crt\n", "tls_server_config.cert_file",
     "private key that belongs to it"),
    ("tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  min_version: TLS14\n",
     "tls_server_config.min_version", "TLS12 or TLS13"),
    ("tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  min_version: TLS13\n"
     "  max_version: TLS12\n", "tls_server_config.min_version", "lower min_version"),
    ("tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  client_auth_type: RequireAnyClientCert\n"
     "  client_ca_file: ca.crt\n", "tls_server_config.client_auth_type", "RequireAndVerifyClientCert"),
    ("tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
     "  client_auth_type: RequireAndVerifyClientCert\n", "tls_server_config.client_auth_type", "client_ca_file"),
    ("tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  client_ca_file: ca.crt\n",
     "tls_server_config.client_auth_type", "RequireAndVerifyClientCert"),
    ("tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  cipher_suites: [TLS_AES_128_GCM_SHA256]\n",
     "tls_server_config.cipher_suites", "OpenSSL's default ciphers"),
    ("basic_auth_users:\n  alice: hunter2\n", "basic_auth_users.alice", "bcrypt"),
    # bcrypt reads costs 04-31 only: these were accepted, and every login was then a 401 with nothing logged
    *((f"basic_auth_users:\n  bob: {CHECKED_HASH[:4]}{cost}{CHECKED_HASH[6:]}\n", "basic_auth_users.bob",
       "cost from 04 to 31") for cost in ("99", "03", "00", "32")),
    (f"basic_auth_users:\n  carol: $2${CHECKED_HASH[4:]}\n", "basic_auth_users.carol", "bcrypt"),
    ("basic_auth_users: [alice]\n", "basic_auth_users", "alice: $2b$10$"),
    ("http_server_config:\n  headers:\n    X-Powered-By: me\n", "http_server_config.headers.X-Powered-By",
     "use one of Content-Security-Policy"),
    ("rate_limit:\n  interval: 1s\n  burst: 20\n", "rate_limit", "reverse proxy"),
    ("tls_server_config: [\n", "", "YAML syntax"),
]


@pytest.mark.parametrize("text,field,fix", BAD, ids=[b[1] or "yaml" for b in BAD])
def test_each_mistake_is_one_line_with_file_field_and_fix(ca, text, field, fix):
    cfg = write(ca.dir, text, "bad.yml")
    with pytest.raises(UserError) as e:
        read_web_config(cfg)
    line = str(e.value)
    assert "\n" not in line and line.startswith(str(cfg) + ":"), line
    assert f": {field}: " in line or not field, line
    if "cost" in fix:                                 # the line names the user who could never log in
        assert "user bob could never log in" in line, line
    assert "fix:" in line and fix in line.split("fix:", 1)[1], line


def test_an_encrypted_key_is_refused_without_asking_for_a_passphrase(ca):
    from cryptography.hazmat.primitives import serialization
    key = serialization.load_pem_private_key(ca.server.key.read_bytes(), None)
    (ca.dir / "locked.key").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"passphrase")))
    cfg = write(ca.dir, "tls_server_config:\n  cert_file: server.crt\n  key_file: locked.key\n", "locked.yml")
    with pytest.raises(UserError, match=r"key_file: the key is encrypted .* fix: decrypt it"):
        read_web_config(cfg)


def test_cli_says_each_mistake_in_one_line(ca, tmp_path):
    """The real commands: a web config mistake, an unreadable web config, and a network address with neither a
    token nor users, each one line on stderr, exit 2, no traceback."""
    bad = write(ca.dir, "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  min_verison: TLS13\n",
                "typo.yml")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPARKCONSOLE_")}
    env["SPARKCONSOLE_STATE_DIR"] = str(tmp_path / "state")
    runs = [(["exporter", "--web-config-file", str(bad)], f"{bad}:4: tls_server_config.min_verison: unknown field"),
            (["serve", "--web-config-file", str(bad)], f"{bad}:4: tls_server_config.min_verison: unknown field"),
            (["exporter", "--web-config-file", str(tmp_path / "none.yml")], f"{tmp_path / 'none.yml'}: file not found"),
            (["exporter", "--listen", "0.0.0.0:9835", "--web-config-file",
              str(write(ca.dir, "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n", "tls.yml"))],
             "--listen: 0.0.0.0 is reachable from the network and no token was given")]
    for argv, want in runs:
        r = subprocess.run([sys.executable, "-m", "sparkconsole", *argv], capture_output=True, text=True,
                           cwd=tmp_path, env=env, timeout=60)
        lines = error_lines(r.stderr)
        assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, (argv, r.stderr)
        assert lines[0].startswith("sparkconsole: " + want) and "fix:" in lines[0], (argv, lines)


async def test_a_renewed_certificate_is_served_from_the_next_connection(tmp_path, caplog):
    """Renewal as certbot or cert-manager does it (new files renamed into place): the next handshake gets the new
    certificate without a restart; a renewal that does not load keeps the last good one, said once in the log."""
    from aiohttp import web

    from sparkconsole.exporter.listen import QuietRunner
    from sparkconsole.exporter.listener import start_site
    ca = TestCA(tmp_path / "pki")
    first = ca.issue("server")
    cfg = write(ca.dir, "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n")
    listener = make_listener("127.0.0.1:0", web_config_file=str(cfg))
    runner = QuietRunner(web.Application(), access_log=None)
    await runner.setup()
    port = await start_site(runner, listener)
    client = ssl.create_default_context(cafile=str(ca.ca_file))

    def served() -> str:
        import socket
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
                client.wrap_socket(raw, server_hostname="127.0.0.1") as s:
            return dict(x[0] for x in s.getpeercert()["subject"])["commonName"]
    try:
        assert await asyncio.to_thread(served) == "server"
        renewed = ca.issue("renewed")
        os.replace(renewed.key, first.key)
        os.replace(renewed.cert, first.cert)
        assert await asyncio.to_thread(served) == "renewed"
        broken = ca.dir / "broken.crt"
        broken.write_text("-----BEGIN CERTIFICATE-----\nnot one\n-----END CERTIFICATE-----\n")
        os.replace(broken, first.cert)
        with caplog.at_level("WARNING", logger="sparkconsole.webconfig"):
            assert await asyncio.to_thread(served) == "renewed"
            assert await asyncio.to_thread(served) == "renewed"
        said = [r.getMessage() for r in caplog.records if r.name == "sparkconsole.webconfig"]
        assert len(said) == 1 and "serving the last good one" in said[0] and "cert_file" in said[0], said
    finally:
        await runner.cleanup()


def test_basic_auth_header_parsing():
    assert parse_basic(basic("alice", "pa:ss")) == ("alice", b"pa:ss")
    assert parse_basic("basic " + base64.b64encode(b"\xff:\xfe").decode()) == ("\udcff", b"\xfe")
    for bad in (None, "", "Bearer abc", "Basic !!!", "Basic " + base64.b64encode(b"no-colon").decode()):
        assert parse_basic(bad) is None


async def test_a_verified_password_costs_one_bcrypt_not_one_per_request():
    """The cache: the right password is bcrypt-checked once and then remembered (as an HMAC, not the password);
    a wrong password or user is checked every time; an unknown user costs a bcrypt too (no faster answer)."""
    users = BasicUsers({"alice": bcrypt_hash("right").encode()})
    access = Access(token="a-bearer-token-0123456789", users=users)
    assert not await access.allows(None)
    for _ in range(20):
        assert await access.allows(basic("alice", "right"))
    assert users.bcrypt_runs == 1
    assert b"right" not in b"".join(users._verified)
    for _ in range(3):
        assert not await access.allows(basic("alice", "wrong"))       # checked once, then remembered as wrong
    assert users.bcrypt_runs == 2
    assert not await access.allows(basic("alice", "wrong again"))
    assert users.bcrypt_runs == 3
    assert not await access.allows(basic("mallory", "right"))
    assert users.bcrypt_runs == 4
    assert not await access.allows(basic("alice", "x" * 100))        # past bcrypt's 72 bytes: refused, no error
    assert await access.allows("Bearer a-bearer-token-0123456789")
    # Concurrent checks of a wrong password all answer (in worker threads, two at a time).
    got = await asyncio.gather(*(access.allows(basic("alice", f"w{i}")) for i in range(6)))
    assert got == [False] * 6
    assert [v for _, v in access.challenge()] == ['Basic realm="sparkconsole", charset="UTF-8"',
                                                   'Bearer realm="sparkconsole"']


class Clients:
    """16 clients sending wrong passwords for alice as fast as they are answered (a 429 waits 10 ms, as a client
    honouring Retry-After a little would): each its own password, or a new one every time. Every bcrypt check is
    noted in the order it starts, so a login's wait is counted in checks that ran before it, not in seconds."""

    def __init__(self, access: Access, users: BasicUsers, *, new_password_each_time: bool) -> None:
        self.access, self.users, self.new = access, users, new_password_each_time
        self.started: list[bytes] = []
        self.answered = [0] * 16
        self.busy = 0
        self.most_checks = 0
        self.stop = asyncio.Event()
        check = users._check

        def noted(password: bytes, hashed: bytes) -> bool:
            self.started.append(password)
            return check(password, hashed)
        users._check = noted

    async def client(self, i: int) -> None:
        n = 0
        while not self.stop.is_set():
            n += 1
            try:
                assert not await self.access.allows(basic("alice", f"wrong-{i}-{n if self.new else 0}"))
                self.answered[i] += 1
                await asyncio.sleep(0)                    # a remembered answer comes without a wait: let others run
            except Busy:
                self.busy += 1
                await asyncio.sleep(0.01)
            self.most_checks = max(self.most_checks, len(self.users._running))

    async def login_while_they_run(self) -> tuple[bool | None, int]:
        """(the real login's outcome: True, or None for a 429; checks that started after it came, before its own)."""
        tasks = [asyncio.ensure_future(self.client(i)) for i in range(16)]
        try:
            deadline = time.monotonic() + 60
            while min(self.answered) < 2:                 # every client answered twice: the queue is as full as it gets
                assert time.monotonic() < deadline, f"answers per client after 60 s: {self.answered}"
                await asyncio.sleep(0.01)
            before = len(self.started)
            try:
                ok: bool | None = await self.access.allows(basic("alice", "right"))
            except Busy:
                return None, 0
            return ok, self.started.index(b"right") - before
        finally:
            self.stop.set()
            await asyncio.gather(*tasks)


async def test_a_new_login_is_not_queued_behind_clients_repeating_wrong_passwords():
    """Issue 40: 16 clients with wrong passwords delayed a real login by 2.9-4.3 s, queued behind their bcrypt
    checks. A wrong pair is now checked once and remembered (as exporter-toolkit does): the login's check is the
    next one to run."""
    users = BasicUsers({"alice": bcrypt_hash("right", cost=6).encode()})
    clients = Clients(Access(users=users), users, new_password_each_time=False)
    ok, ahead = await clients.login_while_they_run()
    assert ok is True and ahead == 0, (ok, ahead)
    assert users.bcrypt_runs <= 16 + 1 and clients.started.count(b"right") == 1


async def test_clients_trying_new_passwords_queue_a_bounded_number_of_checks_the_rest_answered_429():
    """Each request a new wrong password: at most SLOTS checks run and MAX_WAITING wait; a request past them is
    answered at once (Busy: a 429). A real login then waits for at most those, or is answered 429 at once."""
    users = BasicUsers({"alice": bcrypt_hash("right", cost=6).encode()})
    clients = Clients(Access(users=users), users, new_password_each_time=True)
    ok, ahead = await clients.login_while_they_run()
    assert clients.most_checks <= SLOTS + MAX_WAITING and clients.busy > 0
    assert ok is None or (ok is True and ahead <= SLOTS + MAX_WAITING), (ok, ahead)


async def test_the_listener_answers_429_at_once_when_the_password_checks_are_full():
    """Over HTTP (the exporter's app, as `serve` shares the rule): with every slot and queue place taken by checks
    held at a gate, one more password is answered 429 with Retry-After, before any of them ends; then all end 401."""
    import threading

    import aiohttp
    from aiohttp import web
    from prometheus_client import CollectorRegistry

    from sparkconsole.exporter.server import make_app
    users = BasicUsers({"alice": bcrypt_hash("right").encode()})
    gate = threading.Event()
    check = users._check

    def held(password: bytes, hashed: bytes) -> bool:
        gate.wait(30)
        return check(password, hashed)
    users._check = held
    runner = web.AppRunner(make_app(CollectorRegistry(), Access(users=users)))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/metrics"
    try:
        async with aiohttp.ClientSession() as session:
            async def get(password: str) -> tuple[int, str | None]:
                async with session.get(url, headers={"Authorization": basic("alice", password)}) as r:
                    return r.status, r.headers.get("Retry-After")
            waiting = [asyncio.ensure_future(get(f"w{i}")) for i in range(SLOTS + MAX_WAITING)]
            deadline = time.monotonic() + 30
            while len(users._running) < SLOTS + MAX_WAITING:
                assert time.monotonic() < deadline, f"{len(users._running)} checks under way after 30 s"
                await asyncio.sleep(0.01)
            assert await get("one more") == (429, "1")
            assert not any(t.done() for t in waiting)
            gate.set()
            assert [status for status, _ in await asyncio.gather(*waiting)] == [401] * (SLOTS + MAX_WAITING)
            assert (await get("right"))[0] == 200
    finally:
        gate.set()
        await runner.cleanup()


def test_the_options_import_nothing_heavy():
    """An argument error in `serve`'s listener options is answered before aiohttp or bcrypt is imported."""
    from tests.test_cli import heavy, imported
    p, mods = imported("serve", "--web-config-file")
    assert p.returncode == 2 and "expected one argument" in p.stderr
    assert "sparkconsole.exporter.listenargs" in mods and heavy(mods) == [] and "bcrypt" not in mods, heavy(mods)
