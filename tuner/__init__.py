"""verify_tuner: the tuner, the config database, the sidecar and the engine-side runtime of the
MLA verify-attention kernel. The sub-packages are the stages of the data flow: the kernel
(`kernels`), measuring a config (`measure`), searching for the best one (`search`), storing and
serving the answers (`store`, `api`), running tuning jobs (`jobs`), the command line (`cli`) and
what an inference host installs (`engine`). The modules at this root are the vocabulary they all
share -- keys, prefix and batch buckets, the search space and the heuristic default, settings,
typed errors, file writing, strict JSON, the engine config file format, where studies live -- and
stay importable by the bare install where they can (all but settings and study_files, which need
SQLAlchemy's URL parser). May import: `verify_tuner.kernels` and one another; no stage above the
kernel (__main__, which only runs the CLI, excepted). tests/test_namespace.py checks each stage
against the line like this one in its __init__.
"""
