"""Recipe mods, applied as spark-vllm-docker's launch-cluster.sh `--apply-mod` applies them: each a directory
(or a .zip) holding a `run.sh`, copied into the idle container under /workspace/mods/NAME and run there, on
every node, in the recipe's order and then the command line's, before vLLM starts.

A recipe's mod is found as its format's runner finds it (recipes/modrefs.py: v1 against the checkout the recipe
lives in, v2 as sparkrun looks, registries included), a command-line one against the working directory; the plan
says where each comes from. A missing mod, or one without `run.sh`, is a one-line error
before anything starts. The files travel as a tar on the step's stdin (`docker cp - CONTAINER:DIR`), so they
reach a node over its own SSH connection without a copy on the node's disk.
"""

from __future__ import annotations

import io
import tarfile
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from ..errors import UserError
from ..recipes import PreExec, Recipe
from ..recipes.modrefs import ModRef, checkout_root, locate_mods
from .steps import Step

__all__ = ["GATE_FILE", "Mod", "checkout_root", "load_mod", "load_mods", "mod_steps", "pre_exec_steps", "release_step",
           "resolve_mods"]

WORKSPACE = "/workspace"
MODS_DIR = f"{WORKSPACE}/mods"
# The container's main process waits for this file before it execs vLLM: the mods are applied while it waits,
# and vLLM stays the container's main process, so its exit is the container's exit (launch health reads that).
GATE_FILE = f"{WORKSPACE}/.sparkconsole-mods-applied"
GATE_SCRIPT = f'while [ ! -e {GATE_FILE} ]; do sleep 0.2; done; exec "$@"'
# As the runner runs a mod: from its own directory, with WORKSPACE_DIR the container's working directory
# (mods copy files there for the vLLM command to find, e.g. a chat template).
# $1: the mod's directory; the rest: the recipe's own `env:` names, unset for run.sh. The runners export the
# recipe's env in the launch script they start after the mods, so a mod written for them never saw those values
# (one such as HF_HUB_OFFLINE=1 would change what a mod that downloads does).
RUN_SCRIPT = ('export WORKSPACE_DIR=$PWD && cd "$1" && shift && for v in "$@"; do unset -v "$v"; done; '
              "chmod +x run.sh && ./run.sh")
MAX_MOD_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class Mod:
    name: str               # the directory's name, or the zip's without .zip (the runner's naming)
    source: str             # where it was read, as resolved
    kind: str               # dir | zip
    archive: bytes          # a tar of what lands in MODS_DIR/NAME
    files: int
    origin: str = ""        # where it comes from, in words (recipes/modrefs.py): the plan shows it

    @property
    def dest(self) -> str:
        return f"{MODS_DIR}/{self.name}"


def resolve_mods(recipe: Recipe, extra: Sequence[str] = ()) -> tuple[Mod, ...]:
    """The recipe's mods (found as its format's runner finds them, recipes/modrefs.py), then the command line's
    (against the working directory)."""
    return load_mods(locate_mods(recipe, extra), recipe.source)


def load_mods(refs: Sequence[ModRef], recipe_source: str) -> tuple[Mod, ...]:
    out = [replace(load_mod(r.path, file=None if r.field == "--apply-mod" else recipe_source, field=r.field),
                   origin=r.origin) for r in refs]
    names = [m.name for m in out]
    for n in names:
        if names.count(n) > 1:
            raise UserError(f"two mods are named {n!r}: both would land in {MODS_DIR}/{n}", file=recipe_source,
                            field="mods", fix="apply each mod once, or rename one of them")
    return tuple(out)


def load_mod(path: Path, *, file: str | None, field: str) -> Mod:
    if not path.exists():
        raise UserError(f"mod {str(path)[:120]} does not exist", file=file, field=field,
                        fix="check the path (a recipe's mods are relative to its spark-vllm-docker checkout)")
    if path.is_dir():
        if not (path / "run.sh").is_file():
            raise UserError(f"mod directory {str(path)[:120]} has no run.sh", file=file, field=field,
                            fix="a mod is a directory (or .zip) holding run.sh")
        return _from_dir(path)
    if path.suffix == ".zip":
        return _from_zip(path, file=file, field=field)
    raise UserError(f"mod {str(path)[:120]} is neither a directory nor a .zip file", file=file, field=field,
                    fix="name a mod directory holding run.sh, or a .zip of one")


