"""The request path from the edge to a replica: the OpenAI-compatible and function
gateways, the hop's HTTP client, rate limits and async calls."""
