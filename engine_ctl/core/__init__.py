"""The pure core: values in, values out, no I/O. documents (load and check), fit (facts as types, sizing,
placement), render (units), plan (the planner, saved plans and their staleness, status)."""
