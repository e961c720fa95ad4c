"""The classifier layer: a `Classifier` seam and its ONNX Runtime implementation.

`OnnxClassifier` runs a text-classification model from a local folder (nothing is downloaded):
`model.onnx`, `tokenizer.json` (read with the `tokenizers` library, no transformers) and
`config.json` with Hugging Face's `id2label` (and `problem_type`: "multi_label_classification"
scores with a sigmoid per label, anything else with a softmax, as Prompt Guard's two labels).
Long texts are scored in windows of `max_tokens`, a category's score being its highest window's.

Loaded and warmed in the background at gateway start (`ready` stays false until the warm-up run
returned: /ready reports it); scoring runs in a bounded thread pool off the event loop: at most
`workers` run and `max_queue` wait, one more is refused at once, and a caller stops waiting after
`timeout_s` (the run finishes in its thread and frees its slot then, so the bound holds). Every
failure is a ClassifierError; the tenant's fail mode decides what it means.

`onnxruntime` (the `safety` extra), `tokenizers` and numpy are imported only when a classifier
is configured: a gateway without one loads none of them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

import msgspec

from gateway.safety.errors import ClassifierError

logger = logging.getLogger(__name__)

WARM_UP_TEXT = "Warming up the safety classifier."


class ClassifierConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    """`safety.classifier` in the gateway config."""

    model_dir: str  # model.onnx + tokenizer.json + config.json
    workers: int = 2  # inference threads (each runs one text at a time)
    max_queue: int = 32  # texts waiting for a worker; one more is refused (fail mode applies)
    timeout_s: float = 0.5  # longest wait for a score, queueing included
    max_tokens: int = 512  # the model's window; longer texts are scored window by window
    threads_per_run: int = 1  # ONNX Runtime intra-op threads per run

    def __post_init__(self) -> None:
        for name in ("workers", "max_tokens", "threads_per_run"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be at least 1")
        if self.max_queue < 0:
            raise ValueError("max_queue: must be at least 0")
        if self.timeout_s <= 0:
            raise ValueError("timeout_s: must be positive")


class Classifier(Protocol):
    """Scores a text per category, 0..1. `ready` once loaded and warm."""

    @property
    def ready(self) -> bool: ...

    @property
    def labels(self) -> tuple[str, ...]: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def classify(self, text: str) -> Mapping[str, float]: ...


class OnnxModel:
    """The loaded model, tokenizer and labels; `scores` is synchronous (a worker thread's)."""

    def __init__(self, model_dir: Path, *, max_tokens: int, threads_per_run: int) -> None:
        import numpy
        import onnxruntime as ort
        from tokenizers import Tokenizer

        self._np = numpy
        config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
        id2label = config.get("id2label") or {}
        if not id2label:
            raise ValueError(f"{model_dir / 'config.json'}: no id2label")
        self.labels = tuple(str(id2label[str(i)]) for i in range(len(id2label)))
        self.multi_label = config.get("problem_type") == "multi_label_classification"
        self.tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self.tokenizer.no_padding()
        self.tokenizer.no_truncation()
        self.max_tokens = max_tokens
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads_per_run
        options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(
            str(model_dir / "model.onnx"), options, providers=["CPUExecutionProvider"]
        )
        self.inputs = {i.name for i in self.session.get_inputs()}
        if "input_ids" not in self.inputs:
            raise ValueError(f"{model_dir / 'model.onnx'}: the model has no input_ids input")

    def scores(self, text: str) -> dict[str, float]:
        np = self._np
        ids = self.tokenizer.encode(text).ids or [0]
        windows = [ids[i : i + self.max_tokens] for i in range(0, len(ids), self.max_tokens)]
        width = max(len(w) for w in windows)
        batch = np.zeros((len(windows), width), dtype=np.int64)
        mask = np.zeros((len(windows), width), dtype=np.int64)
        for row, window in enumerate(windows):
            batch[row, : len(window)] = window
            mask[row, : len(window)] = 1
        feeds: dict[str, Any] = {"input_ids": batch}
        if "attention_mask" in self.inputs:
            feeds["attention_mask"] = mask
        if "token_type_ids" in self.inputs:
            feeds["token_type_ids"] = np.zeros_like(batch)
        logits = np.asarray(self.session.run(None, feeds)[0], dtype=np.float64)
        if logits.ndim != 2 or logits.shape[1] != len(self.labels):
            raise ValueError(f"expected logits of shape (batch, {len(self.labels)}), got {logits.shape}")
        if self.multi_label:
            probs = 1.0 / (1.0 + np.exp(-logits))
        else:
            shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
            probs = shifted / shifted.sum(axis=1, keepdims=True)
        top = probs.max(axis=0)
        return {label: float(top[i]) for i, label in enumerate(self.labels)}


class OnnxClassifier:
    def __init__(self, config: ClassifierConfig) -> None:
        self.config = config
        self.load_error: str | None = None
        self._model: OnnxModel | None = None
        self._ready = False
        self._pool = ThreadPoolExecutor(config.workers, thread_name_prefix="safety-classifier")
        self._slots = threading.BoundedSemaphore(config.workers + config.max_queue)
        self._load: asyncio.Task[None] | None = None

    @property
    def ready(self) -> bool:
        return self._ready

    @property
    def labels(self) -> tuple[str, ...]:
        return self._model.labels if self._model is not None else ()

    async def start(self) -> None:
        """Begins loading and warming in the background; `ready` turns true when done."""
        if self._load is None:
            self._load = asyncio.create_task(self._load_and_warm(), name="safety-classifier-load")

    async def wait_ready(self) -> bool:
        if self._load is not None:
            await asyncio.shield(self._load)
        return self._ready

    async def stop(self) -> None:
        if self._load is not None and not self._load.done():
            self._load.cancel()
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def classify(self, text: str) -> Mapping[str, float]:
        model = self._model
        if model is None or not self._ready:
            raise ClassifierError(self.load_error or "the classifier is still loading")
        if not self._slots.acquire(blocking=False):
            raise ClassifierError(
                f"the classifier queue is full ({self.config.workers} running, {self.config.max_queue} waiting)"
            )
        try:
            future = self._pool.submit(model.scores, text)
        except RuntimeError as exc:  # the pool is shut down
            self._slots.release()
            raise ClassifierError(str(exc)) from None
        future.add_done_callback(lambda _: self._slots.release())
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), self.config.timeout_s)
        except TimeoutError:
            raise ClassifierError(f"timed out after {self.config.timeout_s:g}s") from None
        except Exception as exc:
            raise ClassifierError(f"the model failed: {exc}") from None

    async def _load_and_warm(self) -> None:
        path = Path(self.config.model_dir)
        try:
            model = await asyncio.to_thread(
                OnnxModel,
                path,
                max_tokens=self.config.max_tokens,
                threads_per_run=self.config.threads_per_run,
            )
            # One run on every worker thread's path, so the first request pays no lazy init.
            await asyncio.get_running_loop().run_in_executor(self._pool, model.scores, WARM_UP_TEXT)
        except Exception as exc:
            self.load_error = f"cannot load the classifier from {path}: {exc}"
            logger.error("%s", self.load_error)
            return
        self._model = model
        self._ready = True
        logger.info("safety classifier ready: %s (labels: %s)", path, ", ".join(model.labels))
