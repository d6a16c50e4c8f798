"""The in-memory read model every request reads, kept fresh by Postgres notifications."""
