from xdsl.ir import Dialect
Sched = Dialect("mdsl.sched", [], [])  # placeholder, being written
