"""Running a tuning job: the keys of one job shared out between tuner processes by claims in the
config database, each key's study run by its owner and helped by the others (claims: the job
loop), and the processes themselves, one per GPU, each measuring through the product backend
(runner). May import: `verify_tuner.search`, `verify_tuner.measure`, `verify_tuner.store`,
`verify_tuner.kernels` and the namespace root's shared modules (`verify_tuner`); only the CLI
sits above it.
"""
