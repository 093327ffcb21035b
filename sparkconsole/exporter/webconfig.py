"""The web config file (`--web-config-file`): TLS and basic auth for `exporter` and `serve`, in the format of the
Prometheus exporter toolkit (node_exporter's `--web.config.file`), so one file serves both kinds of listener:

    tls_server_config: {cert_file, key_file, client_ca_file, client_auth_type, min_version, max_version}
    http_server_config: {headers: {...}}
    basic_auth_users: {user: bcrypt-hash}

Read at start into an `ssl.SSLContext`, the users' hashes and the response headers. Relative paths are read
from the config file's directory, as the toolkit reads them. A renewed certificate is served from the next
connection on: each TLS handshake looks at the files' change times (a stat each) and, when one changed, the
config is read again; a reading that fails (a half-written renewal) keeps the last good certificate and says so
once in the log. Users, headers and the client CA are read at start only. What the toolkit has and Python's `ssl` cannot do
(Go's cipher and curve names, a client certificate requested but not verified, inline PEM keys) is refused with
the fix, never ignored: a setting that silently does nothing is worse than none. Every mistake is one line naming
the file, its line, the field and the fix.
"""

from __future__ import annotations

import difflib
import logging
import os
import re
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import UserError
from ..yamlsrc import Located, Path_, load_file

