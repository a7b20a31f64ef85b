"""The comparison's scenarios and ratios, named once.

experiments/ computes, tabulates, plots and sweeps these ratios and the planner predicts some
of them; each module picks its view (TABLE, PLOTTED, VALIDATED_RATIOS, SWEPT) from here
instead of spelling keys by hand, so a ratio cannot be computed under one name and read under
another. Plain Python, no TensorFlow.
"""

from __future__ import annotations

import dataclasses

SEQUENTIAL, NAIVE, CROSSOVER = "sequential", "naive", "crossover"
NAIVE_ENV, CROSSOVER_ENV = "naive_env", "crossover_env"
CROSSOVER_TURN, PRIORITY = "crossover_turn", "priority"
SHIFT = "shift"  # naive with job B started at a static shift (crossover_tf_planner/shift_rule)
CONCURRENT = (NAIVE, NAIVE_ENV, SHIFT, CROSSOVER, CROSSOVER_ENV, CROSSOVER_TURN, PRIORITY)
NO_LEASE = (NAIVE, NAIVE_ENV, SHIFT)  # free-running jobs, no lease group
SCENARIOS = (SEQUENTIAL, *CONCURRENT)  # the first trial's order
WITH_ENV = (NAIVE_ENV, CROSSOVER_ENV)  # run as their base scenario, plus --scenario_env
CROSSED = (CROSSOVER, CROSSOVER_TURN)  # the crossing scenarios a verdict picks between
SOLO_PREFIX = "solo_"


def solo(job: str) -> str:
    """The name of a job's solo run in the scenario table (solo_A)."""
    return f"{SOLO_PREFIX}{job}"


def is_solo(scenario: str) -> bool:
    return scenario.startswith(SOLO_PREFIX)


@dataclasses.dataclass(frozen=True)
class Metric:
    """A number in a comparison's ratios: its key and its row label (None: not tabulated)."""
    key: str
    label: str | None = None


@dataclasses.dataclass(frozen=True)
class Ratio(Metric):
    """Aggregate images/s of scenario `top` over `bottom`; the key is <top>_over_<bottom>."""
    key: str = dataclasses.field(init=False)
    top: str = ""
    bottom: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", f"{self.top}_over_{self.bottom}")

    @property
    def planner_key(self) -> str:
        """The planner report's name for it (crossover/naive)."""
        return f"{self.top}/{self.bottom}"


def _ratio(top: str, bottom: str, label: str | None = None) -> Ratio:
    return Ratio(label=label, top=top, bottom=bottom)


CROSSOVER_OVER_SEQUENTIAL = _ratio(CROSSOVER, SEQUENTIAL, "crossover / sequential")
CROSSOVER_OVER_NAIVE = _ratio(CROSSOVER, NAIVE, "crossover / naive")
NAIVE_OVER_SEQUENTIAL = _ratio(NAIVE, SEQUENTIAL)
CROSSOVER_ENV_OVER_CROSSOVER = _ratio(CROSSOVER_ENV, CROSSOVER,
                                      "crossover with --scenario_env / crossover")
CROSSOVER_ENV_OVER_NAIVE = _ratio(CROSSOVER_ENV, NAIVE, "crossover with --scenario_env / naive")
NAIVE_ENV_OVER_NAIVE = _ratio(NAIVE_ENV, NAIVE, "naive with --scenario_env / naive")
CROSSOVER_ENV_OVER_NAIVE_ENV = _ratio(CROSSOVER_ENV, NAIVE_ENV,
                                      "crossover / naive, both with --scenario_env")
CROSSOVER_TURN_OVER_CROSSOVER = _ratio(CROSSOVER_TURN, CROSSOVER,
                                       "crossover with link turns / crossover")
CROSSOVER_TURN_OVER_NAIVE = _ratio(CROSSOVER_TURN, NAIVE, "crossover with link turns / naive")
CROSSOVER_TURN_OVER_SEQUENTIAL = _ratio(CROSSOVER_TURN, SEQUENTIAL,
                                        "crossover with link turns / sequential")
SHIFT_OVER_NAIVE = _ratio(SHIFT, NAIVE, "shift / naive")
SHIFT_OVER_SEQUENTIAL = _ratio(SHIFT, SEQUENTIAL, "shift / sequential")
CROSSOVER_OVER_SHIFT = _ratio(CROSSOVER, SHIFT, "crossover / shift")
CROSSOVER_TURN_OVER_SHIFT = _ratio(CROSSOVER_TURN, SHIFT, "crossover with link turns / shift")
# Every ratio of two scenarios, in the order a trial computes them.
SCENARIO_RATIOS = (CROSSOVER_OVER_SEQUENTIAL, CROSSOVER_OVER_NAIVE, NAIVE_OVER_SEQUENTIAL,
                   CROSSOVER_ENV_OVER_CROSSOVER, CROSSOVER_ENV_OVER_NAIVE, NAIVE_ENV_OVER_NAIVE,
                   CROSSOVER_ENV_OVER_NAIVE_ENV, CROSSOVER_TURN_OVER_CROSSOVER,
                   CROSSOVER_TURN_OVER_NAIVE, CROSSOVER_TURN_OVER_SEQUENTIAL, SHIFT_OVER_NAIVE,
                   SHIFT_OVER_SEQUENTIAL, CROSSOVER_OVER_SHIFT, CROSSOVER_TURN_OVER_SHIFT)
