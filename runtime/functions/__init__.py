"""Function replicas: a tenant's Python package served with dynamic batching."""
