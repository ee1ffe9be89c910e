"""The `tuner` command: a thin wrapper that parses, calls the library and prints. The console
script's entry point, which turns a missing server extra into one line (entry), the commands
(commands) and the `tuner study` group (study), `study graph-plan` and `configs verify` (plans), and the one place where expected failures become
one line on stderr and exit 1 (exits). This __init__ imports nothing, so that entry can catch a
missing click or SQLAlchemy. May import: `verify_tuner.jobs`, `verify_tuner.search`,
`verify_tuner.measure`, `verify_tuner.store`, `verify_tuner.api` (`tuner serve`),
`verify_tuner.engine` (the cubin bundles of `configs dump --cubins`), `verify_tuner.kernels` and
the namespace root's shared modules (`verify_tuner`); nothing imports it but `python -m
verify_tuner`.
"""
