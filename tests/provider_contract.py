"""What every provider kind must do, as one test class to run against each (huey's
``StorageTests`` mixin, run over every storage backend).

A kind's test module subclasses :class:`ProviderContract` and supplies :meth:`open`
(a provider of the kind, talking to a server), :attr:`model`, :meth:`input` (the kind's
input for a prompt) and, where its server can be told to misbehave, :meth:`fault`. The
built-in kinds run it against ``tools/provsim.py`` (tests/test_provider_contract.py); a
plug-in author runs it against their own kind the same way::

    from provider_contract import ProviderContract

    class TestMyKind(ProviderContract):
        model = "my-model"
        def open(self, token=None): ...
        def input(self, prompt): return {"text": prompt}

The contract is the one spool's generation workflow relies on (docs/generation.md):
every failure is a :class:`ProviderError` with one of three outcomes (never an
unclassified exception), a create whose fate is unknown is ``ambiguous`` (never retried
blind), a download is verified or leaves nothing, and no error, description or job field
holds the token.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from spool.kinds.generate.providers import Provider, ProviderError, RemoteJob


class ProviderContract:
    """Run against one provider kind; a subclass supplies the hooks below."""

    #: The model every test generates with.
    model: str = ""
    #: The token :meth:`open` gives the provider by default (checked never to leak).
    token: str = ""
    #: Whether the kind can find a create whose reply was lost (a listing by input).
    finds_lost_creates: bool = True

    def open(self, token: str | None = None) -> Provider:
        """A provider of the kind; ``token`` overrides the right one (to test a wrong one)."""
        raise NotImplementedError

    def input(self, prompt: str) -> dict[str, Any]:
        """The kind's input for a generation of ``prompt``."""
        raise NotImplementedError

    def fault(self, prompt: str, fault: str) -> str:
        """``prompt`` changed so that the server misbehaves in the named way (``never``:
        never finishes; ``fail``; ``lose``: forgets the job; ``create_5xx``: answers a
        create with 5xx without making it; ``truncate``: cuts the download short).
        A server that cannot be told so skips the test."""
        pytest.skip(f"this server cannot be made to misbehave ({fault})")

    # -- helpers -------------------------------------------------------------------

    def provider(self, request: pytest.FixtureRequest, token: str | None = None) -> Provider:
        p = self.open(token)
        request.addfinalizer(p.close)
        return p

    def wait_final(self, p: Provider, job_id: str, timeout: float = 30.0) -> RemoteJob:
        end = time.monotonic() + timeout
        while True:
            job = p.get(job_id)
            if job.final:
                return job
            assert time.monotonic() < end, f"{job_id} not final within {timeout} s: {job.raw_status}"
            time.sleep(0.05)

    def fails(self, call: Callable[[], Any]) -> ProviderError:
        with pytest.raises(ProviderError) as info:
            call()
        err = info.value
        assert err.outcome in ("retryable", "final", "ambiguous"), err.outcome
        assert self.token not in str(err) and self.token not in repr(err.__dict__)
        return err

    # -- the contract ----------------------------------------------------------------

    def test_a_generation_succeeds_and_its_download_is_verified(self, request, tmp_path: Path) -> None:
        p = self.provider(request)
        job = p.create(self.model, self.input("contract happy path"), key="contract@1/1")
        assert job.id and job.status in ("queued", "running", "succeeded"), job
        done = self.wait_final(p, job.id)
        assert done.status == "succeeded" and done.outputs and done.output_problem is None
        got = p.download(done.outputs[0], tmp_path / "out.mp4")
        data = (tmp_path / "out.mp4").read_bytes()
        assert got.size == len(data) > 0 and got.sha256 == hashlib.sha256(data).hexdigest()
        assert not [p for p in tmp_path.iterdir() if p.name != "out.mp4"]  # no partial left

    def test_cancel_makes_the_job_final_as_canceled(self, request) -> None:
        p = self.provider(request)
        job = p.create(self.model, self.input(self.fault("contract cancel", "never")), key="contract@1/2")
        p.cancel(job.id)
        after = self.wait_final(p, job.id)
        assert after.status == "canceled" and after.final

    def test_a_failed_generation_is_final_with_its_reason_and_no_token(self, request) -> None:
        p = self.provider(request)
        job = p.create(self.model, self.input(self.fault("contract failure", "fail")), key="contract@1/3")
        done = self.wait_final(p, job.id)
        assert done.status == "failed" and done.error and self.token not in done.error

    def test_a_job_the_provider_forgot_is_final_and_lost(self, request) -> None:
        p = self.provider(request)
        job = p.create(self.model, self.input(self.fault("contract forgotten", "lose")), key="contract@1/4")
        end = time.monotonic() + 10
        while True:  # the job is forgotten after some reads
            try:
                p.get(job.id)
            except ProviderError:
                break
            assert time.monotonic() < end, "the provider never forgot the job"
        err = self.fails(lambda: p.get(job.id))
        assert (err.outcome, err.code) == ("final", "lost")

    def test_a_create_with_an_unknown_fate_is_ambiguous_never_retryable(self, request) -> None:
        p = self.provider(request)
        since = datetime.now(UTC)
        inp = self.input(self.fault(f"contract lost create {time.time_ns()}", "create_5xx"))
        err = self.fails(lambda: p.create(self.model, inp, key="contract@1/5"))
        assert err.outcome == "ambiguous"  # a blind retry could pay twice
        found = p.find(self.model, inp, since)
        if self.finds_lost_creates:
            assert found.supported and found.covered and found.matches == []  # 5xx: nothing made
        else:
            assert not found.covered  # it cannot say, and says so

    def test_a_create_that_was_made_is_found_by_its_input(self, request) -> None:
        if not self.finds_lost_creates:
            pytest.skip("this kind cannot find a create by its input")
        p = self.provider(request)
        since = datetime.now(UTC)
        inp = self.input(f"contract find me {time.time_ns()}")
        made = p.create(self.model, inp, key="contract@1/6")
        found = p.find(self.model, inp, since)
        assert found.covered and made.id in [m.id for m in found.matches]

    def test_a_wrong_token_is_final_and_names_no_value(self, request) -> None:
        wrong = "contract_WrongTokenValue_0123456789abcdef"
        p = self.provider(request, token=wrong)
        err = self.fails(lambda: p.create(self.model, self.input("contract token"), key="contract@1/7"))
        assert (err.outcome, err.code) == ("final", "unauthorized") and wrong not in str(err)

    def test_a_cut_download_is_retryable_and_leaves_nothing(self, request, tmp_path: Path) -> None:
        p = self.provider(request)
        job = p.create(self.model, self.input(self.fault("contract cut", "truncate")), key="contract@1/8")
        done = self.wait_final(p, job.id)
        err = self.fails(lambda: p.download(done.outputs[0], tmp_path / "cut.mp4"))
        assert err.outcome == "retryable" and list(tmp_path.iterdir()) == []

    def test_the_create_description_holds_no_input_and_no_token(self, request) -> None:
        p = self.provider(request)
        secret_prompt = "contract a prompt that must stay out of the log"
        text = p.describe_create(self.model, self.input(secret_prompt))
        assert text and secret_prompt not in text and self.token not in text
