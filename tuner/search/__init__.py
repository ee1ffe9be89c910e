"""Deciding which config to try and which one wins, one workload key at a time: the Optuna study
of a key, opened or resumed and warm-started (study), the objective, the ledger of what the study
measured and the samplers that propose (trials), the re-timing that picks and stores the winner
(winner), and what tuning a key decided (outcome); the graph plan of a batch bucket chosen from
finalists measured side by side (graph_plan, under the prefix distribution of prefix_weights;
plan_job measures, chooses and stores it), and the re-timing of stored bests against the heuristic
that marks stale rows (verify). The search space and the heuristic default
stay at the namespace root (verify_tuner.space, verify_tuner.heuristic): the worker client needs
the heuristic, which needs the space, and must not import this stage. May import:
`verify_tuner.measure` (its `Backend` interface: a study measures through whatever backend it is
given), `verify_tuner.store`, `verify_tuner.kernels` and the namespace root's shared modules
(`verify_tuner`); never the jobs that run it, the API or the CLI.
"""
