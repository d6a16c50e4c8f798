"""What both sides of the control plane -> replica hop share, in pure Python.

`wire.requests` parses and validates OpenAI completion and chat requests (the
control plane refuses bad input at the edge with the same rules the replica
applies); `wire.sampling` holds `SamplingParams` and its one validation;
`wire.responses` builds response bodies, chunks and usage; `wire.sse` frames
and streams server-sent events; `wire.request_id` gives every request one id;
`wire.disconnect` notices a client that left; `wire.errors` is the one error
shape. Nothing here imports torch or any other thawpool package.
"""