TLS_VERSIONS = {"TLS10": ssl.TLSVersion.TLSv1, "TLS11": ssl.TLSVersion.TLSv1_1,
                "TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
# The toolkit's client_auth_type values Python's ssl can honour; the two that accept an unverified certificate
# (RequestClientCert, RequireAnyClientCert) have no equivalent there, and the toolkit calls them insecure.
CLIENT_AUTH = {"NoClientCert": ssl.CERT_NONE, "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
               "RequireAndVerifyClientCert": ssl.CERT_REQUIRED}
HEADERS = ("Content-Security-Policy", "X-Frame-Options", "X-Content-Type-Options", "X-XSS-Protection",
           "Strict-Transport-Security")
BCRYPT_HASH = re.compile(r"^\$2[abxy]\$(\d\d)\$[./A-Za-z0-9]{53}$")
# bcrypt reads costs 04-31 only: with any other, every login would be a silent 401.
BCRYPT_COSTS = range(4, 32)
HASH_FIX = ("put a bcrypt hash here, e.g. from "
            "`python3 -c 'import bcrypt, getpass; print(bcrypt.hashpw(getpass.getpass().encode(), bcrypt.gensalt()).decode())'`"
            " or `htpasswd -nBC 10 \"\" | tr -d ':\\n'`")

TOP = ("tls_server_config", "http_server_config", "basic_auth_users")
TLS_KEYS = ("cert_file", "key_file", "client_ca_file", "client_auth_type", "min_version", "max_version",
            "prefer_server_cipher_suites")
HTTP_KEYS = ("http2", "headers")
UNSUPPORTED = {
    "rate_limit": "remove it: sparkconsole answers every request from memory (a reverse proxy can limit rates)",
    "cert": "write the certificate to a file and name it in cert_file",
    "key": "write the key to a file readable only by you and name it in key_file",
    "client_ca": "write the CA certificate to a file and name it in client_ca_file",
    "cipher_suites": "remove it: sparkconsole uses OpenSSL's default ciphers (Go's cipher names do not apply)",
    "curve_preferences": "remove it: sparkconsole uses OpenSSL's default curves (Go's curve names do not apply)",
    "client_allowed_sans": "remove it and give each client its own certificate from the client CA",
}


@dataclass(frozen=True)
class WebConfig:
    file: str
    ssl_context: ssl.SSLContext | None = None
    users: dict[str, bytes] = field(default_factory=dict)     # user -> bcrypt hash
    headers: dict[str, str] = field(default_factory=dict)     # added to every response
    client_certs: bool = False                                # mTLS: a verified client certificate is asked for
    tls_files: tuple[str, ...] = ()                           # the certificate and key files, as resolved


def read_web_config(path: str | Path, *, reload_certificates: bool = True) -> WebConfig:
    """The file at `path` as a WebConfig; a one-line UserError for anything wrong in it or in the files it names."""
    doc = load_file(Path(path).expanduser())
    data = doc.data
    if data is None:
        return WebConfig(doc.file)          # an empty file configures nothing, as in the toolkit
    _mapping(doc, (), data, TOP)
    tls = data.get("tls_server_config")
    ctx, mtls, files = _tls_context(doc, tls) if tls is not None else (None, False, ())
    if ctx is not None and reload_certificates:
        ctx.sni_callback = _Renewals(doc.file, ctx, files)
    return WebConfig(doc.file, ctx, _users(doc, data.get("basic_auth_users")),
                     _headers(doc, data.get("http_server_config")), mtls, files)


class _Renewals:
    """The SSL context's servername callback (OpenSSL calls it on every handshake, with or without SNI): when the
    config or a file it names changed, the connection gets a context read afresh (its certificate and key)."""

    def __init__(self, file: str, ctx: ssl.SSLContext, files: tuple[str, ...]) -> None:
        self.file = file
        self.files = (file, *files)
        self.current = ctx
        self.stamp = self._stamp()

    def _stamp(self) -> tuple[tuple[int, int, int], ...]:
        out = []
        for name in self.files:
            try:
                st = os.stat(name)
                out.append((st.st_mtime_ns, st.st_ino, st.st_size))     # a renewal renamed into place: a new inode
            except OSError:
                out.append((-1, -1, -1))
        return tuple(out)

    def __call__(self, conn: ssl.SSLObject, server_name: str | None, ctx: ssl.SSLContext) -> None:
        stamp = self._stamp()
        if stamp != self.stamp:
            try:
                fresh = read_web_config(self.file, reload_certificates=False)
            except UserError as exc:
                logging.getLogger("sparkconsole.webconfig").warning(
                    "the changed certificate does not load, serving the last good one: %s", exc)
            else:
                if fresh.ssl_context is not None:
                    self.current, self.files = fresh.ssl_context, (self.file, *fresh.tls_files)
            self.stamp = self._stamp()
        if self.current is not ctx:
            conn.context = self.current


def _mapping(doc: Located, path: Path_, value: Any, known: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise doc.error(path, "must be a mapping", fix="write `key: value` lines under it (exporter-toolkit format)")
    for key in value:
        if key in UNSUPPORTED:
            raise doc.error(path + (key,), "not supported by sparkconsole", fix=UNSUPPORTED[key])
        if key not in known:
            near = difflib.get_close_matches(str(key), known, n=1)
            raise doc.error(path + (key,), "unknown field", fix=(f"did you mean {near[0]}? " if near else "")
                            + f"use one of {', '.join(known)}, or remove it")
    return value


def _string(doc: Located, path: Path_, value: Any, fix: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise doc.error(path, "must be a non-empty string", fix=fix)
    return value.strip()


def _file(doc: Located, path: Path_, value: Any) -> str:
    """A file the config names, relative to the config's own directory; it must exist and be readable."""
    name = _string(doc, path, value, fix="give the path of a PEM file")
    p = Path(name).expanduser()
    if not p.is_absolute():
        p = Path(doc.file).parent / p
    try:
        with p.open("rb"):
            pass
    except OSError as exc:
        raise doc.error(path, f"cannot read {p} ({exc.strerror or exc})",
                        fix="give the path of a readable PEM file (relative paths start at the config's directory)") from None
    return str(p)


def _tls_context(doc: Located, tls: Any) -> tuple[ssl.SSLContext, bool, tuple[str, ...]]:
    base = ("tls_server_config",)
    _mapping(doc, base, tls, TLS_KEYS)
    for need in ("cert_file", "key_file"):
        if need not in tls:
            raise doc.error(base, f"no {need}", fix="give cert_file and key_file, or remove tls_server_config")
    cert, key = _file(doc, base + ("cert_file",), tls["cert_file"]), _file(doc, base + ("key_file",), tls["key_file"])
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = _version(doc, base + ("min_version",), tls.get("min_version", "TLS12"))
    ctx.maximum_version = _version(doc, base + ("max_version",), tls.get("max_version", "TLS13"))
    if ctx.minimum_version > ctx.maximum_version:
        raise doc.error(base + ("min_version",), "higher than max_version", fix="lower min_version or raise max_version")
    if tls.get("prefer_server_cipher_suites", True) is False:
        ctx.options &= ~ssl.OP_CIPHER_SERVER_PREFERENCE
    try:
        ctx.load_cert_chain(cert, key, password=_no_password)
    except _Encrypted:
        raise doc.error(base + ("key_file",), "the key is encrypted with a passphrase",
                        fix=f"decrypt it once into a file only you can read: openssl pkey -in {key} -out KEY") from None
    except ssl.SSLError as exc:
        raise doc.error(base + ("cert_file",), f"certificate and key do not load ({_ssl_reason(exc)})",
                        fix="give a PEM certificate and the PEM private key that belongs to it") from None
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx, _client_auth(doc, base, tls, ctx), (cert, key)


def _client_auth(doc: Located, base: Path_, tls: dict[str, Any], ctx: ssl.SSLContext) -> bool:
    kind = tls.get("client_auth_type", "NoClientCert")
    path = base + ("client_auth_type",)
    if kind not in CLIENT_AUTH:
        insecure = kind in ("RequestClientCert", "RequireAnyClientCert")
        raise doc.error(path, f"{kind!r} is {'not verified, so not supported' if insecure else 'not a known value'}",
                        fix="use RequireAndVerifyClientCert (or VerifyClientCertIfGiven, NoClientCert) with client_ca_file")
    ca = tls.get("client_ca_file")
    if CLIENT_AUTH[kind] == ssl.CERT_NONE:
        if ca is not None:
            raise doc.error(path, "client_ca_file is given but client certificates are not asked for",
                            fix="set client_auth_type: RequireAndVerifyClientCert, or remove client_ca_file")
        return False
    if ca is None:
        raise doc.error(path, f"{kind} needs client_ca_file", fix="give client_ca_file: the CA that signs client certificates")
    try:
        ctx.load_verify_locations(cafile=_file(doc, base + ("client_ca_file",), ca))
    except ssl.SSLError as exc:
        raise doc.error(base + ("client_ca_file",), f"not a CA certificate ({_ssl_reason(exc)})",
                        fix="give the PEM certificate of the CA that signs client certificates") from None
    ctx.verify_mode = CLIENT_AUTH[kind]
    return True


def _version(doc: Located, path: Path_, value: Any) -> ssl.TLSVersion:
    if value not in TLS_VERSIONS:
        raise doc.error(path, f"{value!r} is not a TLS version", fix="use TLS12 or TLS13 (or TLS10, TLS11)")
    return TLS_VERSIONS[value]


def _users(doc: Located, users: Any) -> dict[str, bytes]:
    if users is None:
        return {}
    base = ("basic_auth_users",)
    if not isinstance(users, dict):
        raise doc.error(base, "must be a mapping of user names to bcrypt hashes", fix="write `alice: $2b$10$...` lines")
    out = {}
    for user, hashed in users.items():
        name = str(user)
        if not name or ":" in name or any(c.isspace() or ord(c) < 32 for c in name):
            raise doc.error(base + (user,), "not a usable user name", fix="use a name without ':', spaces or control characters")
        match = BCRYPT_HASH.match(hashed) if isinstance(hashed, str) else None
        if match is None:
            raise doc.error(base + (user,), "not a bcrypt hash (a password in clear is refused)", fix=HASH_FIX)
        if int(match.group(1)) not in BCRYPT_COSTS:
            raise doc.error(base + (user,), f"bcrypt cost {match.group(1)} is outside 04-31: no password would ever "
                                            f"match, so user {name} could never log in",
                            fix="make the hash again with a cost from 04 to 31 (10 is usual): " + HASH_FIX)
        out[name] = hashed.encode()
    return out


def _headers(doc: Located, http: Any) -> dict[str, str]:
    if http is None:
        return {}
    base = ("http_server_config",)
    _mapping(doc, base, http, HTTP_KEYS)
    # http2 is accepted for the toolkit's sake and means nothing here: aiohttp answers HTTP/1.1 (ALPN says so).
    if "http2" in http and not isinstance(http["http2"], bool):
        raise doc.error(base + ("http2",), "must be true or false", fix="write http2: false, or remove it")
    headers = http.get("headers") or {}
    _mapping(doc, base + ("headers",), headers, HEADERS)
    out = {}
    for name, value in headers.items():
        text = "" if value is None else str(value)
        if any(ord(c) < 32 for c in text):
            raise doc.error(base + ("headers", name), "has a control character", fix="write the header's value on one line")
        if text:
            out[name] = text
    return out


class _Encrypted(Exception):
    pass


def _no_password() -> bytes:
    # Without a callback OpenSSL would ask for the passphrase on the terminal, and a service has none.
    raise _Encrypted


def _ssl_reason(exc: ssl.SSLError) -> str:
    return str(exc.reason or exc.strerror or exc).replace("_", " ").lower()
