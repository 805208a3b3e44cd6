"""The scaler on its hosts: its part of an apply (apply) and its PostgreSQL role (lock)."""
