"""Helpers that make third-party training frameworks (DeepSpeed, ...) elastic under elastrain.

Each submodule imports its framework lazily, so importing this package costs nothing.
"""
