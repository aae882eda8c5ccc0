"""The Python decorator DSL, read into the Module DSL's AST (see ``translate``)."""

from modeldsl.frontend.python.translate import parse_python_file, parse_python_source

__all__ = ["parse_python_file", "parse_python_source"]
