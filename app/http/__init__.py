"""The front door: the FastAPI app and its routes, the Gate (what is refused before a body is read), connection
clocks and the replica's own listener, TCP delivery, metrics, SSE framing and the one JSON encoder."""
