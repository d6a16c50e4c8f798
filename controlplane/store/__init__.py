"""The control plane's data layer: queries and writes over its Postgres tables.

`deployments` (deployments and their immutable revisions), `tenants` (tenants,
API keys, the caller behind a key), `billing` (usage and GPU-second report
queries), `desired_state` (what the pool reads: revisions to run; what it
writes: replica lifetimes). Functions take an `AsyncSession` (the caller owns
the transaction) and raise the domain errors of `store.errors`; nothing here
knows HTTP.
"""
