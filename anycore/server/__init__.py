"""OpenAI-compatible HTTP server: FastAPI routes in front of an AsyncEngine thread."""
