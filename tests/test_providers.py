"""Both built-in provider clients against tools/provsim.py, a real HTTP server on 127.0.0.1.

Every fault the simulator injects maps to one normalised outcome of the client:
``retryable`` (ask again, after ``retry_after``), ``final`` (with a next
action), or ``ambiguous`` (a create that may have happened: find, never
resubmit blindly). The token never appears in an error or a file.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from provsim import ProviderSim

from spool.core import secrets
from spool.core.errors import ConfigError
from spool.kinds.base import Abort
from spool.kinds.generate.providers import (
    Provider,
    ProviderError,
    RemoteJob,
    kinds,
    open_provider,
    parse_provider,
    secret_names,
)
from spool.kinds.generate.providers.base import (
    classify_status,
    parse_content_digest,
    parse_retry_after,
    pick_video,
)
from spool.kinds.generate.providers.config import looks_like_token

TOKEN = "r8_SimulatedTokenValue_0123456789abcdef"
ENV = {"SIM_TOKEN": TOKEN}


@pytest.fixture(scope="module")
def sim() -> Iterator[ProviderSim]:
    with ProviderSim(token=TOKEN, work=0.2) as s:
        yield s


@pytest.fixture
def make(sim: ProviderSim) -> Iterator[Callable[..., Provider]]:
    made: list[Provider] = []

    def _make(kind: str = "replicate", **over: Any) -> Provider:
        env = over.pop("env", ENV)
        table: dict[str, Any] = {
            "kind": kind,
            "base_url": sim.url,
            "token_env": "SIM_TOKEN",
            "request_timeout": 2.0,
            **over,
        }
        p = open_provider(parse_provider(f"sim-{kind}", table), env=env)
        made.append(p)
        return p

    yield _make
    for p in made:
        p.close()


def wait_final(p: Provider, job_id: str, timeout: float = 10.0) -> RemoteJob:
    end = time.monotonic() + timeout
    while True:
        job = p.get(job_id)
        if job.final or time.monotonic() > end:
            return job
        time.sleep(0.05)


def fails(call: Callable[[], Any]) -> ProviderError:
    with pytest.raises(ProviderError) as info:
        call()
    err = info.value
    assert TOKEN not in str(err)
    return err


def creates(sim: ProviderSim) -> int:
    return sim.stats().get("create", 0)


# -- the happy paths -------------------------------------------------------------


def test_replicate_generates_downloads_and_hashes_a_real_mp4(
    make: Callable[..., Provider], sim: ProviderSim, tmp_path: Path
) -> None:
    p = make("replicate")
    before = creates(sim)
    job = p.create("acme/video-1", {"prompt": "a mug on a beach"}, key="mug@1/1")
    assert creates(sim) == before + 1
    assert job.status in ("queued", "running")
    done = wait_final(p, job.id)
    assert done.status == "succeeded" and done.raw_status == "succeeded" and len(done.outputs) == 1
    got = p.download(done.outputs[0], tmp_path / "out.mp4")
    assert got.size == (tmp_path / "out.mp4").stat().st_size > 1000
    assert got.checksum_checked  # the simulator states a Content-Digest, and it matched
    probe = subprocess.run(
        [
            "ffprobe",
            "-v",
            "error",
            "-show_entries",
            "stream=codec_name,width,height",
            "-of",
            "csv=p=0",
            got.path,
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert probe.stdout.strip() == "h264,320,180"


def test_replicate_pinned_version_creates_on_v1_predictions(
    make: Callable[..., Provider], sim: ProviderSim
) -> None:
    p = make("replicate")
    job = p.create("acme/video-1:" + "ab" * 32, {"prompt": "versioned", "num_outputs": 1}, key="v@1/1")
    done = wait_final(p, job.id)
    assert done.status == "succeeded" and sim.job(job.id).version == "ab" * 32
    assert isinstance(done.outputs, list) and len(done.outputs) == 1  # a list of URLs is normalised too


def test_runway_text_and_image_to_video_succeed_and_differ(
    make: Callable[..., Provider], tmp_path: Path
) -> None:
    p = make("runway")
    a = p.create("gen4_turbo", {"promptText": "a red mug", "ratio": "1280:720"}, key="a@1/1")
    b = p.create("gen4_turbo", {"promptText": "a blue mug", "promptImage": "https://x/y.png"}, key="b@1/1")
    ja, jb = wait_final(p, a.id), wait_final(p, b.id)
    assert (ja.raw_status, jb.raw_status) == ("SUCCEEDED", "SUCCEEDED")
    da = p.download(ja.outputs[0], tmp_path / "a.mp4")
    db = p.download(jb.outputs[0], tmp_path / "b.mp4")
    assert da.sha256 != db.sha256  # the prompt is drawn into the frames


def test_runway_cancel_is_a_delete_and_reports_cancelled(make: Callable[..., Provider]) -> None:
    p = make("runway")
    job = p.create("gen4_turbo", {"promptText": "slow #fault=never"}, key="c@1/1")
    p.cancel(job.id)
    after = p.get(job.id)
    assert (after.status, after.raw_status) == ("canceled", "CANCELLED")


def test_replicate_cancel_reports_canceled(make: Callable[..., Provider]) -> None:
    p = make("replicate")
    job = p.create("acme/video-1", {"prompt": "never #fault=never"}, key="c@1/1")
    p.cancel(job.id)
    assert p.get(job.id).status == "canceled"


# -- create: retryable, ambiguous, and finding a lost create ----------------------------


def test_rate_limited_create_is_retryable_with_retry_after(
    make: Callable[..., Provider], sim: ProviderSim
) -> None:
    p = make("replicate")
    sim.control(ratelimit={"count": 1, "retry_after": 7})
    err = fails(lambda: p.create("acme/video-1", {"prompt": "x"}, key="k"))
    assert (err.outcome, err.code, err.http_status, err.retry_after) == (
        "retryable",
        "rate_limited",
        429,
        7.0,
    )
    assert err.back_pressure


def test_create_5xx_is_ambiguous_and_the_listing_covers_the_window_without_it(
    make: Callable[..., Provider],
) -> None:
    p = make("replicate")
    since = datetime.now(UTC)
    inp = {"prompt": "unique-5xx #fault=create_5xx"}
    err = fails(lambda: p.create("acme/video-1", inp, key="k5"))
    assert (err.outcome, err.http_status) == ("ambiguous", 503)
    found = p.find("acme/video-1", inp, since)
    assert found.covered and found.matches == []


def test_create_5xx_after_making_the_job_is_found_by_listing(make: Callable[..., Provider]) -> None:
    p = make("replicate")
    since = datetime.now(UTC)
    inp = {"prompt": "made-then-502 #fault=create_5xx_after"}
    err = fails(lambda: p.create("acme/video-1", inp, key="k6"))
    assert err.outcome == "ambiguous" and err.http_status == 502
    found = p.find("acme/video-1", inp, since)
    assert found.covered and [m.input for m in found.matches] == [inp]


def test_create_timeout_is_ambiguous_and_found(make: Callable[..., Provider], sim: ProviderSim) -> None:
    p = make("replicate", request_timeout=0.4)
    since = datetime.now(UTC)
    inp = {"prompt": "slow create #fault=create_timeout:1.5"}
    before = creates(sim)
    err = fails(lambda: p.create("acme/video-1", inp, key="k7"))
    assert (err.outcome, err.code) == ("ambiguous", "timeout")
    assert len(p.find("acme/video-1", inp, since).matches) == 1
    assert creates(sim) == before + 1  # found, so nothing was submitted twice


def test_duplicate_jobs_are_both_listed(make: Callable[..., Provider]) -> None:
    p = make("replicate")
    since = datetime.now(UTC)
    inp = {"prompt": "twins #fault=duplicate"}
    p.create("acme/video-1", inp, key="k8")
    assert len(p.find("acme/video-1", inp, since).matches) == 2


def test_a_job_whose_input_retention_removed_is_listed_as_unknown(make: Callable[..., Provider]) -> None:
    p = make("replicate")
    since = datetime.now(UTC)
    inp = {"prompt": "forgotten input #fault=retention:0"}
    made = p.create("acme/video-1", inp, key="k10")
    found = p.find("acme/video-1", inp, since)
    assert found.matches == [] and made.id in [u.id for u in found.unknown]


def test_find_pages_back_through_the_whole_window(sim: ProviderSim, tmp_path: Path) -> None:
    with ProviderSim(token=TOKEN, page_size=3) as small:
        cfg = parse_provider("paged", {"kind": "replicate", "base_url": small.url, "token_env": "SIM_TOKEN"})
        p = open_provider(cfg, env=ENV)
        since = datetime.now(UTC) - timedelta(seconds=1)
        target = {"prompt": "the first one"}
        p.create("acme/video-1", target, key="first")
        for i in range(20):
            p.create("acme/video-1", {"prompt": f"later {i}"}, key=f"later{i}")
        found = p.find("acme/video-1", target, since)
        assert found.covered and len(found.matches) == 1 and found.searched == 21 and found.pages == 7
        p.close()


def test_a_failing_listing_is_an_error_not_an_answer(make: Callable[..., Provider], sim: ProviderSim) -> None:
    p = make("replicate")
    sim.control(list_fail=1)
    err = fails(lambda: p.find("acme/video-1", {"prompt": "x"}, datetime.now(UTC)))
    assert err.outcome == "retryable" and err.code == "server_error"


def test_runway_cannot_find_a_lost_create(make: Callable[..., Provider]) -> None:
    p = make("runway", request_timeout=0.4)
    err = fails(lambda: p.create("gen4_turbo", {"promptText": "t #fault=create_timeout:1.5"}, key="k9"))
    assert err.outcome == "ambiguous"
    assert not p.find("gen4_turbo", {"promptText": "t"}, datetime.now(UTC)).supported


def test_replicate_deployments_are_a_model_form(make: Callable[..., Provider], sim: ProviderSim) -> None:
    p = make("replicate")
    job = p.create("deployment:acme/video-prod", {"prompt": "via a deployment"}, key="kd")
    assert wait_final(p, job.id).status == "succeeded"
    assert (
        p.describe_create("deployment:acme/video-prod", {})
        == "POST /v1/deployments/acme/video-prod/predictions"
    )


def test_an_undocumented_status_is_unknown_not_an_error(make: Callable[..., Provider]) -> None:
    p = make("replicate")
    job = p.create("acme/video-1", {"prompt": "odd #fault=weird_status #fault=work:5"}, key="kw")
    time.sleep(0.1)
    got = p.get(job.id)
    assert (got.status, got.raw_status, got.final) == ("unknown", "queued", False)


def test_runway_429_on_create_is_the_daily_quota(make: Callable[..., Provider], sim: ProviderSim) -> None:
    p = make("runway")
    sim.control(create_429={"count": 1, "retry_after": 7, "ms": True})
    err = fails(lambda: p.create("gen4_turbo", {"promptText": "over quota"}, key="kq"))
    assert (err.code, err.retry_after) == ("quota", 7.0)


def test_a_trickling_download_is_stalled_and_an_abort_stops_one_within_a_second(
    make: Callable[..., Provider], tmp_path: Path
) -> None:
    p = make("replicate", download={"stall": 1.0, "min_rate": 4096})
    job = _succeeded(p, "drip #fault=trickle:32:0.3")
    t = time.monotonic()
    err = fails(lambda: p.download(job.outputs[0], tmp_path / "a.mp4"))
    assert err.code == "stalled" and time.monotonic() - t < 4.0 and not (tmp_path / "a.mp4").exists()
    slow = make("replicate", download={"stall": 30.0, "min_rate": 1})
    abort = Abort()
    import threading

    threading.Timer(0.5, abort.trip, args=("spool cancel",)).start()
    t = time.monotonic()
    err = fails(lambda: slow.download(job.outputs[0], tmp_path / "b.mp4", abort=abort))
    assert err.code == "aborted" and "spool cancel" in err.problem and time.monotonic() - t < 1.5


def test_the_whole_download_has_a_time_limit(make: Callable[..., Provider], tmp_path: Path) -> None:
    p = make("replicate", download={"timeout": 1.0, "stall": 30.0, "min_rate": 1})
    job = _succeeded(p, "drip forever #fault=trickle:32:0.2")
    t = time.monotonic()
    err = fails(lambda: p.download(job.outputs[0], tmp_path / "c.mp4"))
    assert err.code == "timeout" and time.monotonic() - t < 3.0


def test_connection_refused_is_retryable_even_for_a_create(tmp_path: Path) -> None:
    cfg = parse_provider(
        "gone", {"kind": "replicate", "base_url": "http://127.0.0.1:9", "token_env": "SIM_TOKEN"}
    )
    p = open_provider(cfg, env=ENV)
    err = fails(lambda: p.create("acme/video-1", {"prompt": "x"}, key="k"))
    assert (err.outcome, err.code) == ("retryable", "connect")
    p.close()


# -- polls ---------------------------------------------------------------------------


def test_poll_5xx_is_retryable_back_pressure_then_succeeds(make: Callable[..., Provider]) -> None:
    p = make("runway")
    job = p.create("gen4_turbo", {"promptText": "flaky #fault=get_5xx:2"}, key="k")
    for _ in range(2):
        err = fails(lambda: p.get(job.id))
        assert (err.outcome, err.code, err.back_pressure) == ("retryable", "server_error", True)
    assert wait_final(p, job.id).status == "succeeded"


def test_poll_429_carries_retry_after(make: Callable[..., Provider]) -> None:
    p = make("replicate")
    job = p.create("acme/video-1", {"prompt": "busy #fault=ratelimit:1:3"}, key="k")
    err = fails(lambda: p.get(job.id))
    assert (err.code, err.retry_after, err.back_pressure) == ("rate_limited", 3.0, True)
    assert p.get(job.id).id == job.id


def test_slow_poll_times_out_as_retryable(make: Callable[..., Provider]) -> None:
    p = make("replicate", request_timeout=0.3)
    job = p.create("acme/video-1", {"prompt": "slow #fault=slow:1"}, key="k")
    err = fails(lambda: p.get(job.id))
    assert (err.outcome, err.code, err.back_pressure) == ("retryable", "timeout", False)


def test_lost_job_is_final_with_next_action(make: Callable[..., Provider]) -> None:
    p = make("replicate")
    job = p.create("acme/video-1", {"prompt": "forgotten #fault=lose:1"}, key="k")
    p.get(job.id)
    err = fails(lambda: p.get(job.id))
    assert (err.outcome, err.code, err.http_status) == ("final", "lost", 404)
    assert "does not know this job" in str(err)


def test_failed_generation_reports_the_providers_error_masked(make: Callable[..., Provider]) -> None:
    secrets.install([TOKEN])
    try:
        p = make("replicate")
        job = p.create("acme/video-1", {"prompt": f"oops pasted {TOKEN} #fault=fail"}, key="k")
        done = wait_final(p, job.id)
        assert done.status == "failed" and done.error is not None
        assert "simulated failure" in done.error and TOKEN not in done.error
    finally:
        secrets.install([])


def test_runway_failure_code_is_kept(make: Callable[..., Provider]) -> None:
    p = make("runway")
    done = wait_final(p, p.create("gen4_turbo", {"promptText": "no #fault=fail"}, key="k").id)
    assert done.status == "failed" and done.error is not None and "INTERNAL.BAD_OUTPUT" in done.error


def test_late_completion_of_a_cancelled_job_is_reported_as_it_happens(make: Callable[..., Provider]) -> None:
    p = make("replicate")
    job = p.create("acme/video-1", {"prompt": "zombie #fault=never #fault=late:0.3"}, key="k")
    p.cancel(job.id)
    assert p.get(job.id).status == "canceled"
    time.sleep(0.4)
    late = p.get(job.id)
    assert late.status == "succeeded" and late.outputs  # the caller must not let it win


def test_bad_token_is_final_and_names_the_variable_not_the_value(make: Callable[..., Provider]) -> None:
    wrong = "r8_WrongTokenValue_abcdef0123456789"
    p = make("replicate", env={"SIM_TOKEN": wrong})
    err = fails(lambda: p.create("acme/video-1", {"prompt": "x"}, key="k"))
    assert (err.outcome, err.code) == ("final", "unauthorized")
    assert "SIM_TOKEN" in str(err) and wrong not in str(err)


# -- downloads -------------------------------------------------------------------------


def _succeeded(p: Provider, prompt: str) -> RemoteJob:
    key = "dl"
    model = "acme/video-1" if p.kind == "replicate" else "gen4_turbo"
    field = "prompt" if p.kind == "replicate" else "promptText"
    return wait_final(p, p.create(model, {field: prompt}, key=key).id)


def test_truncated_body_is_detected_retryable_and_leaves_nothing(
    make: Callable[..., Provider], tmp_path: Path
) -> None:
    p = make("replicate")
    job = _succeeded(p, "cut #fault=truncate")
    dest = tmp_path / "cut.mp4"
    err = fails(lambda: p.download(job.outputs[0], dest))
    assert (err.outcome, err.code) == ("retryable", "truncated")
    assert "cut off" in str(err) and not dest.exists()


def test_wrong_checksum_is_detected_and_leaves_nothing(make: Callable[..., Provider], tmp_path: Path) -> None:
    p = make("runway")
    job = _succeeded(p, "lie #fault=bad_checksum")
    dest = tmp_path / "lie.mp4"
    err = fails(lambda: p.download(job.outputs[0], dest))
    assert (err.outcome, err.code) == ("retryable", "checksum") and not dest.exists()


def test_a_compressed_download_is_decoded_and_checked_against_repr_digest(
    make: Callable[..., Provider], tmp_path: Path
) -> None:
    p = make("replicate")
    got = p.download(_succeeded(p, "squeezed #fault=gzip").outputs[0], tmp_path / "z.mp4")
    data = (tmp_path / "z.mp4").read_bytes()
    assert got.checksum_checked and data[4:8] == b"ftyp" and got.size == len(data)


def test_non_video_bytes_download_but_fail_the_probe(make: Callable[..., Provider], tmp_path: Path) -> None:
    from spool.media.probe import ProbeError, ffprobe

    p = make("replicate")
    got = p.download(_succeeded(p, "html #fault=not_video").outputs[0], tmp_path / "fake.mp4")
    assert got.content_type == "text/plain"
    with pytest.raises(ProbeError):  # the validation gate's first check refuses it
        info = ffprobe(got.path)
        if not any(s.get("codec_type") == "video" for s in info.get("streams", [])):
            raise ProbeError("no video stream")


def test_an_expired_runway_url_is_refused_and_fetching_the_task_again_signs_a_fresh_one(
    make: Callable[..., Provider], tmp_path: Path
) -> None:
    p = make("runway")
    job = _succeeded(p, "brief #fault=expire:0")
    time.sleep(1.1)
    err = fails(lambda: p.download(job.outputs[0], tmp_path / "late.mp4"))
    assert (err.outcome, err.code, err.http_status) == ("final", "expired", 403)
    fresh = p.get(job.id).outputs[0]
    assert fresh != job.outputs[0]
    assert p.download(fresh, tmp_path / "fresh.mp4").size > 0


def test_download_over_max_bytes_is_final(make: Callable[..., Provider], tmp_path: Path) -> None:
    p = make("replicate", download={"max_bytes": 1000})
    job = _succeeded(p, "too big")
    dest = tmp_path / "big.mp4"
    err = fails(lambda: p.download(job.outputs[0], dest))
    assert (err.outcome, err.code) == ("final", "too_large") and "download.max_bytes" in str(err)
    assert not dest.exists()


def test_downloads_to_another_host_carry_no_token(sim: ProviderSim, tmp_path: Path) -> None:
    """The output lives on a second server; it must not see the API token."""
    with ProviderSim(token="other-host-token-000") as other:
        cfg = parse_provider("a", {"kind": "replicate", "base_url": sim.url, "token_env": "SIM_TOKEN"})
        p = open_provider(cfg, env=ENV)
        o = open_provider(
            parse_provider("b", {"kind": "replicate", "base_url": other.url, "token_env": "T"}),
            env={"T": "other-host-token-000"},
        )
        job = wait_final(o, o.create("acme/video-1", {"prompt": "elsewhere"}, key="k").id)
        p.download(job.outputs[0], tmp_path / "x.mp4")  # public, signed URL: no auth needed
        seen: list[str | None] = []
        orig = other.server.RequestHandlerClass.do_GET

        def spy(handler: Any) -> None:
            seen.append(handler.headers.get("Authorization"))
            orig(handler)

        other.server.RequestHandlerClass.do_GET = spy  # type: ignore[method-assign]
        try:
            p.download(job.outputs[0], tmp_path / "y.mp4")
        finally:
            other.server.RequestHandlerClass.do_GET = orig  # type: ignore[method-assign]
        assert seen == [None]
        p.close()
        o.close()


# -- pure helpers, config, plug-ins ----------------------------------------------------------


def test_status_classes_and_retry_after_forms() -> None:
    assert classify_status(429) == ("retryable", "rate_limited")
    assert classify_status(503) == ("retryable", "server_error")
    assert classify_status(401) == ("final", "unauthorized")
    assert classify_status(404) == ("final", "lost")
    assert classify_status(422) == ("final", "invalid")
    assert parse_retry_after({"retry-after": "12"}) == 12.0
    assert parse_retry_after({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}, now=1445412470.0) == 10.0
    assert parse_retry_after({"retry-after": "soon"}) is None
    assert parse_retry_after({"retry-after-ms": "250", "retry-after": "9"}) == 0.25  # ms wins
    assert parse_content_digest({"content-digest": "sha-256=:AAAA:"}) == "000000"


def test_provider_config_errors_name_the_field() -> None:
    with pytest.raises(ConfigError, match=r"\[providers.r\] token_env.*NAME"):
        parse_provider(
            "r", {"kind": "replicate", "base_url": "https://api.replicate.com", "token_env": "MY TOKEN"}
        )
    with pytest.raises(ConfigError, match=r"\[providers.r\] base_url"):
        parse_provider("r", {"kind": "replicate", "base_url": "api.replicate.com", "token_env": "T"})
    with pytest.raises(ConfigError, match=r"\[providers.r\] deadline"):
        parse_provider(
            "r", {"kind": "replicate", "base_url": "https://a", "token_env": "T", "deadline": "soon"}
        )
    with pytest.raises(ConfigError, match=r"\[providers.r\] polling.ceiling"):
        parse_provider(
            "r", {"kind": "replicate", "base_url": "https://a", "token_env": "T", "polling": {"ceiling": "x"}}
        )
    cfg = parse_provider(
        "r", {"kind": "replicate", "base_url": "https://a/", "token_env": "T", "deadline": "30m"}
    )
    assert (cfg.base_url, cfg.deadline_seconds, cfg.download.max_bytes_int) == ("https://a", 1800.0, 2**31)
    assert secret_names([cfg]) == ["T"]
    with pytest.raises(ConfigError, match="environment variable T is not set"):
        cfg.token({})


def test_the_video_is_picked_from_any_json_output_by_a_stated_rule() -> None:
    url = "https://x/v.mp4"
    assert pick_video(url, None) == (url, None)
    assert pick_video([url, "https://x/w.mp4"], None) == (url, None)
    assert pick_video({"video": url}, "video") == (url, None)
    assert pick_video({"video": url}, None)[1] and "output_key" in pick_video({"video": url}, None)[1]
    assert "no key 'clip'" in pick_video({"video": url}, "clip")[1]
    assert "empty list" in pick_video([], None)[1]
    assert pick_video(None, None)[0] is None and pick_video("not a url", None)[0] is None


def test_a_pasted_token_is_refused_without_echoing_it_and_http_only_on_loopback() -> None:
    for pasted in ("r8_AbCdEf0123456789aBcDeF", "key_9f8e7d6c5b4a39281716", "abcdefghij0123456789KLMN"):
        assert looks_like_token(pasted)
        with pytest.raises(ConfigError) as info:
            parse_provider("r", {"kind": "replicate", "base_url": "https://a", "token_env": pasted})
        assert pasted not in str(info.value) and "token_env" in str(info.value)
    for name in ("REPLICATE_API_TOKEN", "SPOOL_TEST_GEN_TOKEN_FOR_THE_LONG_RUN", "T"):
        assert not looks_like_token(name)
    with pytest.raises(ConfigError, match=r"base_url.*https://"):
        parse_provider("r", {"kind": "replicate", "base_url": "http://api.replicate.com", "token_env": "T"})
    for loop in ("http://127.0.0.1:8471", "http://localhost:1", "http://[::1]:2"):
        assert parse_provider("r", {"kind": "replicate", "base_url": loop, "token_env": "T"}).base_url == loop
    assert (
        parse_provider(
            "r", {"kind": "replicate", "base_url": "https://a", "token_env": "T"}
        ).retention_seconds
        == 3600
    )
    assert (
        parse_provider("w", {"kind": "runway", "base_url": "https://a", "token_env": "T"}).retention_seconds
        is None
    )


def test_unknown_kind_lists_the_known_ones() -> None:
    cfg = parse_provider("x", {"kind": "nope", "base_url": "https://a", "token_env": "T"})
    with pytest.raises(ConfigError, match=r"\[providers.x\] kind.*replicate, runway"):
        open_provider(cfg, env={"T": "tokenvalue"})


def test_plug_in_kind_loads_from_the_entry_point_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make: Callable[..., Provider]
) -> None:
    (tmp_path / "acme_spool.py").write_text(
        textwrap.dedent(
            """
            from spool.kinds.generate.providers.replicate import Replicate

            class Acme(Replicate):
                kind = "acme"
            """
        )
    )
    dist = tmp_path / "acme_spool-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-spool\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        "[spool.providers]\nacme = acme_spool:Acme\nreplicate = acme_spool:Acme\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    found = kinds()
    assert "acme" in found and found["replicate"].__name__ == "Replicate"  # no shadowing a built-in
    p = make("acme")
    assert type(p).__name__ == "Acme" and p.kind == "acme"
    assert wait_final(p, p.create("acme/video-1", {"prompt": "plugged"}, key="k").id).status == "succeeded"
    monkeypatch.delitem(sys.modules, "acme_spool", raising=False)


def test_token_env_names_register_with_spool_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    """A variable whose name does not look secret (RW_KEY) is masked once the config names it."""
    value = "rw-live-key-value-0987654321"
    monkeypatch.setenv("RW_KEY", value)
    cfg = parse_provider(
        "rw", {"kind": "runway", "base_url": "https://api.dev.runwayml.com", "token_env": "RW_KEY"}
    )
    try:
        secrets.install_from([], [])
        assert secrets.redact(f"x {value} y") == f"x {value} y"
        secrets.install_from(secret_names([cfg]), [])
        assert secrets.redact(f"x {value} y") == "x [redacted] y"
    finally:
        secrets.install([])


def test_simulator_runs_standalone_on_a_port() -> None:
    import json
    import socket
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tools = Path(__file__).resolve().parents[1] / "tools"
    proc = subprocess.Popen(
        [sys.executable, str(tools / "provsim.py"), "--port", str(port), "--token", TOKEN],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and f"127.0.0.1:{port}" in proc.stdout.readline()
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/models/acme/video-1/predictions",
            data=json.dumps({"input": {"prompt": "standalone"}}).encode(),
            headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=10) as r:
            assert json.load(r)["status"] == "starting"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/_sim/stats", timeout=10) as r:
            assert json.load(r) == {"create": 1, "jobs": 1}
    finally:
        proc.terminate()
        # A stop signal is a clean exit (its folder of generated files removed), not a kill.
        assert proc.wait(timeout=10) == 0
