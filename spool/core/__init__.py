"""The words every part of spool speaks: typed records (``model``), errors and their exit
codes, strict decoding, ``spool.toml`` and its units, the submission shape, metric
families as data, crash points and secrets. Depends on the standard library and msgspec."""
