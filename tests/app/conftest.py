"""Fixtures for the app tests: a tiny model shared by the session's tests, chat factories over it; and async test
functions run with asyncio.run (no pytest plugin needed)."""
import asyncio
import inspect

import pytest

from app_support import ChatFactory


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    if inspect.iscoroutinefunction(pyfuncitem.obj):
        args = {name: pyfuncitem.funcargs[name] for name in pyfuncitem._fixtureinfo.argnames}
        asyncio.run(pyfuncitem.obj(**args))
        return True
    return None


@pytest.fixture(scope="session")
def chat_model():
    from support import make_chat_model
    return make_chat_model()


@pytest.fixture
def factory(chat_model):
    """factory(**settings) -> ChatFactory: builds chats on the shared tiny model (autosave into TINYCHAT_HOME)."""
    def make(**kw):
        return ChatFactory(chat_model, **kw)
    return make
