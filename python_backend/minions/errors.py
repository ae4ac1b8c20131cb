"""Errors that carry a message meant for the client."""


class InvalidRequest(ValueError):
    """The request is malformed or out of bounds; the message says what to change."""


class RequestCancelled(Exception):
    """The request's client has gone (Triton reports it cancelled): its work ends, and nothing is sent
    but the FINAL flag that closes its stream."""


class ServerBusy(RuntimeError):
    """The server is at capacity and its wait queue is full (Triton's UNAVAILABLE); retry later."""

    PREFIX = "the server is at capacity"
    """How its message begins: a decoupled model's error reaches gRPC stream and SSE clients without a
    status code, so clients (the load test) recognise a refusal by it."""


class ModelUnavailable(RuntimeError):
    """A model the request needs is not ready (unloaded, loading, or its stub died and it is being
    loaded again): Triton's UNAVAILABLE; retry later."""

    PREFIX = "the service is unavailable"
    """How its message begins, for the same reason as ServerBusy.PREFIX."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"{self.PREFIX}: {reason}")


INTERNAL_PREFIX = "internal error"
"""How the message of a request that failed inside the server begins (Triton's INTERNAL), for the same
reason as ServerBusy.PREFIX."""


def is_refusal(message: str) -> bool:
    """Whether an error's message is a refusal to retry later (ServerBusy, ModelUnavailable): a
    decoupled model's error reaches gRPC stream and SSE clients without a status code."""
    return ServerBusy.PREFIX in message or ModelUnavailable.PREFIX in message
