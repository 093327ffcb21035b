"""Write the test bed's tiny model as a GGUF file for llama.cpp, with the `gguf` package: run with the llama.cpp
venv's Python (gguf, numpy, safetensors), never imported by pytest.

    python tests/testbed/gguf_build.py MODEL_DIR OUT.gguf

The Llama shape and weights from config.json and model.safetensors (float32, as model_build.py wrote them), the
byte-level BPE tokenizer from tokenizer.json (vocabulary, merges, special tokens) and the chat template, under
llama.cpp's names for a Llama (token_embd, blk.N.attn_q, …, output). Q and K rows are permuted as llama.cpp's own
converter permutes them (Hugging Face's rotary layout → GGML's), so RoPE sees the same pairs the Hugging Face model
does.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def permute(w, heads: int):
    """Hugging Face's q/k rows (half-split rotary) → llama.cpp's (interleaved pairs)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


NAMES = {"input_layernorm.weight": "attn_norm.weight", "self_attn.q_proj.weight": "attn_q.weight",
         "self_attn.k_proj.weight": "attn_k.weight", "self_attn.v_proj.weight": "attn_v.weight",
         "self_attn.o_proj.weight": "attn_output.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
         "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
         "mlp.down_proj.weight": "ffn_down.weight"}
TOP = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
       "lm_head.weight": "output.weight"}


def main(argv: list[str]) -> int:
    import gguf
    import numpy as np
    from safetensors.numpy import load_file

    src, out = Path(argv[1]), Path(argv[2])
    cfg = json.loads((src / "config.json").read_text())
    tok = json.loads((src / "tokenizer.json").read_text())
    tok_cfg = json.loads((src / "tokenizer_config.json").read_text())
    heads, kv_heads = cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    rope = (cfg.get("rope_parameters") or {}).get("rope_theta") or cfg.get("rope_theta", 10000.0)

    w = gguf.GGUFWriter(str(out), "llama")
    w.add_name("sparkconsole-testbed tiny-llama")
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(float(rope))
    w.add_layer_norm_rms_eps(float(cfg["rms_norm_eps"]))
    w.add_vocab_size(cfg["vocab_size"])
    w.add_file_type(gguf.LlamaFileType.ALL_F32)

    vocab = tok["model"]["vocab"]
    special = {t["id"] for t in tok.get("added_tokens", []) if t.get("special")}
    tokens = [""] * cfg["vocab_size"]
    for text, i in vocab.items():
        tokens[i] = text
    for t in tok.get("added_tokens", []):
        tokens[t["id"]] = t["content"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.CONTROL if i in special else gguf.TokenType.NORMAL for i in range(len(tokens))])
    w.add_token_merges(merges)
    ids = {t["content"]: t["id"] for t in tok.get("added_tokens", [])}
    w.add_bos_token_id(ids[tok_cfg["bos_token"]])
    w.add_eos_token_id(ids[tok_cfg["eos_token"]])
    w.add_pad_token_id(ids[tok_cfg["pad_token"]])
    w.add_add_bos_token(True)
    template = src / "chat_template.jinja"
    if template.exists():
        w.add_chat_template(template.read_text())

    for name, t in sorted(load_file(str(src / "model.safetensors")).items()):
        t = t.astype(np.float32)
        if name in TOP:
            w.add_tensor(TOP[name], t)
            continue
        _, _, layer, rest = name.split(".", 3)            # model.layers.N.rest
        if rest == "self_attn.q_proj.weight":
            t = permute(t, heads)
        elif rest == "self_attn.k_proj.weight":
            t = permute(t, kv_heads)
        w.add_tensor(f"blk.{layer}.{NAMES[rest]}", t)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
