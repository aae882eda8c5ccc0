"""``mdsl-roundtrip``: check that IR prints in a form that parses back to itself.

For each chunk of the input (``--split-input-file`` style, ``// -----``):
parse it, print the custom form, parse that and print again (the two prints
must be equal), print the generic form, parse that and print in custom form
(must again be equal), and print with source locations (``loc(...)``), parse
that and print again (equal, locations included). Prints the custom form for
FileCheck; exits 1 with a unified diff on any mismatch and with a coded,
located diagnostic for bad input. Used by the lit ``%roundtrip`` substitution.
"""

from __future__ import annotations

import difflib
import sys
from collections.abc import Sequence

from xdsl.utils.exceptions import DiagnosticException, ParseError

from modeldsl.diagnostics import DiagnosticError, render_all
from modeldsl.ir import make_context, parse_module, print_ir, verify_module
from modeldsl.primitive_modules import load_from_environment


class RoundTripMismatch(Exception):
    pass


def _reprint(text: str, name: str, generic: bool = False, debuginfo: bool = False) -> str:
    module, _ = parse_module(make_context(), text, name)
    return print_ir(module, generic=generic, debuginfo=debuginfo)


def roundtrip_chunk(text: str, name: str) -> str:
    """The custom print of ``text``, after checking both round trips."""
    module, spans = parse_module(make_context(), text, name)
    diagnostics = verify_module(module, spans)
    if diagnostics:
        raise DiagnosticException("".join(d.render() for d in diagnostics))
    custom = print_ir(module)
    _expect_equal(custom, _reprint(custom, f"{name} (custom print)"), "custom print does not re-parse to itself")
    generic = print_ir(module, generic=True)
    _expect_equal(custom, _reprint(generic, f"{name} (generic print)"),
                  "generic print does not re-parse to the same IR")
    located = print_ir(module, debuginfo=True)
    _expect_equal(located, _reprint(located, f"{name} (print with locations)", debuginfo=True),
                  "print with locations does not re-parse to itself")
    return custom


def _expect_equal(expected: str, got: str, what: str) -> None:
    if expected != got:
        diff = "".join(difflib.unified_diff(expected.splitlines(True), got.splitlines(True), "first", "second"))
        raise RoundTripMismatch(f"{what}:\n{diff}")


def _read_text(path: str) -> str:
    """The file's text: E028 when it cannot be read, E001 for bytes that are not UTF-8."""
    from modeldsl.files import read_regular_file
    from modeldsl.frontend.text.parser import decode_source

    return decode_source(read_regular_file(path), path)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: mdsl-roundtrip FILE", file=sys.stderr)
        return 2
    path = args[0]
    try:
        load_from_environment()  # MDSL_PRIMITIVES: modules registering user primitives
        chunks = _read_text(path).split("// -----")
    except DiagnosticError as err:
        sys.stderr.write(render_all(err.diagnostics))
        return 1
    outputs = []
    for chunk in chunks:
        try:
            outputs.append(roundtrip_chunk(chunk, path))
        except (ParseError, DiagnosticException, RoundTripMismatch) as err:
            print(str(err), file=sys.stderr)
            return 1
    sys.stdout.write("// -----\n".join(outputs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
