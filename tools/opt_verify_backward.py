"""``mdsl-opt --verify-backward``: the model's backward against float64 finite differences.

Spec 9.8.1 (:mod:`modeldsl.verify_backward`): the written backward
(``@backward``, from a ``backward:`` section) where the model has one, else its
derived gradient (``mdsl-autodiff``; ``--verify-derived`` forces this one); the
report's header says which. The model is specialized with small sizes
(``--verify-shapes B=2,T=8``; a Module DSL parameter named there is a lowering
value instead, so ``d_model=32,n_layers=2`` makes a model tiny), given random
weights and inputs (seed 0), and each parameter's and float input's directional
derivative is printed as a table; the exit code is 1 when an error is above
``--verify-tolerance`` (default 1e-3). First the gradient invariants the model keeps (a
primitive declaration's ``invariants: - backward_uses: [out]``, spec 9.8.3,
:mod:`modeldsl.invariants`) are checked against that backward: E006 where it lacks a tensor
one names, else a line of the report lists them as held. :class:`VerifyBackwardMixin` holds the
driver's part of it; :func:`verify_options` checks the flags.
"""

from __future__ import annotations

import argparse
import dataclasses

from xdsl.dialects.builtin import ModuleOp

from modeldsl.diagnostics import Diagnostic, DiagnosticError
from modeldsl.symbolic import STAR

VERIFY_SHAPES = {"B": 2, "T": 8}
VERIFY_MAX_ELEMENTS = 2**25  # parameters and inputs: 256 MiB of float64


