"""Configuration database: tables (models), engine/session scope (session), queries (repo)."""
