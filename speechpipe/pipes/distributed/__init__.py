"""Distribution: step planning and equal steps on every rank.

This is the package's face: other packages and
users import from here, never from its ``_modules``.
"""

from ._equal import (
    DistributedStepError, EqualSteps, PlanMismatchWarning, POLICIES, StepEqualizer,
    StepEqualizerIterDataPipe, UnevenStepsWarning,
)
from ._steps import batch_samples, StepPlan, StepPlanner, StepStats, TARGETS

__all__ = [
    "DistributedStepError",
    "EqualSteps",
    "POLICIES",
    "PlanMismatchWarning",
    "StepEqualizer",
    "StepEqualizerIterDataPipe",
    "StepPlan",
    "StepPlanner",
    "StepStats",
    "TARGETS",
    "UnevenStepsWarning",
    "batch_samples",
]
