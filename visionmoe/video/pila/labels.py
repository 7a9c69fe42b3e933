"""Category priors from prompts: a built-in lexicon classifier, user labels, and a learned
classifier on text embeddings.

A prior is a :class:`CategoryPrior`: per-category scores and the boolean mask that label-prior
masked routing uses (experts of masked categories are never selected). Precedence, used by
:func:`resolve_prior`: user labels > learned classifier (when the adapter has one and it was
trained) > lexicon > "all categories allowed".
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from .taxonomy import CATEGORY_NAMES, NUM_CATEGORIES, map_external

#: Keyword stems per category. Matching is on lower-case word starts, so "bounc" matches
#: "bounce", "bounces", "bouncing".
LEXICON: dict[str, tuple[str, ...]] = {
    "rigid": (
        "ball", "fall", "drop", "roll", "slid", "collid", "collision", "hit", "crash", "throw", "thrown",
        "toss", "domino", "billiard", "pendulum", "swing", "topple", "tumbl", "projectile", "gravity",
        "stack", "block", "brick", "bowling", "knock", "push", "car ", "skate", "friction", "inertia",
    ),
    "elastic": (
        "bounc", "elastic", "rubber", "spring", "stretch", "squash", "squeez", "deform", "bend", "cloth",
        "fabric", "flag", "jelly", "trampoline", "balloon", "tear", "rope", "clay", "dough", "sponge",
    ),
    "liquid": (
        "water", "pour", "splash", "liquid", "wave", "drip", "drop of", "flow", "river", "ocean", "rain",
        "milk", "juice", "coffee", "wine", "honey", "oil", "fluid", "stream", "fountain", "glass of",
        "spill", "float", "sink", "buoyan", "dissolv", "ink",
    ),
    "gas": (
        "smoke", "steam", "vapor", "vapour", "fog", "mist", "cloud", "wind", "gas", "breath", "bubble",
        "exhaust", "plume", "dust", "blow",
    ),
    "thermal": (
        "melt", "freez", "frozen", "ice", "boil", "burn", "fire", "flame", "candle", "heat", "hot ",
        "evaporat", "condens", "sublimat", "combust", "explo", "lava", "solidif", "thaw", "butter",
        "chocolate", "wax", "snow", "cook", "fry", "toast",
    ),
    "optics": (
        "light", "reflect", "refract", "mirror", "shadow", "lens", "prism", "rainbow", "laser", "glow",
        "shine", "sunlight", "lamp", "glass prism", "transparent", "scatter", "diffract", "sparkl",
    ),
}


@dataclass(frozen=True)
class CategoryPrior:
    """Per-category scores [E] and the routing mask [E] (True = experts allowed)."""

    scores: torch.Tensor  # [E] float, >= 0
    mask: torch.Tensor  # [E] bool, at least one True
    source: str  # "user", "learned", "lexicon" or "uniform"

    @property
    def categories(self) -> tuple[str, ...]:
        return tuple(n for n, m in zip(CATEGORY_NAMES, self.mask.tolist()) if m)


def uniform_prior() -> CategoryPrior:
    return CategoryPrior(torch.ones(NUM_CATEGORIES), torch.ones(NUM_CATEGORIES, dtype=torch.bool), "uniform")


def _stem_hits(text: str, stem: str) -> int:
    # A stem matches at a word start; stems ending in a space must end the word.
    return len(re.findall(r"(?<![a-z])" + re.escape(stem), text))


def lexicon_scores(prompt: str) -> torch.Tensor:
    """Keyword hit counts [E] of a prompt for each category."""
    text = " " + prompt.lower() + " "
    return torch.tensor(
        [float(sum(_stem_hits(text, s) for s in LEXICON[name])) for name in CATEGORY_NAMES], dtype=torch.float32
    )


def classify_prompt(prompt: str, *, min_share: float = 0.0) -> CategoryPrior:
    """Lexicon classifier: categories whose keywords occur in the prompt.

    Categories whose share of the hits is at least ``min_share`` are allowed. A prompt with no
    physics keyword gets the uniform prior (every category allowed), never an empty mask.
    """
    scores = lexicon_scores(prompt)
    total = float(scores.sum())
    if total == 0:
        return uniform_prior()
    mask = (scores > 0) & (scores / total >= min_share)
    if not bool(mask.any()):
        mask = scores == scores.max()
    return CategoryPrior(scores / total, mask, "lexicon")


def prior_from_labels(labels: Iterable[str] | str) -> CategoryPrior:
    """User-given labels (ours, or WISA / PhyGenBench / VideoPhy-2 names) as a prior."""
    if isinstance(labels, str):
        labels = [s for s in re.split(r"[,+]", labels) if s.strip()]
    labels = list(labels)
    if not labels:
        raise ValueError("categories must name at least one category; use 'auto' for the lexicon classifier")
    mask = torch.zeros(NUM_CATEGORIES, dtype=torch.bool)
    for label in labels:
        for name in map_external(label):
            mask[CATEGORY_NAMES.index(name)] = True
    return CategoryPrior(mask.float() / mask.sum(), mask, "user")


def prior_from_logits(logits: torch.Tensor, *, threshold: float = 0.5) -> CategoryPrior:
    """Learned multi-label classifier output [E] (logits) as a prior: sigmoid >= threshold."""
    probs = torch.sigmoid(logits.detach().float().flatten())
    mask = probs >= threshold
    if not bool(mask.any()):
        mask = probs == probs.max()
    return CategoryPrior(probs, mask, "learned")


class TextCategoryClassifier(nn.Module):
    """Learned multi-label category classifier on (masked-mean pooled) text embeddings.

    Trained by the training stage on captions with physics labels; until then
    :attr:`trained` is False and :func:`resolve_prior` ignores it.
    """

    def __init__(self, text_dim: int, hidden: int = 128, num_categories: int = NUM_CATEGORIES):
        super().__init__()
        self.net = nn.Sequential(nn.LayerNorm(text_dim), nn.Linear(text_dim, hidden), nn.GELU(), nn.Linear(hidden, num_categories))
        self.register_buffer("trained", torch.zeros((), dtype=torch.bool))

    @staticmethod
    def pool(text: torch.Tensor) -> torch.Tensor:
        """[B, L, D] -> [B, D], mean over non-padding tokens (Wan zero-pads prompt embeddings)."""
        valid = (text.abs().sum(-1, keepdim=True) > 0).to(text.dtype)
        return (text * valid).sum(1) / valid.sum(1).clamp_min(1)

    def forward(self, text: torch.Tensor) -> torch.Tensor:  # [B, L, D] -> [B, E] logits
        return self.net(self.pool(text))


def resolve_prior(
    categories: str | Sequence[str] | None,
    prompt: str | None = None,
    *,
    learned_logits: torch.Tensor | None = None,
    learned_trained: bool = False,
) -> CategoryPrior:
    """The prior for one prompt: ``categories`` is ``"auto"``/None or a list of labels."""
    if categories not in (None, "auto"):
        return prior_from_labels(categories)
    if learned_logits is not None and learned_trained:
        return prior_from_logits(learned_logits)
    if prompt:
        return classify_prompt(prompt)
    return uniform_prior()
