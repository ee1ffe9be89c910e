"""Measuring one config: the interface the tuner's logic talks to (backend: `Backend`, a
`Workload`, a `Measurement` and its statuses), the product backend that runs the measurer in a
child process owning the CUDA context, so that a config which faults or hangs fails only its own
trial (gpu_backend), and the measurer that runs in that process on the local GPU (gpu); several configs timed side by side at several workloads through the
interface (matrix). Tests
drive the same logic through doubles of their own. May import: `verify_tuner.kernels` and the
namespace root's shared modules (`verify_tuner`); it knows nothing of studies, the database, the
API or the CLI.
"""
