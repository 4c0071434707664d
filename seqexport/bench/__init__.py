"""Benchmarks of exported folders against their eager models. One job per module:

    run             `seqexport bench`: the generic driver (`run_bench`)
    cases           what a family's bench module hands the driver (the family part lives in
                    seqexport/families/<name>/bench.py)
    timing          how anything is timed: paired medians, bandwidth, RSS
    tables          `format_table` of a run's result
    scaling         decode latency and state size as the context grows (scripts/bench_scaling.py)
    serve           `seqexport bench-serve`: continuous batching vs one at a time vs static batches
    int8, int4      a quantised copy timed beside its float32 source
    gemv_floor      the linears alone: the floor a step is measured against
(the Mamba scan lowering study lives with its family: families/mamba/lowering_study.py)
"""
