"""Session and the test fake have every member of the Controller Protocol, with the same signature.

The app is written against the Protocol; the live app's `u` and `p` once did nothing because their bodies
sat in the Protocol rather than in Session while the fake had them. mypy checks conformance (tests/
test_types.py); this checks the shape directly, parameter by parameter, so the pair cannot drift."""
from __future__ import annotations

import inspect
import typing

import pytest

from console.session import Controller, Session
from harness.fake_controller import FakeController

IMPLEMENTATIONS = [Session, FakeController]


def protocol_methods() -> dict[str, object]:
    return {name: value for name, value in vars(Controller).items()
            if callable(value) and not name.startswith("_")}


def protocol_attributes() -> set[str]:
    props = {name for name, value in vars(Controller).items() if isinstance(value, property)}
    return set(typing.get_type_hints(Controller)) | props


def kind(fn: object) -> str:
    """How a caller uses it: awaits it, iterates it with `async for`, or calls it."""
    if inspect.iscoroutinefunction(fn):
        return "coroutine"
    if inspect.isasyncgenfunction(fn):
        return "async iterator"
    returns = inspect.signature(fn, eval_str=True).return_annotation  # type: ignore[arg-type]
    origin = typing.get_origin(returns) or returns
    if origin in (typing.AsyncIterator, typing.AsyncGenerator) or str(origin) in (
            "<class 'collections.abc.AsyncIterator'>", "<class 'collections.abc.AsyncGenerator'>"):
        return "async iterator"
    return "plain"


def shape(fn: object) -> list[tuple[str, object, bool]]:
    """(name, kind, has a default) of each parameter after self."""
    params = list(inspect.signature(fn).parameters.values())[1:]  # type: ignore[arg-type]
    return [(p.name, p.kind, p.default is not inspect.Parameter.empty) for p in params]


def test_the_protocol_declares_what_the_app_uses():
    assert {"disk_report", "prune_plan", "prune_runs", "snapshots", "journal", "deep_check",
            "close"} <= set(protocol_methods())
    assert {"history", "final_error", "readonly", "profile_name", "host_name", "simulated"} <= protocol_attributes()


@pytest.mark.parametrize("impl", IMPLEMENTATIONS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("name", sorted(protocol_methods()))
def test_every_protocol_method_is_implemented_with_the_same_signature(impl, name):
    declared = protocol_methods()[name]
    assert name in vars(impl) or any(name in vars(base) for base in impl.__mro__[1:-1]), \
        f"{impl.__name__} has no {name}"
    actual = getattr(impl, name)
    assert actual is not declared, f"{impl.__name__}.{name} is the Protocol's own stub, not a body"
    assert kind(actual) == kind(declared), f"{impl.__name__}.{name}: {kind(actual)}, declared {kind(declared)}"
    want, got = shape(declared), shape(actual)
    assert got[:len(want)] == want, f"{impl.__name__}.{name}{inspect.signature(actual)} vs {inspect.signature(declared)}"
    # more is allowed only where the app never has to pass it: with a default (Session.snapshots'
    # `connecting`, Session.downtime's `req`, Session.start_stage's `**options`: the headless commands')
    extra = got[len(want):]
    assert all(default or k == inspect.Parameter.VAR_KEYWORD for _, k, default in extra), \
        f"{impl.__name__}.{name} takes more than the Protocol: {extra}"


@pytest.mark.parametrize("impl", IMPLEMENTATIONS, ids=lambda c: c.__name__)
def test_every_protocol_attribute_is_there(impl):
    fake = FakeController()
    for name in protocol_attributes():
        if impl is FakeController:
            assert hasattr(fake, name), f"FakeController has no {name}"
        else:  # Session sets its attributes in __init__ (needs a profile); a property is on the class
            assert name in vars(Session) or name in inspect.getsource(Session.__init__), f"Session has no {name}"


def test_a_method_that_drifts_is_caught():
    class Drifted(FakeController):
        async def prune_runs(self, names: list[str], force: bool) -> None:  # type: ignore[override]
            return None

        def deep_check(self):  # type: ignore[override]
            return None
    assert shape(Drifted.prune_runs)[:1] == shape(Controller.prune_runs) and len(shape(Drifted.prune_runs)) == 2
    assert kind(Drifted.deep_check) == "plain" != kind(Controller.deep_check)
