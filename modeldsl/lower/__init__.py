"""Lowering Module DSL declarations to ``mdsl.graph``.

A top declaration (a model, or a module/block lowered on its own) becomes one
``mdsl.graph.model`` op: its signature parameters become the model's config
(integer ones stay symbols in shapes, so ``mdsl-specialize`` can bind them
later), every tensor parameter of it and of its sub-module instances becomes
an ``mdsl.graph.param`` named by its path (``blocks.attn.qkv_weight``), and
its forward graph becomes ``@forward``. Module instances are inlined, keeping
tensor names as SSA name hints; ``[n] x Block(...)`` becomes one block body
function plus an ``mdsl.graph.stack`` call, its parameters stacked with a
leading ``n`` dimension.

An instance whose module has a written ``backward:`` section (spec 5.12.6:
an explicit backward disables auto-derivation) is not inlined but called,
so that ``mdsl-autodiff`` can use its written backward for its part of the
graph. It becomes two helper functions, named by the instance's path:

- ``@<path>_forward(inputs..., params...) -> (outputs..., saved...)``
  (kind ``helper``): its forward graph, its tensor parameters as arguments
  (like a block body's, so that it works on the per-layer slices inside a
  stacked block), returning after its outputs the tensors its backward
  reads as ``saved.<name>``. Attributes: ``backward`` (the symbol of its
  backward), ``saved`` (the names of the extra results) and ``params`` (the
  parameter arguments, by their path inside the instance);
- ``@<path>_backward(d_outputs..., saved..., params...) -> (d_inputs...,
  d_params...)`` (kind ``backward``): the written backward, lowered and
  checked as the top's ``@backward`` is (E005, E006, E018-E022, W004 at the
  module's source), with ``grads`` naming and ``grad_args`` indexing (into
  the forward's arguments) its results (:mod:`modeldsl.lower.backward`).

The call site is ``mdsl.graph.call @<path>_forward``; the saved results
are only read by a derived gradient. Instances of one module with the same
configuration, parameter and input types share one pair of functions (named
after the first); inside a written backward, and inside such a helper
(whose written backward covers its sub-modules), instances stay inlined, as
do modules holding a stack. Helper functions follow the model's other
functions.

Every problem is a coded diagnostic collected in a sink, so one run reports
all independent errors.

The package, one module per responsibility, each a mixin of :class:`Lowering`
(:mod:`modeldsl.lower.lowering`, which also holds the entry points):

- :mod:`~modeldsl.lower.hf_sections`: ``hf_config``/``hf_mapping``/``hf_export``;
- :mod:`~modeldsl.lower.constants`: configuration, ConstExprs, guards;
- :mod:`~modeldsl.lower.tensor_types`: written tensor types;
- :mod:`~modeldsl.lower.params`: parameters and module instances;
- :mod:`~modeldsl.lower.annotations`: annotations, recipes, memory policies;
- :mod:`~modeldsl.lower.forward`: the ``forward:`` section and its signature;
- :mod:`~modeldsl.lower.flows`: a graph's statements and data flows;
- :mod:`~modeldsl.lower.calls`: a flow's stages, inlined instances;
- :mod:`~modeldsl.lower.called_modules`: modules with a written backward;
- :mod:`~modeldsl.lower.stacks`: stacked blocks;
- :mod:`~modeldsl.lower.indexing`: subscripts;
- :mod:`~modeldsl.lower.emit`: primitive ops;
- :mod:`~modeldsl.lower.backward`: written ``backward:`` sections.
"""

from modeldsl.lower.lowering import LOWERABLE, Lowering, choose_top, lower_program, report_placeholders

__all__ = ["LOWERABLE", "Lowering", "choose_top", "lower_program", "report_placeholders"]
