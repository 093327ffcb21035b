"""secrets: secret names, shape rules and registered values never survive redact()."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkconsole import secrets


@pytest.fixture(autouse=True)
def _clean_registry():
    secrets.forget_all()
    yield
    secrets.forget_all()


@pytest.mark.parametrize("name", ["HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "LITELLM_MASTER_KEY", "OPENAI_API_KEY",
                                  "MY_SERVICE_TOKEN", "AWS_SECRET", "DB_PASSWORD", "api_key", "apiKey",
                                  "--api-key", "--hf-token", "password"])
def test_secret_names(name):
    assert secrets.is_secret_name(name)


@pytest.mark.parametrize("name", ["MAX_TOKENS", "max_num_batched_tokens", "HF_HOME", "MODEL", "--port",
                                  "KEYBOARD", "TOKENIZER", "", "VLLM_HOST_IP"])
def test_plain_names(name):
    assert not secrets.is_secret_name(name)


@pytest.mark.parametrize("text,secret", [
    ("docker run -e HF_TOKEN=hf_live_value_1 -e HF_HOME=/cache vllm", "hf_live_value_1"),
    ("docker run -e 'HF_TOKEN=two words' img", "two words"),
    ('export LITELLM_MASTER_KEY="sk master"', "sk master"),
    ("vllm serve m --api-key s3cr3t-value --port 8000", "s3cr3t-value"),
    ("vllm serve m --api-key=s3cr3t-value", "s3cr3t-value"),
    ('{"OPENAI_API_KEY": "abc\\"def", "model": "x"}', 'abc\\"def'),
    ("curl -H 'Authorization: Bearer eyJhbGciOi.x.y' http://h:4000/v1/models", "eyJhbGciOi.x.y"),
    ("proxy at http://ops:pa55word@10.0.0.1:3128 failed", "pa55word"),
    ("  api_key: sk-yaml-value\n  model: m", "sk-yaml-value"),
    ("token hf_AbCdEfGhIjKlMnOpQrStUv leaked in a log line", "hf_AbCdEfGhIjKlMnOpQrStUv"),
    ("key sk-proj-AbCdEfGhIjKlMn0123 pasted", "sk-proj-AbCdEfGhIjKlMn0123"),
])
def test_shapes_are_masked(text, secret):
    out = secrets.redact(text)
    assert secret not in out
    assert "***" in out


@pytest.mark.parametrize("text", [
    "vllm serve openai/gpt-oss-120b --max-num-seqs 64 --max-model-len 8192 HF_HOME=/cache --port 8000",
    "(APIServer pid=93) INFO 11-22 17:00:01 [loggers.py:123] Engine 000: Avg prompt throughput: 2926.0 tokens/s, "
    "Running: 1 reqs, Waiting: 0 reqs, GPU KV cache usage: 3.1%, Prefix cache hit rate: 0.0%",
    "Token indices sequence length is longer than the specified maximum sequence length",
    "Basic usage: sparkconsole --cluster sparkconsole.yaml",
])
def test_plain_text_is_untouched(text):
    assert secrets.redact(text) == text


def test_values_of_secret_env_are_registered():
    n = secrets.register_env({"HF_TOKEN": "value-from-env", "HF_HOME": "/not/secret", "X_TOKEN": "ab"})
    assert n == 1  # "ab" is too short to register
    assert secrets.redact("echo value-from-env /not/secret") == "echo *** /not/secret"


def test_redact_argv_masks_flag_values_across_words():
    argv = ["vllm", "serve", "m", "--api-key", "plain", "--port", "8000"]
    assert secrets.redact_argv(argv) == ["vllm", "serve", "m", "--api-key", "***", "--port", "8000"]


@settings(max_examples=300, deadline=None)
@given(secret=st.text(min_size=secrets.MIN_SECRET_LEN, max_size=40).filter(lambda s: s.strip() == s),
       before=st.text(max_size=40), after=st.text(max_size=40), times=st.integers(1, 3))
def test_registered_secret_never_survives(secret, before, after, times):
    secrets.forget_all()
    assert secrets.register(secret)
    text = before + (secret + after) * times
    assert secret not in secrets.redact(text)


@settings(max_examples=200, deadline=None)
@given(secret=st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="*"),
                      min_size=secrets.MIN_SECRET_LEN, max_size=30).filter(lambda s: s.strip() == s),
       words=st.lists(st.sampled_from(["HF_TOKEN=", "--api-key ", "Bearer ", '"api_key": "', " ", "x", "="]),
                      max_size=4))
def test_registered_secret_survives_no_shape_rule(secret, words):
    secrets.forget_all()
    secrets.register(secret)
    text = "".join(words) + secret + "".join(reversed(words))
    assert secret not in secrets.redact(text)
