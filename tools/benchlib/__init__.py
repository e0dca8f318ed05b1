"""The pieces of ``tools/bench``: one module per measure, plus what they share.

``common`` holds the table, the statistics, spool and process helpers;
``peers`` the worker programs and task modules of the systems spool is
compared with (the raw rename limit, dirq, huey, RQ); ``dispatch``,
``latency``, ``render``, ``publish`` and ``scale`` each measure one thing and
return rows of the one table that ``tools/bench`` prints.
"""
