"""The simulator: scenarios run through the real scheduling engine on a virtual clock.

Above ``scheduling.engine`` and below nothing else: no Django, no app, and the product does not
import it (import-linter contracts in pyproject.toml). ``python -m sim.simulate`` runs one
scenario of ``sim/scenarios/``, ``python -m sim.sweep`` the sweep, ``python -m sim.engine_speed``
the engine's cost per decision; ``python -m bench.report`` writes bench/REPORT.md from them.
"""
