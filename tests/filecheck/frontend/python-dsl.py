# The Python DSL lowers through mdsl-opt like the Module DSL: the decorated classes are read (never
# run), each op carries its Python file:line:col, and a mistake is the text DSL's coded diagnostic.
# RUN: mdsl-opt %s --top Scale | filecheck %s
# RUN: mdsl-opt %s --top Scale --print-debuginfo | filecheck %s --check-prefix=LOC
# RUN: mdsl-opt %s --top Scale -p 'mdsl-specialize{B=1 T=4}' --emit=json | filecheck %s --check-prefix=JSON
# RUN: not mdsl-opt %s --top Broken 2>&1 | filecheck %s --check-prefix=ERR
from modeldsl.dsl import Param, Tensor, forward, graph, module, save


@module
class Scale:
    """y = x * w, for each of the d features."""

    def __init__(self, d: int):
        pass

    weight = Param(Tensor["d"])

    @save("in_")
    @forward
    def forward(self, in_: Tensor["B", "T", "d"]) -> Tensor["B", "T", "d"]:
        with graph() as g:
            out = g.mul(in_, "weight", hook="AfterScale")


@module
class Broken:
    def __init__(self, d: int):
        pass

    @forward
    def forward(self, in_: Tensor["B", "T", "d"]) -> Tensor["B", "T", "d"]:
        with graph() as g:
            out = g.mul(in_, "missing_weight")


# CHECK: mdsl.graph.model @Scale
# CHECK: mdsl.graph.param @weight : !mdsl.graph.tensor<[d], bf16>
# CHECK: mdsl.graph.func @forward(%in: !mdsl.graph.tensor<[B, T, d], bf16>)
# CHECK: mdsl.graph.mul %in, %weight
# CHECK-SAME: hook

# LOC: mdsl.graph.mul {{.*}} loc("{{.*}}python-dsl.py":23:19)

# JSON: "format": "modeldsl-ir",
# JSON: "op": "mdsl.graph.mul",

# ERR: python-dsl.py:34:31: error[E002]: undefined identifier 'missing_weight'
# ERR-NEXT: 34 |             out = g.mul(in_, "missing_weight")
