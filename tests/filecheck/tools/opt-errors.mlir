// Bad input and bad flags give located messages and a non-zero exit, never a traceback.
// RUN: not mdsl-opt %s 2>&1 | filecheck %s --check-prefix=PARSE
// RUN: not mdsl-opt %s -p no-such-pass 2>&1 | filecheck %s --check-prefix=PASS
// RUN: not mdsl-opt %s --pass-pipeline='dce{' 2>&1 | filecheck %s --check-prefix=SYNTAX
// RUN: not mdsl-opt %s.missing 2>&1 | filecheck %s --check-prefix=MISSING
// RUN: mdsl-opt %s --parsing-diagnostics | filecheck %s --check-prefix=PARSE

mdsl.graph.model @m {
  mdsl.graph.func @f(%x: !mdsl.graph.tensor<[B, 64], float>) {
  }
}

// PARSE: opt-errors.mlir:9:54: error: unknown element type 'float' (expected one of bf16, fp16, fp32, fp8_e4m3, fp8_e5m2, fp4_e2m1, int8, int32, int64, bool)
// PARSE-NEXT: mdsl.graph.func @f(%x: !mdsl.graph.tensor<[B, 64], float>) {
// PARSE-NEXT: ^^^^^
// PARSE-NOT: Traceback

// PASS: mdsl-opt: error: Unrecognized passes: ['no-such-pass'] (known passes:
// SYNTAX: mdsl-opt: error: invalid pass pipeline
// MISSING: mdsl-opt: error: no such file: {{.*}}opt-errors.mlir.missing
