"""Alembic migrations, shipped inside the package so `tuner db upgrade` works from an install."""
