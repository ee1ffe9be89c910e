"""The config database and what goes in and out of it: the tables (models), the one session
scope and engine (session), the keyword-only queries of devices and kernels (devices), best
configs (best_configs), studies and trials (studies), graph plan sets and verifications (plans) and
the documents a plan set is served as (plan_docs), the
data_version counter and the sidecar's stamp (data_version), what every table keyed by the tuning
key shares -- its columns filled, its rows selected and deleted by any key field (keyed) -- and the
portable upserts every writer shares (writes), schema migrations and the check the sidecar runs before serving (migrate, health), the
answer to a lookup with its heuristic fallback (lookup), the one schema of an imported or exported
row (row_schema), import and export (configs_io), the engine config files written from it
(engine_dump), a read-only snapshot (snapshot) and the tuning report (report). Alembic's
revisions live in `verify_tuner.migrations` (migrations/), which is this stage's too: its env.py
imports the tables, and migrate points Alembic at it. May import: `verify_tuner.kernels`,
`verify_tuner.migrations` and the namespace root's shared modules (`verify_tuner`); nothing of the
search, the measuring, the jobs, the API or the CLI, which all sit above it.
"""
