"""What an inference host installs and runs beside its engine: the config client that answers
"which config for this shape" from the sidecar, a folder of engine config files or its own
heuristic, with no server package installed (client; the table it holds and the checks every
table passes in config_table, its HTTP request to the sidecar in sidecar), the cubin bundle the
tuner writes and the host loads without nvcc (bundle), the kernel as a torch op that launches
those cubins through cuda-python (op), and the verify path of an SGLang-style attention backend
on that op, which keeps a captured graph's buffers and refills them each step (adapter; it and
op alone need torch). Lives apart from the API package on purpose: the light client must not be
a module of the server. May import: `verify_tuner.kernels` and the namespace root's shared
modules (`verify_tuner`), nothing that needs the server extra; the CLI imports it to write
bundles.
"""
