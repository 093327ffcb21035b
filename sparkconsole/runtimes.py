"""The serving runtimes sparkconsole launches and watches, and each one's command-line vocabulary, as data.

vLLM (`vllm serve`, mp or Ray), SGLang (`python3 -m sglang.launch_server`) and llama.cpp (`llama-server`) say the
same things with different flags: which word is the model, the tensor- and pipeline-parallel sizes, the memory
claim, the context length, the KV cache's dtype, the name it serves under. Preflight (launch/lint*.py), the plan
(launch/runtime_cmd.py) and the memory estimate (placement/estimate.py) read a server's argv through this table,
so a rule about vLLM's `--gpu-memory-utilization` is asked of SGLang as `--mem-fraction-static` and never of
llama.cpp, which claims nothing up front. Pure: no I/O, nothing above errors.py.

Names as sparkrun's recipes write them: `vllm` (also `vllm-distributed`, `vllm-ray`, `eugr-vllm`), `sglang`,
`llama-cpp` (also `llama.cpp`, `llamacpp`, `llama_cpp`). Any other runtime is refused in one line naming it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from .errors import UserError

VLLM, SGLANG, LLAMA_CPP = "vllm", "sglang", "llama-cpp"
# sparkrun's names for vLLM launched its way (mp, Ray, eugr's image) are all vLLM to us: the topology and
# --backend choose how it spreads over nodes.
_ALIASES = {"vllm": VLLM, "vllm-distributed": VLLM, "vllm-ray": VLLM, "eugr-vllm": VLLM,
            "sglang": SGLANG, "llama-cpp": LLAMA_CPP, "llama.cpp": LLAMA_CPP, "llamacpp": LLAMA_CPP,
            "llama_cpp": LLAMA_CPP}
# A command that names its runtime plainly (as sparkrun reads it when a recipe says no runtime).
_COMMAND_HINTS = ((re.compile(r"(^|[\s/])(python3?\s+-m\s+sglang\.launch_server|sglang\s+serve)\b"), SGLANG),
                  (re.compile(r"(^|[\s/])llama-server(\s|$)"), LLAMA_CPP))


@dataclass(frozen=True)
class Runtime:
    """One runtime's vocabulary. Flags are listed long form first; the last one on a command line wins."""

    name: str
    title: str
    model: tuple[str, ...]                 # the flag naming the model (vLLM also takes `serve MODEL`)
    served_name: tuple[str, ...]
    tp: tuple[str, ...]
    pp: tuple[str, ...]
    context: tuple[str, ...]               # the longest sequence the server admits
    kv_dtype: tuple[str, ...]              # KV cache dtype (llama.cpp: the K half; kv_dtype_v the V half)
    claim_fraction: tuple[str, ...]        # the share of the node's memory taken at start (None-able)
    dtype: tuple[str, ...] = ()            # activations' dtype ("auto" KV follows it)
    claim_gib: tuple[str, ...] = ()        # a claim written in GiB instead of a fraction
    kv_dtype_v: tuple[str, ...] = ()
    default_claim_fraction: float | None = None   # what the server takes when the flag is absent
    default_port: int = 8000               # where it listens when its command names no --port
    default_host: str | None = None        # the address it binds without --host (None: every interface)
    health_path: str = "/health"
    models_path: str = "/v1/models"
    topologies: tuple[str, ...] = ("solo", "cluster-tp2", "2x-solo", "disagg")
    backends: tuple[str, ...] = ("mp",)    # how a cluster launch spreads it (mp: the runtime's own multi-node)
    metrics_note: str = ""

    def refuse_topology(self, topology: str, source: str | None) -> None:
        if topology not in self.topologies:
            raise UserError(f"{self.title} does not run as {topology}", file=source, field="runtime",
                            fix=f"use --topology {' or '.join(self.topologies)}"
                                + (" (a llama.cpp server runs on one node)" if self.name == LLAMA_CPP else ""))


