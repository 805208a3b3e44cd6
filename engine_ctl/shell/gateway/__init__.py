"""The gateway on its hosts: its files and runtime (runtime), and its part of an apply (apply)."""