class VerifyBackwardMixin:
    """The ``--verify-backward`` steps of :class:`modeldsl.tools.opt.MdslOptMain`."""

    def verify_lowering_config(self, program, config: dict | None) -> dict | None:
        """``--verify-shapes`` values that name parameters of the lowered declaration join its
        configuration (over the checkpoint's); the rest bind symbols after lowering."""
        from modeldsl.lower import choose_top

        decl = choose_top(program, self.args.top)
        params = {p.name: p for p in decl.params or [] if p.name is not None and not p.rest}
        names = set(params)
        for name in self.verify.given:
            kind = getattr(params[name].type, "id", None) if name in params else "int"
            if kind != "int":
                raise flag_error(f"--verify-shapes: {name} is a{'n' if str(kind)[:1] in 'aeiou' else ''} {kind} "
                                 f"parameter of {decl.name}, not a size",
                                 "--verify-shapes binds sizes; other values come from the model's defaults or "
                                 "a checkpoint's config (--hf DIR)")
        lowered = {k: v for k, v in self.verify.sizes.items() if k in names}
        self.verify.bindings = {k: v for k, v in self.verify.sizes.items() if k not in names}
        return {**(config or {}), **lowered} if lowered or config is not None else None

    def specialize_for_verify(self, prog: ModuleOp) -> None:
        """Bind ``--verify-shapes`` (and every config integer) into each model; E029 naming the
        symbols still unbound and the names that are neither symbols nor config values."""
        from modeldsl.dialects.graph import ModelOp
        from modeldsl.passes.specialize import _symbols_of, specialize_model
        from modeldsl.verify_backward import unbound_symbols

        models = [m for m in prog.walk() if isinstance(m, ModelOp)]
        if not models:
            raise flag_error("--verify-backward needs a model: the input has no mdsl.graph.model",
                             "lower a Module DSL model, module or block (--top NAME)")
        bindings = self.verify.bindings if self.verify.bindings is not None else self.verify.sizes
        for model in models:
            known = _symbols_of(model) | set(model.config_values)
            unknown = sorted(k for k in bindings if k not in known and k not in VERIFY_SHAPES)
            if unknown:
                raise flag_error(f"--verify-shapes: {', '.join(unknown)} is neither a symbol nor a config value of "
                                 f"@{model.sym_name.data}",
                                 "symbols: " + (", ".join(sorted(_symbols_of(model))) or "none") + "; config: "
                                 + (", ".join(model.config_values) or "none"))
            specialize_model(model, {k: v for k, v in bindings.items() if k in known})
            missing = unbound_symbols(model)
            if missing:
                example = ",".join(f"{k}={v}" for k, v in {**VERIFY_SHAPES, **bindings}.items())
                raise flag_error(f"--verify-backward: the shapes of @{model.sym_name.data} still hold "
                                 f"{', '.join(missing)}: the check needs concrete sizes",
                                 f"give them with --verify-shapes {example},{'=4,'.join(missing)}=4")

    def verify_backward_report(self, prog: ModuleOp) -> str:
        """The finite-difference table of each model's gradient (``--verify-backward``)."""
        from modeldsl.dialects.graph import ModelOp
        from modeldsl.passes.autodiff import AutodiffError
        from modeldsl.runtime.executor import ExecutionError
        from modeldsl.verify_backward import (
            BackwardCheckError,
            checked_backward,
            random_inputs,
            random_weights,
            report,
            verify_backward,
        )

        which = "derived" if self.verify.derived else "auto"
        out = []
        for model in [m for m in prog.walk() if isinstance(m, ModelOp)]:
            sizes = {**VERIFY_SHAPES, **self.verify.sizes}
            self.check_size(model, sizes)
            try:
                kind = checked_backward(model, which=which)
                held = self.check_invariants(model, kind)
                inputs = random_inputs(model, sizes=sizes, rope=self.rope_of(model))
                checks = verify_backward(model, random_weights(model), inputs, epsilon=self.verify.epsilon,
                                         which=which)
            except BackwardCheckError as err:
                raise DiagnosticError([Diagnostic(err.code, f"--verify-backward: {err.message}", None,
                                                  err.hint)]) from None
            except AutodiffError as err:
                hint = ("drop --verify-derived to check the module's written backward" if self.verify.derived
                        and checked_backward(model) == "written" else "write a backward: section for this module")
                raise DiagnosticError([Diagnostic("E014", f"--verify-backward: {err}", None, hint)]) from None
            except ExecutionError as err:
                raise DiagnosticError([Diagnostic("E014", f"--verify-backward: {err}", None,
                                                  "the check runs the model with the numpy reference kernels")]) \
                    from None
            shapes = ", ".join(f"{k}={v}" for k, v in sizes.items())
            what = "the written backward @backward" if kind == "written" else "the derived gradient (mdsl-autodiff)"
            out.append(f"verify-backward @{model.sym_name.data} ({shapes}; float64, epsilon "
                       f"{self.verify.epsilon:g}, seed 0): {what}\n")
            text, ok = report(checks, self.verify.tolerance)
            out.append(text + held)
            self.verify_failed |= not ok
        return "".join(out)

    def check_invariants(self, model, kind: str) -> str:
        """The model's gradient invariants (spec 9.8.3) against the backward the check runs: E006
        where it lacks a tensor one names; the report's line of those that hold ("" for none)."""
        from modeldsl.invariants import backward_problems, model_invariants

        kept = model_invariants(model)
        if not kept:
            return ""
        problems = backward_problems(model, kind)
        if problems:
            raise DiagnosticError(problems)
        listed = "; ".join(f"{primitive} {k}: [{', '.join(names)}]" for primitive, kinds in sorted(kept.items())
                           for k, names in kinds.items())
        return f"invariants held by the {kind} backward: {listed}\n"

    def check_size(self, model, sizes: dict[str, int]) -> None:
        """E029 for a model too large for a float64 finite-difference check."""
        from math import prod

        from modeldsl.dialects.graph import ParamOp
        from modeldsl.verify_backward import forward_of

        for param in (p for p in model.body.block.ops if isinstance(p, ParamOp)):
            dims = [d.evaluate({}) for d in param.param_type.shape if d is not STAR]
            if any(d < 1 for d in dims):
                raise flag_error(f"--verify-backward: parameter {param.sym_name.data} of @{model.sym_name.data} "
                                 f"has the shape {dims} under these sizes: every extent must be at least 1",
                                 "choose sizes whose derived dimensions stay positive (e.g. d_model a multiple of "
                                 "num_heads), with --verify-shapes")
        types_ = [p.param_type for p in model.body.block.ops if isinstance(p, ParamOp)]
        forward = forward_of(model)
        types_ += [a.type for a in forward.body.block.args] if forward is not None else []
        count = sum(prod(sizes["B"] * sizes["T"] if d is STAR else d.evaluate({}) for d in t.shape) for t in types_)
        if count > VERIFY_MAX_ELEMENTS:
            raise flag_error(f"--verify-backward: @{model.sym_name.data} has {count:,} parameter and input "
                             f"elements, more than the check runs ({VERIFY_MAX_ELEMENTS:,}); it is meant for small "
                             "sizes", "make the model small with --verify-shapes, e.g. d_model=32,n_layers=2")

    def rope_of(self, model):
        """The RoPE frequencies of the model's ``freqs`` input (rope_theta, the checkpoint's scaling)."""
        from xdsl.dialects.builtin import FloatAttr, IntegerAttr

        from modeldsl.runtime.rope import RopeScalingError, rope_frequencies
        from modeldsl.verify_backward import forward_of

        forward = forward_of(model)
        arg = next((a for a in forward.body.block.args if a.name_hint == "freqs"), None) if forward else None
        if arg is None or len(arg.type.shape) != 3 or not arg.type.shape[1].is_const():
            return None
        config = model.config_values
        theta = config.get("rope_theta")
        theta = theta.value.data if isinstance(theta, FloatAttr) else self.hf_config.get("rope_theta", 10000.0)
        max_seq = config.get("max_seq")
        max_seq = max_seq.value.data if isinstance(max_seq, IntegerAttr) else \
            self.hf_config.get("max_position_embeddings")
        try:
            return rope_frequencies(2 * arg.type.shape[1].evaluate({}), theta, self.hf_config.get("rope_scaling"),
                                    max_seq)
        except RopeScalingError as err:
            raise DiagnosticError([Diagnostic("E030", f"{self.args.hf}: rope_scaling {err}", None,
                                              "fix rope_scaling in config.json")]) from None


