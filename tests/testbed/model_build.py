"""Build the test bed's tiny chat model from nothing: run with the vLLM venv's Python (it has torch,
transformers and tokenizers), never imported by pytest.

    python tests/testbed/model_build.py OUT_DIR

A BPE tokenizer trained on generated text, a chat template, and a 2-layer Llama (hidden 128, 4 heads:
head size 32, the smallest vLLM's CPU attention takes) with seeded random weights. Nothing comes from a hub.
The same seed gives the same files, so the cache can be rebuilt at will.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

SEED = 1234
VOCAB_SIZE = 1536
HIDDEN = 128
HEADS = 4
LAYERS = 2
MAX_POSITIONS = 4096
SPECIAL = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
# Llama-3-shaped so clients that send system/user/assistant turns get a familiar prompt layout.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n{{ message['content'] | trim }}<|eot_id|>"
    "{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
COMMON_WORDS = ["the", "of", "and", "to", "in", "is", "was", "for", "on", "that", "with", "as", "by", "at", "from", "it", "this", "be", "are", "or", "an", "which", "his", "her", "their", "one", "what", "capital", "France", "Paris", "city", "model", "token", "GPU", "node", "memory", "cluster", "spark", "request", "answer", "question", "write", "story", "about", "please", "tell", "me", "you", "we", "they", "time", "day", "year", "people", "world", "system", "server", "test", "bench"]


def corpus(lines: int = 4000, seed: int = SEED) -> list[str]:
    """Sentences of common words, made-up words, numbers and punctuation: enough variety for ~1.5k merges."""
    rng = random.Random(seed)
    syllables = ["ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "zu", "pe", "qua", "dor", "len", "gri", "sho"]
    made_up = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 3))) for _ in range(600)]
    out = []
    for _ in range(lines):
        words = []
        for _ in range(rng.randint(5, 18)):
            pick = rng.random()
            if pick < 0.55:
                word = rng.choice(COMMON_WORDS)
            elif pick < 0.9:
                word = rng.choice(made_up)
            else:
                word = str(rng.randint(0, 2000))
            words.append(word.capitalize() if not words else word)
        out.append(" ".join(words) + rng.choice([".", ".", "?", "!", ","]))
    return out


def ascii_alphabet() -> list[str]:
    """The byte-level symbols of printable ASCII, tab and newline (GPT-2's byte-to-unicode table).

    Without the other 161 byte symbols the random model can only emit tokens that decode to whole characters:
    with them, ~9% of its tokens were partial UTF-8, which vLLM streams as chunks with empty `content`, and
    llama-benchy leaves those out of its token count (its decode t/s read 8-12% below ours on the same server),
    so the cross-check compared definitions rather than timings. Input outside ASCII is dropped by the tokenizer.
    """
    visible = [*range(ord("!"), ord("~") + 1), *range(ord("\xa1"), ord("\xac") + 1), *range(ord("\xae"), 256)]
    table, extra = {}, 0
    for b in range(256):
        if b in visible:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return [table[b] for b in (*range(32, 127), 9, 10)]


def build_tokenizer(out: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=SPECIAL,
                                  initial_alphabet=ascii_alphabet(), show_progress=False)
    tok.train_from_iterator(corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>",
                                   pad_token="<|end_of_text|>", model_max_length=MAX_POSITIONS)
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    return fast


def build_model(out: Path, tokenizer) -> None:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(SEED)
    eos_ids = [tokenizer.convert_tokens_to_ids("<|eot_id|>"), tokenizer.convert_tokens_to_ids("<|end_of_text|>")]
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=HIDDEN, intermediate_size=HIDDEN * 2, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, num_key_value_heads=HEADS, max_position_embeddings=MAX_POSITIONS,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=eos_ids, pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False, torch_dtype="float32",
    )
    model = LlamaForCausalLM(config)
    model.save_pretrained(out, safe_serialization=True)
    GenerationConfig(bos_token_id=tokenizer.bos_token_id, eos_token_id=eos_ids,
                     pad_token_id=tokenizer.pad_token_id).save_pretrained(out)


def main(argv: list[str]) -> int:
    out = Path(argv[1])
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(out)
    build_model(out, tokenizer)
    (out / "sparkconsole-model.json").write_text(json.dumps(
        {"seed": SEED, "vocab": len(tokenizer), "hidden": HIDDEN, "heads": HEADS, "layers": LAYERS}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
