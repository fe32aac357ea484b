"""The sweep: the engine's tuned settings run beyond the scenarios they were tuned on.

    python -m sim.sweep [--quick] [--no-speed] [--write-report] [--json OUT] [--from-json IN]
    python -m sim.sweep --headroom [--quick] [--jobs N] [--write-report] [--json OUT] [--from-json IN]
    python -m sim.sweep --eta [--quick] [--write-report] [--json OUT] [--from-json IN]

Three parts, each a marked section of bench/REPORT.md (``--write-report``; run it after
``python -m bench.report``): admission by predicted dispatch and early fast-fail
(:mod:`sim.sweep.admission`), predictive headroom's cost against strict
(:mod:`sim.sweep.headroom`), and the ETA's calibration (:mod:`sim.sweep.eta`). What each varies
and its targets: docs/simulator.md.
"""
