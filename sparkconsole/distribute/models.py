"""Models in each node's Hugging Face cache: list, pull (download on one node, copy to the others), rm.

A copy goes file by file through relay.py into the receiving node's staging directory (nodescript.py), each
file resumed from the bytes already there, and is renamed into the hub only when every file has its size and
the snapshot links resolve. So an interrupted copy, a full disk or a vanished node leaves nothing that the
runner's check (`snapshots/` not empty) or vLLM would take for a complete model, and the same command resumes.
"""

from __future__ import annotations

import asyncio
import errno
import json
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .. import audit
from ..errors import UserError
from ..nodes.transport import Transport, TransportError
from .nodescript import STAGE_DIR, cache_dir_name, check_link, check_rel, model_id, node_argv
from .progress import Progress, human
from .relay import CHUNK, RelayError, relay

DOWNLOAD_TOOLS = ("hf", "huggingface-cli")   # huggingface_hub's CLI, new name first


@dataclass(frozen=True)
class CachedModel:
    model: str
    size: int
    complete: bool


@dataclass(frozen=True)
class NodeModels:
    node: str
    hub: str | None = None
    free: int | None = None
    models: tuple[CachedModel, ...] = ()
    partial: tuple[CachedModel, ...] = ()      # staged copies not yet complete (resumable)
    error: str | None = None


def _env(t: Transport) -> tuple[tuple[str, str], ...]:
    return tuple(getattr(t.node, "env", ()) or ())


async def node_call(t: Transport, mode: str, *args: str, input: bytes | None = None,
                    timeout: float | None = 120) -> dict[str, Any]:
    """NODE_SCRIPT on the node → its JSON answer; a failure is a one-line UserError naming the node."""
    argv = node_argv(_env(t), t.python, mode, *args)
    try:
        res = await t.run(argv, input=input, timeout=timeout)
    except TransportError as exc:
        raise UserError(f"{t.node.name}: {exc}", fix="check that the node is up and reachable, then run the "
                        "same command again") from None
    if res.rc != 0:
        raise UserError(f"{t.node.name}: {_error_text(res.stderr) or f'exit status {res.rc}'}",
                        fix="see the node's message; run the same command again once it is fixed")
    try:
        answer: dict[str, Any] = json.loads(res.stdout.strip().splitlines()[-1])
        return answer
    except (ValueError, IndexError):
        raise UserError(f"{t.node.name}: unexpected answer from the cache script ({res.stdout[:60]!r})",
                        fix="check that python3 runs on the node") from None


def _error_text(stderr: str) -> str:
    for line in reversed(stderr.strip().splitlines()):
        try:
            return str(json.loads(line).get("error", ""))[:200]
        except (ValueError, AttributeError):
            continue
    return " ".join(stderr.split())[-200:]


def _errno(stderr: str) -> int | None:
    for line in reversed(stderr.strip().splitlines()):
        try:
            code: int | None = json.loads(line).get("errno")
            return code
        except (ValueError, AttributeError):
            continue
    return errno.ENOSPC if "No space left on device" in stderr else None


async def list_models(transports: Sequence[Transport]) -> list[NodeModels]:
    """Every node's cached models (size, complete or not) and staged partial copies; an unreachable node is a
    row with its error, not a failure of the whole list."""
    async def one(t: Transport) -> NodeModels:
        try:
            d = await node_call(t, "list")
        except UserError as err:
            return NodeModels(t.node.name, error=err.problem)
        return NodeModels(t.node.name, d["hub"], d["free"],
                          tuple(CachedModel(model_id(m["dir"]), m["size"], m["complete"]) for m in d["models"]),
                          tuple(CachedModel(model_id(m["dir"]), m["size"], False) for m in d["partial"]))
    return list(await asyncio.gather(*(one(t) for t in transports)))


def download_argv(tool: str, model: str, revision: str | None = None) -> list[str]:
    """huggingface_hub's CLI: `hf download REPO_ID [--revision REV]` (`huggingface-cli download` takes the same)."""
    if tool not in DOWNLOAD_TOOLS:
        raise ValueError(tool)
    cache_dir_name(model)                       # validates the id
    return [tool, "download", model, *(["--revision", revision] if revision else [])]


@dataclass
class PullReport:
    model: str
    source: str
    downloaded: bool = False
    copied: dict[str, int] = field(default_factory=dict)       # node → bytes moved
    already: list[str] = field(default_factory=list)


async def download(t: Transport, model: str, revision: str | None = None) -> None:
    """`hf download` on the node into its staging directory, then the atomic rename into the hub. The token, if
    the model needs one, is the node's own HF_TOKEN (huggingface_hub reads it); it never passes through here."""
    name = cache_dir_name(model)
    stage = await node_call(t, "stage", name)
    find = await t.run(["env", *(f"{k}={v}" for k, v in _env(t)), "sh", "-c",
                        "command -v hf || command -v huggingface-cli"], timeout=30)
    tool = find.stdout.strip().rsplit("/", 1)[-1] if find.rc == 0 else ""
    if tool not in DOWNLOAD_TOOLS:
        raise UserError(f"{t.node.name}: neither `hf` nor `huggingface-cli` is on the node's PATH, so {model} "
                        "cannot be downloaded there",
                        fix=f"install huggingface_hub on {t.node.name} (pip install -U huggingface_hub), or copy "
                            "the model from a node that has it with --from NODE")
    argv = ["env", *(f"{k}={v}" for k, v in _env(t)), f"HF_HUB_CACHE={stage['hub']}/{STAGE_DIR}",
            *download_argv(tool, model, revision)]
    audit.record("model pull (download)", t.node.name, argv)
    res = await t.run(argv, timeout=None)
    if res.rc != 0:
        tail = " ".join((res.stderr or res.stdout).split())[-160:]
        raise UserError(f"{t.node.name}: {tool} download {model} failed ({tail or f'exit status {res.rc}'})",
                        fix="check the model id, the node's network and its HF_TOKEN; the partial download "
                            "stays staged and resumes on the next pull")
    await node_call(t, "commit", name, input=b"[]")


