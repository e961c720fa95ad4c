"""Brief, deterministic training of a demo checkpoint on the repository's corpus.

Random checkpoints make every answer noise (and every confidence score meaningless); a few hundred
steps on `corpus.txt` and `corpus_extra.txt` give word-like English and a large tier that is measurably better than the
small one. The model here is a plain training-mode Llama / Qwen2 (full-sequence causal attention,
no KV cache) whose parameters carry transformers' names, so the state dict it ends with is written
exactly as `weights.random_state_dict`'s would be.

Determinism: fixed seeds for the init and the batch order, and one intra-op thread while training (float32 reductions split over threads sum in another order),
so the same (shape, arch, seed, steps, corpus) gives the same weights on every run of one machine.
One window in HELD_OUT_EVERY is never trained on; its loss is reported.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from regional_node.checkpoints.hf_config import RMS_NORM_EPS, ROPE_THETA
from regional_node.checkpoints.sizes import Arch, ModelShape

HELD_OUT_EVERY = 20


# Steps `--train` takes by default: the demo pair (tiny: the small tier, mini: the large tier) trains
# side by side in about a minute on two idle cores; other sizes get a token effort.
DEFAULT_STEPS = {"tiny": 300, "mini": 200}


def default_steps(size: str) -> int:
    return DEFAULT_STEPS.get(size, 100)


@dataclass(frozen=True)
class TrainingPlan:
    steps: int
    seq_len: int = 64
    batch_size: int = 8
    learning_rate: float = 3e-3
    warmup_steps: int = 20
    weight_decay: float = 0.01
    seed: int = 0


@dataclass(frozen=True)
class TrainingResult:
    weights: dict[str, torch.Tensor]
    first_loss: float  # the first batch's, before any update
    final_train_loss: float  # mean over the last 10 steps
    held_out_loss: float  # mean cross-entropy per token on the held-out tail
    held_out_bits_per_byte: float  # the same, per UTF-8 byte of text: comparable across vocabularies
    seconds: float
    plan: TrainingPlan

    def record(self) -> dict[str, object]:
        """What training.json says (everything but the weights)."""
        return {
            "plan": dataclasses.asdict(self.plan),
            "first_loss": round(self.first_loss, 4),
            "final_train_loss": round(self.final_train_loss, 4),
            "held_out_loss": round(self.held_out_loss, 4),
            "held_out_bits_per_byte": round(self.held_out_bits_per_byte, 4),
            "seconds": round(self.seconds, 1),
        }


Progress = Callable[[int, int, float], None]


def stderr_progress(label: str) -> Progress:
    """A one-line progress bar on stderr, redrawn at most ~20 times."""
    started = time.monotonic()

    def report(step: int, total: int, loss: float) -> None:
        if step != total and step % max(1, total // 20):
            return
        width = 30
        filled = width * step // total
        elapsed = time.monotonic() - started
        sys.stderr.write(
            f"\r{label} [{'#' * filled}{'.' * (width - filled)}] {step}/{total} loss {loss:.3f} {elapsed:.0f}s"
        )
        if step == total:
            sys.stderr.write("\n")
        sys.stderr.flush()

    return report


class _RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


class _Attention(nn.Module):
    def __init__(self, shape: ModelShape, bias: bool) -> None:
        super().__init__()
        h, d = shape.hidden_size, shape.head_dim
        self.heads, self.kv_heads, self.head_dim = shape.num_attention_heads, shape.num_key_value_heads, d
        self.q_proj = nn.Linear(h, self.heads * d, bias=bias)
        self.k_proj = nn.Linear(h, self.kv_heads * d, bias=bias)
        self.v_proj = nn.Linear(h, self.kv_heads * d, bias=bias)
        self.o_proj = nn.Linear(self.heads * d, h, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        groups = self.heads // self.kv_heads
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class _MLP(nn.Module):
    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        h, inter = shape.hidden_size, shape.intermediate_size
        self.gate_proj = nn.Linear(h, inter, bias=False)
        self.up_proj = nn.Linear(h, inter, bias=False)
        self.down_proj = nn.Linear(inter, h, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class _Layer(nn.Module):
    def __init__(self, shape: ModelShape, arch: Arch) -> None:
        super().__init__()
        eps = RMS_NORM_EPS[arch]
        self.input_layernorm = _RMSNorm(shape.hidden_size, eps)
        self.self_attn = _Attention(shape, bias=arch == "qwen2")
        self.post_attention_layernorm = _RMSNorm(shape.hidden_size, eps)
        self.mlp = _MLP(shape)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class _Body(nn.Module):
    def __init__(self, shape: ModelShape, arch: Arch) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(shape.vocab_size, shape.hidden_size)
        self.layers = nn.ModuleList(_Layer(shape, arch) for _ in range(shape.num_hidden_layers))
        self.norm = _RMSNorm(shape.hidden_size, RMS_NORM_EPS[arch])


class CausalLM(nn.Module):
    """Llama / Qwen2 for training, with transformers' parameter names (`model.layers.0...`)."""

    def __init__(self, shape: ModelShape, *, arch: Arch, tied: bool) -> None:
        super().__init__()
        self.model = _Body(shape, arch)
        self.tied = tied
        if not tied:
            self.lm_head = nn.Linear(shape.hidden_size, shape.vocab_size, bias=False)
        d = shape.head_dim
        inv_freq = 1.0 / (ROPE_THETA[arch] ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], dtype=torch.float32)
        freqs = torch.outer(positions, self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos()[None, None], emb.sin()[None, None]
        x = self.model.embed_tokens(ids)
        for layer in self.model.layers:
            x = layer(x, cos, sin)
        x = self.model.norm(x)
        head = self.model.embed_tokens.weight if self.tied else self.lm_head.weight
        return x @ head.T


@contextmanager
def _deterministic() -> Iterator[None]:
    # One thread is what makes CPU training reproducible here; torch.use_deterministic_algorithms
    # adds nothing on CPU and costs seconds of imports on first use.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def split_tokens(tokens: list[int], seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(train stream, held-out windows): every HELD_OUT_EVERY-th window of seq_len + 1 tokens is
    held out, so the held-out text is spread over the whole corpus (prose, dialogue, code) rather
    than being its last pages."""
    data = torch.tensor(tokens, dtype=torch.long)
    span = seq_len + 1
    windows = len(data) // span
    held_ids = [i for i in range(windows) if i % HELD_OUT_EVERY == HELD_OUT_EVERY // 2]
    held = torch.stack([data[i * span : (i + 1) * span] for i in held_ids])
    keep = torch.ones(len(data), dtype=torch.bool)
    for i in held_ids:
        keep[i * span : (i + 1) * span] = False
    return data[keep], held


def _held_out_loss(model: CausalLM, held: torch.Tensor) -> float:
    with torch.no_grad():
        logits = model(held[:, :-1])
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), held[:, 1:].reshape(-1)).item()


def train_weights(
    shape: ModelShape,
    *,
    arch: Arch,
    tied: bool,
    tokens: list[int],
    bytes_per_token: float,
    plan: TrainingPlan,
    progress: Progress | None = None,
) -> TrainingResult:
    """Train from `random_state_dict(seed=plan.seed)` on `tokens` for `plan.steps` AdamW steps."""
    started = time.monotonic()
    with _deterministic():
        torch.manual_seed(plan.seed)
        model = CausalLM(shape, arch=arch, tied=tied)
        _initialise(model, plan.seed)
        train, held = split_tokens(tokens, plan.seq_len)
        decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
        no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
        optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": plan.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=plan.learning_rate,
            betas=(0.9, 0.95),
        )
        generator = torch.Generator().manual_seed(plan.seed)
        offsets = torch.arange(plan.seq_len + 1)
        losses: list[float] = []
        for step in range(plan.steps):
            lr = _learning_rate(step, plan)
            for group in optimizer.param_groups:
                group["lr"] = lr
            starts = torch.randint(0, len(train) - plan.seq_len - 1, (plan.batch_size,), generator=generator)
            batch = train[starts[:, None] + offsets]
            logits = model(batch[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            losses.append(loss.item())
            if progress is not None:
                progress(step + 1, plan.steps, losses[-1])
        model.eval()
        held_loss = _held_out_loss(model, held)
    weights = {name: tensor.detach().clone().contiguous() for name, tensor in model.state_dict().items()}
    if tied:
        weights.pop("lm_head.weight", None)
    tail = losses[-10:] or [float("nan")]
    return TrainingResult(
        weights=weights,
        first_loss=losses[0] if losses else float("nan"),
        final_train_loss=sum(tail) / len(tail),
        held_out_loss=held_loss,
        held_out_bits_per_byte=held_loss / math.log(2) / bytes_per_token,
        seconds=time.monotonic() - started,
        plan=plan,
    )


def _initialise(model: CausalLM, seed: int) -> None:
    """GPT-2's init (std 0.02, residual projections scaled by depth) except for unit-std input
    embeddings, which let the direct embedding → head path learn bigrams within the first few dozen
    steps instead of sitting on the unigram plateau (two 0.02-std factors barely move each other).
    The random checkpoints' init is tuned for near-tie-free logits, not for learning."""
    generator = torch.Generator().manual_seed(seed)
    depth = len(model.model.layers)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            elif name.endswith(".bias"):
                param.zero_()
            elif name == "model.embed_tokens.weight" and not model.tied:
                param.copy_(torch.randn(param.shape, generator=generator))
            else:
                std = (
                    0.02 / math.sqrt(2 * depth)
                    if name.endswith(("o_proj.weight", "down_proj.weight"))
                    else 0.02
                )
                param.copy_(torch.randn(param.shape, generator=generator) * std)


def _learning_rate(step: int, plan: TrainingPlan) -> float:
    """Linear warm-up, then cosine decay to a tenth."""
    if step < plan.warmup_steps:
        return plan.learning_rate * (step + 1) / plan.warmup_steps
    progress = (step - plan.warmup_steps) / max(1, plan.steps - plan.warmup_steps)
    return plan.learning_rate * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))
