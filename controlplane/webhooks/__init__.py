"""Signed webhooks: endpoints an operator or a tenant registers, events published once
(by dedupe key) with one durable delivery per matching endpoint, and a worker that POSTs
each delivery signed (HMAC-SHA256, `t=...,v1=...`) and retries it with backoff.

- `events`: the event types and their payloads' shapes;
- `endpoints`: registering, listing and deleting endpoints, their sealed secrets;
- `publisher`: `WebhookPublisher.publish` writes an event and its deliveries;
- `deliveries`: claiming due deliveries (FOR UPDATE SKIP LOCKED) and recording attempts;
- `sender`: one signed POST with timeouts; `targets`: which addresses it may reach;
- `worker`: the background loop over claim, send and record;
- `signing`: the signature, and `verify` for receivers; `backoff`: the retry schedule;
- `history`: deleting delivered events past their retention.
"""
