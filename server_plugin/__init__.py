"""Chronicler: long-campaign memory for AI roleplay (the sidecar)."""

__version__ = "0.1.0"
