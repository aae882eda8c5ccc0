"""The decorated classes of the Python DSL files imported so far: the attributes a decorator gives a
class (its kind, its file, whether it is abstract) and the registry of them by kind and name, which
``modeldsl.load(TheClass)`` and the compiler API (:mod:`modeldsl.frontend.python.compiler`) read."""

from __future__ import annotations

KIND, FILE, ABSTRACT = "__mdsl_kind__", "__mdsl_file__", "__mdsl_abstract__"
REGISTERED: dict[str, dict[str, type]] = {"model": {}, "block": {}, "module": {}}  # kind -> name -> class
