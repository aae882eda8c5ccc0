// --list-passes (also in --help), --version, the targets that work, --mlir-timing.
// RUN: mdsl-opt --list-passes | filecheck %s --check-prefix=LIST
// RUN: mdsl-opt --help | filecheck %s --check-prefix=HELP
// RUN: mdsl-opt --version | filecheck %s --check-prefix=VERSION
// RUN: mdsl-run --version | filecheck %s --check-prefix=RUNVERSION
// RUN: mdsl-opt %s -t mlir | filecheck %s --check-prefix=TARGET
// RUN: not mdsl-opt %s -t llvm 2>&1 | filecheck %s --check-prefix=NOTARGET
// RUN: mdsl-opt %s -p cse,dce --mlir-timing 2>&1 >/dev/null | filecheck %s --check-prefix=TIMING
// RUN: mdsl-opt %s -p cse --time-passes 2>&1 >/dev/null | filecheck %s --check-prefix=TIMING

!x = !mdsl.graph.tensor<[B, 64], fp32>
mdsl.graph.model @m {
  mdsl.graph.func @f(%x: !x) -> !x {
    mdsl.graph.return %x : !x
  }
}

// LIST: Available passes:
// LIST: {{^}}  cse
// LIST-NEXT: eliminate common subexpressions
// LIST: {{^}}  mdsl-specialize
// LIST: NAME=INT
// LIST: {{^}}  mdsl-plan-memory
// LIST-NEXT: give every buffer of an mdsl.sched.program its arena offset
// LIST-NEXT: strategy=str {{ +}} default: first-fit
// LIST-NEXT: alignment=int {{ +}} default: 256
// LIST-NEXT: inplace=bool {{ +}} default: true
// LIST: {{^}}  mdsl-recompute
// LIST: {{^}}      patterns:
// LIST-NEXT: {{^}}        layer_tensors {{ +}} RecomputeLayerTensors
// LIST-NEXT: {{^}}        top_level_tensors {{ +}} RecomputeTopLevelTensors
// LIST: {{^}}  mdsl-fuse
// LIST: {{^}}      patterns:
// LIST-NEXT: {{^}}        residual_norm {{ +}} ResidualNorm, ResidualNormBackward
// LIST-NEXT: {{^}}        scalar_alpha {{ +}} ScaleIntoAlpha, AlphaFromScale
// LIST: {{^}}        qk_norm_rope {{ +}} QkNormRope, QkNormRopeBackward
// LIST-NEXT: {{^}}  mdsl-optimizer-step

// HELP: usage: mdsl-opt
// HELP: --list-passes
// HELP: --print-ir-after-change
// HELP: -t TARGET, --target TARGET
// HELP-NEXT: the output form: mlir (the only target that works on
// HELP: Available passes:
// HELP: mdsl-lower-to-sched

// VERSION: mdsl-opt (modeldsl {{[0-9]+\.[0-9]+\.[0-9]+.*}}) on xDSL {{[0-9.]+}}
// RUNVERSION: mdsl-run (modeldsl {{[0-9]+\.[0-9]+\.[0-9]+.*}})

// TARGET: mdsl.graph.model @m
// NOTARGET: error[E029]: argument -t/--target: invalid choice: 'llvm' (choose from mlir)

// TIMING: ===-------------------------------------------------------------------------===
// TIMING-NEXT: Execution time report
// TIMING-NEXT: ===-------------------------------------------------------------------------===
// TIMING-NEXT: Total Execution Time: {{[0-9]+\.[0-9]+}} ms
// TIMING: ----Wall Time (ms)----  ----Name----
// TIMING-NEXT: {{[0-9]+\.[0-9]+}} ({{ *[0-9]+\.[0-9]}}%)  Read input
// TIMING-NEXT: Parser
// TIMING-NEXT: Verifier
// TIMING-NEXT: 'builtin.module' Pipeline
// TIMING-NEXT: {{^ +[0-9]+\.[0-9]+ \( *[0-9]+\.[0-9]%\)    }}CommonSubexpressionElimination (cse)
// TIMING-NEXT: {{^ +[0-9]+\.[0-9]+ \( *[0-9]+\.[0-9]%\)    }}Verifier
// TIMING: Output
// TIMING: {{[0-9]+\.[0-9]+}} (100.0%)  Total
