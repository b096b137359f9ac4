"""Reading configs: YAML with lines, the schema engine, net and solver specs, modules and includes."""
