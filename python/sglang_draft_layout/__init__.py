"""Bring SGLang trees up to upstream's shared multi-step EAGLE draft layout helpers."""

__version__ = "0.5.0"
