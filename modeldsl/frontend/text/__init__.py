"""The Module DSL text frontend: Lark grammar, indentation post-lexer, AST."""

from modeldsl.frontend.text.parser import parse_source, parse_tree

__all__ = ["parse_source", "parse_tree"]
