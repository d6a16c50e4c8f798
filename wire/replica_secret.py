"""How a replica gets its secret, spoken by the pool that sets it and the server that
reads it: in the environment, or (a sandboxed replica's) in a file only its uid may
read. The server reads it once at start and drops both variables, so nothing it starts
inherits them; every call to the replica but `GET /health` carries it as a bearer token."""
from __future__ import annotations

SECRET_ENV = "THAWPOOL_REPLICA_SECRET"             # the secret itself
SECRET_FILE_ENV = "THAWPOOL_REPLICA_SECRET_FILE"   # or a file (mode 0600) that holds it
