"""Documents: YAML with positions, the forms users write, the rules, engine arguments, the inventory."""
