"""Errors that carry a message meant for the client."""


class InvalidRequest(ValueError):
    """The request is malformed or out of bounds; the message says what to change."""


class ServerBusy(RuntimeError):
    """The server is at capacity and its wait queue is full (Triton's UNAVAILABLE); retry later."""
