"""The OpenAI-compatible HTTP server: app factory, protocol models, one router per endpoint, serving, metrics."""
