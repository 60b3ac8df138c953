"""Where a refusal's time goes: refused requests joined, by X-Request-Id, with the service's own `app.access`
log lines, which time each request from its arrival in the app to its last byte."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from loadkit.overload.client import Record

_ACCESS_LINE = re.compile(
    r'"logger": "app\.access".*?"request_id": "(ovl-[0-9a-f]{32})".*?"status": (\d{3}).*?"duration_ms": ([\d.]+)')


@dataclass
class Breakdown:
    """Seconds, one entry per joined refusal: what the client measured, what the service spent, and what lay
    outside the service (this driver's event loop, the kernel, and, with `--serve-proxy`, Serve's proxy)."""

    client: list[float] = field(default_factory=list)
    service: list[float] = field(default_factory=list)
    client_minus_service: list[float] = field(default_factory=list)

    @property
    def joined(self) -> int:
        return len(self.client)


def refusal_breakdown(log_text: str, refused: list[Record]) -> Breakdown:
    served = {m[1]: float(m[3]) / 1000 for m in _ACCESS_LINE.finditer(log_text) if m[2] in ("429", "503")}
    out = Breakdown()
    for r in refused:
        if r.request_id in served:
            out.client.append(r.latency)
            out.service.append(served[r.request_id])
            out.client_minus_service.append(r.latency - served[r.request_id])
    return out
