"""A small keyword classifier, written as an ONNX model folder the classifier layer can load.

For demos and tests, never for production: each category fires on its keywords (a word-level
tokenizer, an embedding of per-category weights, the highest over the text, a sigmoid), so what
it scores is predictable. It has the layout a real exported model has (model.onnx,
tokenizer.json, config.json with id2label), built with `onnx.helper` and `tokenizers` only.
`meridian safety init-model PATH` writes one.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

DEFAULT_KEYWORDS: dict[str, tuple[str, ...]] = {
    "injection": ("ignore", "disregard", "jailbreak", "override", "bypass"),
    "toxicity": ("idiot", "stupid", "moron", "hate"),
}
_HIT, _BIAS = 8.0, -4.0  # logit +4 with a keyword (score ≈ 0.98), -4 without (≈ 0.018)


def write_keyword_model(
    out_dir: str | Path, keywords: Mapping[str, Sequence[str]] = DEFAULT_KEYWORDS
) -> Path:
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    labels = list(keywords)
    vocab = {"[PAD]": 0, "[UNK]": 1}
    for words in keywords.values():
        for word in words:
            vocab.setdefault(word.lower(), len(vocab))
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.Lowercase()
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(out / "tokenizer.json"))

    weights = np.zeros((len(vocab), len(labels)), dtype=np.float32)
    for column, label in enumerate(labels):
        for word in keywords[label]:
            weights[vocab[word.lower()], column] = _HIT
    graph = helper.make_graph(
        [
            helper.make_node("Gather", ["weights", "input_ids"], ["per_token"]),
            helper.make_node("ReduceMax", ["per_token"], ["pooled"], axes=[1], keepdims=0),
            helper.make_node("Add", ["pooled", "bias"], ["logits"]),
        ],
        "keyword_classifier",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", len(labels)])],
        initializer=[
            numpy_helper.from_array(weights, "weights"),
            numpy_helper.from_array(np.full((len(labels),), _BIAS, dtype=np.float32), "bias"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # readable by every onnxruntime since 1.10
    onnx.checker.check_model(model)
    onnx.save(model, str(out / "model.onnx"))
    config = {
        "id2label": {str(i): label for i, label in enumerate(labels)},
        "problem_type": "multi_label_classification",
        "meridian": "keyword demo classifier (gateway/safety/demo_model.py)",
    }
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return out
