import json
import os

import pytest

# Tests never reach the Hugging Face hub: everything they load ships in the repo.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

from vocagno.tokenization import ASSETS, SHIPPED_TOKENIZERS, load_tokenizer  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def _tokenizer_cache(tmp_path_factory):
    """Unpack the shipped tokenizers into a fresh cache, so the unpacking itself is tested every run."""
    os.environ["VOCAGNO_CACHE"] = str(tmp_path_factory.mktemp("vocagno-cache"))


@pytest.fixture(scope="session")
def tokenizers(_tokenizer_cache):
    return {name: load_tokenizer(name) for name in SHIPPED_TOKENIZERS}


@pytest.fixture(scope="session")
def math_texts():
    """Real math text: GSM8K train questions and answers, MATH problems and solutions (shipped slices)."""
    texts = []
    with open(ASSETS / "text" / "gsm8k_train_500.jsonl", encoding="utf-8") as f:
        texts += [row["text"] for row in map(json.loads, f)]
    with open(ASSETS / "text" / "math_test_100.jsonl", encoding="utf-8") as f:
        texts += [f"Problem: {row['problem']}\n\nSolution: {row['solution']}" for row in map(json.loads, f)]
    return texts
