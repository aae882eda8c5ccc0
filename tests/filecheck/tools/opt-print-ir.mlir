// IR dumps around passes go to stderr under mlir-opt's headers.
// RUN: mdsl-opt %s -p cse,dce --print-ir-after-all 2>&1 >/dev/null | filecheck %s --check-prefix=ALL
// RUN: mdsl-opt %s -p cse,dce --print-ir-before=dce 2>&1 >/dev/null | filecheck %s --check-prefix=BEFORE
// RUN: mdsl-opt %s -p cse,dce --print-ir-after=cse,dce 2>&1 >/dev/null | filecheck %s --check-prefix=AFTER
// RUN: mdsl-opt %s -p cse,dce,cse --print-ir-after-change 2>&1 >/dev/null | filecheck %s --check-prefix=CHANGE
// RUN: mdsl-opt %s -p dce --print-ir-after-all 2>/dev/null | filecheck %s --check-prefix=STDOUT

!x = !mdsl.graph.tensor<[B, 64], fp32>
mdsl.graph.model @m {
  mdsl.graph.func @f(%x: !x) -> !x {
    %a = mdsl.graph.relu %x : (!x) -> !x
    %b = mdsl.graph.relu %x : (!x) -> !x
    %y = mdsl.graph.add %a, %a : (!x, !x) -> !x
    mdsl.graph.return %y : !x
  }
}

// ALL: // -----// IR Dump After CommonSubexpressionElimination (cse) //----- //
// ALL-NEXT: builtin.module {
// ALL: %a = mdsl.graph.relu
// ALL: // -----// IR Dump After DeadCodeElimination (dce) //----- //
// ALL-NEXT: builtin.module {

// BEFORE-NOT: IR Dump After
// BEFORE: // -----// IR Dump Before DeadCodeElimination (dce) //----- //
// BEFORE-NOT: IR Dump

// AFTER: // -----// IR Dump After CommonSubexpressionElimination (cse) //----- //
// AFTER: // -----// IR Dump After DeadCodeElimination (dce) //----- //

// cse removes %b (an equal relu), dce has nothing left to remove, the second cse neither.
// CHANGE: // -----// IR Dump After CommonSubexpressionElimination (cse) //----- //
// CHANGE-NOT: %b =
// CHANGE-NOT: IR Dump After

// STDOUT-NOT: IR Dump
// STDOUT: mdsl.graph.add %a, %a
