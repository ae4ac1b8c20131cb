"""deploy.yaml to a running server: the file (config.py), the model files made once (artifacts.py),
the rendered model repository (render.py) and tritonserver itself (server.py, `make serve`)."""