def _tar_info(name: str, size: int, mode: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.uid, info.gid = size, mode, 0, 0
    return info


def _from_dir(path: Path) -> Mod:
    buf, files, total = io.BytesIO(), 0, 0
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for f in sorted(path.rglob("*")):
            rel = f.relative_to(path).as_posix()
            if f.is_symlink() or not (f.is_file() or f.is_dir()):
                continue
            if f.is_dir():
                tar.addfile(_dir_info(rel))
                continue
            data = f.read_bytes()
            total += len(data)
            if total > MAX_MOD_BYTES:
                raise UserError(f"mod {path} holds more than {MAX_MOD_BYTES >> 20} MiB", field="mods",
                                fix="keep large files out of the mod (build them into the image instead)")
            tar.addfile(_tar_info(rel, len(data), f.stat().st_mode & 0o777), io.BytesIO(data))
            files += 1
    return Mod(path.name, str(path), "dir", buf.getvalue(), files)


def _dir_info(rel: str) -> tarfile.TarInfo:
    info = _tar_info(rel, 0, 0o755)
    info.type = tarfile.DIRTYPE
    return info


def _from_zip(path: Path, *, file: str | None, field: str) -> Mod:
    """The zip itself and what it holds, as the runner leaves them: it copies the zip into the mod's directory
    and extracts it there."""
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as exc:
        raise UserError(f"mod {path} is not a readable zip ({exc})", file=file, field=field,
                        fix="re-create the zip, or name the mod's directory") from None
    with zf:
        if "run.sh" not in zf.namelist():
            raise UserError(f"mod zip {path} has no run.sh at its top", file=file, field=field,
                            fix="zip the mod's files with run.sh at the top level")
        if sum(i.file_size for i in zf.infolist()) > MAX_MOD_BYTES:
            raise UserError(f"mod {path} unpacks to more than {MAX_MOD_BYTES >> 20} MiB", file=file, field=field,
                            fix="keep large files out of the mod")
        buf, files = io.BytesIO(), 0
        with tarfile.open(fileobj=buf, mode="w") as tar:
            raw = path.read_bytes()
            tar.addfile(_tar_info(path.name, len(raw), 0o644), io.BytesIO(raw))
            dirs: set[str] = set()
            for info in zf.infolist():
                name = info.filename
                if name.startswith("/") or ".." in Path(name).parts:
                    raise UserError(f"mod zip {path} holds a path outside itself: {name[:80]}", file=file,
                                    field=field, fix="re-create the zip with relative paths")
                # every directory an entry needs, once, before it (a zip need not list them)
                parents = [p.as_posix() for p in reversed(Path(name.rstrip("/")).parents) if p.as_posix() != "."]
                for d in [*parents, *([name.rstrip("/")] if info.is_dir() else [])]:
                    if d not in dirs:
                        dirs.add(d)
                        tar.addfile(_dir_info(d))
                if info.is_dir():
                    continue
                data = zf.read(info)
                tar.addfile(_tar_info(name, len(data), 0o755 if name == "run.sh" else 0o644), io.BytesIO(data))
                files += 1
    return Mod(path.stem, str(path), "zip", buf.getvalue(), files)


def mod_steps(node: str, container: str, mods: Sequence[Mod], hidden: Sequence[str] = ()) -> list[Step]:
    """Each mod into one node's idle container, in order: make its directory, copy it in, run its run.sh (without
    the variables named in `hidden`: the recipe's own env, as the runners do)."""
    steps: list[Step] = []
    for m in mods:
        steps.append(Step(node, f"mod {m.name}: make {m.dest} in {container}",
                          ("docker", "exec", "-w", "/", container, "mkdir", "-p", m.dest)))
        steps.append(Step(node, f"mod {m.name}: copy its {m.files} file(s) in ({m.kind} {m.source})",
                          ("docker", "cp", "-", f"{container}:{m.dest}"), input=m.archive,
                          input_label=f"a tar of {m.source}: {m.files} file(s), {len(m.archive):,} bytes"))
        steps.append(Step(node, f"mod {m.name}: run its run.sh",
                          ("docker", "exec", container, "bash", "-c", RUN_SCRIPT, "mod", m.dest, *hidden),
                          report_output=True))
    return steps


def release_step(node: str, container: str) -> Step:
    return Step(node, f"start vLLM in {container} now that its mods are applied",
                ("docker", "exec", "-w", "/", container, "touch", GATE_FILE))


def gated(argv: Sequence[str]) -> list[str]:
    """The container's command: wait until the mods are applied, then become `argv`."""
    return ["sh", "-c", GATE_SCRIPT, "sparkconsole-mods-gate", *argv]


def pre_exec_steps(node: str, container: str, entries: Sequence[PreExec], recipe_source: str) -> list[Step]:
    """A v2 recipe's pre_exec, in order, after its mods and before the server: each command run in the idle
    container (as root, like a mod), each copy sent in as a tar (a file or folder beside the recipe)."""
    steps: list[Step] = []
    for i, e in enumerate(entries):
        if e.command is not None:
            steps.append(Step(node, f"pre_exec[{i}]: run in {container}",
                              ("docker", "exec", container, "bash", "-c", e.command), report_output=True))
            continue
        assert e.copy is not None and e.dest is not None
        src = Path(e.copy).expanduser()
        src = src if src.is_absolute() else Path(recipe_source).parent / src
        if not src.exists():
            raise UserError(f"pre_exec[{i}] copies {e.copy[:80]}, which does not exist", file=recipe_source,
                            field=f"pre_exec[{i}].copy", fix="copy a file or folder beside the recipe")
        m = _from_dir(src) if src.is_dir() else _one_file(src)
        steps.append(Step(node, f"pre_exec[{i}]: make {e.dest} in {container}",
                          ("docker", "exec", "-w", "/", container, "mkdir", "-p", e.dest)))
        steps.append(Step(node, f"pre_exec[{i}]: copy {src} to {e.dest}", ("docker", "cp", "-", f"{container}:{e.dest}"),
                          input=m.archive, input_label=f"a tar of {src}: {m.files} file(s), {len(m.archive):,} bytes"))
    return steps


def _one_file(path: Path) -> Mod:
    data = path.read_bytes()
    if len(data) > MAX_MOD_BYTES:
        raise UserError(f"{path} is larger than {MAX_MOD_BYTES >> 20} MiB", field="pre_exec",
                        fix="keep large files out of the recipe (build them into the image instead)")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.addfile(_tar_info(path.name, len(data), path.stat().st_mode & 0o777), io.BytesIO(data))
    return Mod(path.name, str(path), "file", buf.getvalue(), 1)
