"""What the commands print: plans, fetch progress, and the output helpers (rich on a TTY, plain otherwise)."""
