"""Sessions on disk: the file layer below the chat runtime (no torch here; replaying is the runtime's, chat/replay.py).

session.py   the file layer's public face: load / save / list, ids, management (no torch)
records.py   Session, Message, SessionInfo, the errors, the format's constants
read.py      reading a file: bytes, text, JSON, validated field by field into a Session
tree.py      the message tree: active path, alternatives, validation in one walk
check.py     what a loaded session may claim (ids in the vocabulary, text matching tokens)
write.py     atomic, fsynced writes with revisions
lock.py      one writer per session file
index.py     the listing index, so unchanged big trees are not parsed again
snapshot.py  KV-cache snapshots beside a session
export.py    a session as markdown or JSON text"""
