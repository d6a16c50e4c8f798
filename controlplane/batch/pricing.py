"""What a batch line costs: the price book's batch rows in effect when its batch was
created (scoped like the interactive ones: default, plan, deployment, adapter); where
the book has no batch row, the interactive price then times the batch discount
(`settings.batch_price_discount`, 0.5 by default: OpenAI's, Together's and Fireworks'
batch price is about half the interactive one). Pure Decimal."""
from __future__ import annotations

from decimal import Decimal
from typing import Optional

from controlplane.billing.pricing import PRICE_FIELDS, PRICE_QUANTUM, Pricing


def batch_pricing(interactive: Pricing, discount: Decimal) -> Pricing:
    """Every price of `interactive` times `discount`, to the price book's 9 decimals."""
    return Pricing(*((getattr(interactive, name) * discount).quantize(PRICE_QUANTUM)
                     for name in PRICE_FIELDS))


def line_pricing(batch_row: Optional[Pricing], interactive: Pricing, discount: Decimal) -> Pricing:
    return batch_row if batch_row is not None else batch_pricing(interactive, discount)
