"""The app's window waits for no screen it does not show: the help (with its Markdown stack), sessions, settings and
A/B screens and the dialogs are imported when first opened (tinychat/tui/screens/__init__.py)."""
import subprocess
import sys

SCREENS = ("help", "sessions", "settings", "ab", "dialogs")


def _loaded(code: str) -> list[str]:
    probe = code + "\nimport sys\nprint([s for s in %r if 'tinychat.tui.screens.' + s in sys.modules])" % (SCREENS,)
    p = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return eval(p.stdout.strip().splitlines()[-1])    # noqa: S307  our own repr


def test_importing_the_app_imports_no_screen():
    assert _loaded("import tinychat.cli, tinychat.tui.app") == []


def test_a_screen_named_from_the_package_is_imported_on_first_use():
    assert _loaded("from tinychat.tui.screens import HelpScreen") == ["help"]
    assert _loaded("from tinychat.tui import screens; screens.ConfirmDialog") == ["dialogs"]
