"""The planner's prediction made before a comparison's trials, from solo runs measured before
them (the period calibration's runs of job A and of job B at its chosen batch), so that a
measured winner can be set against a call that could not have seen it (issue 50)."""
from __future__ import annotations

from typing import Any, Mapping

from crossover_tf_planner import registry
from crossover_tf_planner.compare_record import Regime, ScenarioResult, Trial
from crossover_tf_planner.job_stats import JobStats

OVER_NAIVE = (registry.SHIFT, registry.CROSSOVER, registry.CROSSOVER_TURN)


def predict_before(solos: Mapping[str, JobStats], regime: Regime) -> dict[str, Any]:
    """The planner's recommendation (and the policy it runs) and each policy's predicted
    aggregate images/s over naive's, on the emulated cluster's device model (cpu) with the
    regime's probes, from `solos` alone (the compare.md planner's own inputs)."""
    from crossover_tf_planner import validate as planner_validate
    trial = Trial({registry.solo(job): ScenarioResult({job: s}, s.images_per_s)
                   for job, s in solos.items()})
    prediction = planner_validate.validate_comparison(trial, regime=regime)["prediction"]
    images = prediction["images_per_s"]
    return {"recommendation": prediction["recommendation"], "policy": prediction["policy"],
            "over_naive": {p: images[p] / images[registry.NAIVE] for p in OVER_NAIVE},
            "shift_offset_s": prediction["shift_offset_s"]}
