"""Alembic migrations, shipped inside the package so `tuner db upgrade` works from an install.

Part of the store stage (verify_tuner.store): env.py imports the store's tables and engine, and
verify_tuner.store.migrate points Alembic at this folder, so the layering check counts the two as
one stage. May import: `verify_tuner.store`.
"""
