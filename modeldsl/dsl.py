"""The Python decorator DSL's public names: ``from modeldsl.dsl import module, Param, Tensor, ...``
(see :mod:`modeldsl.frontend.python`)."""

from modeldsl.frontend.python.api import *  # noqa: F401,F403 - the DSL's names
from modeldsl.frontend.python.api import __all__  # noqa: F401
