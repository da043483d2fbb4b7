"""The conversation view rebuilt from the chat's session (after a load, opening a session, a new chat, a switch of
alternatives): its messages, each reply with the tokens and traces this app recorded when it decoded it (else the
token ids alone), the alternatives of each, and the opening note. On the UI thread, while the chat is idle."""
from __future__ import annotations


from ..textsafe import plural
from .widgets import AssistantMessage, NoticeMessage, UserMessage


async def show_history(app, note: str = "") -> None:
    view, chat, replaying = app.view, app.chat, app.controller.replay_sess is not None
    await view.clear()
    app.stream.close()
    app.turns.end_edit()                        # the view (and the messages' places) changed under it
    sess = chat.session
    tok = chat.tok
    widgets = []
    history = []
    for i, m in enumerate(sess.messages):
        if m.role == "user":
            u = UserMessage(m.content, classes="message user")
            if not replaying:
                u.index = i
                u.set_alternatives(*chat.alternatives(i))
            widgets.append(u)
            history.append(m.content)
        elif m.role == "assistant" and not replaying:
            ids = tok.content_ids(m.role, m.token_ids)
            known = app.state.recall(sess.id, m.id, ids)
            meta = known[2] if known else history_meta(m, len(ids))
            w = AssistantMessage(m.content, meta=meta, classes="message assistant")
            w.set_history(ids, [app.piece(t) for t in ids], *(known[:2] if known else ()))
            if m.fork:
                w.marks[m.fork["position"]] = "forked"
            w.index = i
            w.alts = chat.alternatives(i)
            widgets.append(w)
    if not note and not sess.n_turns and not replaying:
        saved = "every chat is saved" if chat.autosave else "--no-save: this chat is not saved; /save saves it"
        note = (f"New chat with {chat.model_name or 'the model'}. Enter sends, Ctrl+J adds a line, "
                f"F1 lists keys and commands, Ctrl+S the saved chats ({saved}).")
        if chat.model_name == "default":
            from ..hub import DEMO_NOTE
            note += " " + DEMO_NOTE
    if note:
        widgets.append(NoticeMessage(note, classes="notice"))
    if widgets:
        await view.mount_all(widgets)
    app.prompt.set_history(history)
    view.scroll_end(animate=False)
    app.inspector.show_text("Send a message: each token's candidates appear here as it is sampled."
                            if not replaying else "Replaying: each token's candidates appear here.")


def history_meta(m, n_tokens: int) -> str:
    """The line under a reply shown from the session without this app's record of it (restored from a file, or
    written by hand with /edit rN)."""
    if m.finish == "edited":
        return f"{plural(n_tokens, 'token')} · written by hand (/edit): not sampled, no trace"
    how = {"length": "cut off at max-new", "cancelled": "stopped"}.get(m.finish or "stop", "")
    return " · ".join([plural(n_tokens, "token"), *([how] if how else []), "restored (no trace)"])
