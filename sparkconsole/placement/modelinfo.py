"""What the memory estimate knows of a model: its shape (config.json) and the bytes of its weights.

Sources, in this order (issue 36): the node's Hugging Face cache, read on the node over its transport by
NODE_SCRIPT (config.json, and each safetensors file's header: the exact bytes of every tensor, quantised packing
and scales included, without reading a weight); then the recipe's `metadata:` block (sparkrun's keys:
model_params, model_dtype, kv_dtype, num_layers, num_kv_heads, head_dim, model_vram, kv_vram_per_token, plus
kv_lora_rank and qk_rope_head_dim for MLA models); then the Hub when online (config.json and the safetensors
index's total size; never in tests: HF_HUB_OFFLINE=1 or `offline` keeps it off). A later source only fills what
the earlier ones left unknown.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

from ..distribute.nodescript import HUB_PY

GIB = 1024 ** 3
MISSING_RC = 3                         # NODE_SCRIPT's exit status when the model is not in the node's cache

# Bytes per element of the dtype names configs, recipes' metadata and runtimes' flags use.
DTYPE_BYTES: dict[str, float] = {
    "float32": 4, "fp32": 4, "f32": 4, "float": 4,
    "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "f16": 2, "half": 2,
    "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "fp8_e4m3fn": 1, "int8": 1, "i8": 1,
    "int4": 0.5, "fp4": 0.5, "nvfp4": 0.5, "mxfp4": 0.5, "awq": 0.5, "gptq": 0.5,
    # llama.cpp's cache types (ggml block sizes: q8_0 34 bytes per 32 values, q4_0 18, …)
    "q8_0": 34 / 32, "q4_0": 18 / 32, "q4_1": 20 / 32, "q5_0": 22 / 32, "q5_1": 24 / 32, "iq4_nl": 18 / 32,
}
_SAFETENSORS_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "I64": 8, "I32": 4,
                      "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}


def dtype_bytes(name: str | None) -> float | None:
    if not name:
        return None
    return DTYPE_BYTES.get(str(name).strip().lower().replace("-", "_").removeprefix("torch."))


@dataclass(frozen=True)
class ModelInfo:
    source: str                            # hf-cache | metadata | hub | unknown: where the weights figure came from
    weights_b: int | None = None           # the weight tensors' bytes (all shards)
    params: int | None = None              # parameter count (elements), where known
    dtype: str | None = None               # the checkpoint's activation dtype (config torch_dtype): "auto" KV follows it
    num_layers: int | None = None
    num_kv_heads: int | None = None
    head_dim: int | None = None
    kv_lora_rank: int | None = None        # MLA (DeepSeek V2/V3): the compressed KV latent's width
    qk_rope_head_dim: int | None = None    # MLA: the decoupled RoPE key's width, stored beside the latent
    max_position_embeddings: int | None = None
    kv_dtype: str | None = None            # the recipe metadata's KV dtype, used when the command sets none
    kv_per_token_b: float | None = None    # metadata's kv_vram_per_token, when given directly (whole model)
    sparse_indexer: bool = False           # DeepSeek's sparse attention (DSA): fp8 KV is stored as fp8_ds_mla
    model_type: str | None = None
    notes: tuple[str, ...] = ()

    @property
    def mla(self) -> bool:
        return bool(self.kv_lora_rank)

    def fill(self, other: ModelInfo | None) -> ModelInfo:
        """This, with what it left unknown taken from `other` (a later source in the order)."""
        if other is None:
            return self
        taken, changes = [], {}
        for f in fields(self):
            if f.name in ("source", "notes", "sparse_indexer"):
                continue
            if getattr(self, f.name) is None and getattr(other, f.name) is not None:
                changes[f.name] = getattr(other, f.name)
                taken.append(f.name)
        source = self.source
        if source == "unknown" or (self.weights_b is None and other.weights_b is not None):
            source = other.source      # the source named is the one the weights came from
        notes = self.notes + other.notes
        if taken and source != other.source:
            notes += (f"{', '.join(taken)} from {other.source}",)
        return replace(self, **changes, source=source, notes=notes,
                       sparse_indexer=self.sparse_indexer or other.sparse_indexer)


UNKNOWN = ModelInfo("unknown")


# --- config.json -------------------------------------------------------------------------------------------------

def _int(v: Any) -> int | None:
    if isinstance(v, bool):
        return None
    try:
        n = int(v)
    except (TypeError, ValueError):
        return None
    return n if n > 0 else None


def _text_config(cfg: Mapping[str, Any]) -> Mapping[str, Any]:
    """Multimodal configs keep the language model's shape in a nested block."""
    if "num_hidden_layers" in cfg or "num_layers" in cfg or "n_layer" in cfg:
        return cfg
    for key in ("text_config", "llm_config", "language_config"):
        inner = cfg.get(key)
        if isinstance(inner, Mapping):
            return inner
    return cfg


