"""What a batch line costs: the price in effect when its batch was created, times the
batch discount (`settings.batch_price_discount`, 0.5 by default: OpenAI's, Together's
and Fireworks' batch price is about half the interactive one). Pure Decimal."""
from __future__ import annotations

from decimal import Decimal

from controlplane.billing.pricing import PRICE_FIELDS, PRICE_QUANTUM, Pricing


def batch_pricing(interactive: Pricing, discount: Decimal) -> Pricing:
    """Every price of `interactive` times `discount`, to the price book's 9 decimals."""
    return Pricing(*((getattr(interactive, name) * discount).quantize(PRICE_QUANTUM)
                     for name in PRICE_FIELDS))
