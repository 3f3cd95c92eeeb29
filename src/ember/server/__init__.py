"""The HTTP server: OpenAI- and Anthropic-compatible routes over an AsyncEngine (needs ember[server])."""
from ember.server.app import build_app

__all__ = ["build_app"]