def info_from_config(cfg: Mapping[str, Any], *, source: str, weights_b: int | None = None,
                     params: int | None = None) -> ModelInfo:
    t = _text_config(cfg)
    layers = next((_int(t[k]) for k in ("num_hidden_layers", "num_layers", "n_layer", "n_layers") if k in t), None)
    heads = next((_int(t[k]) for k in ("num_attention_heads", "n_head") if k in t), None)
    kv_heads = next((_int(t[k]) for k in ("num_key_value_heads", "num_kv_heads") if k in t), None) or heads
    head_dim = _int(t.get("head_dim"))
    if head_dim is None and heads and _int(t.get("hidden_size")):
        head_dim = int(t["hidden_size"]) // heads
    dtype = t.get("torch_dtype") or t.get("dtype") or cfg.get("torch_dtype") or cfg.get("dtype")
    return ModelInfo(source=source, weights_b=weights_b, params=params,
                     dtype=str(dtype) if isinstance(dtype, str) else None, num_layers=layers,
                     num_kv_heads=kv_heads, head_dim=head_dim, kv_lora_rank=_int(t.get("kv_lora_rank")),
                     qk_rope_head_dim=_int(t.get("qk_rope_head_dim")),
                     max_position_embeddings=_int(t.get("max_position_embeddings")),
                     sparse_indexer=bool(t.get("index_topk")),
                     model_type=str(t.get("model_type") or cfg.get("model_type") or "") or None)


# --- the recipe's metadata ---------------------------------------------------------------------------------------

_SUFFIX = {"T": 10 ** 12, "B": 10 ** 9, "M": 10 ** 6, "K": 10 ** 3}


def param_count(v: Any) -> int | None:
    """7000000000, 7e9, "7B", "0.5B", "480M", "1_000_000" → an integer count."""
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return int(v) if v > 0 and math.isfinite(v) else None
    text = str(v).strip().replace("_", "").upper()
    try:
        return param_count(float(text))
    except ValueError:
        pass
    if text and text[-1] in _SUFFIX:
        try:
            return param_count(float(text[:-1]) * _SUFFIX[text[-1]])
        except ValueError:
            return None
    return None


