"""Errors that carry a message meant for the client."""


class InvalidRequest(ValueError):
    """The request is malformed or out of bounds; the message says what to change."""


class ServerBusy(RuntimeError):
    """The server is at capacity and its wait queue is full (Triton's UNAVAILABLE); retry later."""

    PREFIX = "the server is at capacity"
    """How its message begins: a decoupled model's error reaches gRPC stream and SSE clients without a
    status code, so clients (the load test) recognise a refusal by it."""


class ModelUnavailable(RuntimeError):
    """A model the request needs is not ready (unloaded, loading, or its stub died and it is being
    loaded again): Triton's UNAVAILABLE; retry later."""
