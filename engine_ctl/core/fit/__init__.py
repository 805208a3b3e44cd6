"""Fit: host and model facts as types, what one replica needs, and where replicas are placed."""
