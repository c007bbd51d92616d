"""A tiny text-embedding model on disk, in the file layout fastembed loads.

No weights can be downloaded here, so tests build one: a word-level tokenizer
over the words :func:`daemon.rag.embedding.render` writes (digits split one by
one) and an ONNX graph that sums a random 384-wide embedding of each unmasked
token. fastembed then runs its real path on it: tokenizer loading, padding,
onnxruntime, CLS pooling and normalization.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from tokenizers import Tokenizer, models, pre_tokenizers

from daemon.rag.schema import DERIVED

DIMS = 384
# The files fastembed's description of BAAI/bge-small-en-v1.5 asks for.
MODEL_FILE = "model_optimized.onnx"
HF_REPO = "Qdrant/bge-small-en-v1.5-onnx-Q"


def _vocabulary() -> dict[str, int]:
    words = ["[PAD]", "[UNK]", *"0123456789", ".", "-", ";"]
    for name in DERIVED:
        words += [w for w in name.split("_") if w not in words]
    return {w: i for i, w in enumerate(dict.fromkeys(words))}


def _graph(vocab_size: int, seed: int) -> onnx.ModelProto:
    table = np.random.default_rng(seed).standard_normal((vocab_size, DIMS)).astype(np.float32)
    ids = ["b", "s"]
    graph = helper.make_graph(
        [
            helper.make_node("Gather", ["table", "input_ids"], ["emb"]),
            helper.make_node("Cast", ["attention_mask"], ["maskf"], to=TensorProto.FLOAT),
            helper.make_node("Unsqueeze", ["maskf", "axis2"], ["mask3"]),
            helper.make_node("Mul", ["emb", "mask3"], ["masked"]),
            helper.make_node("ReduceSum", ["masked", "axis1"], ["last_hidden_state"], keepdims=1),
        ],
        "tiny-bag-of-tokens",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ids),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ids),
            helper.make_tensor_value_info("token_type_ids", TensorProto.INT64, ids),
        ],
        [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["b", 1, DIMS])],
        initializer=[
            numpy_helper.from_array(table, "table"),
            numpy_helper.from_array(np.array([2], dtype=np.int64), "axis2"),
            numpy_helper.from_array(np.array([1], dtype=np.int64), "axis1"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def write_model(directory: Path, seed: int = 7) -> Path:
    """The model's files in ``directory`` (what an operator copies from the hub)."""
    directory.mkdir(parents=True, exist_ok=True)
    vocab = _vocabulary()
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Whitespace(), pre_tokenizers.Digits(individual_digits=True)]
    )
    tokenizer.save(str(directory / "tokenizer.json"))
    special = {"pad_token": "[PAD]", "unk_token": "[UNK]"}
    (directory / "tokenizer_config.json").write_text(
        json.dumps({"model_max_length": 512, **special})
    )
    (directory / "special_tokens_map.json").write_text(json.dumps(special))
    (directory / "config.json").write_text(json.dumps({"pad_token_id": vocab["[PAD]"]}))
    onnx.save(_graph(len(vocab), seed), str(directory / MODEL_FILE))
    return directory


def write_hub_cache(cache_dir: Path, seed: int = 7) -> Path:
    """The same files as a Hugging Face hub cache (what fastembed leaves after a download)."""
    repo = cache_dir / f"models--{HF_REPO.replace('/', '--')}"
    revision = "0" * 40
    write_model(repo / "snapshots" / revision, seed)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(revision)
    return cache_dir
