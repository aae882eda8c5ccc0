"""Frontends: the Module DSL text language (``text``) and the Python decorator DSL (``python``),
both giving the text DSL's AST, which lowering turns into ``mdsl.graph``; :mod:`.read` reads a model
given as either (``read_model``)."""
