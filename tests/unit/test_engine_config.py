"""EngineConfig's decode burst: 1 where tokens stream, OFFLINE_DECODE_BURST for offline callers."""

import pytest

from anycore.cli import build_parser, engine_config
from anycore.config import OFFLINE_DECODE_BURST, EngineConfig


def test_unset_burst_streams_every_token():
    c = EngineConfig()
    assert c.decode_burst is None and c.burst == 1


def test_offline_callers_take_the_offline_burst():
    c = EngineConfig().for_offline()
    assert c.decode_burst == OFFLINE_DECODE_BURST == c.burst
    assert OFFLINE_DECODE_BURST > 1


@pytest.mark.parametrize("burst", [0, 1, 4])
def test_an_explicit_burst_stays_offline(burst):
    c = EngineConfig(decode_burst=burst)
    assert c.for_offline() is c and c.burst == burst


def test_negative_burst_is_refused():
    with pytest.raises(ValueError, match="decode_burst"):
        EngineConfig(decode_burst=-1)


def test_cli_leaves_the_burst_to_the_entry_point():
    args = build_parser().parse_args(["serve"])
    assert engine_config(args).burst == 1
    args = build_parser().parse_args(["serve", "--decode-burst", "4"])
    assert engine_config(args).burst == 4
