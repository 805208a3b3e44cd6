"""The operator verbs (stop, start, park, delete): recorded in the state (verbs), run on the hosts (hosts)."""
