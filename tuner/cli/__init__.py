"""The `tuner` command: a thin wrapper that parses, calls the library and prints. The console
script's entry point, which turns a missing server extra into one line (entry), the root group
(commands), its command groups (db, serve, device, configs, and study for `study start` and
`study report`, whose options and their parsing are study_options and whose output is
study_output), `study graph-plan` and `configs verify` (plans), the database URL's checks and
the checked sessions (database), options several groups share (options), and the one place where
expected failures become one line on stderr and exit 1 (exits). This __init__ imports nothing,
so that entry can catch a missing click or SQLAlchemy. May import: `verify_tuner.jobs`,
`verify_tuner.search`, `verify_tuner.measure`, `verify_tuner.store`, `verify_tuner.api`
(`tuner serve`), `verify_tuner.engine` (the cubin bundles of `configs dump --cubins`),
`verify_tuner.kernels` and the namespace root's shared modules (`verify_tuner`); nothing imports
it but `python -m verify_tuner`.
"""
