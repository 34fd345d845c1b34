"""The run's description and what is built from it: the translator's context and bounds."""

from __future__ import annotations

import msgspec

from codelegate.daemon.record import FIXED_LIMITS, run_context, translator_limits
from codelegate.daemon.store.queries import RunRecord
from codelegate.policy.config import development_config
from codelegate.policy.limits import LimitsConfig
from codelegate.translator import Limits, RunContext


def test_every_translator_bound_comes_from_the_config_unless_the_translator_fixes_it() -> None:
    # Every [limits] field a step off its default: a bound that is not passed on keeps the
    # translator's default and is caught, whatever the two sides call it.
    defaults = LimitsConfig()
    moved = {
        f.name: getattr(defaults, f.name) + 1
        for f in msgspec.structs.fields(LimitsConfig)
        if isinstance(getattr(defaults, f.name), int)
    }
    config = msgspec.structs.replace(
        development_config("/srv/ws", "claude"), limits=LimitsConfig(**moved)
    )
    limits = translator_limits(config)
    fields = {f.name for f in msgspec.structs.fields(Limits)}
    from_config = {name for name in fields if getattr(limits, name) != getattr(Limits(), name)}
    assert from_config | FIXED_LIMITS == fields, "a Limits field is neither configured nor fixed"
    assert not from_config & FIXED_LIMITS
    assert {name: getattr(limits, name) for name in from_config} == {
        name: moved[name] for name in from_config
    }
    # A bound the operator can set is never left fixed (the config names it like Limits does).
    assert not FIXED_LIMITS & moved.keys()


def test_the_translators_context_is_the_records_with_what_only_a_new_run_knows() -> None:
    rec = RunRecord(run_id="r1", created_at=1000.0, cwd="/srv/ws", mode="auto")
    rec.session_id, rec.resumed, rec.parent_tool_call_id = "s1", True, "call_1"
    ctx = run_context(rec, parent_session_id="p1", revision_base=3, sequence_base=4)
    from_record = {
        name: getattr(rec, name) for name in RunContext.__struct_fields__ if hasattr(rec, name)
    }
    extra = {
        "started_at": 1000.0,
        "parent_session_id": "p1",
        "revision_base": 3,
        "sequence_base": 4,
    }
    # Every field of the context is the record's or one only a new run knows: none is left out.
    assert from_record.keys() | extra.keys() == set(RunContext.__struct_fields__)
    assert msgspec.structs.asdict(ctx) == from_record | extra
