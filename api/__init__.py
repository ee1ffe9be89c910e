"""HTTP sidecar: answers config lookups from the database the tuner fills. The only package that
knows HTTP. May import: `verify_tuner.store`, `verify_tuner.kernels` and the namespace root's
shared modules (`verify_tuner`); the worker client it serves lives in verify_tuner.engine and
does not import it.
"""
