"""Named policies as configurations of the same engine (``--policy`` of the simulator).

``fairgate`` (the configuration as written), ``fifo`` (one global FIFO, no aging, depth limit,
expiry or cancellation), ``strict`` (class priority, FIFO inside a class, no aging) and ``linear``
(boost = wait ratio). Every preset but ``fairgate`` turns prediction and headroom off (headroom to
``HEADROOM_OFF``, the section's defaults before issue 48), so the presets stay the baselines they
were. Details: docs/engine.md, "Presets".
"""

from __future__ import annotations

from dataclasses import replace

from .model import HEADROOM_OFF, AgingPolicy, FairnessMode, Policy, SchedulerConfig


def apply_policy(config: SchedulerConfig, policy: Policy | str) -> SchedulerConfig:
    policy = Policy(policy)
    if policy is Policy.FAIRGATE:
        return replace(config, policy=policy)
    unpredicted = replace(config.queue, admission="depth", fast_fail=False, prior_weight=0, margin_after_ms=0)
    config = replace(config, headroom=HEADROOM_OFF)  # predictive headroom (on by default) is Fairgate's
    if policy is Policy.FIFO:
        queue = replace(
            unpredicted, single_queue=True, enforce_depth=False, enforce_deadline=False, honour_cancel=False
        )
        fairness = replace(config.fairness, mode=FairnessMode.FIFO)
        return replace(config, aging=AgingPolicy(mode="none"), fairness=fairness, queue=queue, policy=policy)
    if policy is Policy.STRICT:
        fairness = replace(config.fairness, mode=FairnessMode.FIFO)
        return replace(config, aging=AgingPolicy(mode="none"), fairness=fairness, queue=unpredicted, policy=policy)
    return replace(config, aging=AgingPolicy(mode="linear"), queue=unpredicted, policy=policy)
