"""A multipart/form-data body (what the openai client sends to POST /v1/files), parsed
with the standard library's MIME parser: the body is already bounded by the route's
size limit, so it is parsed in memory. ProtocolError (400) for anything else."""
from __future__ import annotations

from dataclasses import dataclass
from email.message import Message
from email.parser import BytesParser
from email.policy import HTTP
from typing import Optional

from wire.errors import ProtocolError


@dataclass(frozen=True)
class FormPart:
    name: str
    filename: Optional[str]
    data: bytes


def parse_form(content_type: str, body: bytes) -> dict[str, FormPart]:
    """Each part by its field name (the first of a name wins)."""
    if not content_type.lower().startswith("multipart/form-data") or "boundary=" not in content_type:
        raise ProtocolError("body: must be multipart/form-data with a boundary", param="body")
    head = f"Content-Type: {content_type}\r\nMIME-Version: 1.0\r\n\r\n".encode()
    message = BytesParser(policy=HTTP).parsebytes(head + body)
    if not message.is_multipart():
        raise ProtocolError("body: not a multipart form", param="body")
    parts: dict[str, FormPart] = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if isinstance(name, str) and name not in parts:
            parts[name] = FormPart(name, _filename(part), _payload(part))
    return parts


def _filename(part: Message) -> Optional[str]:
    name = part.get_filename()
    return name if isinstance(name, str) else None


def _payload(part: Message) -> bytes:
    payload = part.get_payload(decode=True)
    return payload if isinstance(payload, bytes) else b""
