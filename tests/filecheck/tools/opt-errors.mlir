// Bad input and bad flags give one coded diagnostic form, file:line:col: error[EXXX],
// with the source line and a caret, and a non-zero exit; never a traceback.
// RUN: not mdsl-opt %s 2>&1 | filecheck %s --check-prefix=PARSE
// RUN: not mdsl-opt %s.missing 2>&1 | filecheck %s --check-prefix=MISSING
// RUN: not mdsl-opt %S 2>&1 | filecheck %s --check-prefix=FOLDER
// RUN: mdsl-opt %s --parsing-diagnostics | filecheck %s --check-prefix=PARSE
// RUN: not mdsl-opt %s --no-such-flag 2>&1 | filecheck %s --check-prefix=FLAG
// RUN: not mdsl-opt %s --print-ir-after-al 2>&1 | filecheck %s --check-prefix=FLAGHINT
// RUN: not mdsl-opt %S/../../../README.md 2>&1 | filecheck %s --check-prefix=KIND

mdsl.graph.model @m {
  mdsl.graph.func @f(%x: !mdsl.graph.tensor<[B, 64], float>) {
  }
}

// PARSE: opt-errors.mlir:12:54: error[E001]: unknown element type 'float' (expected one of bf16, fp16, fp32, fp8_e4m3, fp8_e5m2, fp4_e2m1, int8, int32, int64, bool)
// PARSE-NEXT: 12 |   mdsl.graph.func @f(%x: !mdsl.graph.tensor<[B, 64], float>) {
// PARSE-NEXT: |                                                      ^^^^^
// PARSE-NOT: Traceback

// MISSING: error[E028]: cannot read '{{.*}}opt-errors.mlir.missing': No such file or directory
// FOLDER: error[E028]: cannot read '{{.*}}tools': it is a folder
// FLAG: error[E029]: unrecognized arguments: --no-such-flag
// FLAGHINT: error[E029]: unrecognized arguments: --print-ir-after-al
// FLAGHINT-NEXT: hint: did you mean '--print-ir-after-all'?
// KIND: error[E029]: cannot tell the kind of '{{.*}}README.md' from its extension '.md'
// KIND-NEXT: hint: name it .mlir, .module, .py (the Python DSL) or .json, or give the kind with -f mlir / -f module / -f py / -f json

// --split-input-file splits IR only: on Module DSL, Python DSL or JSON IR input it is an error, not ignored.
// RUN: not mdsl-opt %S/opt-debuginfo.module --split-input-file 2>&1 | filecheck %s --check-prefix=SPLITMODULE
// RUN: not mdsl-opt -f py --split-input-file < %s 2>&1 | filecheck %s --check-prefix=SPLITPY
// RUN: not mdsl-opt -f json --split-input-file < %s 2>&1 | filecheck %s --check-prefix=SPLITJSON
// SPLITMODULE: error[E029]: --split-input-file cuts IR text at '// -----'; '{{.*}}opt-debuginfo.module' is Module DSL text (.module), which is read whole
// SPLITMODULE-NEXT: hint: drop --split-input-file, or put each case in a file of its own
// SPLITPY: error[E029]: --split-input-file cuts IR text at '// -----'; '<stdin>' is a Python DSL file (.py), which is read whole
// SPLITJSON: error[E029]: --split-input-file cuts IR text at '// -----'; '<stdin>' is JSON IR (.json), which is read whole
