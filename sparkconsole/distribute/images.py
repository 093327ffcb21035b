"""Container images on every node: list, pull (`docker save` on a node that has it | `docker load` on each node
that lacks it, through relay.py, with progress), rm.

`docker load` tags the image only once it has read the whole archive, so an interrupted copy leaves no image a
launch would start. The node's environment (e.g. DOCKER_HOST) is put in front of every docker command.
"""

from __future__ import annotations

import asyncio
import re
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from .. import audit
from ..errors import UserError
from ..nodes.transport import Transport, TransportError
from .progress import Progress, human
from .relay import CHUNK, RelayError, relay

_IMAGE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_./:@-]{0,255}$")


def check_image(image: str) -> str:
    if not _IMAGE_RE.match(image or ""):
        raise UserError(f"bad image name {str(image)[:80]!r}", field="IMAGE",
                        fix="write an image reference like vllm-node or vllm-node:tag")
    return image


def docker_argv(t: Transport, *args: str) -> list[str]:
    return ["env", *(f"{k}={v}" for k, v in (getattr(t.node, "env", ()) or ())), "docker", *args]


@dataclass(frozen=True)
class ImageState:
    node: str
    id: str | None = None          # None: the node does not have it
    size: int | None = None
    error: str | None = None


async def state(t: Transport, image: str) -> ImageState:
    """The image's ID and size on the node, or none; an unreachable node or a missing docker is the row's error."""
    try:
        res = await t.run(docker_argv(t, "image", "inspect", "-f", "{{.Id}} {{.Size}}", image), timeout=30)
    except TransportError as exc:
        return ImageState(t.node.name, error=str(exc))
    if res.rc == 0 and res.stdout.split():
        ident, _, size = res.stdout.strip().partition(" ")
        return ImageState(t.node.name, ident, int(size) if size.isdigit() else None)
    err = " ".join(res.stderr.split())
    if "No such image" in err or "No such object" in err:
        return ImageState(t.node.name)
    return ImageState(t.node.name, error=err[-160:] or f"docker exit status {res.rc}")


async def list_images(transports: Sequence[Transport]) -> dict[str, list[tuple[str, str, str]] | str]:
    """Node → [(repository:tag, id, size)] or the node's error line."""
    async def one(t: Transport) -> list[tuple[str, str, str]] | str:
        try:
            res = await t.run(docker_argv(t, "image", "ls", "--format", "{{.Repository}}:{{.Tag}}\t{{.ID}}\t{{.Size}}"),
                              timeout=30)
        except TransportError as exc:
            return str(exc)
        if res.rc != 0:
            return " ".join(res.stderr.split())[-160:] or f"docker exit status {res.rc}"
        rows = [line.split("\t") for line in res.stdout.splitlines() if line.count("\t") >= 2]
        return [(r[0], r[1], r[2]) for r in rows]
    return dict(zip((t.node.name for t in transports), await asyncio.gather(*(one(t) for t in transports)), strict=False))


@dataclass
class ImagePullReport:
    image: str
    source: str
    copied: dict[str, int] = field(default_factory=dict)     # node → archive bytes moved
    already: list[str] = field(default_factory=list)


async def pull(image: str, transports: Sequence[Transport], *, source: str | None = None,
               on_progress: Callable[[Progress, bool], None] | None = None, chunk: int = CHUNK) -> ImagePullReport:
    """Copies `image` from `source` (or the first node that has it) to every node that lacks it or holds a
    different image under that name; checks the loaded image's ID against the source's."""
    check_image(image)
    states = list(await asyncio.gather(*(state(t, image) for t in transports)))
    by_name = {t.node.name: t for t in transports}
    for s in states:
        if s.error:
            raise UserError(f"{s.node}: cannot read its images ({s.error})",
                            fix="check that the node is up and docker runs there")
    if source is not None and source not in by_name:
        raise UserError(f"unknown node {source!r}", field="--from", fix=f"use one of: {', '.join(by_name)}")
    have = {s.node: s for s in states if s.id}
    src_name = source if source is not None else next(iter(have), None)
    if src_name is None or src_name not in have:
        where = f"{src_name} does not have" if src_name else "no node has"
        raise UserError(f"{where} image {image}", fix="build it on one node (spark-vllm-docker's build-and-copy.sh) "
                        "or `docker pull` it there, then run the same command again")
    src = have[src_name]
    report = ImagePullReport(image, src_name)
    for s in states:
        if s.id == src.id:
            report.already.append(s.node)
            continue
        t = by_name[s.node]
        prog = Progress(f"{image} → {s.node}", src.size or 0)
        audit.record("image pull", s.node, f"docker save {image} on {src_name} | docker load")

        def counted(k: int, prog: Progress = prog) -> None:
            prog.add(k)
            if on_progress:
                on_progress(prog, False)
        try:
            moved, _ = await relay(by_name[src_name], docker_argv(by_name[src_name], "save", image), t,
                                   docker_argv(t, "load"), on_bytes=counted, chunk=chunk)
        except RelayError as exc:
            text = " ".join(exc.text.split())[-160:] or f"exit status {exc.rc}"
            full = "no space left on device" in text.lower()
            raise UserError(f"{exc.node}: copying image {image} failed ({'disk full: ' if full else ''}{text}); "
                            "docker loads an image only once the archive is whole, so no partial image is left",
                            fix=("free space on the node, then " if full else "") + "run the same command again") from None
        except TransportError as exc:
            raise UserError(str(exc), fix="bring the node back and run the same command again") from None
        loaded = await state(t, image)
        if loaded.id != src.id:
            raise UserError(f"{s.node}: after loading, {image} is {loaded.id or 'missing'}, not {src.id}",
                            fix="run the same command again")
        if on_progress:
            prog.total = max(prog.total, moved)
            on_progress(prog, True)
        report.copied[s.node] = moved
    return report


async def remove(image: str, transports: Sequence[Transport]) -> dict[str, str]:
    """`docker image rm IMAGE` on each node → node → "removed" / "absent" / the error line."""
    check_image(image)
    out: dict[str, str] = {}
    for t in transports:
        argv = docker_argv(t, "image", "rm", image)
        audit.record("image rm", t.node.name, shlex.join(argv))
        try:
            res = await t.run(argv, timeout=120)
        except TransportError as exc:
            out[t.node.name] = str(exc)
            continue
        err = " ".join(res.stderr.split())
        out[t.node.name] = "removed" if res.rc == 0 else ("absent" if "No such image" in err else err[-160:])
    return out


def size_text(n: int | None) -> str:
    return human(n) if n is not None else "?"
