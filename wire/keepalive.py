"""How long an idle connection on the gateway -> replica hop stays open, on each side.

The client (controlplane/gateway/upstream.py) must give an idle connection up before the
replica's server does: otherwise a request can go out on a connection the server is
closing at that instant, and the call fails though nothing was wrong (the same rule
as a load balancer's idle timeout under its backends' keep-alive).
"""
from __future__ import annotations

REPLICA_KEEPALIVE_S = 75        # uvicorn's timeout_keep_alive in runtime.serve.server, function_server
GATEWAY_KEEPALIVE_S = 60.0      # the control plane's pool of connections to replicas
