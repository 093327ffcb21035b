"""The program run on a node for its Hugging Face cache (stdlib only, Python 3.8+), and how to call it.

`python3 -c NODE_SCRIPT MODE ARGS…`; it prints one JSON object on stdout (or, for `read`, the bytes of a file),
and on failure one JSON object {"error": …, "errno": …} on stderr with exit status 1. Paths are relative to
the cache and checked on both sides: a name with `..` or a leading `/` is refused.

The hub: $HF_HUB_CACHE, else $HF_HOME/hub, else ${XDG_CACHE_HOME:-~/.cache}/huggingface/hub (huggingface_hub's
own order). Staging: <hub>/.sparkconsole-partial/ — neither the runner's check (`models--X/snapshots` not
empty) nor huggingface_hub ever looks there, so a half-copied model is never taken for a complete one.
"""

from __future__ import annotations

import re
import shlex
from typing import Sequence

from ..errors import UserError

STAGE_DIR = ".sparkconsole-partial"
_MODEL_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$")

# The node's hub directory, in huggingface_hub's own order (also read on the node by placement/modelinfo.py).
HUB_PY = r'''
import os
def hub():
    e = os.environ
    if e.get("HF_HUB_CACHE"):
        return e["HF_HUB_CACHE"]
    home = e.get("HF_HOME") or os.path.join(e.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "huggingface")
    return os.path.join(home, "hub")
'''

NODE_SCRIPT = HUB_PY + r'''
import json, os, shutil, sys, time
H = hub()
S = os.path.join(H, ".sparkconsole-partial")
def fail(msg, err=None):
    sys.stderr.write(json.dumps({"error": msg, "errno": getattr(err, "errno", None),
                                 "strerror": getattr(err, "strerror", None)}) + "\n")
    sys.exit(1)
def safe(rel):
    if not rel or rel.startswith("/") or ".." in rel.split("/"):
        fail("unsafe path " + rel[:80])
    return rel
def walk(root):
    out = []
    for d, dirs, files in os.walk(root):
        dirs.sort()
        rel = os.path.relpath(d, root)
        for name in sorted(dirs) + sorted(files):
            p = os.path.join(d, name)
            r = os.path.normpath(os.path.join(rel, name))
            if os.path.islink(p):
                out.append([r, "l", 0, os.readlink(p)])
            elif os.path.isdir(p):
                out.append([r, "d", 0, None])
            elif os.path.isfile(p):
                out.append([r, "f", os.path.getsize(p), None])
    return out
def size(root):
    return sum(e[2] for e in walk(root) if e[1] == "f")
def complete(root):
    snaps = os.path.join(root, "snapshots")
    if not os.path.isdir(snaps) or not any(os.listdir(os.path.join(snaps, r)) for r in os.listdir(snaps)
                                           if os.path.isdir(os.path.join(snaps, r))):
        return False
    for r, kind, _, _ in walk(root):
        p = os.path.join(root, r)
        if r.endswith(".incomplete") or (kind == "l" and not os.path.exists(p)):
            return False
    return True
def free(path):
    while not os.path.exists(path):
        path = os.path.dirname(path) or "/"
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize
def pump(src, dst):
    while True:
        b = src.read(1 << 20)
        if not b:
            break
        dst.write(b)
    dst.flush()
mode, args = sys.argv[1], sys.argv[2:]
try:
    if mode == "list":
        models, partial = [], []
        if os.path.isdir(H):
            for n in sorted(os.listdir(H)):
                if n.startswith("models--") and os.path.isdir(os.path.join(H, n)):
                    p = os.path.join(H, n)
                    models.append({"dir": n, "size": size(p), "complete": complete(p)})
        if os.path.isdir(S):
            for n in sorted(os.listdir(S)):
                if n.startswith("models--"):
                    partial.append({"dir": n, "size": size(os.path.join(S, n))})
        print(json.dumps({"hub": H, "free": free(H), "models": models, "partial": partial}))
    elif mode == "manifest":
        p = os.path.join(H, safe(args[0]))
        print(json.dumps({"hub": H, "present": os.path.isdir(p), "complete": os.path.isdir(p) and complete(p),
                          "entries": walk(p) if os.path.isdir(p) else []}))
    elif mode == "stage":
        p = os.path.join(S, safe(args[0]))
        os.makedirs(p, exist_ok=True)
        have = {e[0]: e[2] for e in walk(p) if e[1] == "f"}
        final = os.path.join(H, args[0])
        print(json.dumps({"hub": H, "free": free(p), "have": have,
                          "complete": os.path.isdir(final) and complete(final)}))
    elif mode == "write":
        p = os.path.join(S, safe(args[0]), safe(args[1]))
        off = int(args[2])
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "ab") as f:
            f.truncate(off)
            f.seek(off)
            pump(sys.stdin.buffer, f)
            os.fsync(f.fileno())
        print(json.dumps({"size": os.path.getsize(p)}))
    elif mode == "read":
        p = os.path.join(H, safe(args[0]), safe(args[1]))
        with open(p, "rb") as f:
            f.seek(int(args[2]))
            pump(f, sys.stdout.buffer)
    elif mode == "commit":
        name = safe(args[0])
        staged, final = os.path.join(S, name), os.path.join(H, name)
        entries = json.load(sys.stdin)
        for r, kind, n, target in entries:
            p = os.path.join(staged, safe(r))
            if kind == "d":
                os.makedirs(p, exist_ok=True)
            elif kind == "l":
                if os.path.lexists(p):
                    os.remove(p)
                os.makedirs(os.path.dirname(p), exist_ok=True)
                os.symlink(target, p)
            elif not os.path.isfile(p) or os.path.getsize(p) != n:
                fail("%s has %s of %d bytes" % (r, os.path.getsize(p) if os.path.isfile(p) else "none", n))
        if not complete(staged):
            fail("the staged copy is not a complete model")
        if os.path.isdir(final):
            if complete(final):
                fail("a complete copy is already there")
            trash = os.path.join(S, "%s.replaced-%d" % (name, time.time()))
            os.rename(final, trash)
            shutil.rmtree(trash, ignore_errors=True)
        os.rename(staged, final)
        print(json.dumps({"dir": final, "size": size(final)}))
    elif mode == "rm":
        name = safe(args[0])
        freed = 0
        for p in (os.path.join(H, name), os.path.join(S, name)):
            if os.path.isdir(p):
                freed += size(p)
                shutil.rmtree(p)
        print(json.dumps({"freed": freed}))
    else:
        fail("unknown mode " + mode)
except OSError as exc:
    fail("%s: %s" % (exc.strerror or exc, getattr(exc, "filename", "") or ""), exc)
'''


