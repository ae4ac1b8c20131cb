"""The OpenAI-compatible frontend: an HTTP service beside tritonserver that turns /v1/completions and
/v1/chat/completions into requests to the `minions` model over Triton's gRPC streaming endpoint."""
