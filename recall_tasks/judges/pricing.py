"""What a judge call costs: USD per million tokens by model, and the Batch API's discount."""

from __future__ import annotations

from collections.abc import Mapping

#: USD per million tokens (input, output). Override with ``OpenAIJudge(prices={...})``.
PRICES_PER_MTOK: dict[str, tuple[float, float]] = {
    "gpt-4o-mini": (0.15, 0.60),
    "gpt-4o": (2.50, 10.00),
    "gpt-4.1": (2.00, 8.00),
    "gpt-4.1-mini": (0.40, 1.60),
    "gpt-4.1-nano": (0.10, 0.40),
    "gpt-5": (1.25, 10.00),
    "gpt-5-mini": (0.25, 2.00),
    "gpt-5-nano": (0.05, 0.40),
    "o4-mini": (1.10, 4.40),
}

#: Share of the live price a Batch API request costs (OpenAI's and Azure's global batch: 50 % off).
BATCH_PRICE_FACTOR = 0.5


def price_for(model: str, prices: Mapping[str, tuple[float, float]]) -> tuple[float, float] | None:
    """Exact model name first, then the longest known prefix (dated snapshots share their family's price)."""
    if model in prices:
        return prices[model]
    best = max((name for name in prices if model.startswith(name)), key=len, default=None)
    return prices[best] if best else None
