"""Plan: the planner, saved plans and their staleness rules, refresh, and the states a deployment is in."""
