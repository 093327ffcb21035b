"""Keep tokens and passwords out of everything sparkconsole prints, logs or stores.

Two layers:
- shape rules: values of secret-named variables (`HF_TOKEN=…`, `"OPENAI_API_KEY": "…"`, `api_key: …`),
  secret-named flags (`--api-key …`, `--hf-token=…`), `Bearer …` / `Basic …` credentials, URL passwords,
  and token-shaped words (`hf_…`, `sk-…`);
- registered values: anything the process knows is secret (`register(value)`, and the values of secret-named
  environment variables) is replaced wherever it appears, whatever surrounds it.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterable, Mapping

MASK = "***"
# Shorter values would blank out ordinary words; such values are refused by register().
MIN_SECRET_LEN = 4

_EXACT_NAMES = frozenset({
    "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HUGGINGFACE_TOKEN", "LITELLM_MASTER_KEY", "OPENAI_API_KEY",
    "TOKEN", "SECRET", "PASSWORD", "PASSWD", "PASSPHRASE", "API_KEY", "APIKEY", "AUTHORIZATION",
    "CREDENTIALS", "PRIVATE_KEY",
})
_SUFFIXES = ("_TOKEN", "_KEY", "_SECRET", "_PASSWORD", "_PASSWD", "_PASSPHRASE", "_APIKEY", "_CREDENTIALS")

_lock = threading.Lock()
_registered: set[str] = set()
_env_loaded = False


def _normalise(name: str) -> str:
    # apiKey -> API_KEY, api-key -> API_KEY, --hf-token -> HF_TOKEN
    name = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name.strip().lstrip("-"))
    return name.replace("-", "_").replace(".", "_").upper()


def is_secret_name(name: str) -> bool:
    """True for names whose values must never be shown: HF_TOKEN, *_KEY, *_TOKEN, *_SECRET, *_PASSWORD, …"""
    if not isinstance(name, str) or not name.strip():
        return False
    n = _normalise(name)
    return n in _EXACT_NAMES or n.endswith(_SUFFIXES)


def register(value: str | None) -> bool:
    """Remember a value as secret so redact() removes it anywhere. False when refused (empty or too short)."""
    if not isinstance(value, str):
        return False
    value = value.strip()
    if len(value) < MIN_SECRET_LEN:
        return False
    with _lock:
        _registered.add(value)
    return True


def register_env(env: Mapping[str, str] | None = None) -> int:
    """Register the values of secret-named variables in `env` (default: this process's environment)."""
    env = os.environ if env is None else env
    return sum(1 for k, v in env.items() if is_secret_name(k) and register(v))


def forget_all() -> None:
    """Drop every registered value (tests; a console that reloads its cluster file)."""
    global _env_loaded
    with _lock:
        _registered.clear()
        _env_loaded = True


def _ensure_env() -> None:
    global _env_loaded
    if not _env_loaded:
        _env_loaded = True
        register_env()


# --- shape rules -------------------------------------------------------------------------------------------
_NAME = r"[A-Za-z_][A-Za-z0-9_.-]*"
# 'HF_TOKEN=a b' as shlex.join writes it: the whole word is quoted, the value runs to the closing quote.
_QUOTED_ASSIGN = re.compile(rf"(?P<q>['\"])(?P<name>{_NAME})=(?P<val>.*?)(?P=q)")
# HF_TOKEN=abc, HF_TOKEN="a b", HF_TOKEN='a b'
_ASSIGN = re.compile(rf"(?<![A-Za-z0-9_.-])(?P<name>{_NAME})=(?P<val>\"[^\"]*\"|'[^']*'|[^\s'\",;&|)]+)")
# "HF_TOKEN": "abc"  /  'api_key': 'abc'
_JSON_PAIR = re.compile(rf"(?P<kq>[\"'])(?P<name>{_NAME})(?P=kq)\s*:\s*(?P<vq>[\"'])(?P<val>(?:\\.|(?!(?P=vq)).)*)(?P=vq)")
# api_key: abc   (YAML / HTTP-header style, one per line)
_COLON_PAIR = re.compile(rf"(?m)^(?P<lead>[ \t]*(?:-[ \t]+)?)(?P<name>{_NAME})[ \t]*:[ \t]+(?P<val>\S[^\n]*?)[ \t]*$")
# --api-key abc, --api-key=abc, --hf-token "a b"
_FLAG = re.compile(r"(?P<flag>--?[A-Za-z][A-Za-z0-9-]*)(?P<sep>=|\s+)(?P<val>\"[^\"]*\"|'[^']*'|[^\s'\"]+)")
# Spelled out rather than (?i): case-insensitive scanning costs ~2x on every log line.
# Credentials are 8+ characters; shorter words after "Bearer"/"Basic" are prose.
_AUTH = re.compile(r"\b(?P<scheme>[Bb]earer|BEARER|[Bb]asic|BASIC)(?P<sep>[ \t]+)(?P<val>[A-Za-z0-9._~+/=-]{8,})")
_URL_PASSWORD = re.compile(r"(?P<pre>[a-z][a-z0-9+.-]*://[^\s:/@]+:)(?P<val>[^\s@/]+)(?=@)")
_TOKEN_SHAPES = re.compile(r"(?<![A-Za-z0-9])(?:hf_[A-Za-z0-9]{16,}|sk-[A-Za-z0-9_-]{12,}|gh[pousr]_[A-Za-z0-9]{20,})")


def _mask_value(val: str) -> str:
    if len(val) >= 2 and val[0] == val[-1] and val[0] in "\"'":
        return val[0] + MASK + val[0]
    return MASK


def _apply_shapes(text: str) -> str:
    def quoted(m: re.Match[str]) -> str:
        if not is_secret_name(m["name"]):
            return m[0]
        return f"{m['q']}{m['name']}={MASK}{m['q']}"

    def assign(m: re.Match[str]) -> str:
        if not is_secret_name(m["name"]) or m["val"] == MASK:
            return m[0]
        return f"{m['name']}={_mask_value(m['val'])}"

    def json_pair(m: re.Match[str]) -> str:
        if not is_secret_name(m["name"]):
            return m[0]
        return f"{m['kq']}{m['name']}{m['kq']}: {m['vq']}{MASK}{m['vq']}"

    def colon_pair(m: re.Match[str]) -> str:
        if not is_secret_name(m["name"]):
            return m[0]
        return f"{m['lead']}{m['name']}: {MASK}"

    def flag(m: re.Match[str]) -> str:
        if not is_secret_name(m["flag"]) or m["val"].startswith("-"):
            return m[0]
        return f"{m['flag']}{m['sep']}{_mask_value(m['val'])}"

    # Cheap substring checks first: most log lines match none of the rules, and this runs on every line.
    if "=" in text:
        text = _QUOTED_ASSIGN.sub(quoted, text)
        text = _ASSIGN.sub(assign, text)
    if ":" in text:
        if '"' in text or "'" in text:
            text = _JSON_PAIR.sub(json_pair, text)
        text = _COLON_PAIR.sub(colon_pair, text)
    if "-" in text:
        text = _FLAG.sub(flag, text)
    lower = text.lower()
    if "bearer" in lower or "basic" in lower:
        text = _AUTH.sub(lambda m: f"{m['scheme']}{m['sep']}{MASK}", text)
    if "://" in text:
        text = _URL_PASSWORD.sub(lambda m: m["pre"] + MASK, text)
    if "hf_" in text or "sk-" in text or "gh" in text:
        text = _TOKEN_SHAPES.sub(MASK, text)
    return text


def _apply_registered(text: str, values: Iterable[str]) -> str:
    ordered = sorted(values, key=len, reverse=True)
    # Masking can join the text around a value into a new occurrence ("aa***" with value "a***"):
    # repeat until none is left. Each pass shortens the text (values are longer than the mask), so it ends.
    changed = True
    while changed:
        changed = False
        for v in ordered:
            if v in text:
                text = text.replace(v, MASK)
                changed = True
    return text


def redact(text: str) -> str:
    """`text` with every secret value replaced by ***; safe to print, log or store."""
    if not isinstance(text, str):
        text = str(text)
    _ensure_env()
    with _lock:
        values = tuple(_registered)
    if values:
        text = _apply_registered(text, values)
    text = _apply_shapes(text)
    if values:
        text = _apply_registered(text, values)
    return text


def redact_argv(argv: Iterable[str]) -> list[str]:
    """Each word redacted, with secret-flag values (`--api-key`, `VALUE`) masked across word boundaries."""
    out: list[str] = []
    hide_next = False
    for word in argv:
        word = str(word)
        if hide_next and not word.startswith("-"):
            out.append(MASK)
            hide_next = False
            continue
        hide_next = word.startswith("-") and "=" not in word and is_secret_name(word)
        out.append(redact(word))
    return out