RUNTIMES: dict[str, Runtime] = {
    VLLM: Runtime(
        name=VLLM, title="vLLM", model=("--model",), served_name=("--served-model-name",),
        tp=("--tensor-parallel-size", "-tp"), pp=("--pipeline-parallel-size", "-pp"), context=("--max-model-len",),
        kv_dtype=("--kv-cache-dtype",), claim_fraction=("--gpu-memory-utilization",), dtype=("--dtype",),
        claim_gib=("--gpu-memory-utilization-gb",), default_claim_fraction=0.9, backends=("mp", "ray")),
    # SGLang: multi-node is its own (--nnodes, --node-rank, --dist-init-addr); /health answers once the server
    # is up (/health_generate would run a generation on every poll); its prefill/decode split uses its own
    # bootstrap and router, not vLLM's NixlConnector and vllm-router, so disagg is not planned for it.
    SGLANG: Runtime(
        name=SGLANG, title="SGLang", model=("--model-path", "--model"), served_name=("--served-model-name",),
        tp=("--tp-size", "--tensor-parallel-size", "--tp"), pp=("--pp-size", "--pipeline-parallel-size"),
        context=("--context-length",), kv_dtype=("--kv-cache-dtype",), claim_fraction=("--mem-fraction-static",),
        dtype=("--dtype",), topologies=("solo", "cluster-tp2", "2x-solo"), default_port=30000,
        default_host="127.0.0.1", metrics_note="SGLang publishes /metrics only with --enable-metrics"),
    # llama.cpp's llama-server: one node (sparkrun's RPC split is experimental); /health is 503 while the model
    # loads, 200 once it serves; it allocates weights + its context's KV and claims no share up front.
    LLAMA_CPP: Runtime(
        name=LLAMA_CPP, title="llama.cpp", model=("--model", "-m"), served_name=("--alias", "-a"), tp=(), pp=(),
        context=("--ctx-size", "-c"), kv_dtype=("--cache-type-k", "-ctk"), kv_dtype_v=("--cache-type-v", "-ctv"),
        claim_fraction=(), topologies=("solo",), default_port=8080, default_host="127.0.0.1",
        metrics_note="llama-server publishes /metrics only with --metrics"),
}


def canonical(name: str | None) -> str | None:
    """The runtime a recipe's `runtime:` names, or None for one sparkconsole does not run."""
    return _ALIASES.get((name or VLLM).strip().lower())


def from_command(command: str) -> str | None:
    """The runtime a command line names plainly (`python3 -m sglang.launch_server`, `llama-server`), else None."""
    for pattern, name in _COMMAND_HINTS:
        if pattern.search(command or ""):
            return name
    return None


def runtime_for(name: str | None, command: str = "", *, source: str | None = None) -> Runtime:
    """The runtime a recipe runs: its `runtime:` (default vLLM), except that a recipe left at the default whose
    command plainly starts another runtime is that runtime (sparkrun reads it so). Any runtime sparkconsole does
    not run is refused in one line naming it."""
    key = canonical(name)
    if key is None:
        known = ", ".join(sorted({VLLM, SGLANG, LLAMA_CPP}))
        raise UserError(f"runtime {str(name)[:30]!r} is not one sparkconsole runs", file=source, field="runtime",
                        fix=f"use one of: {known} (or run this recipe with sparkrun)")
    if key == VLLM and (name or VLLM).strip().lower() == VLLM:
        hinted = from_command(command)
        if hinted is not None:
            key = hinted
    return RUNTIMES[key]


# --- reading flags back out of an argv (the last one wins, as vLLM, SGLang and llama.cpp read them) ---------------

def flag_value(argv: Sequence[str], *names: str) -> str | None:
    """The last value of a flag written `--flag V` or `--flag=V`."""
    found = None
    for i, a in enumerate(argv):
        for n in names:
            if a == n and i + 1 < len(argv):
                found = argv[i + 1]
            elif a.startswith(n + "="):
                found = a[len(n) + 1:]
    return found


def has_flag(argv: Sequence[str], *names: str) -> bool:
    return any(a in names or any(a.startswith(n + "=") for n in names) for a in argv)


def int_flag(argv: Sequence[str], names: Sequence[str], default: int) -> int:
    v = flag_value(argv, *names) if names else None
    try:
        return int(v) if v is not None else default
    except ValueError:
        return default


def float_flag(argv: Sequence[str], names: Sequence[str]) -> float | None:
    v = flag_value(argv, *names) if names else None
    try:
        return float(v) if v is not None else None
    except ValueError:
        return None


