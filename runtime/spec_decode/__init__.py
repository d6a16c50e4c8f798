"""Speculative decoding: proposers, the draft model, rejection sampling."""