def cache_dir_name(model: str) -> str:
    """org/name → models--org--name (huggingface_hub's layout); anything else is a one-line UserError."""
    if not _MODEL_RE.match(model or "") or ".." in model:
        raise UserError(f"bad model id {str(model)[:80]!r}", field="MODEL",
                        fix="write a Hugging Face model id like openai/gpt-oss-120b")
    return "models--" + model.replace("/", "--")


def model_id(dir_name: str) -> str:
    return dir_name[len("models--"):].replace("--", "/", 1) if dir_name.startswith("models--") else dir_name


def check_rel(rel: str) -> str:
    """A path a node reported, before it is sent to another node."""
    if not rel or rel.startswith("/") or ".." in rel.split("/") or "\x00" in rel:
        raise UserError(f"a node reported an unsafe path {rel[:80]!r}", fix="check the model's cache directory")
    return rel


def check_link(rel: str, target: str) -> str:
    """A snapshot link a node reported: relative, and pointing inside the model's directory (huggingface_hub
    writes `../../blobs/<hash>`), so a copy never plants a link to elsewhere on the receiving node."""
    import posixpath
    inside = posixpath.normpath(posixpath.join(posixpath.dirname(rel), target or ""))
    if not target or target.startswith("/") or inside.startswith("..") or "\x00" in target:
        raise UserError(f"a node reported a link {rel[:60]!r} → {str(target)[:60]!r} that leaves the model's "
                        "directory", fix="check the model's cache directory on the source node")
    return target


def node_argv(env: Sequence[tuple[str, str]], python: str, mode: str, *args: str) -> list[str]:
    """The argv running NODE_SCRIPT on a node, with the node's environment (e.g. HF_HUB_CACHE) in front."""
    return ["env", *(f"{k}={v}" for k, v in env), python, "-c", NODE_SCRIPT, mode, *args]


def shell(argv: Sequence[str]) -> str:
    return shlex.join(argv)