@dataclasses.dataclass
class VerifyOptions:
    """``--verify-backward``'s options: the sizes given (over B=2, T=8), the tolerance, the step and
    whether the derived gradient is checked even where a written backward is (``--verify-derived``);
    ``bindings`` the sizes left to bind after lowering (None: all of them)."""

    sizes: dict[str, int]
    tolerance: float
    epsilon: float
    derived: bool = False
    bindings: dict[str, int] | None = None

    def text(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self.sizes.items())

    @property
    def given(self) -> list[str]:
        return [k for k in self.sizes if k not in VERIFY_SHAPES]


def flag_error(message: str, hint: str = "") -> DiagnosticError:
    return DiagnosticError([Diagnostic("E029", message, None, hint)])


def verify_options(args: argparse.Namespace) -> VerifyOptions | None:
    """The checked ``--verify-*`` flags (E029 for a bad value or one without --verify-backward)."""
    given = [f for f, v in (("--verify-shapes", args.verify_shapes), ("--verify-tolerance", args.verify_tolerance),
                            ("--verify-epsilon", args.verify_epsilon),
                            ("--verify-derived", args.verify_derived or None)) if v is not None]
    if not args.verify_backward:
        if given:
            raise flag_error(f"{given[0]} is an option of --verify-backward", "add --verify-backward")
        return None
    if args.emit != "ir":
        raise flag_error(f"--verify-backward prints the gradient check, not --emit={args.emit}",
                         "drop one of --verify-backward and --emit")
    return VerifyOptions(parse_sizes(args.verify_shapes or ""),
                         positive_float("--verify-tolerance", args.verify_tolerance, 1e-3),
                         positive_float("--verify-epsilon", args.verify_epsilon, 1e-6), args.verify_derived)


def parse_sizes(text: str) -> dict[str, int]:
    """``B=2,T=8`` (commas or spaces) as sizes over the defaults B=2, T=8."""
    sizes = dict(VERIFY_SHAPES)
    for item in text.replace(",", " ").split():
        name, eq, value = item.partition("=")
        name, value = name.strip(), value.strip()
        if not eq or not name.isidentifier():
            raise flag_error(f"--verify-shapes: '{item}' is not NAME=SIZE", "write --verify-shapes B=2,T=8")
        try:
            size = int(value)
        except ValueError:
            raise flag_error(f"--verify-shapes: {name}={value} is not an integer",
                             "sizes are positive integers: --verify-shapes B=2,T=8") from None
        if not 0 < size < 2**63:
            raise flag_error(f"--verify-shapes: {name}={size} is not a positive size",
                             "sizes are positive integers: --verify-shapes B=2,T=8")
        sizes[name] = size
    return sizes


def positive_float(flag: str, text: str | None, default: float) -> float:
    if text is None:
        return default
    try:
        value = float(text)
    except ValueError:
        raise flag_error(f"{flag} {text!r} is not a number", f"e.g. {flag} {default:g}") from None
    if not (value > 0 and value != float("inf")):
        raise flag_error(f"{flag} must be a finite number above 0, got {text}", f"e.g. {flag} {default:g}")
    return value
