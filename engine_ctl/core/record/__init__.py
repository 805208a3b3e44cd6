"""The recorded state's values: what engine-ctl did, as pure data (the backends that keep it are engine_ctl.state)."""
