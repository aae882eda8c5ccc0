"""The modeldsl dialects: ``mdsl.graph`` (functional graph) and ``mdsl.sched`` (schedule)."""
