"""Spend budgets: money limits per tenant, API key and deployment (docs/budgets.md)."""
