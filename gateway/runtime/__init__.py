"""Serving the app (uvicorn, workers) and the helpers that own tasks and shield clean-up."""
