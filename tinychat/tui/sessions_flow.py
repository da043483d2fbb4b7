"""Saved sessions in the app: the sessions screen (Ctrl+S), opening one (/load, the screen) in place of the chat, a
rename of the open one, and a session recorded with another model: the offer to switch to it. A part of TinyChatApp
(`app.sessions`), on the UI thread; the controller opens the sessions on the chat thread."""
from __future__ import annotations


from .messages import ChatOpened


class SessionsFlow:
    def __init__(self, app):
        self.app = app

    def open_screen(self) -> None:
        app, ctl = self.app, self.app.controller
        app.input_box.clear_note()
        if not ctl.can_run("open the sessions"):
            return
        cur = ctl.chat.session.id if ctl.chat.session.n_turns else None
        from .screens.sessions import SessionsScreen    # imported when first opened
        app.push_screen(SessionsScreen(current=cur, sessions_dir=ctl.chat.sessions_dir, export_dir=app.export_dir,
                                       on_renamed=self.renamed), self.screen_done)

    def renamed(self, sid: str, title: str) -> None:
        chat = self.app.chat
        if chat is not None and chat.session.id == sid:
            chat.session.title = title      # the next autosave keeps the new title
            from ..sessions import session as session_files          # ... over the renamed file: take its revision
            session_files.adopt_revision(chat.session, getattr(chat, "sessions_dir", None))

    def screen_done(self, result: tuple | None) -> None:
        if not result:
            return
        what, sid = result
        if what == "new":
            self.app.action_new_chat()
        elif what == "open":
            self.open(sid)

    def open(self, sid: str) -> None:
        self.app.input_box.clear_note()
        if self.app.controller.open_session(sid):
            self.app.status_bar.update_status(activity="opening session…")

    async def opened(self, msg: ChatOpened) -> None:
        app = self.app
        app.controller.opened(msg.chat)
        if msg.token_strings is not None:
            app.strings = msg.token_strings
        with app.controller.idle_after():
            await app.show_history(msg.note)
        app.update_status(msg.status, tok_s=None, ttft_ms=None, activity="")
        app.prompt.focus()

    def offer_model(self, err: BaseException) -> bool:
        """A session recorded with another model failed to open: offer to switch to that model when it is here (the
        shipped one, or imported), and open the session on it. False when there is nothing to offer (the caller
        reports the error)."""
        from ..settings import OtherModel
        app, ctl = self.app, self.app.controller
        if not isinstance(err, OtherModel) or err.same_name or not err.model_name:
            return False
        where = ctl.backend.find_model(err.model_name)
        if where is None:
            return False
        ctl.set_busy(None)
        app.status_bar.update_status(activity="")
        sid, name = err.session_id, err.model_name

        def called(n: str | None) -> str:
            return "the shipped model" if n == "default" else f"the model {n!r}" if n else "the current model"
        current = called(ctl.chat.model_name if ctl.chat is not None else None)
        kept = " (this chat stays saved)" if ctl.chat is not None and ctl.chat.session.n_turns else ""

        def answer(yes: bool | None) -> None:
            if not yes:
                app.notify(f"session {sid} stays closed: it needs the model {name!r}")
                return
            if ctl.switch_model(where, sid):
                app.status_bar.update_status(activity=f"loading {name}…")
        from .screens.dialogs import ConfirmDialog
        app.push_screen(ConfirmDialog(f"Session {sid} was recorded with {called(name)}, not with {current}. "
                                      f"Switch to it and open the session?{kept}"), answer)
        return True
