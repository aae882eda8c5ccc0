// Pipeline errors are located in the pipeline text (<pipeline>:1:col) with a
// caret and a "did you mean" hint; so are unknown pass options.
// RUN: not mdsl-opt %s -p csee 2>&1 | filecheck %s --check-prefix=PASS
// RUN: not mdsl-opt %s -p 'cse,mdsl-plan-memory{alignmen=64}' 2>&1 | filecheck %s --check-prefix=OPTION
// RUN: not mdsl-opt %s --pass-pipeline='builtin.module(cse,dce{' 2>&1 | filecheck %s --check-prefix=SYNTAX
// RUN: not mdsl-opt %s -p 'cse dce' 2>&1 | filecheck %s --check-prefix=COMMA
// RUN: not mdsl-opt %s -p 'mdsl-plan-memory{alignment=abc}' 2>&1 | filecheck %s --check-prefix=VALUE
// RUN: not mdsl-opt %s -p cse --pass-pipeline=dce 2>&1 | filecheck %s --check-prefix=BOTH
// RUN: not mdsl-opt %s --print-ir-before=dcee 2>&1 | filecheck %s --check-prefix=DUMP

mdsl.graph.model @m {
}

// PASS: <pipeline>:1:1: error[E029]: unknown pass 'csee'
// PASS-NEXT: 1 | csee
// PASS-NEXT: | ^^^^
// PASS-NEXT: hint: did you mean 'cse'?

// OPTION: <pipeline>:1:22: error[E029]: mdsl-plan-memory has no option 'alignmen'
// OPTION-NEXT: 1 | cse,mdsl-plan-memory{alignmen=64}
// OPTION-NEXT: |                      ^^^^^^^^
// OPTION-NEXT: hint: did you mean 'alignment'?

// SYNTAX: <pipeline>:1:24: error[E001]: pass pipeline: expected argument name here
// SYNTAX-NEXT: 1 | builtin.module(cse,dce{
// SYNTAX-NEXT: |                        ^

// COMMA: <pipeline>:1:5: error[E001]: pass pipeline: expected a comma or pass arguments here
// COMMA-NEXT: 1 | cse dce
// COMMA-NEXT: |     ^^^{{$}}

// VALUE: <pipeline>:1:18: error[E029]: mdsl-plan-memory: alignment=abc is not an int
// VALUE-NEXT: 1 | mdsl-plan-memory{alignment=abc}
// VALUE-NEXT: |                  ^^^^^^^^^

// BOTH: error[E029]: give the pipeline with either -p or --pass-pipeline, not both

// DUMP: error[E029]: --print-ir-before: unknown pass 'dcee'
// DUMP-NEXT: hint: did you mean 'dce'?
