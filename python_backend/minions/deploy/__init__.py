"""deploy.yaml to a running server: the file (config.py) and its schema (schema.py), the model files made
once (artifacts.py), the rendered model repository (render.py) and tritonserver itself (server.py, `make serve`)."""
