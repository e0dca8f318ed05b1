"""A job's path through the queue: acceptance, claim, the attempt and its execution,
publish, dependencies, the journal, operator intent, retries, blocklists,
host health, worker records and whether a worker is alive. ``status`` reads where a job
is (the lean CLI's layer)."""
