"""What an inference host installs and runs beside its engine: the config client that answers
"which config for this shape" from the sidecar, a folder of engine config files or its own
heuristic, with no server package installed (client; the table it holds and the checks every
table passes in config_table, its HTTP request to the sidecar in sidecar), the cubin bundle the
tuner writes and the host loads without nvcc (bundle), the kernel as a torch op that launches
those cubins through cuda-python (op), and the verify path of an SGLang-style attention backend
on that op, which keeps a captured graph's buffers and refills them each step (adapter), and an
attention backend on SGLang's own interface (sglang_backend, its step buffers in sglang_metadata,
SGLang's tree masks as kernel rows in tree_masks) with its SGLang plugin (sglang_plugin, the only
module that imports SGLang, and only when SGLang calls it); op and the modules on it need torch.
Lives apart from the API package on purpose: the light client must not be a module of the server.
May import: `verify_tuner.kernels` and the namespace root's shared modules (`verify_tuner`),
nothing that needs the server extra; the CLI imports it to write bundles.
"""
