"""The asset library over published outputs: the index of tags and versions (format 1
entries, format 2 segments), search, versions and verified ``get`` (``catalog``), the
one visibility rule, enrichment, adoption of an existing library."""