def _gb(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if f > 0 and math.isfinite(f) else None


def info_from_metadata(meta: Mapping[str, Any] | None) -> ModelInfo | None:
    """The recipe's `metadata:` (sparkrun's keys), or None when it says nothing about the model's size."""
    if not meta:
        return None
    params = param_count(meta.get("model_params")) if meta.get("model_params") is not None else None
    dtype = meta.get("model_dtype")
    weights = None
    vram = _gb(meta.get("model_vram"))
    if vram is not None:
        weights = int(vram * GIB)        # sparkrun's model_vram is in GB of 1024³ bytes
    elif params and dtype_bytes(dtype):
        weights = int(params * (dtype_bytes(dtype) or 0))
    per_token = _gb(meta.get("kv_vram_per_token"))
    info = ModelInfo(source="metadata", weights_b=weights, params=params,
                     dtype=str(dtype) if dtype and dtype_bytes(dtype) and (dtype_bytes(dtype) or 0) >= 2 else None,
                     num_layers=_int(meta.get("num_layers")), num_kv_heads=_int(meta.get("num_kv_heads")),
                     head_dim=_int(meta.get("head_dim")), kv_lora_rank=_int(meta.get("kv_lora_rank")),
                     qk_rope_head_dim=_int(meta.get("qk_rope_head_dim")),
                     kv_dtype=str(meta["kv_dtype"]) if meta.get("kv_dtype") else None,
                     kv_per_token_b=per_token * GIB if per_token is not None else None)
    if info.weights_b is None and info.num_layers is None and info.kv_per_token_b is None:
        return None
    return info


# --- the node's Hugging Face cache (read on the node, stdlib only) ------------------------------------------------
# config.json is read up to 1 MiB; a safetensors header (8 bytes of length, then JSON) over 100 MiB is not one.

NODE_SCRIPT = HUB_PY + r'''
import json, os, struct, sys
src, rev = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else "")
if src.startswith("/") or src.startswith("~/"):
    d = os.path.expanduser(src)
else:
    root = os.path.join(hub(), "models--" + src.replace("/", "--"))
    snaps = os.path.join(root, "snapshots")
    if not rev:
        try:
            rev = open(os.path.join(root, "refs", "main")).read().strip()
        except OSError:
            rev = ""
    d = os.path.join(snaps, rev) if rev else ""
    if not rev or not os.path.isdir(d):
        try:
            names = sorted(os.listdir(snaps), key=lambda n: os.path.getmtime(os.path.join(snaps, n)))
        except OSError:
            names = []
        d = os.path.join(snaps, names[-1]) if names else ""
if not d or not os.path.exists(d):
    print(json.dumps({"missing": True}))
    sys.exit(3)
out = {}
files = [d] if os.path.isfile(d) else [os.path.join(d, n) for n in sorted(os.listdir(d))]
cfg = os.path.join(d, "config.json")
if os.path.isfile(cfg) and os.path.getsize(cfg) <= 1048576:
    try:
        out["config"] = json.load(open(cfg))
    except ValueError:
        out["bad"] = "config.json is not JSON"
weights, params, shards, gguf = 0, 0, 0, 0
for p in files:
    if p.endswith(".gguf") and os.path.isfile(p):
        gguf += os.path.getsize(p)
    if not p.endswith(".safetensors") or not os.path.isfile(p):
        continue
    with open(p, "rb") as f:
        head = f.read(8)
        n = struct.unpack("<Q", head)[0] if len(head) == 8 else 0
        if not 0 < n <= 104857600:
            out["bad"] = os.path.basename(p) + ": not a safetensors file"
            continue
        try:
            header = json.loads(f.read(n))
        except ValueError:
            out["bad"] = os.path.basename(p) + ": unreadable safetensors header"
            continue
    shards += 1
    for name, t in header.items():
        if name == "__metadata__" or not isinstance(t, dict):
            continue
        begin, end = t["data_offsets"]
        weights += end - begin
        count = 1
        for s in t.get("shape", []):
            count *= s
        params += count
out.update(weights_b=weights if shards else None, params=params if shards else None, shards=shards,
           gguf_b=gguf or None)
print(json.dumps(out))
'''


def probe_command(source: str, revision: str | None = None, python: str = "python3") -> str:
    """The shell command that reads `source` (a Hub id, or a path on the node) from the node's cache."""
    return shlex.join([python, "-c", NODE_SCRIPT, source, *([revision] if revision else [])])


def parse_probe(stdout: str, *, source: str = "hf-cache") -> ModelInfo | None:
    """NODE_SCRIPT's answer → ModelInfo; None when the model is not there or the answer is not one."""
    try:
        doc = json.loads(stdout.strip().splitlines()[-1]) if stdout.strip() else None
    except ValueError:
        return None
    if not isinstance(doc, dict) or doc.get("missing"):
        return None
    weights = _int(doc.get("weights_b")) or _int(doc.get("gguf_b"))
    cfg = doc.get("config")
    notes: tuple[str, ...] = (f"the node's cache: {doc['bad']}",) if doc.get("bad") else ()
    if _int(doc.get("gguf_b")) and not _int(doc.get("weights_b")):
        notes += ("GGUF: the weights are the file's size",)
    if isinstance(cfg, dict):
        return replace(info_from_config(cfg, source=source, weights_b=weights, params=_int(doc.get("params"))),
                       notes=notes)
    if weights:
        return ModelInfo(source=source, weights_b=weights, params=_int(doc.get("params")), notes=notes)
    return None


# --- the Hub (online only) ------------------------------------------------------------------------------------------

HUB = "https://huggingface.co"
_REPO_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$")


def hub_allowed() -> bool:
    """The Hub is asked only when nothing says offline (HF_HUB_OFFLINE, as huggingface_hub reads it)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() not in ("1", "true", "yes", "on")


async def read_hub(model: str, revision: str | None = None, *, timeout: float = 5.0) -> ModelInfo | None:
    """config.json and the weights' total size from the Hub, without downloading a weight; None on any failure."""
    if not hub_allowed() or not _REPO_RE.match(model):
        return None
    import httpx

    rev = revision or "main"
    base = f"{HUB}/{model}/resolve/{rev}"
    try:
        async with httpx.AsyncClient(timeout=timeout, follow_redirects=False) as client:
            cfg_r = await client.get(f"{base}/config.json", follow_redirects=True)
            if cfg_r.status_code != 200:
                return None
            cfg = cfg_r.json()
            weights = None
            idx = await client.get(f"{base}/model.safetensors.index.json", follow_redirects=True)
            if idx.status_code == 200:
                weights = _int((idx.json().get("metadata") or {}).get("total_size"))
            else:
                head = await client.head(f"{base}/model.safetensors")
                weights = _int(head.headers.get("x-linked-size"))
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    return info_from_config(cfg, source="hub", weights_b=weights) if isinstance(cfg, dict) else None


# The bundled recipes' models (v1 recipes carry no metadata): figures from their model cards and seed 004.
BUILT_IN: dict[str, dict[str, Any]] = {
    "openai/gpt-oss-120b": {"model_vram": 60.8, "num_layers": 36, "num_kv_heads": 8, "head_dim": 64,
                            "model_dtype": "bfloat16"},           # 117B params, MXFP4 checkpoint ~65 GB
    "meta-llama/Llama-3.1-8B-Instruct": {"model_vram": 14.96, "num_layers": 32, "num_kv_heads": 8, "head_dim": 128,
                                         "model_dtype": "bfloat16"},   # 8.03B params bf16
    "deepseek-ai/DeepSeek-V4-Flash": {"model_vram": 136.0, "kv_vram_per_token": 6144 / GIB},
    # seed 004: ~75 GiB loaded per node at TP=2; ~865K KV tokens in ~5 GiB (fp8)
}


def resolve(node_cache: ModelInfo | None, metadata: Mapping[str, Any] | None, hub: ModelInfo | None = None,
            *, model: str | None = None) -> ModelInfo:
    """The sources in their order, each filling what the earlier left unknown: the node's cache, the recipe's
    metadata, sparkconsole's own figures for a bundled recipe's model, the Hub."""
    info = node_cache or UNKNOWN
    info = info.fill(info_from_metadata(metadata))
    built_in = info_from_metadata(BUILT_IN.get(model or ""))
    if built_in is not None:
        info = info.fill(replace(built_in, notes=(f"sparkconsole's own figures for {model}",)))
    return info.fill(hub)


async def read_node(transport: Any, source: str, revision: str | None = None,
                    timeout: float = 30.0, env: Sequence[tuple[str, str]] = ()) -> tuple[ModelInfo | None, bool]:
    """NODE_SCRIPT over a node's transport: (the model as its cache has it, whether the cache lacks it). A node that
    cannot be read gives (None, False): the estimate falls back to the recipe's metadata. `env`: the node's own
    environment for sparkconsole's commands (a .env's HF_HOME: where its cache is), put in front."""
    prefix = "".join(f"{k}={shlex.quote(v)} " for k, v in env)
    try:
        res = await transport.run(prefix + probe_command(source, revision), timeout=timeout)
    except Exception:  # noqa: BLE001 — an unreadable node is an unknown, not a failed plan
        return None, False
    if res.rc == MISSING_RC:
        return None, True
    return (parse_probe(res.stdout) if res.rc == 0 else None), False
