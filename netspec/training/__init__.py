"""Training: the solver loop, update pipeline, snapshots and resume, logs, signals, distributed runs."""