RATIO_BY_KEY = {ratio.key: ratio for ratio in SCENARIO_RATIOS}

IDEAL = Metric("ideal_crossover_over_sequential", "ideal (an upper bound)")
# Each crossed scenario's <scenario>_over_sequential over the ideal.
OVER_IDEAL = {CROSSOVER: Metric("measured_over_ideal", "measured / ideal"),
              CROSSOVER_TURN: Metric("crossover_turn_measured_over_ideal",
                                     "crossover with link turns: measured / ideal")}
PRIMARY_OVER_SOLO = Metric("primary_over_solo", "priority: primary / its solo run")
PRIMARY_OVER_NAIVE = Metric("primary_over_naive", "priority: primary / primary in naive")
SECONDARY_OVER_NAIVE = Metric("secondary_over_naive", "priority: secondary / secondary in naive")
SECONDARY_OVER_SOLO = Metric("secondary_over_solo", "priority: secondary / its solo run")
PRIMARY_MAX_WAIT = Metric("primary_max_wait_s", "priority: primary's worst wait (s)")
PRIMARY_P99_WAIT = Metric("primary_p99_wait_s", "priority: primary's 99th-percentile wait (s)")
SECONDARY_MICRO_BATCH = Metric("secondary_micro_batch_s",
                               "priority: secondary micro-batch compute (s)")
PRIMARY_WAIT_OVER_MICRO_BATCH = Metric("primary_max_wait_over_micro_batch",
                                       "priority: worst wait / micro-batch")
# What rests on the sequential run, i.e. on its jobs' solo runs: every ratio over it, the ideal
# (from the solo runs' steps) and each measured / ideal, and the priority scenario's ratios over
# solo. A trial whose sequential run is refused (experiments/analysis/bounds.py) loses these.
ON_SEQUENTIAL = (*(r.key for r in SCENARIO_RATIOS if SEQUENTIAL in (r.top, r.bottom)),
                 IDEAL.key, *(m.key for m in OVER_IDEAL.values()), PRIMARY_OVER_SOLO.key,
                 SECONDARY_OVER_SOLO.key)
# A trial's invalid entry that names no scenario: the whole trial ran more than the tolerance
# off the asked-for M/C, and its ratios are left out of the calls (experiments/analysis/regime).
OUT_OF_REGIME = "out of the regime"

# compare.md's ratio table, in its row order.
TABLE = (CROSSOVER_OVER_SEQUENTIAL, CROSSOVER_OVER_NAIVE, IDEAL, OVER_IDEAL[CROSSOVER],
         CROSSOVER_ENV_OVER_CROSSOVER, CROSSOVER_ENV_OVER_NAIVE, NAIVE_ENV_OVER_NAIVE,
         CROSSOVER_ENV_OVER_NAIVE_ENV, CROSSOVER_TURN_OVER_CROSSOVER, CROSSOVER_TURN_OVER_NAIVE,
         CROSSOVER_TURN_OVER_SEQUENTIAL, OVER_IDEAL[CROSSOVER_TURN], SHIFT_OVER_NAIVE,
         SHIFT_OVER_SEQUENTIAL, CROSSOVER_OVER_SHIFT, CROSSOVER_TURN_OVER_SHIFT, PRIMARY_OVER_SOLO,
         PRIMARY_OVER_NAIVE, SECONDARY_OVER_NAIVE, SECONDARY_OVER_SOLO, PRIMARY_MAX_WAIT,
         PRIMARY_P99_WAIT, SECONDARY_MICRO_BATCH, PRIMARY_WAIT_OVER_MICRO_BATCH)
# compare.png's ratio panel, in its order.
PLOTTED = (CROSSOVER_OVER_SEQUENTIAL, CROSSOVER_OVER_NAIVE, NAIVE_OVER_SEQUENTIAL,
           CROSSOVER_ENV_OVER_CROSSOVER, NAIVE_ENV_OVER_NAIVE, CROSSOVER_ENV_OVER_NAIVE_ENV,
           CROSSOVER_TURN_OVER_CROSSOVER, CROSSOVER_TURN_OVER_NAIVE, SHIFT_OVER_NAIVE,
           PRIMARY_OVER_SOLO, SECONDARY_OVER_NAIVE)
# The ratios the planner predicts and checks (validate.py), in its table's order.
VALIDATED_RATIOS = (CROSSOVER_OVER_SEQUENTIAL, CROSSOVER_OVER_NAIVE, NAIVE_OVER_SEQUENTIAL,
                    CROSSOVER_TURN_OVER_SEQUENTIAL, CROSSOVER_TURN_OVER_NAIVE,
                    SHIFT_OVER_SEQUENTIAL, SHIFT_OVER_NAIVE)
# The M/C sweep's columns (the last when it ran).
SWEPT = (CROSSOVER_OVER_NAIVE, CROSSOVER_OVER_SEQUENTIAL, CROSSOVER_TURN_OVER_NAIVE)
# The ratio that picks the representative trial (the one whose scenarios compare.json shows).
PRIMARY_RATIO = CROSSOVER_OVER_NAIVE


def scenario_ratio(top: str, bottom: str) -> Ratio:
    """The registered ratio of top over bottom (a KeyError names an unregistered pair)."""
    return RATIO_BY_KEY[Ratio(top=top, bottom=bottom).key]
