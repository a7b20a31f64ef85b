"""`python -m crossover_tf_planner recommend a.json b.json`: the crossover-plan command."""
from crossover_tf_planner.cli import main

main()
