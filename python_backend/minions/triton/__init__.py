"""Thin adapters between Triton's Python backend (pb_utils) and the pure code of the package.

Only these modules import `triton_python_backend_utils`, which exists inside a Triton stub alone.
"""
