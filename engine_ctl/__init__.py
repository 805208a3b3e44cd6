"""engine-ctl: plan and apply LLM inference engines on SSH-managed hosts."""

__version__ = "0.1.0"