def model_source(runtime: Runtime, argv: Sequence[str]) -> str | None:
    """What the server loads: vLLM's `serve MODEL` (else --model); the runtime's model flag otherwise."""
    if runtime.name == VLLM:
        for i, a in enumerate(argv[:-1]):
            if a == "serve" and not argv[i + 1].startswith("-"):
                return argv[i + 1]
    return flag_value(argv, *runtime.model)


def parallel(runtime: Runtime, argv: Sequence[str]) -> tuple[int, int]:
    """(tensor, pipeline) parallel sizes of one server's argv (1, 1 for llama.cpp)."""
    return int_flag(argv, runtime.tp, 1), int_flag(argv, runtime.pp, 1)


# --- a serve command from `defaults`, for a recipe that has no `command:` (as sparkrun generates one) ---------------

# recipe key → flag. Values stay `{placeholders}`, so --set changes them as it changes a written command.
_VALUE_FLAGS: dict[str, tuple[tuple[str, str], ...]] = {
    SGLANG: (("host", "--host"), ("port", "--port"), ("tensor_parallel", "--tp-size"),
             ("pipeline_parallel", "--pp-size"), ("gpu_memory_utilization", "--mem-fraction-static"),
             ("max_model_len", "--context-length"), ("max_num_seqs", "--max-running-requests"),
             ("served_model_name", "--served-model-name"), ("dtype", "--dtype"), ("quantization", "--quantization"),
             ("kv_cache_dtype", "--kv-cache-dtype"), ("chunked_prefill", "--chunked-prefill-size"),
             ("tokenizer_path", "--tokenizer-path")),
    LLAMA_CPP: (("host", "--host"), ("port", "--port"), ("ctx_size", "--ctx-size"), ("max_model_len", "--ctx-size"),
                ("n_gpu_layers", "--n-gpu-layers"), ("parallel", "--parallel"), ("threads", "--threads"),
                ("chat_template", "--chat-template"), ("served_model_name", "--alias")),
}
_BOOL_FLAGS: dict[str, tuple[tuple[str, str], ...]] = {
    SGLANG: (("trust_remote_code", "--trust-remote-code"), ("enable_torch_compile", "--enable-torch-compile"),
             ("disable_radix_cache", "--disable-radix-cache")),
    LLAMA_CPP: (("cont_batching", "--cont-batching"), ("jinja", "--jinja"), ("no_webui", "--no-webui")),
}
# What the console reads is switched on in every generated command: SGLang's and llama-server's /metrics are off
# unless asked for.
_ALWAYS = {SGLANG: ("--enable-metrics",), LLAMA_CPP: ("--metrics",)}


def _truthy(v: object) -> bool:
    return v is True or str(v).strip().lower() in ("1", "true", "yes", "on")


def generate_command(runtime: Runtime, model: str | None, defaults: dict[str, object] | None, *,
                     source: str | None = None) -> str:
    """The serve command a recipe without `command:` runs, from its model and `defaults` (sparkrun's mapping for
    SGLang and llama.cpp). vLLM's is the recipe reader's (sparkconsole/recipes/); any other runtime is refused."""
    import shlex

    if runtime.name not in _VALUE_FLAGS:
        raise UserError(f"the recipe has no command, and sparkconsole does not write one for {runtime.title}",
                        file=source, field="command", fix="write the serve command under `command:`")
    if not model:
        raise UserError("the recipe has neither a command nor a model", file=source, field="model",
                        fix="add `model:` (a Hugging Face id or a path), or write the serve command under `command:`")
    d = defaults or {}
    word = shlex.quote(model).replace("{", "{{").replace("}", "}}")
    if runtime.name == SGLANG:
        words = ["python3", "-m", "sglang.launch_server", "--model-path", word]
    elif model.lower().endswith(".gguf") or "/" not in model or model.startswith(("/", "~/", "./")):
        words = ["llama-server", "-m", word]
    else:
        words = ["llama-server", "-hf", word]       # llama-server fetches org/repo[:quant] itself
    taken: set[str] = set()
    for key, flag in _VALUE_FLAGS[runtime.name]:
        # host and port always: the plan fills them (the node's port), where the runtime's own default would differ
        if (d.get(key) is not None or key in ("host", "port")) and flag not in taken:
            words += [flag, "{" + key + "}"]
            taken.add(flag)
    words += [flag for key, flag in _BOOL_FLAGS[runtime.name] if _truthy(d.get(key))]
    words += list(_ALWAYS[runtime.name])
    return " ".join(words)