async def copy_model(src: Transport, dst: Transport, model: str, entries: list[list[Any]], *,
                     on_progress: Callable[[Progress, bool], None] | None = None, chunk: int = CHUNK) -> int:
    """Copies the model's cache directory from src to dst (resuming staged bytes); returns the bytes moved."""
    name = cache_dir_name(model)
    stage = await node_call(dst, "stage", name)
    if stage["complete"]:
        return 0
    have: dict[str, int] = stage["have"]
    files = [(check_rel(r), n) for r, kind, n, _ in entries if kind == "f"]
    need = sum(n - min(have.get(r, 0), n) if have.get(r, 0) <= n else n for r, n in files)
    if need > stage["free"]:
        raise UserError(f"{dst.node.name}: {model} needs {human(need)} more, {human(stage['free'])} free in "
                        f"{stage['hub']}", fix=f"free space on {dst.node.name} (sparkconsole model list shows what "
                        "is cached; model rm removes one), then run the same command again")
    prog = Progress(f"{model} → {dst.node.name}", need)
    moved = 0
    audit.record("model pull (copy)", dst.node.name, f"copy {name} from {src.node.name} into {stage['hub']}")
    for rel, n in files:
        off = have.get(rel, 0)
        if off == n:
            continue
        off = 0 if off > n else off
        src_argv = node_argv(_env(src), src.python, "read", name, rel, str(off))
        dst_argv = node_argv(_env(dst), dst.python, "write", name, rel, str(off))

        def counted(k: int) -> None:
            prog.add(k)
            if on_progress:
                on_progress(prog, False)
        try:
            got, _ = await relay(src, src_argv, dst, dst_argv, on_bytes=counted, chunk=chunk)
        except RelayError as exc:
            raise _copy_error(exc, model, rel, src, dst, stage["hub"]) from None
        except TransportError as exc:
            raise UserError(f"{exc}", fix="bring the node back and run the same command again: the copy resumes "
                            "where it stopped") from None
        if got != n - off:
            raise UserError(f"{src.node.name}: {rel} changed while it was copied ({got} of {n - off} bytes)",
                            fix="run the same command again")
        moved += got
    entries_json = json.dumps([[check_rel(r), k, n, check_link(r, t) if k == "l" else None]
                               for r, k, n, t in entries]).encode()
    await node_call(dst, "commit", name, input=entries_json)
    if on_progress:
        on_progress(prog, True)
    return moved


def _copy_error(exc: RelayError, model: str, rel: str, src: Transport, dst: Transport, hub: str) -> UserError:
    if exc.side == "dest" and _errno(exc.text) == errno.ENOSPC:
        return UserError(f"{dst.node.name}: disk full while copying {model} ({rel}); nothing was put in the hub, "
                         f"the partial copy waits in {hub}/{STAGE_DIR}",
                         fix=f"free space on {dst.node.name}, then run the same command again (it resumes), or "
                             f"`sparkconsole model rm {model} --node {dst.node.name}` to drop the partial copy")
    side = dst if exc.side == "dest" else src
    text = _error_text(exc.text) or f"exit status {exc.rc}"
    return UserError(f"{side.node.name}: copying {model} ({rel}) failed: {text}",
                     fix="bring the node back (or fix the cause) and run the same command again: the copy resumes")


async def pull(model: str, transports: Sequence[Transport], *, source: str | None = None, revision: str | None = None,
               download_missing: bool = True, on_progress: Callable[[Progress, bool], None] | None = None,
               chunk: int = CHUNK) -> PullReport:
    """Puts `model` on every node in `transports`: from `source` (or the first node that has a complete copy),
    downloading it there first when no node has it; then copied to each node that lacks it, one at a time."""
    name = cache_dir_name(model)
    by_name = {t.node.name: t for t in transports}
    if source is not None and source not in by_name:
        raise UserError(f"unknown node {source!r}", field="--from", fix=f"use one of: {', '.join(by_name)}")
    manifests = dict(zip(by_name, await asyncio.gather(*(node_call(t, "manifest", name) for t in transports)), strict=False))
    report = PullReport(model, source or "")
    if source is None:
        source = next((n for n, m in manifests.items() if m["complete"]), None)
    if source is None or not manifests[source]["complete"]:
        if not download_missing:
            raise UserError(f"no node has a complete copy of {model}",
                            fix="pull without --no-download to download it on one node first")
        source = source or next(iter(by_name))
        await download(by_name[source], model, revision)
        report.downloaded = True
        manifests[source] = await node_call(by_name[source], "manifest", name)
    report.source = source
    entries = manifests[source]["entries"]
    for node, t in by_name.items():
        if node == source or manifests[node]["complete"]:
            report.already.append(node)
            continue
        report.copied[node] = await copy_model(by_name[source], t, model, entries, on_progress=on_progress,
                                               chunk=chunk)
    return report


async def remove(model: str, transports: Sequence[Transport]) -> dict[str, int]:
    """Removes the model (and any staged partial copy) from each node's cache → node → bytes freed."""
    name = cache_dir_name(model)
    out: dict[str, int] = {}
    for t in transports:
        audit.record("model rm", t.node.name, shlex.join(["rm", "-r", f"<hub>/{name}", f"<hub>/{STAGE_DIR}/{name}"]))
        out[t.node.name] = (await node_call(t, "rm", name))["freed"]
    return out
