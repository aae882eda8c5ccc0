"""Frontends: the Module DSL text language (``text``), later the Python decorator DSL."""
