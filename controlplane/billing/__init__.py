"""Usage, prices and GPU time: metering, the outbox, the call journal, reconciliation."""
