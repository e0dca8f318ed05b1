"""The spool tree on disk: where every file lives (``tree``), how bytes reach the disk
durably (``durable``, ``groupcommit``), the content-addressed store and its manifests
(``store``), the tree's format version (``formats``), reading a record another host may
be replacing (``records``), and a full disk said in one line (``diskfull``)."""
