"""Deployments: their specs, traffic splits, model sources and uploads."""
