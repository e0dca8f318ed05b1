"""Looking at a spool without changing it: the overview behind ``spool status`` and
``spool watch``, Prometheus metrics, the status page, the journal reader."""
