"""Deciding which config to try and which one wins, one workload key at a time.

A key's search (study: run_study) opens or resumes the key's Optuna study in its storage
(study_storage: a shared RDB storage or an SQLite file per key), warm-starts it (warm_start: the
heuristic default and stored bests of neighbouring keys), runs the ask/tell loop, then re-times
the fastest configs to pick and store the winner (winner) and returns what tuning the key decided
(outcome). The loop (loop) runs in the calling thread, the only one that talks to the study: one
proposer (proposer) asks the sampler, checks each config before anything is built and answers at
once those that need no measurement (refused: a pruned trial with its reason; measured before;
in flight), queueing the configs it chooses itself (the warm start, a start drawn among the configs
that fit, a grid's order, the fitting config nearest a refused one); a compile pool of threads
builds what it accepts and one measuring thread times them one at a time (loop's Pipeline), while
the loop tells each measurement back, within the budget (key_search: what a key searches, its
progress, a config's signature and the trial attributes). The ledger (ledger) is what every process
sharing the study has run, the trial log each trial's row in the config database; the heartbeat
(heartbeat) beats this process's trials in flight from a thread of its own and fails other
processes' stale trials, which the storage's retry callback queues again.

Beside the search: the graph plan of a batch bucket chosen from finalists measured side by side
(graph_plan, under the prefix distribution of prefix_weights; plan_job measures, chooses and
stores it), and the re-timing of stored bests against the heuristic that marks stale rows
(verify). The search space and the heuristic default stay at the namespace root
(verify_tuner.space, verify_tuner.heuristic): the worker client needs the heuristic, which needs
the space, and must not import this stage. May import:
`verify_tuner.measure` (its `Backend` interface: a study measures through whatever backend it is
given), `verify_tuner.store`, `verify_tuner.kernels` and the namespace root's shared modules
(`verify_tuner`); never the jobs that run it, the API or the CLI.
"""
