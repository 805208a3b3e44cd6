"""The imperative shell: transport (SSH, local), gathering facts, the apply executor, and the remote probe."""
