"""``[fanout]``: off when absent, validated when present, a password never shown."""

from __future__ import annotations

import pytest

from codelegate.policy.config import (
    FanoutConfig,
    fanout_host_id,
    parse_config,
    redacted_url,
    redis_url_problem,
)
from codelegate.policy.errors import ConfigError

BASE = '[policy]\nworkspaces = ["/srv/ws"]\n'


def parse(fanout: str) -> FanoutConfig | None:
    return parse_config((BASE + fanout).encode(), "test.toml").fanout


def refusal(fanout: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        parse(fanout)
    return info.value


def test_fanout_is_off_when_the_section_is_absent() -> None:
    assert parse("") is None


def test_a_fanout_section_gets_the_documented_defaults() -> None:
    fanout = parse('[fanout]\nredis_url = "redis://127.0.0.1:6379/0"\n')
    assert fanout == FanoutConfig(redis_url="redis://127.0.0.1:6379/0")
    assert (fanout.stream_prefix, fanout.host_id, fanout.maxlen_runs) == (
        "codelegate",
        None,
        10_000,
    )


def test_every_key_of_the_section_is_read() -> None:
    fanout = parse(
        "[fanout]\n"
        'redis_url = "unix:///run/redis/redis.sock"\n'
        'stream_prefix = "fleet:a"\n'
        'host_id = "build-01.example"\n'
        "maxlen_runs = 50\n"
    )
    assert fanout == FanoutConfig(
        redis_url="unix:///run/redis/redis.sock",
        stream_prefix="fleet:a",
        host_id="build-01.example",
        maxlen_runs=50,
    )


def test_the_host_id_defaults_to_the_host_name_the_daemon_passes() -> None:
    assert fanout_host_id(FanoutConfig(redis_url="redis://r"), "machine-7") == "machine-7"
    assert fanout_host_id(FanoutConfig(redis_url="redis://r", host_id="a"), "machine-7") == "a"


def test_a_section_without_a_url_is_refused_naming_the_key() -> None:
    exc = refusal("[fanout]\nstream_prefix = 'x'\n")
    assert exc.key == "fanout"
    assert "redis_url" in exc.expected


def test_an_unknown_key_in_the_section_is_refused_with_the_known_ones() -> None:
    exc = refusal('[fanout]\nredis_url = "redis://r"\nredis = 1\n')
    assert exc.key == "fanout.redis"
    assert "redis_url, stream_prefix, host_id, maxlen_runs" in exc.expected


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("http://r:6379", "redis://, rediss:// or unix://"),
        ("redis://r:99999", "bad port"),
        ("redis://r:port", "bad port"),
        ("redis:///0", "no host"),
        ("redis://r 1", "expected a URL"),
        ("unix://relative.sock", "unix:///absolute/path"),
        ("", "redis://, rediss:// or unix://"),
    ],
)
def test_a_bad_redis_url_is_refused_saying_why(url: str, says: str) -> None:
    exc = refusal(f"[fanout]\nredis_url = {url!r}\n")
    assert exc.key == "fanout.redis_url"
    assert says in exc.expected


@pytest.mark.parametrize("url", ["redis://r", "rediss://u:p@r:6380/2", "unix:///run/r.sock"])
def test_good_redis_urls_pass(url: str) -> None:
    assert redis_url_problem(url) == ""


def test_a_refused_url_never_repeats_its_password() -> None:
    exc = refusal('[fanout]\nredis_url = "http://user:hunter2-secret@r:6379"\n')
    assert "hunter2-secret" not in str(exc)
    assert "user:***@r:6379" in str(exc)


def test_redaction_masks_only_the_password() -> None:
    assert redacted_url("redis://:pw@r:1/0") == "redis://:***@r:1/0"
    assert redacted_url("rediss://me:pw@r") == "rediss://me:***@r"
    assert redacted_url("redis://me@r:1") == "redis://me@r:1"
    assert redacted_url("redis://r:1") == "redis://r:1"


@pytest.mark.parametrize("prefix", ["", "a b", "{tag}", "x*", "p" * 65])
def test_a_stream_prefix_that_would_make_odd_keys_is_refused(prefix: str) -> None:
    exc = refusal(f'[fanout]\nredis_url = "redis://r"\nstream_prefix = {prefix!r}\n')
    assert exc.key == "fanout.stream_prefix"


@pytest.mark.parametrize("host", ["", "-x", "a b", "a/b"])
def test_a_host_id_that_is_not_a_host_name_is_refused(host: str) -> None:
    exc = refusal(f'[fanout]\nredis_url = "redis://r"\nhost_id = {host!r}\n')
    assert exc.key == "fanout.host_id"


@pytest.mark.parametrize("n", [0, 10_000_001])
def test_maxlen_runs_out_of_range_is_refused(n: int) -> None:
    exc = refusal(f'[fanout]\nredis_url = "redis://r"\nmaxlen_runs = {n}\n')
    assert exc.key == "fanout.maxlen_runs"
