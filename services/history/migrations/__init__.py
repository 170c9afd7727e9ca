"""Alembic migrations of the history database (a package so that installs ship them)."""
