"""spoold: the per-machine daemon. It orchestrates what the ``spool`` library
offers (accept, claim, execute, recover, heartbeat) and owns only the loop,
the watcher, the slots and the signals."""
