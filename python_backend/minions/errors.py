"""Errors that carry a message meant for the client."""


class InvalidRequest(ValueError):
    """The request is malformed or out of bounds; the message says what to change."""
