"""Who may see an asset: the one visibility rule every door asks (SPEC 11, invariant 11).

An asset (a job's published output) is visible to a reader when the job's
``visibility`` tag is one of the values the reader is allowed: ``[library]
visible`` from ``spool.toml``, widened only where a command says so
(``--visibility V`` of ``spool search``, ``get`` and ``show``; the status page
never widens it). It fails closed: a job without a ``visibility`` tag, or with
one that is not allowed, is invisible. Values are compared in Unicode NFC, as
tags are accepted (:func:`spool.queue.accept.build_job`).

Every door asks :meth:`Rule.admits` and nothing else: ``spool search``,
``spool get`` (by job, name or sha256), ``spool show NAME``, the status page's
listings, its JSON, ``/download/<sha256>`` and ``/thumbs/<sha256>.jpg``. A
store object is visible when a visible complete job publishes it
(:func:`spool.library.catalog.visible_object`). An invisible asset is answered as an
unknown one (exit 4, HTTP 404), never "forbidden": a refusal must not confirm
that it exists.

This is a discovery filter, not access control: whoever can read the spool's
folder reads every file in it. The metrics name no asset at all (no job, name,
tag or hash is ever a label), so they have nothing to filter.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from spool.core.config import Config

#: The tag the rule reads.
TAG = "visibility"


def nfc(text: str) -> str:
    """``text`` in Unicode normal form C (how tag values are stored and compared)."""
    return text if text.isascii() else unicodedata.normalize("NFC", text)


@dataclass(frozen=True)
class Rule:
    """The visibility values one reader is allowed."""

    allowed: frozenset[str]

    def admits(self, tags: Mapping[str, str] | None) -> bool:
        """Whether an asset with these tags is visible under this rule (fails closed)."""
        if not tags:
            return False
        value = tags.get(TAG)
        return value is not None and nfc(value) in self.allowed

    def widened(self, more: Iterable[str]) -> Rule:
        return Rule(self.allowed | {nfc(v) for v in more})


def rule(cfg: Config, widen: Iterable[str] = ()) -> Rule:
    """The rule ``[library] visible`` sets, widened by ``widen`` (a command's ``--visibility``)."""
    return Rule(frozenset(nfc(v) for v in cfg.library.visible)).widened(widen)
