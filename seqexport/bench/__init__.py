"""Benchmarks of exported folders against their eager models. One job per module:

    run             `seqexport bench`: the generic driver (`run_bench`)
    cases           what a family's bench module hands the driver (the family part lives in
                    seqexport/families/<name>/bench.py)
    timing          how anything is timed: paired medians, bandwidth, RSS
    tables          `format_table` of a run's result
    scaling         decode latency and state size as the context grows (scripts/bench_scaling.py)
    lowering_study  the Mamba scan lowerings compared (scripts/study_lowerings.py)
"""
